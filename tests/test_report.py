"""The evaluate, report and selection stages on small synthetic files (real computations, subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import yaml

from xmc.io import write_json
from xmc.metrics import evaluate_topk
from xmc.metrics.bootstrap import InstanceContributions
from xmc.predictions import TopK
from xmc.data import XMCDataset, save_processed
from xmc.data.dataset import Split
from xmc.report import seed_rows
from tests.pipeline_repo import results_of, lab_results_of

ROOT = Path(__file__).resolve().parents[1]
METRICS4 = ["P@1", "P@5", "PSP@5", "R@100"]
EVAL = {"top_k": 12, "ks": [1, 3, 5], "recall_ks": [4, 10], "propensity_a": 0.55, "propensity_b": 1.5,
        "bootstrap": {"n_resamples": 300, "seed": 0, "level": 0.95}}


def run_stage(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120)


def write_params(repo: Path, **extra: Any) -> None:
    params = {"data": {"dataset_dir": "../datasets/toy"}, "evaluate": EVAL, "runs": {}, "xr_linear": {}, **extra}
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def toy_split(rng: np.random.Generator, n: int, L: int = 30, k: int = 12) -> tuple[sp.csr_matrix, TopK]:
    """Truth with some empty rows and predictions that put a positive first on about half the rows."""
    Y = (rng.random((n, L)) < 0.1).astype(np.float32)
    Y[:3] = 0
    idx = np.array([rng.permutation(L)[:k] for _ in range(n)], dtype=np.int32)
    for i in range(n):
        pos = np.flatnonzero(Y[i])
        if len(pos) and rng.random() < 0.5:
            idx[i] = np.concatenate([[pos[0]], [x for x in idx[i] if x != pos[0]]])[:k]
    return sp.csr_matrix(Y), TopK(idx, np.tile(-np.arange(k, dtype=np.float32), (n, 1)))


def _split(Y: sp.csr_matrix, prefix: str) -> Split:
    return Split([f"{prefix}{i}" for i in range(Y.shape[0])], [f"{prefix} text {i}" for i in range(Y.shape[0])], Y)


@pytest.fixture
def eval_repo(tmp_path):
    """params + data/processed (trn, val, tst; the test split with a filter) + predictions of method m on val and tst."""
    rng = np.random.default_rng(0)
    repo = tmp_path / "repo"
    write_params(repo)
    trn_Y = (rng.random((100, 30)) < 0.1).astype(np.float32)
    trn_Y[:, :5] = 0  # labels 0..4 unseen in training
    trn_Y = sp.csr_matrix(trn_Y)
    val_Y, val_pred = toy_split(rng, 60)
    tst_Y, tst_pred = toy_split(rng, 80)
    # the filter removes the first prediction of rows 3..30, often a hit
    filt = sp.csr_matrix((np.ones(28, np.float32), (np.arange(3, 31), tst_pred.indices[3:31, 0])), shape=tst_Y.shape)
    ds = XMCDataset([f"l{i}" for i in range(30)], [f"label {i}" for i in range(30)], _split(trn_Y, "t"),
                    _split(tst_Y, "s"), filt, meta={}, val=_split(val_Y, "v"))
    save_processed(ds, results_of(repo) / "data/processed")
    val_pred.save(results_of(repo) / "predictions/m/val_topk.npz")
    tst_pred.save(results_of(repo) / "predictions/m/tst_topk.npz")
    write_json(results_of(repo) / "predictions/m/timing.json", {"train_seconds": 12.5, "predict_seconds": 1.25})
    freq = np.asarray(trn_Y.sum(0)).ravel()
    return {"repo": repo, "freq": freq, "val": (val_Y, val_pred), "tst": (tst_Y, tst_pred, filt)}


def _expected(Y, pred, freq, filt=None) -> dict[str, Any]:
    return evaluate_topk(pred, Y, freq, 100, ks=(1, 3, 5), recall_ks=(4, 10), filt=filt)


# ------------------------------------------------------------------------------------------ evaluate


def test_evaluate_val_split_writes_validation_records_only(eval_repo):
    repo = eval_repo["repo"]
    p = run_stage(repo, "stages.evaluate", "m", "val")
    assert p.returncode == 0, p.stderr
    m = json.loads((results_of(repo) / "metrics_val/m.json").read_text())
    val_Y, val_pred = eval_repo["val"]
    exp = _expected(val_Y, val_pred, eval_repo["freq"])["metrics"]
    for k, v in exp.items():
        assert m[k] == (round(v, 4) if isinstance(v, float) else v), k
    assert "train_seconds" not in m
    assert set(m["ci95"]) == {"P@1", "nDCG@1", "PSP@1", "P@3", "nDCG@3", "PSP@3", "P@5", "nDCG@5", "PSP@5",
                              "R@4", "R@10", "unseen_R@10"}
    for k, (lo, hi) in m["ci95"].items():
        assert lo <= m[k] <= hi and hi > lo, k
    c = InstanceContributions.load(results_of(repo) / "evaluation/val/m.npz")
    assert c.n == 60 and c.values()["P@1"] == pytest.approx(exp["P@1"], abs=1e-9)
    assert not (results_of(repo) / "metrics").exists() and not (results_of(repo) / "plots").exists()
    assert sorted(p.relative_to(results_of(repo)).as_posix() for p in (results_of(repo) / "evaluation").rglob("*")) == ["evaluation/val",
                                                                                           "evaluation/val/m.npz"]
    # same inputs, same bytes (seeded bootstrap, deterministic npz)
    files = [results_of(repo) / "metrics_val/m.json", results_of(repo) / "evaluation/val/m.npz"]
    before = [f.read_bytes() for f in files]
    assert run_stage(repo, "stages.evaluate", "m", "val").returncode == 0
    assert before == [f.read_bytes() for f in files]


def test_evaluate_test_split_applies_filter_and_writes_plots(eval_repo):
    repo = eval_repo["repo"]
    tst_Y, tst_pred, filt = eval_repo["tst"]
    p = run_stage(repo, "stages.evaluate", "m", "tst")
    assert p.returncode == 0, p.stderr
    m = json.loads((results_of(repo) / "metrics/m.json").read_text())
    exp = _expected(tst_Y, tst_pred, eval_repo["freq"], filt)
    unfiltered = _expected(tst_Y, tst_pred, eval_repo["freq"])["metrics"]
    assert unfiltered["P@1"] != exp["metrics"]["P@1"]  # the filter matters on this data
    assert m["P@1"] == round(exp["metrics"]["P@1"], 4) and m["n_test"] == 80
    assert m["train_seconds"] == 12.5 and m["predict_seconds"] == 1.25
    assert m["ci95"]["P@1"][0] <= m["P@1"] <= m["ci95"]["P@1"][1]
    c = InstanceContributions.load(results_of(repo) / "evaluation/tst/m.npz")
    assert c.values()["P@1"] == pytest.approx(exp["metrics"]["P@1"], abs=1e-9)
    at_k = json.loads((results_of(repo) / "plots/eval/m/at_k.json").read_text())
    # P@k and R@k at every k up to the prediction depth, agreeing with the metrics at their ks
    assert [r["k"] for r in at_k] == list(range(1, len(at_k) + 1)) and len(at_k) >= 10
    for k in (1, 3, 5):
        assert at_k[k - 1]["precision"] == pytest.approx(m[f"P@{k}"], abs=1e-3), k
    for k in (4, 10):
        assert at_k[k - 1]["recall"] == pytest.approx(m[f"R@{k}"], abs=1e-3), k
    assert all(a["recall"] <= b["recall"] for a, b in zip(at_k, at_k[1:]))
    rbf = json.loads((results_of(repo) / "plots/eval/m/recall_by_frequency.json").read_text())
    assert [r["test_pairs"] for r in rbf] == [b["test_pairs"] for b in exp["recall_by_frequency"]]
    assert not (results_of(repo) / "metrics_val").exists() and not (results_of(repo) / "evaluation/val").exists()


def test_evaluate_missing_predictions_is_one_line_error(eval_repo):
    p = run_stage(eval_repo["repo"], "stages.evaluate", "nope", "val")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == "error: results/toy/predictions/nope/val_topk.npz: no predictions of 'nope'"
    bad = run_stage(eval_repo["repo"], "stages.evaluate", "m", "dev")
    assert bad.returncode == 2 and "splits to predict must be val and/or tst" in bad.stderr.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------ report


def contrib(hits: np.ndarray) -> InstanceContributions:
    """The same per-row hits for P@1, P@5, PSP@5 and R@100 (den 1): enough for paired tests."""
    return InstanceContributions(METRICS4, np.tile(hits.astype(np.float64), (4, 1)), np.ones((4, len(hits))))


def metrics_json(p1: float, **kw: Any) -> dict[str, Any]:
    m = {"P@1": p1, "P@3": 30.0, "P@5": 25.0, "nDCG@5": 33.0, "PSP@5": 31.0, "R@10": 31.0, "R@100": 65.0,
         "unseen_R@100": 70.0, "n_test": 1500, "n_test_without_labels": 0, "unseen_test_pairs": 9}
    m.update(kw)
    return m


@pytest.fixture
def report_repo(tmp_path):
    """A product with runs good and bad (evaluated) and a lab with an ablation abl of good and seeds of good."""
    repo = tmp_path / "repo"
    write_params(repo, runs={"good": {"method": "tfidf_knn"}, "bad": {"method": "tfidf_zeroshot"}},
                 report={"paired": [["good", "bad"]], "alpha": 0.05})
    (repo / "lab").mkdir()
    (repo / "lab/params.yaml").write_text(yaml.safe_dump({
        "runs": {"abl": {"method": "tfidf_knn", "splits": "val tst", "n_neighbors": 3},
                 "good_seed1": {"method": "tfidf_knn", "splits": "val tst"},
                 "good_seed2": {"method": "tfidf_knn", "splits": "val tst"}},
        "report": {"rows": [], "paired": [["abl", "bad"], ["good", "abl"], ["good", "missing"]],
                   "ablation_controls": {"abl": "good", "not_run": "good"},
                   "seeds": {"good": ["good_seed1", "good_seed2", "good_seed3"], "absent": ["x"]}}}))
    n = 1500
    bad = np.zeros(n)
    bad[:450] = 1  # 30 %
    good = bad.copy()
    good[450:600] = 1  # 40 %: +150 hits
    abl = bad.copy()
    abl[450:463] = 1
    abl[:10] = 0  # 13 rows won, 10 lost: +0.2, a tie
    for name, h in (("good", good), ("bad", bad)):
        contrib(h).save(results_of(repo) / f"evaluation/tst/{name}.npz")
    contrib(abl).save(lab_results_of(repo) / "runs/abl/evaluation/tst/abl.npz")
    write_json(results_of(repo) / "metrics/good.json", metrics_json(40.0, ci95={"P@1": [37.54, 42.46], "R@100": [63.0, 67.0]},
                                                       train_seconds=10.0, predict_seconds=1.0))
    write_json(results_of(repo) / "metrics/bad.json", metrics_json(30.0, ci95={"P@1": [27.7, 32.3]}))
    # the training plans (stages.plan): what each run's training read; the 'labelled pairs used' column comes from them
    write_json(results_of(repo) / "plans/good.json", {"inputs": {"data/processed/lbl.jsonl": "0", "data/processed/trn.jsonl": "0",
                                                    "data/processed/trn_Y.npz": "0"}})
    write_json(results_of(repo) / "plans/bad.json", {"inputs": {"data/processed/lbl.jsonl": "0"}})
    write_json(lab_results_of(repo) / "runs/good_seed1/metrics/good_seed1.json", metrics_json(42.0, **{"P@5": 26.0}))
    write_json(lab_results_of(repo) / "runs/good_seed2/metrics/good_seed2.json", metrics_json(44.0, **{"P@5": 27.0}))
    write_json(lab_results_of(repo) / "runs/abl/metrics/abl.json", metrics_json(30.2, ci95={"P@1": [27.9, 32.5]}))
    return repo


def test_report_intervals_and_paired(report_repo):
    repo = report_repo
    p = run_stage(repo, "stages.report")
    assert p.returncode == 0, p.stderr
    md = (results_of(repo) / "reports/comparison.md").read_text()
    # kind of row, what labelled pairs it used, value [interval], the best of each column in bold
    assert "| good | method | training pairs | **40.0** [37.5, 42.5] | **30.0** | **25.0** |" in md
    assert "| bad | method | none (zero-shot) | 30.0 [27.7, 32.3] |" in md
    # the report of one dataset, in its folder (results/toy/), with its rows as data
    assert results_of(repo).name == "toy"
    record = json.loads((results_of(repo) / "reports/record.json").read_text())
    assert record["dataset"] == "toy" and [r["method"] for r in record["rows"]] == ["good", "bad"]
    # another dataset's results beside it are not read
    other = repo / "results" / "other-data"
    write_json(other / "metrics/good.json", metrics_json(99.0))
    write_json(other / "reports/record.json", dict(record, dataset="other-data"))
    assert run_stage(repo, "stages.report").returncode == 0
    md2 = (results_of(repo) / "reports/comparison.md").read_text()
    assert md2 == md and md2.count("## XMC comparison on") == 1 and "99.0" not in md2
    # a metrics file of another dataset's run among these rows: refused with one line, nothing rewritten
    bad_file = results_of(repo) / "metrics/bad.json"
    kept = bad_file.read_text()
    bad_file.write_text(json.dumps(dict(json.loads(kept), n_test=9)))
    p = run_stage(repo, "stages.report")
    assert p.returncode == 2 and "metrics/bad.json: evaluated on 9 test instances" in p.stderr
    assert (results_of(repo) / "reports/comparison.md").read_text() == md2
    bad_file.write_text(kept)
    assert "95 % percentile bootstrap intervals over the 1500 test instances (B = 300 resamples, seed 0)" in md
    assert "abl" not in md and "Seed variation" not in md   # the lab's rows are in the lab's reports
    paired = json.loads((results_of(repo) / "reports/paired.json").read_text())
    assert [(r["a"], r["b"], r["metric"]) for r in paired] == [("good", "bad", m) for m in METRICS4]
    p1 = paired[0]
    assert p1["a_value"] == 40.0 and p1["b_value"] == 30.0 and p1["diff"] == 10.0
    assert p1["p_value"] < 0.01 and p1["verdict"] == "a better" and p1["better"] == "good"
    assert p1["ci95"][0] > 8 and p1["ci95"][1] < 12
    assert "| good | bad | P@1 | 40.0 | 30.0 | +10.00 [" in md and "| good better |" in md
    html = (results_of(repo) / "reports/comparison.html").read_text()
    for s in ("[37.5, 42.5]", "Paired comparisons", "good better", "class='best'",
              "percentile bootstrap", "figures/precision_at_k.png", "href='plots.html'"):
        assert s in html, s
    assert "http" not in html.replace("<!doctype html>", "") and "<script" not in html and "<link" not in html
    assert (results_of(repo) / "reports/figures/precision_at_k.png").stat().st_size > 0
    # the offline figures page: static images only, every figure it names exists
    plots = (results_of(repo) / "reports/plots.html").read_text()
    assert "<script" not in plots and "http" not in plots.replace("<!doctype html>", "")
    import re
    shown = re.findall(r"<img src='([^']+)'", plots)
    assert "figures/recall_at_k.png" in shown and all((results_of(repo) / "reports" / f).stat().st_size > 0 for f in shown)


def test_lab_ablation_report_adds_paired_ablation_rows(report_repo):
    repo = report_repo
    p = run_stage(repo, "lab.stages.report")
    assert p.returncode == 0, p.stderr
    md = (lab_results_of(repo) / "reports/ablations.md").read_text()
    assert "| abl | method | 30.2 [27.9, 32.5] |" in md and "| good | method | **40.0** [37.5, 42.5] |" in md
    rows = json.loads((lab_results_of(repo) / "reports/paired_ablations.json").read_text())
    abl = [r for r in rows if r["a"] == "abl" and r["metric"] == "P@1"][0]
    assert abl["diff"] == 0.2 and abl["p_value"] >= 0.05 and abl["verdict"] == "tie" and abl["better"] is None
    assert "| abl | bad | P@1 | 30.2 | 30.0 | +0.20 [" in md and "| tie |" in md
    # a product run (evaluation/tst) against a lab run (lab/runs/abl/evaluation/tst)
    cross = [r for r in rows if (r["a"], r["b"]) == ("good", "abl")]
    assert [r["metric"] for r in cross] == METRICS4 and cross[0]["diff"] == pytest.approx(9.8)
    assert [(r["a"], r["b"]) for r in rows[:4]] == [("good", "bad")] * 4  # the product's pairs first
    assert "not compared: good vs missing: no test contributions for missing" in md
    # each ablation as its difference to its control, with intervals (an ablation not in the list is skipped)
    assert "### Ablations: difference to their control" in md and "not_run" not in md
    line = next(x for x in md.splitlines() if x.startswith("| abl | good | "))
    assert line.startswith("| abl | good | -9.80 [") and line.endswith("| good better |")
    assert "Ablations: difference to their control" in (lab_results_of(repo) / "reports/ablations.html").read_text()
    assert not (results_of(repo) / "reports/comparison.md").exists()   # the lab writes nothing of the product's


def test_lab_seed_report_reads_base_and_extra_seed_metrics(report_repo):
    repo = report_repo
    p = run_stage(repo, "lab.stages.report", "--seeds")
    assert p.returncode == 0, p.stderr
    md = (lab_results_of(repo) / "reports/seeds.md").read_text()
    # the base run's own row with its interval, then P@1 40, 42, 44 -> 42.0 +- 2.0; P@5 25, 26, 27 -> 26.0 +- 1.0;
    # good_seed3 has no metrics file; "absent" has no base metrics: no row
    assert "| good | method | **40.0** [37.5, 42.5] |" in md and "| bad |" not in md
    assert "| good | 3 | 42.0 ± 2.0 | 26.0 ± 1.0 | 31.0 ± 0.0 | 65.0 ± 0.0 |" in md
    assert "good: 3 of 4 runs found" in md and "| absent |" not in md
    html = (lab_results_of(repo) / "reports/seeds.html").read_text()
    assert "Seed variation" in html and "42.0 ± 2.0" in html


def test_seed_rows_single_seed_has_no_sd(tmp_path):
    write_json(tmp_path / "a.json", {"P@1": 10.0, "P@5": 5.0, "PSP@5": 1.0, "R@100": 2.0})
    rows = seed_rows(tmp_path, {"a": ["a_s1"]})
    assert rows[0]["n_found"] == 1 and rows[0]["n_runs"] == 2
    assert rows[0]["P@1"] == {"mean": 10.0, "sd": None}


# ------------------------------------------------------------------------------------------ seed studies


def test_a_seed_study_side_is_the_pipelines_run_with_only_its_seed_and_overrides_changed(monkeypatch):
    """lab.bench.seed_study trains each side through train_run: the run as params.yaml or lab/params.yaml defines
    it, its seeds set."""
    from lab.bench.seed_study import all_runs, seeded_run

    monkeypatch.chdir(ROOT)
    params, specs = all_runs()
    before = json.dumps({n: s.config for n, s in specs.items()}, sort_keys=True, default=str)
    cand = seeded_run(specs, params, "unidec_dropout01", {}, 4)   # a lab run
    assert json.dumps({n: s.config for n, s in specs.items()}, sort_keys=True, default=str) == before   # untouched
    got, want = cand.config, specs["unidec_dropout01"].config
    assert cand.name == "unidec_dropout01" and cand.method == "unidec"
    assert got["train"]["seed"] == got["encoder"]["seed"] == 4 and got["model"]["dropout"] == 0.1
    strip = lambda c: {**c, "train": {**c["train"], "seed": 0}, "encoder": {**c["encoder"], "seed": 0}}   # noqa: E731
    assert strip(got) == strip(want)
    over = seeded_run(specs, params, "dexml_bow", {"negatives": {"refresh_every_epochs": 2}}, 1)   # a product run
    assert over.config["negatives"]["refresh_every_epochs"] == 2 and over.config["train"]["seed"] == 1
    assert strip(over.config) == strip({**specs["dexml_bow"].config,
                                        "negatives": {**specs["dexml_bow"].config["negatives"],
                                                      "refresh_every_epochs": 2}})
    with pytest.raises(SystemExit, match="not a trained run"):
        seeded_run(specs, params, "tfidf_zeroshot", {}, 1)
    with pytest.raises(SystemExit, match="not a trained run"):
        seeded_run(specs, params, "unidec_spaces", {}, 1)   # predicts with a product model: nothing to train
    with pytest.raises(SystemExit, match="negatives.refresh_every_epochz"):
        seeded_run(specs, params, "dexml_bow", {"negatives": {"refresh_every_epochz": 2}}, 1)


def test_a_seed_study_cut_short_resumes_where_it_stopped(tmp_path, monkeypatch):
    """--out is written after every model; --resume trains only the (seed, side) rows it lacks."""
    import types

    import lab.bench.seed_study as study
    import xmc.data

    val = types.SimpleNamespace(Y=sp.csr_matrix(np.eye(4, dtype=np.float32)))
    monkeypatch.setattr(xmc.data, "load_processed", lambda *a, **k: types.SimpleNamespace(val=val))
    monkeypatch.chdir(ROOT)
    trained: list[tuple[str, int]] = []
    budget = {"models": 3}

    def fake_train_and_rank(params, spec, data_root, ds, hybrid=False):
        if len(trained) == budget["models"]:
            raise MemoryError("killed")
        run, seed = spec.name, spec.config["train"]["seed"]
        trained.append((run, seed))
        p5 = 40.0 + seed + (0.5 if run == "dexml_bow_refresh5" else 0.0)
        row = {"P@1": p5 + 20, "P@5": p5, "PSP@5": 17.0, "R@100": 60.0, "train_seconds": 1.0}
        if hybrid:   # the hybrid does not follow its base: the candidate's hybrid is 0.25 lower on every seed
            h = 60.0 + seed - (0.25 if run == "dexml_bow_refresh5" else 0.0)
            row["hybrid"] = {"P@1": h + 20, "P@5": h, "PSP@5": 18.0, "R@100": 80.0}
        return row

    monkeypatch.setattr(study, "train_and_rank", fake_train_and_rank)
    out = tmp_path / "study.json"
    argv = ["seed_study", "--run", "dexml_bow", "--seeds", "3", "--candidate-runs", "dexml_bow_refresh5",
            "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(MemoryError):
        study.main()
    cut = json.loads(out.read_text())
    assert [r["seed"] for r in cut["per_seed"]["default"]] == [0, 1]
    assert [r["seed"] for r in cut["per_seed"]["dexml_bow_refresh5"]] == [0]
    cut["note"] = "added by hand"
    out.write_text(json.dumps(cut))
    budget["models"] = 100
    monkeypatch.setattr(sys, "argv", argv + ["--resume"])
    study.main()
    assert trained[3:] == [("dexml_bow_refresh5", 1), ("dexml_bow", 2), ("dexml_bow_refresh5", 2)]
    done = json.loads(out.read_text())
    assert done["note"] == "added by hand"
    assert [r["seed"] for r in done["per_seed"]["dexml_bow_refresh5"]] == [0, 1, 2]
    assert done["candidate_minus_default"]["dexml_bow_refresh5"]["P@5"]["diff"] == pytest.approx(0.5)
    monkeypatch.setattr(sys, "argv", ["seed_study", "--run", "dexml_bow", "--seeds", "3", "--candidate-runs",
                                      "dexml_bow_refresh2", "--out", str(out), "--resume"])
    with pytest.raises(SystemExit, match="another study"):
        study.main()
    assert "hybrid_candidate_minus_default" not in done
    monkeypatch.setattr(sys, "argv", argv + ["--resume", "--hybrid"])   # the rows hold no hybrid metrics
    with pytest.raises(SystemExit, match="another study"):
        study.main()
    hybrid_out = tmp_path / "hybrid_study.json"
    monkeypatch.setattr(sys, "argv", [*argv[:-1], str(hybrid_out), "--hybrid"])
    study.main()
    fused = json.loads(hybrid_out.read_text())
    assert fused["hybrid"] is True
    assert fused["candidate_minus_default"]["dexml_bow_refresh5"]["P@5"]["diff"] == pytest.approx(0.5)
    assert fused["hybrid_candidate_minus_default"]["dexml_bow_refresh5"]["P@5"]["diff"] == pytest.approx(-0.25)


def test_live_page_renders_a_training_record_while_it_grows(tmp_path):
    """The offline live view: a record DVCLive is still writing renders to a self-reloading page."""
    from xmc.report.live import render_live_page
    from xmc.trainer.live import TrainingLog

    run = tmp_path / "plots" / "train" / "r"
    live = TrainingLog(run, sync_every_s=0)
    live.start()
    for step in range(1, 21):
        live.log(step, {"train/loss": 3.0 / step, "train/lr": 0.01})
    live.log_validation(20, {"P@1": 50.0, "P@5": 30.0, "PSP@5": 10.0, "R@100": 60.0, "nDCG@5": 1.0}, epoch=1)
    page = render_live_page([run], tmp_path / "out" / "live.html").read_text()
    assert "http-equiv='refresh'" in page and "<script" not in page and "live_r.png" in page
    assert (tmp_path / "out" / "live_r.png").stat().st_size > 0
    summary = json.loads((run / "metrics.json").read_text())
    assert summary["step"] == 20 and summary["val"]["P@5"] == 30.0 and "nDCG@5" not in summary["val"]
    live.log(21, {"train/loss": 0.1})     # the run goes on: the page follows
    live.close()
    assert json.loads((run / "metrics.json").read_text())["train"]["loss"] == 0.1


def test_paired_verdicts_read_holm_adjusted_p_over_the_report(tmp_path):
    """Three pairs x two metrics are one family: each verdict reads the Holm-adjusted p, which is never below the
    raw one, and a raw p under alpha whose adjusted p is not is reported as a tie."""
    import numpy as np

    from xmc.metrics.bootstrap import InstanceContributions
    from xmc.report.table import paired_comparisons

    rng = np.random.default_rng(0)
    n = 600
    g = np.repeat(np.arange(60), 10)
    base = rng.uniform(0, 1, n)
    for name, shift in (("a", 0.0), ("b", 0.012), ("c", 0.2), ("d", 0.0)):
        v = np.clip(base + shift + rng.normal(0, 0.05, n), 0, 1)
        InstanceContributions(["P@1", "P@5"], np.vstack([v, v]), np.ones((2, n)), g).save(tmp_path / f"{name}.npz")
    rows, skipped = paired_comparisons([["b", "a"], ["c", "a"], ["d", "a"]], [tmp_path], metrics=["P@1", "P@5"],
                                       n_resamples=400)
    assert not skipped and len(rows) == 6
    # resolution: the smallest bootstrap p (1 / (B + 1)) times the family size stays well under alpha
    assert all(r["n_resamples"] >= 10 * 6 / 0.05 for r in rows)
    for r in rows:
        assert r["p_holm"] >= r["p_value"] and r["unit"] == "documents" and r["n_units"] == 60
        assert (r["verdict"] == "tie") == (r["p_holm"] >= 0.05)
    assert {r["better"] for r in rows if r["b"] == "a" and r["a"] == "c"} == {"c"}


def test_report_shows_the_hybrids_on_texts_with_and_without_a_correct_name_match():
    from xmc.report.table import render_markdown

    side = {"texts": 40, "base P@1": 50.0, "hybrid P@1": 49.0, "base P@5": 30.0, "hybrid P@5": 30.0,
            "P@1 diff": -1.0, "P@1 diff ci95": [-3.0, 1.0], "p_value": 0.4}
    rows = [{"method": "astra", "P@1": 50.0},
            {"method": "astra_hybrid", "P@1": 60.0,
             "by_name_match": {"with_correct_name_match": {**side, "hybrid P@1": 80.0}, "without": side},
             "by_name_match_val": {"with_correct_name_match": {"texts": 0}, "without": side}}]
    md = render_markdown(rows, "t")
    assert "### Hybrids on texts with and without a correct name match" in md
    assert "| astra_hybrid | tst | 40 / 40 | 50.0 → 80.0 | 50.0 → 49.0 | -1.00 [-3.00, 1.00] |" in md
    assert "| astra_hybrid | val | 0 / 40 | – | 50.0 → 49.0 |" in md
    assert "name match" not in render_markdown(rows[:1], "t")
