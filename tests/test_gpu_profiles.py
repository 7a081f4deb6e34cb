"""The GPU profile runner's parts that run anywhere: the profiles are valid params, the carried encoder equals
MiniLM, and a training record is written without DVCLive (the GPU image has no DVC)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from lab.bench.gpu_profiles import PROFILES, pack, profile_run, unpack
from xmc.config import load_params
from xmc.trainer.live import TrainingLog

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("method", sorted(PROFILES))
def test_each_gpu_profile_is_valid_params_on_the_transformer_with_its_schedule_scaled(method, tmp_path):
    run, full_epochs, _, _ = PROFILES[method]
    spec = profile_run(load_params(ROOT / "params.yaml"), method, 4, str(tmp_path))
    assert spec.name == run and spec.method == method
    cfg = spec.config
    assert cfg["encoder"]["kind"] == "transformer" and cfg["encoder"]["model_dir"] == str(tmp_path)
    train = cfg["stage1"]["train"] if method == "maclr" else cfg["train"]
    assert train["epochs"] == 4 and train["max_steps_per_epoch"] == 0 and train["checkpoint_every_steps"] == 0
    if method == "dexml":   # every 5 of 20 epochs -> every 1 of 4
        assert cfg["negatives"]["refresh_every_epochs"] == 1 and cfg["negatives"]["negatives_per_query"] == 5
    if method == "maclr":   # T = 4 x 62 steps: T_K = T/10, T_update = T/20
        assert (cfg["stage1"]["t_k"], cfg["stage1"]["t_update"]) == (24, 12)
        assert cfg["stage2"]["train"]["epochs"] == 4
    full_cfg = profile_run(load_params(ROOT / "params.yaml"), method, full_epochs, None).config
    assert (full_cfg["stage1"]["train"] if method == "maclr" else full_cfg["train"])["epochs"] == full_epochs
    capped = profile_run(load_params(ROOT / "params.yaml"), method, 4, None, max_steps=3).config
    assert all(t["max_steps_per_epoch"] == 3 for t in ([capped["stage1"]["train"], capped["stage2"]["train"]]
                                                       if method == "maclr" else [capped["train"]]))


def test_the_carried_encoder_embeds_the_carried_texts_as_minilm_does(tmp_path):
    from sentence_transformers import SentenceTransformer

    from xmc.encoders.transformer import default_model_dir

    texts = ["The cat sat on the mat.", "run quickly (verb): move fast by using one's feet",
             "a financial institution that accepts deposits", "Ölkännchen, naïve café"]
    root = tmp_path / "project"
    for d, name in (("data/processed", "lbl.jsonl"), ("data/graph/augmented", "anchors.jsonl"),
                    ("data/maclr_pairs", "pairs.jsonl")):
        (root / d).mkdir(parents=True)
        (root / d / name).write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    info = pack(tmp_path / "carry", wheels=False, data_root=root, preset=0)
    assert info["embedding_rows_kept"] < info["vocab_size"]
    model = unpack(tmp_path / "carry", tmp_path / "work")
    assert (tmp_path / "work" / "data" / "maclr_pairs" / "pairs.jsonl").read_text() == \
        (root / "data" / "maclr_pairs" / "pairs.jsonl").read_text()
    a = SentenceTransformer(default_model_dir(), device="cpu").encode(texts, normalize_embeddings=True)
    b = SentenceTransformer(str(model), device="cpu")
    cos = (a * b.encode(texts, normalize_embeddings=True)).sum(1)
    assert cos.min() > 0.9999, cos
    # a word piece none of the texts holds is rebuilt as a zero row; one they hold is not
    emb = b[0].auto_model.get_input_embeddings().weight.detach().numpy()
    tok = b.tokenizer
    assert np.all(emb[tok.convert_tokens_to_ids("zebra")] == 0)
    assert np.any(emb[tok.convert_tokens_to_ids("financial")] != 0)


def test_the_training_record_is_written_without_dvclive(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "dvclive", None)   # import dvclive -> ImportError, as on the GPU image
    log = TrainingLog(tmp_path / "rec", sync_every_s=0.0)
    log.start()
    log.log(0, {"loss": 2.0})
    log.log(1, {"loss": 1.5})
    log.log_validation(1, {"P@1": 0.25, "P@5": 0.1}, epoch=0)
    log.close()
    summary = json.loads((tmp_path / "rec" / "metrics.json").read_text())
    assert summary["loss"] == 1.5 and summary["val"]["P@1"] == 0.25 and summary["step"] == 1
    rows = (tmp_path / "rec" / "plots" / "metrics" / "loss.tsv").read_text().splitlines()
    assert rows == ["step\tloss", "0\t2.0", "1\t1.5"]
    assert (tmp_path / "rec" / "plots" / "metrics" / "val" / "P@1.tsv").read_text().splitlines()[1] == "1\t0.25"


def test_a_method_that_fails_or_overruns_is_reported_and_the_child_is_stopped(tmp_path, monkeypatch):
    from lab.bench.gpu_profiles import _child

    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    log = (tmp_path / "log.txt").open("w")
    slow = _child("dexml", 1, str(tmp_path / "no-model"), False, 1.0, log)
    assert not slow["ok"] and slow["why"] == "timeout after 1 s" and slow["seconds"] < 10
    failed = _child("dexml", 1, str(tmp_path / "no-model"), False, 300.0, log)
    log.close()
    assert not failed["ok"] and "lbl.jsonl: missing" in failed["why"], failed   # its last line, not a crash here


METRICS = ["P@1", "P@5", "PSP@5", "R@100"]


def _fake_call(d: Path, device: str, rows: list[tuple[str, int, float]], n: int = 50) -> None:
    """A device call's files: gpu_profiles.json and gpu_outputs.tar.gz with metrics and per-instance contributions
    (P@1 hits drawn at the row's rate, so a longer run can be told apart)."""
    import tarfile

    from xmc.metrics.bootstrap import InstanceContributions

    d.mkdir(parents=True)
    out_rows = []
    for k, (v, epochs, rate) in enumerate(rows):
        hits = (np.random.default_rng(k).random(n) < rate).astype(float)
        c = InstanceContributions(METRICS, np.stack([hits] * 4), np.ones((4, n)))
        for split in ("tst", "val"):
            c.save(d / "evaluation" / split / f"{v}.npz")
        m = {"P@1": 100 * hits.mean(), "P@5": 100 * hits.mean()}
        out_rows.append({"method": v, "run": v, "epochs": epochs, "profile_epochs": 20, "ok": True,
                         "metrics": {v: m}, "metrics_val": {v: m}})
    (d / "gpu_profiles.json").write_text(json.dumps({"device": device, "rows": out_rows}))
    with tarfile.open(d / "gpu_outputs.tar.gz", "w:gz") as tar:
        tar.add(d / "evaluation", arcname="evaluation")


def test_collect_keeps_earlier_leases_and_tests_longer_runs_and_cpu_peers(tmp_path, monkeypatch):
    import lab.bench.gpu_profiles as gp
    from xmc.metrics.bootstrap import InstanceContributions

    root = tmp_path / "repo"
    (root / "lab" / "bench").mkdir(parents=True)
    (root / "params.yaml").write_text("data: {dataset_dir: ../datasets/semcor-wn30}\n")
    monkeypatch.setattr(gp, "ROOT", root)
    assert gp.product_root() == root / "results/semcor-wn30"
    peer = InstanceContributions(METRICS, np.zeros((4, 50)), np.ones((4, 50)))   # a peer that never hits
    peer.save(root / "results/semcor-wn30/evaluation/tst/xr_linear.npz")        # a product run's
    peer.save(root / "lab/results/semcor-wn30/runs/st_mnrl/evaluation/tst/st_mnrl.npz")   # a lab run's

    _fake_call(tmp_path / "a", "H200", [("dexml", 4, 0.3), ("astra", 20, 0.5)])
    gp.collect([tmp_path / "a"], peers=("xr_linear", "st_mnrl"))
    first = json.loads((root / "lab" / "bench" / "gpu_profiles.json").read_text())
    assert [c["call"] for c in first["calls"]] == [1] and len(first["rows"]) == 2
    assert all("metrics" not in r for r in first["rows"])
    beat = [x for x in first["paired_against_cpu"] if x["variant"] == "dexml" and x["metric"] == "P@1"]
    assert [x["peer"] for x in beat] == ["xr_linear", "st_mnrl"] and all(x["diff"] > 0 for x in beat)

    # a later lease: dexml longer (replaces its metrics), astra shorter (keeps the earlier, longer one)
    _fake_call(tmp_path / "b", "H200", [("dexml", 20, 0.9), ("astra", 2, 0.1)])
    _fake_call(tmp_path / "c", "H200", [("dexml", 1, 0.05)])
    gp.collect([tmp_path / "b", tmp_path / "c"])
    both = json.loads((root / "lab" / "bench" / "gpu_profiles.json").read_text())
    assert [c["call"] for c in both["calls"]] == [1, 2, 3] and len(both["rows"]) == 5
    gpu = root / "lab" / "bench" / "gpu"
    assert json.loads((gpu / "metrics" / "dexml.json").read_text())["epochs"] == 20
    assert json.loads((gpu / "metrics" / "astra.json").read_text())["epochs"] == 20
    assert (gpu / "metrics_val" / "dexml.json").is_file() and (gpu / "evaluation" / "val" / "dexml.npz").is_file()
    longer = [x for x in both["paired_more_epochs"] if x["metric"] == "P@1"]
    assert [(x["variant"], x["a_epochs"], x["b_epochs"]) for x in longer] == [("dexml", 20, 1)]
    assert longer[0]["diff"] > 0 and longer[0]["p_value"] < 0.05


def _fusable_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A GPU call's returned predictions of ``dexml`` on a six-label dataset (its carried data in ``carry``), with
    the repo (``gp.ROOT``) moved to ``tmp_path/repo``. The base run ranks the gold label second; the names in the
    texts put it first, so a fusion with the label names must beat the base on P@1. Returns (call, carry)."""
    import shutil
    import tarfile

    import scipy.sparse as sp

    import lab.bench.gpu_profiles as gp
    from xmc.data import Split, XMCDataset, save_processed
    from xmc.predictions import TopK

    labels = ["bank (n): sloping land beside a body of water",
              "bank, banking company (n): a financial institution that accepts deposits",
              "river (n): a large natural stream of water",
              "breathe, take a breath, respire (v): draw air into, and expel out of, the lungs",
              "half (n): one of two equal parts", "angstrom (n): a metric unit of length"]
    texts = {0: "we sat on the bank of the river", 1: "the bank accepts deposits", 2: "the river was high",
             3: "take a breath", 4: "cut it in half", 5: "an angstrom is small"}
    rng = np.random.default_rng(0)

    def split(prefix: str, n: int) -> Split:
        gold = rng.integers(0, len(labels), n)
        Y = sp.csr_matrix((np.ones(n), (np.arange(n), gold)), shape=(n, len(labels)))
        return Split([f"{prefix}{i}" for i in range(n)], [texts[g] for g in gold], Y, [f"{prefix}d{i % 6}" for i in range(n)])

    ds = XMCDataset([f"L{i}" for i in range(len(labels))], labels, split("t", 40), split("s", 24),
                    meta={"layout": "test"}, val=split("v", 36))
    work = tmp_path / "work"
    save_processed(ds, work / "data/processed")
    carry = tmp_path / "carry"
    carry.mkdir()
    with tarfile.open(carry / "data.tar.xz", "w:xz") as tar:
        tar.add(work / "data/processed", arcname="data/processed")
    call = tmp_path / "call"
    for name, sp_ in (("val", ds.val), ("tst", ds.tst)):
        gold = sp_.Y.indices
        second = (gold + 1) % len(labels)   # the base ranks a wrong label first, the gold one second
        rest = [(gold + k) % len(labels) for k in range(2, len(labels))]
        idx = np.stack([second, gold, *rest], 1).astype(np.int32)
        scores = np.tile(np.linspace(1.0, 0.5, len(labels), dtype=np.float32), (len(gold), 1))
        TopK(idx, scores).save(call / "predictions" / "dexml" / f"{name}_topk.npz")
        # and its evaluation on the device (P@1 0: the gold label is second)
        from xmc.metrics.bootstrap import InstanceContributions

        InstanceContributions(METRICS, np.zeros((len(METRICS), len(gold))), np.ones((len(METRICS), len(gold)))).save(
            call / "evaluation" / name / "dexml.npz")
    repo = tmp_path / "repo"
    (repo / "lab").mkdir(parents=True)
    shutil.copy2(ROOT / "params.yaml", repo / "params.yaml")
    shutil.copy2(ROOT / "lab" / "params.yaml", repo / "lab" / "params.yaml")   # the lab's hybrid of dexml
    monkeypatch.setattr(gp, "ROOT", repo)
    monkeypatch.chdir(tmp_path)

    return call, carry


def test_a_gpu_runs_predictions_are_fused_with_the_label_names_and_evaluated_here(tmp_path, monkeypatch):
    """collect's hybrid step: the predictions a GPU call brought back + the carried data -> the fuse stage's
    fusion (fit on validation) and the evaluate stage's metrics of ``<run>_hybrid``. The base run ranks the
    gold label second; the names in the texts put it first, so the hybrid must beat the base on P@1. ``dexml`` (the
    lab's MiniLM run) has its hybrid in lab/params.yaml; a prediction with no hybrid in either file is not fused."""
    import shutil

    import lab.bench.gpu_profiles as gp

    call, carry = _fusable_call(tmp_path, monkeypatch)
    assert gp._fuse_with_label_names(call, "astra_hybrid", carry) is None   # no predictions of it came back
    shutil.copytree(call / "predictions" / "dexml", call / "predictions" / "unidec_de_only")
    assert gp._fuse_with_label_names(call, "unidec_de_only", carry) is None   # no hybrid of it
    fused = gp._fuse_with_label_names(call, "dexml", carry)
    assert fused["variant"] == "dexml_hybrid" and Path.cwd() == tmp_path
    assert fused["fusion"]["fusion"]["features"][0] == "method_score"
    for key in ("metrics", "metrics_val"):
        assert fused[key]["P@1"] > 50.0, fused[key]["P@1"]   # the base's P@1 is 0
    assert "dexml_hybrid.npz" in {p.name for p in (fused["evaluation"] / "tst").iterdir()}
    wo = fused["metrics"]["by_name_match"]
    assert wo["with_correct_name_match"]["texts"] + wo["without"]["texts"] == 24


def test_refuse_fuses_collected_runs_again_with_the_current_fusion_and_adds_no_rows(tmp_path, monkeypatch):
    """A fusion change reaches the GPU runs' hybrids without a new lease: ``refuse`` re-fits the hybrid of a call
    already collected, replaces its metrics, fusion note and paired tests, and leaves the calls and rows as they
    were; a call whose run metrics/gpu no longer records is left alone; an unknown call is refused."""
    import shutil
    import tarfile

    import yaml

    import lab.bench.gpu_profiles as gp
    from xmc.metrics.bootstrap import InstanceContributions

    call, carry = _fusable_call(tmp_path, monkeypatch)
    monkeypatch.setattr(gp, "CARRY", carry)
    repo = gp.ROOT
    n = 24   # the test split's size (the call's evaluation of the base, P@1 0, is _fusable_call's)
    c = InstanceContributions(METRICS, np.zeros((4, n)), np.ones((4, n)))
    c.save(gp.product_root() / "evaluation" / "tst" / "xr_linear.npz")
    m = {"P@1": 0.0, "P@5": 20.0}
    (call / "gpu_profiles.json").write_text(json.dumps({"device": "H200", "rows": [
        {"method": "dexml", "run": "dexml", "epochs": 20, "profile_epochs": 20, "ok": True,
         "metrics": {"dexml": m}, "metrics_val": {"dexml": m}}]}))
    with tarfile.open(call / "gpu_outputs.tar.gz", "w:gz") as tar:
        tar.add(call / "evaluation", arcname="evaluation")
        tar.add(call / "predictions", arcname="predictions")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["hybrid"]["fusion"] = "boosted_trees"
    params["hybrid"]["boosted_trees"]["min_samples_leaf"] = 2   # this toy's few positives would fall back to logistic
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    (repo / "lab" / "bench").mkdir()
    gp.collect([call])
    first = json.loads((repo / "lab" / "bench" / "gpu_profiles.json").read_text())
    assert first["rows"][0]["hybrids"]["dexml_hybrid"]["fusion"]["kind"] == "boosted_trees"
    assert any(x["variant"] == "dexml_hybrid" for x in first["paired_against_cpu"])

    # a second call of the same length: metrics/gpu now records it, so re-fusing call 1 changes nothing
    later = tmp_path / "later"
    shutil.copytree(call, later)
    gp.collect([later])
    two = json.loads((repo / "lab" / "bench" / "gpu_profiles.json").read_text())
    recorded = (repo / "lab" / "bench" / "gpu" / "metrics" / "dexml_hybrid.json").read_text()
    params["hybrid"]["fusion"] = "logistic"
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    gp.refuse([call], [1])
    assert json.loads((repo / "lab" / "bench" / "gpu_profiles.json").read_text()) == two
    assert (repo / "lab" / "bench" / "gpu" / "metrics" / "dexml_hybrid.json").read_text() == recorded

    gp.refuse([later], [2])
    again = json.loads((repo / "lab" / "bench" / "gpu_profiles.json").read_text())
    assert again["calls"] == two["calls"] and len(again["rows"]) == 2
    assert [r["hybrids"]["dexml_hybrid"]["fusion"]["kind"] for r in again["rows"]] == ["boosted_trees", "logistic"]
    assert len(again["paired_against_cpu"]) == len(two["paired_against_cpu"])   # replaced, not appended
    assert json.loads((repo / "lab" / "bench" / "gpu" / "metrics" / "dexml_hybrid.json").read_text())["P@1"] > 50.0
    with pytest.raises(SystemExit, match="no call 3"):
        gp.refuse([later], [3])
