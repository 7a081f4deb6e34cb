"""The lab's selection of settings on the validation split (lab/selection.py, its schema in lab/config.py and its
stage lab/stages/selection.py): the reference stays unless a candidate beats it significantly, seed studies decide
the choices that have one, and the stage reads validation results only (real computations, a subprocess)."""

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

from lab.config import SelectionChoice, SelectionConfig
from lab.selection import render_selection_markdown, select, select_all
from tests.pipeline_repo import ROOT, results_of, lab_results_of
from xmc.config.schema import filled
from xmc.errors import ConfigError
from xmc.io import save_csr, write_json
from xmc.metrics.bootstrap import InstanceContributions

METRICS4 = ["P@1", "P@5", "PSP@5", "R@100"]


def contrib(hits: np.ndarray) -> InstanceContributions:
    """The same per-row hits for P@1, P@5, PSP@5 and R@100 (den 1): enough for paired tests."""
    return InstanceContributions(METRICS4, np.tile(hits.astype(np.float64), (4, 1)), np.ones((4, len(hits))))


def _val(n: int = 1200, extra: int = 0, lost: int = 0, seed: int = 0) -> tuple[dict[str, Any], InstanceContributions]:
    """Validation metrics and contributions of a run: a shared 30 % base, ``extra`` hits added, ``lost`` removed."""
    hits = (np.random.default_rng(seed).random(n) < 0.3).astype(np.float64)
    gain, loss = np.flatnonzero(hits == 0)[:extra], np.flatnonzero(hits == 1)[:lost]
    hits[gain], hits[loss] = 1, 0
    c = contrib(hits)
    return {**{k: round(v, 4) for k, v in c.values().items()}, "n_test": n}, c


def _choice(**kw: Any) -> dict[str, Any]:
    return {"method": "dexml", "knob": "dexml: negatives.positive_sampling", "reference": "uniform",
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
    choice = {"method": "dexml_bow", "knob": "dexml: negatives.refresh_every_epochs", "reference": "5",
              "default": "1", "candidates": {"5": "r5", "1": "r1"},
              "seed_study": {"file": "lab/seed_studies/x.json", "sides": {"5": "default", "1": "every_epoch"}}}
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
    """The choice of a hybrid's base (params hybrids.<name>.base) reads each seed's hybrid figures, not its base
    model's, which here rank the other way; the reference value, which no pipeline run has, is shown by its seed
    mean."""
    study = _study()
    for side, shift in (("default", 1.0), ("every_epoch", -1.0)):   # the base models: the reference ahead
        for row in study["per_seed"][side]:
            row["hybrid"] = {"P@5": row["P@5"] + 20.0}
            row["P@5"] += shift
    choice = {"method": "dexml_bow", "knob": "hybrids.dexml_bow_hybrid.base", "reference": "5", "default": "10",
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


def test_split_fingerprint_names_the_instances_and_labels():
    from xmc.metrics.bootstrap import split_fingerprint

    Y = sp.csr_matrix(np.array([[1, 0, 1], [0, 1, 0]], dtype=np.float32))
    assert split_fingerprint(Y) == split_fingerprint(Y.tocoo()) == split_fingerprint(Y * 2)   # the pattern only
    assert split_fingerprint(Y) != split_fingerprint(Y[[1, 0]])
    assert split_fingerprint(Y) != split_fingerprint(sp.csr_matrix(np.array([[1, 0, 1], [0, 1, 0], [0, 0, 0]])))


def test_the_selection_schema_is_the_labs_and_fills_its_defaults():
    """lab.config holds the selection's schema (the product's params.yaml has no selection section)."""
    from xmc.config.schema import ParamsConfig

    assert "selection" not in ParamsConfig.model_fields
    d = SelectionConfig().model_dump()
    assert (d["metric"], d["alpha"], d["choices"]) == ("P@5", 0.05, {})
    assert select_all({}, {}, {})["settings"]["metric"] == d["metric"]
    with pytest.raises(ConfigError, match=r"^selection\.metric: must look like P@5"):
        select_all({"metric": "precision"}, {}, {})
    with pytest.raises(ConfigError, match="reference 'x' is not one of the candidates"):
        filled(SelectionChoice, _choice(reference="x"), "c")
    with pytest.raises(ConfigError, match=r"seed_study.sides \['2'\] are not candidates"):
        filled(SelectionChoice, _choice(seed_study={"file": "s.json", "sides": {"uniform": "a", "2": "b"}}), "c")


def test_a_bad_choice_in_lab_params_is_one_line_with_its_line(tmp_path):
    from lab.config import load_lab

    lab = yaml.safe_load((ROOT / "lab/params.yaml").read_text())
    assert lab["selection"]["choices"], "the lab has selection choices"
    text = (ROOT / "lab/params.yaml").read_text()
    bad = text.replace("    dexml_positive_sampling:\n      method: dexml\n      knob: \"dexml (MiniLM run): "
                       "negatives.positive_sampling\"\n      reference: uniform\n      default: uniform\n",
                       "    dexml_positive_sampling:\n      method: dexml\n      knob: \"dexml (MiniLM run): "
                       "negatives.positive_sampling\"\n      reference: uniform\n      default: sometimes\n", 1)
    assert bad != text
    (tmp_path / "params.yaml").write_text(bad)
    with pytest.raises(ConfigError) as e:
        load_lab(tmp_path / "params.yaml", ROOT / "params.yaml")
    line = 1 + bad[: bad.index("    dexml_positive_sampling:")].count("\n")
    assert str(e.value).startswith(f"{tmp_path / 'params.yaml'}:{line}: selection.choices.dexml_positive_sampling: ")
    assert "default 'sometimes' is not one of the candidates" in str(e.value) and "\n" not in str(e.value)


def _run_selection(repo: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "lab.stages.selection"], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)


def test_selection_stage_uses_validation_only(tmp_path):
    """lab.stages.selection on candidates evaluated by the product (metrics_val/, evaluation/val/) and by a lab run
    (lab/runs/<run>/): the test-split files beside them would reverse every decision if they were read."""
    from xmc.workspace import Workspace

    repo = tmp_path / "repo"
    (repo / "lab").mkdir(parents=True)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["data"]["dataset_dir"] = str((ROOT / params["data"]["dataset_dir"]).resolve())
    params["graph"]["wordnet_dir"] = None
    params["graph"]["wordnet"]["enabled"] = False
    params["evaluate"]["bootstrap"]["n_resamples"] = 300
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    choices = {
        "positive_sampling": _choice(note="DEXML code samples uniformly"),
        "stage2_select": {"method": "maclr", "knob": "maclr: stage2.select", "reference": "union",
                          "default": "agree", "candidates": {"union": "maclr_union", "agree": "maclr"}},
        "loss": {"method": "dexml", "knob": "dexml: loss.name", "reference": "decoupled_softmax",
                 "default": "decoupled_softmax", "candidates": {"decoupled_softmax": "r_uni", "softmax": "r_soft"}},
    }
    (repo / "lab/params.yaml").write_text(yaml.safe_dump(
        {"selection": {"metric": "P@5", "alpha": 0.05, "choices": choices}}, sort_keys=False))
    for run, (extra, lost) in {"r_uni": (0, 0), "r_ip": (130, 10), "maclr_union": (0, 0), "maclr": (12, 10)}.items():
        # the product's runs in results/<data.name>/, the lab's candidate in lab/results/<data.name>/runs/<run>/
        ws = Workspace(lab_results_of(repo) / "runs" / run) if run == "maclr_union" else Workspace(results_of(repo))
        m, c = _val(extra=extra, lost=lost)
        write_json(ws.metrics(run, "val"), m)
        c.save(ws.contributions(run, "val"))
        # test-split files that would reverse every decision if they were read
        write_json(ws.metrics(run, "tst"), {**m, "P@5": 100.0 - m["P@5"]})
        _val(extra=600 - extra)[1].save(ws.contributions(run, "tst"))
    val_Y = sp.csr_matrix((np.random.default_rng(1).random((1200, 40)) < 0.05).astype(np.float32))
    save_csr(results_of(repo) / "data/processed/val_Y.npz", val_Y)
    p = _run_selection(repo)
    assert p.returncode == 0, p.stderr
    rep = json.loads((lab_results_of(repo) / "reports/selection.json").read_text())
    assert rep["settings"] == {"split": "val", "metric": "P@5", "alpha": 0.05, "n_resamples": 300, "seed": 0,
                               "level": 0.95, "unit": "documents", "rule": rep["settings"]["rule"]}
    by = {c["name"]: c for c in rep["choices"]}
    assert by["positive_sampling"]["chosen"] == "inverse_propensity" and by["positive_sampling"]["default_is_chosen"]
    assert by["stage2_select"]["chosen"] == "union" and by["stage2_select"]["default_is_chosen"] is False
    assert by["loss"]["complete"] is False and by["loss"]["chosen"] is None
    assert by["stage2_select"]["val_labels_used"] == {"instances": 1200, "pairs": int(val_Y.nnz)}
    md = (lab_results_of(repo) / "reports/selection.md").read_text()
    assert "Choices are made on the validation split (group-disjoint from training)" in md
    assert "Primary metric: P@5; alpha = 0.05" in md
    assert "Final models train on the training split minus validation with the selected settings" in md
    assert (f"MACLR is zero-shot: its selection used the labels of the 1200 validation instances "
            f"({val_Y.nnz} labelled pairs)") in md
    assert "stage2_select: the default (agree) disagrees with the selection (union)" in md
    assert "positive_sampling: the default (inverse_propensity) agrees with the selection" in md
    assert "| loss | dexml: loss.name | softmax | r_soft | – | – | – | – | not run |" in md
    assert "Note: DEXML code samples uniformly" in md
    html = (lab_results_of(repo) / "reports/selection.html").read_text()
    assert "MACLR is zero-shot" in html and "class='chosen'" in html and "not run" in html
    # the product's outputs are untouched: the selection writes under lab/reports only
    assert not (results_of(repo) / "reports").exists()


def test_the_shipped_selection_names_runs_that_exist():
    """Every candidate run of lab/params.yaml's selection is a product run, a lab run (or one of its predictions,
    a UniDEC space), a hybrid or a linear-peer run: a typo would leave its choice incomplete for ever; and every
    seed study a choice names is in the repository."""
    from lab.config import load_lab, prediction_names

    cfg = load_lab(ROOT / "lab/params.yaml", ROOT / "params.yaml")
    product, lab = cfg["product"], cfg["lab"]
    names = set(product["runs"]) | set(product["hybrids"]) | set(product["xr_linear"]) | set(lab["hybrids"])
    names |= set(lab["xr_linear"]) | {lab["ensemble"]["name"]}
    for name, entry in cfg["entries"].items():
        names |= set(prediction_names(name, entry))
    assert lab["selection"]["choices"]
    for cname, choice in lab["selection"]["choices"].items():
        for value, run in choice["candidates"].items():
            assert run is None or run in names, (cname, value, run)
        if choice.get("seed_study"):
            assert (ROOT / choice["seed_study"]["file"]).is_file(), cname
