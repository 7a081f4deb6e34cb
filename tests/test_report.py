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

from xmc.errors import ConfigError
from xmc.io import save_csr, write_json
from xmc.metrics import evaluate_topk
from xmc.metrics.bootstrap import InstanceContributions
from xmc.predictions import TopK
from xmc.report import seed_rows, select

ROOT = Path(__file__).resolve().parents[1]
METRICS4 = ["P@1", "P@5", "PSP@5", "R@100"]
EVAL = {"top_k": 12, "ks": [1, 3, 5], "recall_ks": [4, 10], "propensity_a": 0.55, "propensity_b": 1.5,
        "bootstrap": {"n_resamples": 300, "seed": 0, "level": 0.95}}


def run_stage(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120)


def write_params(repo: Path, **extra: Any) -> None:
    params = {"data": {"dataset_dir": "../datasets/toy", "processed_dir": "data/processed"}, "evaluate": EVAL, **extra}
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


@pytest.fixture
def eval_repo(tmp_path):
    """params + data/processed (only the *_Y.npz files) + predictions of method m on val (tst added by tests)."""
    rng = np.random.default_rng(0)
    repo = tmp_path / "repo"
    write_params(repo)
    trn_Y = (rng.random((100, 30)) < 0.1).astype(np.float32)
    trn_Y[:, :5] = 0  # labels 0..4 unseen in training
    trn_Y = sp.csr_matrix(trn_Y)
    save_csr(repo / "data/processed/trn_Y.npz", trn_Y)
    val_Y, val_pred = toy_split(rng, 60)
    save_csr(repo / "data/processed/val_Y.npz", val_Y)
    val_pred.save(repo / "predictions/m/val_topk.npz")
    write_json(repo / "predictions/m/timing.json", {"train_seconds": 12.5, "predict_seconds": 1.25})
    freq = np.asarray(trn_Y.sum(0)).ravel()
    return {"repo": repo, "rng": rng, "freq": freq, "val": (val_Y, val_pred)}


def add_test_split(ctx: dict[str, Any]) -> tuple[sp.csr_matrix, TopK, sp.csr_matrix]:
    repo = ctx["repo"]
    tst_Y, tst_pred = toy_split(ctx["rng"], 80)
    # the filter removes the first prediction of rows 3..30, often a hit
    filt = sp.csr_matrix((np.ones(28, np.float32), (np.arange(3, 31), tst_pred.indices[3:31, 0])), shape=tst_Y.shape)
    save_csr(repo / "data/processed/tst_Y.npz", tst_Y)
    save_csr(repo / "data/processed/tst_filter.npz", filt)
    tst_pred.save(repo / "predictions/m/tst_topk.npz")
    return tst_Y, tst_pred, filt


def _expected(Y, pred, freq, filt=None) -> dict[str, Any]:
    return evaluate_topk(pred, Y, freq, 100, ks=(1, 3, 5), recall_ks=(4, 10), filt=filt)


# ------------------------------------------------------------------------------------------ evaluate


def test_evaluate_val_split_reads_no_test_file(eval_repo):
    repo = eval_repo["repo"]
    p = run_stage(repo, "stages.evaluate", "m", "--split", "val")  # no tst_* file exists at all
    assert p.returncode == 0, p.stderr
    m = json.loads((repo / "metrics_val/m.json").read_text())
    val_Y, val_pred = eval_repo["val"]
    exp = _expected(val_Y, val_pred, eval_repo["freq"])["metrics"]
    for k, v in exp.items():
        assert m[k] == (round(v, 4) if isinstance(v, float) else v), k
    assert "train_seconds" not in m
    assert set(m["ci95"]) == {"P@1", "nDCG@1", "PSP@1", "P@3", "nDCG@3", "PSP@3", "P@5", "nDCG@5", "PSP@5",
                              "R@4", "R@10", "unseen_R@10"}
    for k, (lo, hi) in m["ci95"].items():
        assert lo <= m[k] <= hi and hi > lo, k
    c = InstanceContributions.load(repo / "evaluation/val/m.npz")
    assert c.n == 60 and c.values()["P@1"] == pytest.approx(exp["P@1"], abs=1e-9)
    assert not (repo / "metrics").exists() and not (repo / "plots").exists()
    assert sorted(p.relative_to(repo).as_posix() for p in (repo / "evaluation").rglob("*")) == ["evaluation/val",
                                                                                           "evaluation/val/m.npz"]
    # same inputs, same bytes (seeded bootstrap, deterministic npz)
    files = [repo / "metrics_val/m.json", repo / "evaluation/val/m.npz"]
    before = [f.read_bytes() for f in files]
    assert run_stage(repo, "stages.evaluate", "m", "--split", "val").returncode == 0
    assert before == [f.read_bytes() for f in files]


def test_evaluate_test_split_applies_filter_and_writes_plots(eval_repo):
    repo = eval_repo["repo"]
    tst_Y, tst_pred, filt = add_test_split(eval_repo)
    p = run_stage(repo, "stages.evaluate", "m")  # --split tst is the default
    assert p.returncode == 0, p.stderr
    m = json.loads((repo / "metrics/m.json").read_text())
    exp = _expected(tst_Y, tst_pred, eval_repo["freq"], filt)
    unfiltered = _expected(tst_Y, tst_pred, eval_repo["freq"])["metrics"]
    assert unfiltered["P@1"] != exp["metrics"]["P@1"]  # the filter matters on this data
    assert m["P@1"] == round(exp["metrics"]["P@1"], 4) and m["n_test"] == 80
    assert m["train_seconds"] == 12.5 and m["predict_seconds"] == 1.25
    assert m["ci95"]["P@1"][0] <= m["P@1"] <= m["ci95"]["P@1"][1]
    c = InstanceContributions.load(repo / "evaluation/tst/m.npz")
    assert c.values()["P@1"] == pytest.approx(exp["metrics"]["P@1"], abs=1e-9)
    at_k = json.loads((repo / "plots/eval/m/at_k.json").read_text())
    # P@k and R@k at every k up to the prediction depth, agreeing with the metrics at their ks
    assert [r["k"] for r in at_k] == list(range(1, len(at_k) + 1)) and len(at_k) >= 10
    for k in (1, 3, 5):
        assert at_k[k - 1]["precision"] == pytest.approx(m[f"P@{k}"], abs=1e-3), k
    for k in (4, 10):
        assert at_k[k - 1]["recall"] == pytest.approx(m[f"R@{k}"], abs=1e-3), k
    assert all(a["recall"] <= b["recall"] for a, b in zip(at_k, at_k[1:]))
    rbf = json.loads((repo / "plots/eval/m/recall_by_frequency.json").read_text())
    assert [r["test_pairs"] for r in rbf] == [b["test_pairs"] for b in exp["recall_by_frequency"]]
    assert not (repo / "metrics_val").exists() and not (repo / "evaluation/val").exists()


def test_evaluate_ablation_destinations(eval_repo):
    repo = eval_repo["repo"]
    add_test_split(eval_repo)
    assert run_stage(repo, "stages.evaluate", "m", "--ablation").returncode == 0
    assert "ci95" in json.loads((repo / "ablations/metrics/m.json").read_text())
    assert (repo / "ablations/plots/m/at_k.json").exists() and (repo / "evaluation/ablations/m.npz").exists()
    assert not (repo / "metrics").exists() and not (repo / "evaluation/tst").exists()


def test_evaluate_seed_run_destinations(eval_repo):
    repo = eval_repo["repo"]
    add_test_split(eval_repo)
    assert run_stage(repo, "stages.evaluate", "m", "--seed-run").returncode == 0
    assert "ci95" in json.loads((repo / "seeds/metrics/m.json").read_text())
    assert (repo / "evaluation/seeds/m.npz").exists()
    assert not (repo / "metrics").exists() and not (repo / "evaluation/tst").exists() and not (repo / "plots").exists()
    p = run_stage(repo, "stages.evaluate", "m", "--seed-run", "--split", "val")
    assert p.returncode == 2 and "--seed-run evaluates the test split only" in p.stderr


def test_evaluate_missing_predictions_is_one_line_error(eval_repo):
    p = run_stage(eval_repo["repo"], "stages.evaluate", "nope", "--split", "val")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == "error: predictions/nope/val_topk.npz: no predictions for method 'nope'"
    bad = run_stage(eval_repo["repo"], "stages.evaluate", "m", "--split", "dev")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr.strip().splitlines()[-1]


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
    repo = tmp_path / "repo"
    write_params(repo, methods=["good", "bad"], ablations=["abl"],
                 report={"seeds": {"good": ["good_seed1", "good_seed2", "good_seed3"], "absent": ["x"]},
                         "paired": [["good", "bad"], ["good", "missing"]], "paired_ablations": [["abl", "bad"], ["good", "abl"]],
                         "ablation_controls": {"abl": "good", "not_run": "good"}, "alpha": 0.05})
    n = 1500
    bad = np.zeros(n)
    bad[:450] = 1  # 30 %
    good = bad.copy()
    good[450:600] = 1  # 40 %: +150 hits
    abl = bad.copy()
    abl[450:463] = 1
    abl[:10] = 0  # 13 rows won, 10 lost: +0.2, a tie
    for name, h in (("good", good), ("bad", bad)):
        contrib(h).save(repo / f"evaluation/tst/{name}.npz")
    contrib(abl).save(repo / "evaluation/ablations/abl.npz")
    write_json(repo / "metrics/good.json", metrics_json(40.0, ci95={"P@1": [37.54, 42.46], "R@100": [63.0, 67.0]},
                                                       train_seconds=10.0, predict_seconds=1.0))
    write_json(repo / "metrics/bad.json", metrics_json(30.0, ci95={"P@1": [27.7, 32.3]}))
    write_json(repo / "seeds/metrics/good_seed1.json", metrics_json(42.0, **{"P@5": 26.0}))
    write_json(repo / "seeds/metrics/good_seed2.json", metrics_json(44.0, **{"P@5": 27.0}))
    write_json(repo / "seeds/metrics/x.json", metrics_json(1.0))  # extra run of a base that is absent
    write_json(repo / "ablations/metrics/abl.json", metrics_json(30.2, ci95={"P@1": [27.9, 32.5]}))
    return repo


def test_report_intervals_and_paired(report_repo):
    repo = report_repo
    p = run_stage(repo, "stages.report")
    assert p.returncode == 0, p.stderr
    md = (repo / "reports/comparison.md").read_text()
    # kind of row, value [interval], the best of each column in bold
    assert "| good | method | **40.0** [37.5, 42.5] | **30.0** | **25.0** |" in md
    assert "| bad | method | 30.0 [27.7, 32.3] |" in md
    assert "95 % percentile bootstrap intervals over the 1500 test instances (B = 300 resamples, seed 0)" in md
    assert "Seed variation" not in md  # the extra seeds are outside make run: reports/seeds.md (make seeds)
    paired = json.loads((repo / "reports/paired.json").read_text())
    assert [(r["a"], r["b"], r["metric"]) for r in paired] == [("good", "bad", m) for m in METRICS4]
    p1 = paired[0]
    assert p1["a_value"] == 40.0 and p1["b_value"] == 30.0 and p1["diff"] == 10.0
    assert p1["p_value"] < 0.01 and p1["verdict"] == "a better" and p1["better"] == "good"
    assert p1["ci95"][0] > 8 and p1["ci95"][1] < 12
    assert "| good | bad | P@1 | 40.0 | 30.0 | +10.00 [" in md and "| good better |" in md
    assert "not compared: good vs missing: no test contributions for missing (evaluation/tst/<run>.npz)" in md
    html = (repo / "reports/comparison.html").read_text()
    for s in ("[37.5, 42.5]", "Paired comparisons", "good better", "class='best'",
              "percentile bootstrap", "figures/precision_at_k.png", "href='plots.html'"):
        assert s in html, s
    assert "http" not in html.replace("<!doctype html>", "") and "<script" not in html and "<link" not in html
    assert (repo / "reports/figures/precision_at_k.png").stat().st_size > 0
    # the offline figures page: static images only, every figure it names exists
    plots = (repo / "reports/plots.html").read_text()
    assert "<script" not in plots and "http" not in plots.replace("<!doctype html>", "")
    import re
    shown = re.findall(r"<img src='([^']+)'", plots)
    assert "figures/recall_at_k.png" in shown and all((repo / "reports" / f).stat().st_size > 0 for f in shown)


def test_report_ablations_adds_paired_ablation_rows(report_repo):
    repo = report_repo
    assert run_stage(repo, "stages.report", "--ablations").returncode == 0
    md = (repo / "reports/ablations.md").read_text()
    assert "| abl | method | 30.2 [27.9, 32.5] |" in md and "| good | method | **40.0** [37.5, 42.5] |" in md
    rows = json.loads((repo / "reports/paired_ablations.json").read_text())
    abl = [r for r in rows if r["a"] == "abl" and r["metric"] == "P@1"][0]
    assert abl["diff"] == 0.2 and abl["p_value"] >= 0.05 and abl["verdict"] == "tie" and abl["better"] is None
    assert "| abl | bad | P@1 | 30.2 | 30.0 | +0.20 [" in md and "| tie |" in md
    # a main run (evaluation/tst) against an ablation (evaluation/ablations)
    cross = [r for r in rows if (r["a"], r["b"]) == ("good", "abl")]
    assert [r["metric"] for r in cross] == METRICS4 and cross[0]["diff"] == pytest.approx(9.8)
    assert [(r["a"], r["b"]) for r in rows[:4]] == [("good", "bad")] * 4  # report.paired first
    assert "Seed variation" not in md
    # each ablation as its difference to its control, with intervals (an ablation not in the list is skipped)
    assert "### Ablations: difference to their control" in md and "not_run" not in md
    line = next(x for x in md.splitlines() if x.startswith("| abl | good | "))
    assert line.startswith("| abl | good | -9.80 [") and line.endswith("| good better |")
    assert "Ablations: difference to their control" in (repo / "reports/ablations.html").read_text()


def test_seed_report_reads_base_and_extra_seed_metrics(report_repo):
    repo = report_repo
    p = run_stage(repo, "stages.report", "--seeds")
    assert p.returncode == 0, p.stderr
    md = (repo / "reports/seeds.md").read_text()
    # the base run's own row with its interval, then P@1 40, 42, 44 -> 42.0 +- 2.0; P@5 25, 26, 27 -> 26.0 +- 1.0;
    # good_seed3 has no metrics file; "absent" has no base metrics: no row
    assert "| good | method | **40.0** [37.5, 42.5] |" in md and "| bad |" not in md
    assert "| good | 3 | 42.0 ± 2.0 | 26.0 ± 1.0 | 31.0 ± 0.0 | 65.0 ± 0.0 |" in md
    assert "good: 3 of 4 runs found" in md and "| absent |" not in md
    html = (repo / "reports/seeds.html").read_text()
    assert "Seed variation" in html and "42.0 ± 2.0" in html
    assert not (repo / "reports/comparison.md").exists()  # the seed report writes nothing else


def test_seed_rows_single_seed_has_no_sd(tmp_path):
    write_json(tmp_path / "a.json", {"P@1": 10.0, "P@5": 5.0, "PSP@5": 1.0, "R@100": 2.0})
    rows = seed_rows(tmp_path, {"a": ["a_s1"]})
    assert rows[0]["n_found"] == 1 and rows[0]["n_runs"] == 2
    assert rows[0]["P@1"] == {"mean": 10.0, "sd": None}


# ------------------------------------------------------------------------------------------ selection


def _val(n: int = 1200, extra: int = 0, lost: int = 0, seed: int = 0) -> tuple[dict[str, Any], InstanceContributions]:
    """Validation metrics and contributions of a run: a shared 30 % base, ``extra`` hits added, ``lost`` removed."""
    hits = (np.random.default_rng(seed).random(n) < 0.3).astype(np.float64)
    gain, loss = np.flatnonzero(hits == 0)[:extra], np.flatnonzero(hits == 1)[:lost]
    hits[gain], hits[loss] = 1, 0
    c = contrib(hits)
    return {**{k: round(v, 4) for k, v in c.values().items()}, "n_test": n}, c


def _choice(**kw: Any) -> dict[str, Any]:
    return {"method": "dexml", "knob": "dual_encoder.negatives.positive_sampling", "reference": "uniform",
            "default": "inverse_propensity", "candidates": {"uniform": "r_uni", "inverse_propensity": "r_ip"}, **kw}


def _runs(**changes: tuple[int, int]) -> tuple[dict[str, Any], dict[str, InstanceContributions]]:
    """run -> (hits added, hits lost) against the shared base."""
    ms, cs = {}, {}
    for run, (extra, lost) in changes.items():
        ms[run], cs[run] = _val(extra=extra, lost=lost)
    return ms, cs


def test_select_keeps_the_reference_on_a_tie():
    ms, cs = _runs(r_uni=(0, 0), r_ip=(25, 20))  # 25 rows won, 20 lost of 1200: +0.42 P@5
    r = select(_choice(), ms, cs, "P@5", 0.05, n_resamples=300)
    assert r["complete"] and r["best"] == "inverse_propensity" and r["chosen"] == "uniform"
    assert r["p_value"] >= 0.05 and r["diff"] > 0 and r["default_is_chosen"] is False
    assert r["reason"].startswith("uniform: inverse_propensity is +0.42 P@5")
    assert r["reason"].endswith(": tie, keep the reference")
    marks = {c["value"]: (c["reference"], c["default"]) for c in r["candidates"]}
    assert marks == {"uniform": (True, False), "inverse_propensity": (False, True)}


def test_select_takes_a_significantly_better_candidate():
    ms, cs = _runs(r_uni=(0, 0), r_ip=(130, 10))  # +10 points
    r = select(_choice(), ms, cs, "P@5", 0.05, n_resamples=300)
    assert r["chosen"] == "inverse_propensity" and r["chosen_run"] == "r_ip" and r["p_value"] < 0.01
    assert r["default_is_chosen"] is True and "choose inverse_propensity" in r["reason"]
    r2 = select(_choice(default="uniform"), ms, cs, "P@5", 0.05, n_resamples=300)
    assert r2["chosen"] == "inverse_propensity" and r2["default_is_chosen"] is False


def test_select_reference_best_and_incomplete_cases():
    ms, cs = _runs(r_uni=(50, 0), r_ip=(0, 0))
    r = select(_choice(default="uniform"), ms, cs, "P@5", 0.05, n_resamples=100)
    assert r["best"] == r["chosen"] == "uniform" and r["default_is_chosen"] is True and r["p_value"] is None
    three = _choice(candidates={"uniform": "r_uni", "inverse_propensity": "r_ip", "mixed": "r_mix"})
    r = select(three, ms, cs, "P@5", 0.05)
    assert r["complete"] is False and r["chosen"] is None and r["default_is_chosen"] is False
    assert [c["status"] for c in r["candidates"]] == ["ok", "ok", "not run"] and "mixed (r_mix)" in r["reason"]
    ms2, cs2 = _runs(r_uni=(0, 0), r_ip=(130, 10))
    del cs2["r_ip"]  # metrics but no contributions: cannot test, so no decision
    assert select(_choice(), ms2, cs2, "P@5", 0.05)["chosen"] is None
    with pytest.raises(ConfigError, match="default 'other' is not a candidate"):
        select(_choice(default="other"), ms, cs, "P@5", 0.05)


def _study(split: str = "val", shift: float = 0.2, noise: float = 0.3, seeds: int = 9) -> dict[str, Any]:
    """A seed study: the reference's per-seed P@5 drawn with seed noise, the candidate the same plus ``shift``
    and a small per-seed jitter (a consistent gain smaller than the seed noise)."""
    rng = np.random.default_rng(3)
    base = 41.5 + noise * rng.standard_normal(seeds)
    cand = base + shift + 0.05 * rng.standard_normal(seeds)
    rows = lambda v: [{"seed": i, "P@5": round(float(x), 2)} for i, x in enumerate(v)]   # noqa: E731
    return {"split": split, "val_fingerprint": "f0", "per_seed": {"default": rows(base), "every_epoch": rows(cand)}}


def test_select_over_seeds_sees_a_gain_inside_the_seed_noise():
    """A +0.2 gain under 0.3 of seed noise: one seed per side cannot tell, nine paired seeds can."""
    from xmc.metrics.bootstrap import paired_over_seeds

    study = _study()
    choice = {"method": "dexml_bow", "knob": "bow_encoder.negatives.refresh_every_epochs", "reference": "5",
              "default": "1", "candidates": {"5": "r5", "1": "r1"},
              "seed_study": {"file": "bench/seed_studies/x.json", "sides": {"5": "default", "1": "every_epoch"}}}
    ms, cs = _runs(r5=(0, 0), r1=(0, 0))   # the single-seed runs tie exactly: the study decides
    r = select(choice, ms, cs, "P@5", 0.05, n_resamples=100, seed_study=study)
    assert r["complete"] and r["chosen"] == "1" and r["default_is_chosen"] and r["n_seeds"] == 9
    assert 0.1 < r["diff"] < 0.3 and r["p_value"] < 0.001 and r["ci95"][0] > 0
    assert "mean of 9 training seeds" in r["reason"] and "choose 1" in r["reason"]
    assert {c["value"]: c["seed_mean"] for c in r["candidates"]} == {
        "5": round(np.mean([x["P@5"] for x in study["per_seed"]["default"]]), 2),
        "1": round(np.mean([x["P@5"] for x in study["per_seed"]["every_epoch"]]), 2)}
    # no consistent gain: a tie keeps the reference
    flat = _study(shift=0.0)
    flat["per_seed"]["every_epoch"] = [{"seed": x["seed"], "P@5": x["P@5"] + (0.1 if x["seed"] % 2 else -0.05)}
                                       for x in flat["per_seed"]["default"]]
    r = select(choice, ms, cs, "P@5", 0.05, seed_study=flat)
    assert r["chosen"] == "5" and r["p_value"] >= 0.05 and r["default_is_chosen"] is False
    # not written yet, or measured on another validation split: incomplete; a study of the test split: refused
    assert select(choice, ms, cs, "P@5", 0.05, seed_study=None)["complete"] is False
    assert select(choice, ms, cs, "P@5", 0.05, seed_study=study, val_fingerprint="f0")["chosen"] == "1"
    other = select(choice, ms, cs, "P@5", 0.05, seed_study=study, val_fingerprint="f1")
    assert other["complete"] is False and "another validation split" in other["reason"]
    with pytest.raises(ConfigError, match="choices are made on 'val' only"):
        select(choice, ms, cs, "P@5", 0.05, seed_study=_study(split="tst"))
    with pytest.raises(ValueError, match="at least 2 seeds"):
        paired_over_seeds([1.0], [2.0])
    assert paired_over_seeds([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])["p_value"] == 0.0   # the same gain on every seed


def test_a_hybrids_base_is_chosen_on_the_hybrids_figures_and_a_value_without_a_run_is_shown_by_its_study():
    """The choice of a hybrid's base (params hybrid.runs) reads each seed's hybrid figures, not its base model's,
    which here rank the other way; the reference value, which no pipeline run has, is shown by its seed mean."""
    from xmc.config.schema import SelectionChoice, filled
    from xmc.report.selection import render_selection_markdown, select_all

    study = _study()
    for side, shift in (("default", 1.0), ("every_epoch", -1.0)):   # the base models: the reference ahead
        for row in study["per_seed"][side]:
            row["hybrid"] = {"P@5": row["P@5"] + 20.0}
            row["P@5"] += shift
    choice = {"method": "dexml_bow", "knob": "hybrid.runs.dexml_bow", "reference": "5", "default": "10",
              "candidates": {"5": None, "10": "dexml_bow_hybrid"},
              "seed_study": {"file": "s.json", "sides": {"5": "default", "10": "every_epoch"}, "part": "hybrid"}}
    ms, cs = _runs(dexml_bow_hybrid=(0, 0))
    r = select(filled(SelectionChoice, choice, "c"), ms, cs, "P@5", 0.05, seed_study=study)
    assert r["complete"] and r["chosen"] == "10" and r["default_is_chosen"] and r["diff"] > 0.1
    rows = {c["value"]: c for c in r["candidates"]}
    assert rows["5"]["run"] is None and rows["5"]["status"] == "seed study only" and rows["10"]["status"] == "ok"
    assert rows["5"]["seed_mean"] == round(np.mean([x["hybrid"]["P@5"] for x in study["per_seed"]["default"]]), 2)
    md = render_selection_markdown(select_all({"choices": {"c": choice}}, ms, cs, seed_studies={"s.json": study}))
    assert "| 5 | – |" in md and "mean P@5 of the hybrids over 9 seeds" in md
    # on the base models' own figures the same study keeps the reference
    assert select({**choice, "seed_study": {**choice["seed_study"], "part": "run"}}, ms, cs, "P@5", 0.05,
                  seed_study=study)["chosen"] == "5"
    del study["per_seed"]["default"][0]["hybrid"]
    with pytest.raises(ConfigError, match="no hybrid figures"):
        select(choice, ms, cs, "P@5", 0.05, seed_study=study)
    # a value without a run needs a seed study that trained it, and the default needs a run
    with pytest.raises(ConfigError, match="only a seed study's side"):
        filled(SelectionChoice, {**choice, "seed_study": None}, "c")
    with pytest.raises(ConfigError, match="needs a run"):
        filled(SelectionChoice, {**choice, "default": "5"}, "c")


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


def test_split_fingerprint_names_the_instances_and_labels():
    from xmc.metrics.bootstrap import split_fingerprint

    Y = sp.csr_matrix(np.array([[1, 0, 1], [0, 1, 0]], dtype=np.float32))
    assert split_fingerprint(Y) == split_fingerprint(Y.tocoo()) == split_fingerprint(Y * 2)   # the pattern only
    assert split_fingerprint(Y) != split_fingerprint(Y[[1, 0]])
    assert split_fingerprint(Y) != split_fingerprint(sp.csr_matrix(np.array([[1, 0, 1], [0, 1, 0], [0, 0, 0]])))


def test_selection_stage_uses_validation_only(tmp_path):
    repo = tmp_path / "repo"
    choices = {
        "positive_sampling": _choice(note="DEXML code samples uniformly"),
        "stage2_select": {"method": "maclr", "knob": "maclr.defaults.stage2.select", "reference": "union",
                          "default": "agree", "candidates": {"union": "maclr_union", "agree": "maclr"}},
        "loss": {"method": "dexml", "knob": "dual_encoder.loss.name", "reference": "decoupled_softmax",
                 "default": "decoupled_softmax", "candidates": {"decoupled_softmax": "r_uni", "softmax": "r_soft"}},
    }
    write_params(repo, selection={"metric": "P@5", "alpha": 0.05, "choices": choices})
    for run, (extra, lost) in {"r_uni": (0, 0), "r_ip": (130, 10), "maclr_union": (0, 0), "maclr": (12, 10)}.items():
        m, c = _val(extra=extra, lost=lost)
        write_json(repo / f"metrics_val/{run}.json", m)
        c.save(repo / f"evaluation/val/{run}.npz")
        # test-split files that would reverse every decision if they were read
        write_json(repo / f"metrics/{run}.json", {**m, "P@5": 100.0 - m["P@5"]})
        _val(extra=600 - extra)[1].save(repo / f"evaluation/tst/{run}.npz")
    val_Y = sp.csr_matrix((np.random.default_rng(1).random((1200, 40)) < 0.05).astype(np.float32))
    save_csr(repo / "data/processed/val_Y.npz", val_Y)
    p = run_stage(repo, "stages.selection")
    assert p.returncode == 0, p.stderr
    rep = json.loads((repo / "reports/selection.json").read_text())
    assert rep["settings"] == {"split": "val", "metric": "P@5", "alpha": 0.05, "n_resamples": 300, "seed": 0,
                               "level": 0.95, "rule": rep["settings"]["rule"]}
    by = {c["name"]: c for c in rep["choices"]}
    assert by["positive_sampling"]["chosen"] == "inverse_propensity" and by["positive_sampling"]["default_is_chosen"]
    assert by["stage2_select"]["chosen"] == "union" and by["stage2_select"]["default_is_chosen"] is False
    assert by["loss"]["complete"] is False and by["loss"]["chosen"] is None
    assert by["stage2_select"]["val_labels_used"] == {"instances": 1200, "pairs": int(val_Y.nnz)}
    md = (repo / "reports/selection.md").read_text()
    assert "Choices are made on the validation split (group-disjoint from training)" in md
    assert "Primary metric: P@5; alpha = 0.05" in md
    assert "Final models train on the training split minus validation with the selected settings" in md
    assert (f"MACLR is zero-shot: its selection used the labels of the 1200 validation instances "
            f"({val_Y.nnz} labelled pairs)") in md
    assert "stage2_select: the default (agree) disagrees with the selection (union)" in md
    assert "positive_sampling: the default (inverse_propensity) agrees with the selection" in md
    assert "| loss | dual_encoder.loss.name | softmax | r_soft | – | – | – | – | not run |" in md
    assert "Note: DEXML code samples uniformly" in md
    html = (repo / "reports/selection.html").read_text()
    assert "MACLR is zero-shot" in html and "class='chosen'" in html and "not run" in html


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
