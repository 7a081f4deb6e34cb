"""The linear one-vs-all peer (PECOS XR-Linear) in its own environment, on the pipeline's TF-IDF features.

Runs the real stage with the real libpecos in ``.venv-pecos`` (``make setup`` creates it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import yaml

from tests.pipeline_repo import ROOT, results_of, lab_results_of

PECOS_PY = ROOT / ".venv-pecos" / "bin" / "python"
pytestmark = pytest.mark.skipif(not PECOS_PY.exists(), reason=".venv-pecos missing: run `make setup`")

TOPICS = {
    "river": ["the river bank was flooded", "water flows down the river", "a boat on the river"],
    "money": ["she paid money into her account", "the bank lent him money", "money in a savings account"],
    "tree": ["green leaves on the tree", "the tree lost its leaves", "an old oak tree in the park"],
    "fruit": ["a red apple is a fruit", "he ate fruit for lunch", "fresh fruit and an apple"],
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    from xmc.baselines import fit_tfidf
    from xmc.data import Split, XMCDataset, save_processed

    root = tmp_path_factory.mktemp("xr")
    labels = list(TOPICS)
    texts, rows = [], []
    for _ in range(4):
        for lid, name in enumerate(labels):
            for t in TOPICS[name]:
                texts.append(t)
                rows.append(lid)
    Y = sp.csr_matrix((np.ones(len(rows), np.float32), (np.arange(len(rows)), rows)), shape=(len(rows), len(labels)))

    def split(idx: list[int]) -> Split:
        return Split([f"u{i}" for i in idx], [texts[i] for i in idx], Y[idx])

    ds = XMCDataset(label_uids=[f"L{i}" for i in range(4)], label_texts=labels, trn=split(list(range(len(texts)))),
                    val=split(list(range(12))), tst=split(list(range(12, 24))), meta={"content_sha256": "x"})
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["xr_linear"]["xr_linear"].update({"nr_splits": 2, "max_leaf_size": 2, "threads": 1})
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    save_processed(ds, results_of(root) / "data/processed")
    (root / "lab").mkdir()
    (root / "lab/params.yaml").write_text((ROOT / "lab/params.yaml").read_text())
    fit_tfidf(ds.trn.texts, ds.val.texts, ds.label_texts, params["tfidf"]).save(results_of(root) / "data/tfidf")
    return root


def _stage(repo: Path, *argv: str, module: str = "stages.xr_linear") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([str(PECOS_PY), "-m", module, *argv], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)


def test_trains_and_predicts_the_training_topics(repo):
    from xmc.predictions import TopK

    p = _stage(repo, "train", "xr_linear")
    assert p.returncode == 0, p.stderr[-2000:]
    assert (results_of(repo) / "models/xr_linear/model/param.json").is_file()
    p = _stage(repo, "predict", "xr_linear", "val", "tst")
    assert p.returncode == 0, p.stderr[-2000:]
    for split, first in (("val", 0), ("tst", 12)):
        top = TopK.load(results_of(repo) / f"predictions/xr_linear/{split}_topk.npz")
        assert top.indices.shape[0] == 12 and (top.indices[:, :4] >= 0).all()
        truth = np.array([i // 3 % 4 for i in range(first, first + 12)])
        assert (top.indices[:, 0] == truth).mean() >= 0.9, (split, top.indices[:, 0], truth)
        assert np.all(np.diff(top.scores[:, :4], axis=1) <= 0)
    assert "train_seconds" in (results_of(repo) / "predictions/xr_linear/timing.json").read_text()


def test_a_lab_variant_trains_its_own_settings_into_its_own_folder(repo):
    """A lab variant is the product's settings with its overrides, trained and predicted (val only) under
    lab/runs/<variant>; its model is removed after predicting and the product's folders are untouched."""
    from xmc.predictions import TopK

    before = sorted(p.as_posix() for p in repo.rglob("*") if not p.as_posix().startswith(str(repo / "lab")))
    p = _stage(repo, "xr_linear_c1", "val", module="lab.stages.xr_linear")
    assert p.returncode == 0, p.stderr[-2000:]
    out = lab_results_of(repo) / "runs/xr_linear_c1"
    timing = (out / "predictions/xr_linear_c1/timing.json").read_text()
    assert "train_seconds" in timing
    assert TopK.load(out / "predictions/xr_linear_c1/val_topk.npz").indices.shape[0] == 12
    assert not (out / "predictions/xr_linear_c1/tst_topk.npz").exists() and not (out / "models").exists()
    assert sorted(p.as_posix() for p in repo.rglob("*") if not p.as_posix().startswith(str(repo / "lab"))) == before


def test_an_unknown_run_is_a_one_line_error_and_writes_nothing(repo):
    p = _stage(repo, "train", "xr_linear_c2")
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert p.returncode == 2 and len(errors) == 1, p.stderr[-2000:]
    assert "xr_linear_c2" in errors[0] and "is not under xr_linear" in errors[0] and "have: xr_linear" in errors[0]
    assert not (results_of(repo) / "models/xr_linear_c2").exists()


def test_the_peer_environment_transforms_texts_like_the_main_one(repo):
    """The vectoriser saved as plain data (vocabulary, idf, settings) gives the same rows under the PECOS
    environment's scikit-learn as the tfidf stage wrote."""
    code = ("import scipy.sparse as sp; from xmc.baselines import TfidfFeatures; from xmc.data import load_processed;"
            "f = TfidfFeatures.load('data/tfidf'); ds = load_processed('data/processed', splits=('trn', 'val'));"
            "sp.save_npz('X_val_peer.npz', f.transform(ds.val.texts))")
    p = subprocess.run([str(PECOS_PY), "-c", code], cwd=results_of(repo), env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    a, b = sp.load_npz(results_of(repo) / "X_val_peer.npz").tocsr(), sp.load_npz(results_of(repo) / "data/tfidf/X_val.npz").tocsr()
    assert a.shape == b.shape and abs(a - b).max() < 1e-6


def test_without_libpecos_the_error_is_one_line(repo):
    p = subprocess.run([sys.executable, "-m", "stages.xr_linear", "train", "xr_linear"], cwd=repo,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert p.returncode == 2 and len(errors) == 1 and ".venv-pecos" in errors[0], p.stderr[-2000:]


def test_a_knob_study_variant_parses_and_an_unknown_knob_is_refused():
    from lab.bench.xr_linear_knobs import parse_variant

    defaults = {"max_leaf_size": 100, "label_embedding": "pifa", "Cp": 16.0}
    assert parse_variant("pii_leaves200:max_leaf_size=200,label_embedding=pii", defaults) == (
        "pii_leaves200", {"max_leaf_size": 200, "label_embedding": "pii"})
    assert parse_variant("Cp=2.5", defaults) == ("Cp=2.5", {"Cp": 2.5})
    with pytest.raises(SystemExit, match="'leaf_size' is not a knob"):
        parse_variant("leaf_size=200", defaults)
    with pytest.raises(SystemExit, match="expected key=value"):
        parse_variant("leaves:max_leaf_size", defaults)
    with pytest.raises(SystemExit, match="other than 'defaults'"):
        parse_variant("defaults:max_leaf_size=200", defaults)
