"""Model packages: build, load anywhere, predict; the same predictions as the models they were built from;
every broken or mismatched package refused with one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import xmc
from tests.package_fixtures import build_all, semcor_labels
from tests.pipeline_repo import SEMCOR
from xmc.errors import ConfigError, DataFormatError
from xmc.package import InputError, label_set_sha256, load

pytestmark = pytest.mark.skipif(not SEMCOR.exists(), reason="../shared/datasets/semcor-wn30 not present")

QUERIES = ["she was able to swim across", "that which is known to exist", "not yet, up to the present time"]


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    return build_all(tmp_path_factory.mktemp("pkgs"))


def test_every_kind_loads_and_predicts_ranked_labels_with_uids_texts_scores(packages):
    uids, texts = semcor_labels()
    for name, path in packages.items():
        pkg = xmc.load(str(path))
        assert pkg.n_labels == len(uids) and pkg.name == name
        preds = pkg.predict(QUERIES, k=5)
        assert len(preds) == 3 and all(len(row) == 5 for row in preds), name
        for row in preds:
            scores = [p.score for p in row]
            assert scores == sorted(scores, reverse=True), name
            for p in row:
                assert p.id == uids[p.index] and p.text == texts[p.index]
        assert pkg.predict("one text", k=2)[0][0].id in uids  # a single string is one text


def test_predictions_equal_the_models_they_were_built_from(packages):
    """The package's search = what the pipeline computes from the trained folders."""
    from xmc.baselines.tfidf import TfidfFeatures, tfidf_zero_shot
    from xmc.encoders.build import load_encoder
    from xmc.methods.astra import ASTRAModel
    from xmc.methods.unidec import UniDECModel, predict_spaces

    _, texts = semcor_labels()
    src = packages["dense"].parent / "src"
    enc = load_encoder(src / "dense")
    S = enc.encode(QUERIES, "query") @ enc.encode(texts, "label").T
    D, I = xmc.load(str(packages["dense"])).topk(QUERIES, 10)
    assert np.allclose(D, -np.sort(-S, 1)[:, :10], atol=1e-5)
    astra = ASTRAModel.load(src / "astra", texts)
    S = astra.query_vectors_np(QUERIES) @ astra.all_label_vectors().T
    D, I = xmc.load(str(packages["astra"])).topk(QUERIES, 10)
    assert np.allclose(D, -np.sort(-S, 1)[:, :10], atol=1e-5) and (I[:, 0] == S.argmax(1)).all()
    model = UniDECModel.load(src / "unidec", texts)
    ref = predict_spaces(model, QUERIES, 10)
    for space, name in (("concat", "unidec"), ("de", "unidec_de_only"), ("clf", "unidec_clf_only")):
        D, I = xmc.load(str(packages[name])).topk(QUERIES, 10)
        assert np.allclose(D, ref[space]["scores"], atol=1e-5), space
    feats = TfidfFeatures.load(src / "data" / "tfidf")
    ref = tfidf_zero_shot(feats.transform(QUERIES), feats.lbl, 10)
    D, I = xmc.load(str(packages["tfidf_zeroshot"])).topk(QUERIES, 10)
    assert (I == ref.indices).all() and np.allclose(D, ref.scores)


def test_k_larger_than_the_label_set_returns_every_label_ranked(packages):
    pkg = load(packages["label_prior"])
    D, I = pkg.topk(QUERIES[:1], 5000)
    assert I.shape == (1, pkg.n_labels) and sorted(I[0].tolist()) == list(range(pkg.n_labels))


@pytest.mark.parametrize("texts,k,match", [
    (["fine"], 0, r"k must be an integer in \[1, 10000\]"),
    (["fine"], 10**9, r"k must be an integer"),
    (["fine"], True, r"k must be an integer"),
    (["fine", "  "], 3, r"text 1 is empty"),
    (["fine", 7], 3, r"text 1 is not a string"),
    ({"texts": "x"}, 3, r"texts must be a list"),
])
def test_bad_requests_are_one_line_input_errors(packages, texts, k, match):
    pkg = load(packages["dense"])
    with pytest.raises(InputError, match=match):
        pkg.predict(texts, k)


def _copy(packages, name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(packages[name], dst)
    return dst


def test_broken_packages_are_refused_with_one_line(packages, tmp_path):
    with pytest.raises(ConfigError, match="model package not found"):
        load(tmp_path / "nope")
    d = _copy(packages, "dense", tmp_path)
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(DataFormatError, match=r"manifest\.json"):
        load(d)
    d = _copy(packages, "astra", tmp_path)
    (d / "manifest.json").unlink()
    with pytest.raises(DataFormatError, match="not a model package"):
        load(d)
    # a truncated weight file (an interrupted copy)
    d = _copy(packages, "unidec", tmp_path)
    w = d / "model" / "unidec_heads.pt"
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(DataFormatError, match=r"unidec_heads\.pt: 100 bytes, the manifest says"):
        load(d)
    # same size, other content: found by --verify
    d = _copy(packages, "tfidf_knn", tmp_path)
    f = d / "tfidf" / "idf.npz"
    data = bytearray(f.read_bytes())
    data[-10] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(DataFormatError, match="SHA-256"):
        load(d, verify=True)
    # a label file that no longer matches the manifest (labels edited after packaging)
    d = _copy(packages, "label_prior", tmp_path)
    lines = (d / "labels.jsonl").read_text().splitlines()
    lines[0], lines[1] = lines[1], lines[0]
    (d / "labels.jsonl").write_text("\n".join(lines) + "\n")
    m = json.loads((d / "manifest.json").read_text())
    m["files"]["labels.jsonl"]["bytes"] = (d / "labels.jsonl").stat().st_size
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataFormatError, match="label-set hash"):
        load(d)
    # a manifest of a future format
    d = _copy(packages, "tfidf_zeroshot", tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    m["format_version"] = 99
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataFormatError, match="format_version 99"):
        load(d)


def test_a_package_for_another_label_set_is_refused(packages, tmp_path):
    uids, texts = semcor_labels()
    pkg = load(packages["dense"], expect_labels=label_set_sha256(uids, texts))
    assert pkg.n_labels == len(uids)
    other = tmp_path / "lbl.jsonl"
    other.write_text("".join(json.dumps({"uid": u, "text": t}) + "\n" for u, t in zip(uids[:-1], texts[:-1])))
    with pytest.raises(ConfigError, match="built for another label set"):
        load(packages["dense"], expect_labels=other)


def test_registry_names_need_a_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("XMC_REPO_DIR", raising=False)
    with pytest.raises(ConfigError, match="no DVC repository here"):
        xmc.load("astra#prod")
    with pytest.raises(ConfigError, match="not a package folder nor a registry name"):
        xmc.load("Astra!!")


def test_every_package_carries_a_model_card_that_matches_its_manifest(packages):
    """The card (README.md) is written from the manifest and is one of the checksummed files."""
    from xmc.cards import split_front_matter

    for name, path in packages.items():
        card = (path / "README.md").read_text()
        manifest = json.loads((path / "manifest.json").read_text())
        assert "README.md" in manifest["files"], name
        meta, body = split_front_matter(card)   # HF layout: YAML front matter, then the Markdown
        assert meta["library_name"] == "xmc" and body.startswith(f"# {name}\n")
        assert f"{manifest['labels']['count']:,} labels" in card
        assert "| validation (? instances) | 50.0 | – | 30.0 | – | 20.0 |" in card, name
        assert "| test (? instances) | 49.0 |" in card and f"xmc predict {name} " in card
        xmc.load(str(path), verify=True)   # every file, the card included, matches its SHA-256


def test_code_version_is_dirty_only_when_the_model_code_changed(tmp_path):
    """A clean checkout's pipeline rewrites dvc.lock and metrics/ before it packages: the commit stays clean;
    a changed, staged or new file under the code paths makes it dirty."""
    import subprocess

    from xmc.package.package import code_version

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()

    for rel, text in {"xmc/a.py": "x = 1\n", "stages/train.py": "", "metrics/m.json": "{}\n",
                      "dvc.lock": "stages: {}\n"}.items():
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text(text)
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-qm", "one")
    head = git("rev-parse", "--short=12", "HEAD")
    assert code_version(tmp_path)["git"] == head
    (tmp_path / "metrics/m.json").write_text('{"P@1": 50.0}\n')
    (tmp_path / "dvc.lock").write_text("stages: {a: {}}\n")
    (tmp_path / "metrics/new.json").write_text("{}\n")
    assert code_version(tmp_path)["git"] == head
    assert code_version(tmp_path / "metrics")["git"] == head   # paths are the repository root's, from anywhere
    (tmp_path / "xmc/a.py").write_text("x = 2\n")
    assert code_version(tmp_path)["git"] == head + "-dirty"
    git("add", "xmc/a.py")
    assert code_version(tmp_path / "metrics")["git"] == head + "-dirty"
    git("reset", "-q", "--hard")
    (tmp_path / "stages/extra.py").write_text("")
    assert code_version(tmp_path)["git"] == head + "-dirty"
    (tmp_path / "stages/extra.py").unlink()
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    assert code_version(tmp_path)["git"] == head + "-dirty"
    outside = tmp_path.parent / f"{tmp_path.name}-plain"
    outside.mkdir()
    assert "git" not in code_version(outside)   # not a git checkout: no commit, no error


def test_card_training_line_reads_one_stage_and_two_stage_summaries():
    """A MACLR summary has a step count per stage and a machine but no device; the card must not show "?" for it."""
    from xmc.cards import encoder_card, split_front_matter, training_budget, training_record

    assert training_budget({"epochs": 6, "steps": 330, "train_seconds": 35.58, "device": "cpu"}) == \
        "6 epochs, 330 steps, 35.58 s on cpu"
    two_stage = {"stage1": {"steps": 24, "seconds": 98.9}, "stage2": {"steps": 180, "seconds": 519.2},
                 "train_seconds": 618.06, "machine": {"cpu": "AMD EPYC", "cores": 2}}
    assert training_budget(two_stage) == "Stage I 24 steps, Stage II 180 steps, 618.06 s on AMD EPYC (2 cores)"
    card = encoder_card("maclr", "maclr", {}, two_stage, "semcor-wn30")
    body = split_front_matter(card)[1]
    assert "Stage II 180 steps" in card and "?" not in body.split("\n")[2]
    assert training_budget({"train_seconds": 1279.78}) == "1279.78 s of training"   # the ensemble's sum
    # a package manifest keeps only what the line needs, and the line reads the same from it
    assert training_budget(training_record({**two_stage, "pairs": {"names_pairs": 42005}})) == training_budget(two_stage)


def test_package_run_hard_links_the_trained_weights_and_serves_what_it_evaluated(tmp_path, monkeypatch):
    """The package stage (xmc.package.build.package_run) of a trained run: the package's weights are hard links of
    the trained model's files (one copy on disk), its manifest carries the run, its settings and both splits'
    metrics as written to metrics_val/ and metrics/, and it ranks the test texts as the predictions it wrote."""
    import os

    import scipy.sparse as sp

    from tests.pipeline_repo import ROOT
    from xmc.config import load_params
    from xmc.config.runs import single_run
    from xmc.data import Split, XMCDataset, save_processed
    from xmc.methods.harness import train_run
    from xmc.package.build import package_run
    from xmc.predictions import TopK
    from xmc.workspace import Workspace

    labels = ["river bank water", "money bank account", "green tree leaf", "red apple fruit"]
    texts = ["the river bank was full of water", "a bank account for money", "a leaf of a green tree",
             "an apple is a red fruit", "water in the river", "money in the account"] * 3
    rows = [0, 1, 2, 3, 0, 1] * 3
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (np.arange(len(rows)), rows)), shape=(len(rows), 4))
    split = lambda n: Split([f"u{i}" for i in range(n)], texts[:n], Y[:n])   # noqa: E731
    ds = XMCDataset(trn=split(12), val=split(6), tst=split(6), label_uids=[f"L{i}" for i in range(4)],
                    label_texts=labels, meta={"content_sha256": "x"})
    monkeypatch.chdir(tmp_path)
    ws = Workspace(tmp_path)
    save_processed(ds, ws.processed)
    params = load_params(ROOT / "params.yaml")
    params["evaluate"]["bootstrap"]["n_resamples"] = 20
    run = single_run("dexml", {"encoder": {"dim": 8, "n_buckets": 1024, "ngram_max": 1},
                               "negatives": {"kind": "in_batch"},
                               "train": {"epochs": 2, "batch_size": 4, "lr": 0.05, "eval_every_epochs": 0}},
                     params, name="tiny")
    train_run(params, run, ws)
    out = package_run(params, "tiny", ws, run_params=run.config)
    weights = [f for f in ws.model("tiny").rglob("*") if f.is_file()
               and f.name not in ("train_summary.json", "model.json", "README.md")]
    assert {f.name for f in weights} == {"bow_encoder.pt", "xmc_encoder.json"}
    for f in weights:
        packaged = ws.package("tiny") / "encoder" / f.relative_to(ws.model("tiny"))
        assert packaged.stat().st_ino == f.stat().st_ino and os.path.samefile(packaged, f), f
        assert f.stat().st_nlink >= 2
    manifest = json.loads((ws.package("tiny") / "manifest.json").read_text())
    assert manifest["name"] == "tiny" and manifest["method"] == "dexml" and manifest["params"]["run"] == "tiny"
    assert manifest["params"]["encoder"] == run.config["encoder"]
    for split_name in ("val", "tst"):
        written = json.loads(ws.metrics("tiny", split_name).read_text())
        assert manifest["metrics"][split_name] == {k: v for k, v in written.items() if k != "ci95"}
        assert out["metrics"][split_name]["P@1"] == written["P@1"]
    assert manifest["dataset"]["train_instances"] == 12 and manifest["training"]
    ref = TopK.load(ws.predictions("tiny") / "tst_topk.npz")
    D, I = xmc.load(str(ws.package("tiny")), verify=True).topk(ds.tst.texts, 4)
    assert np.array_equal(I, ref.indices[:, :4].astype(I.dtype)) and np.allclose(D, ref.scores[:, :4], atol=1e-6)
    with pytest.raises(ConfigError, match="trained model folder not found"):
        package_run(params, "untrained", ws)
