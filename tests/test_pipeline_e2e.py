"""`dvc repro` end to end in a temporary git repository on a small real slice of semcor-wn30."""

from __future__ import annotations

import json

import pytest

from tests.pipeline_repo import SEMCOR, make_repo, run, set_param, stages_run, write_xc_dataset

pytestmark = pytest.mark.skipif(not SEMCOR.exists(), reason="../shared/datasets/semcor-wn30 not present")


BASELINES = ["label_prior", "tfidf_zeroshot", "tfidf_knn", "xr_linear"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    # the report of the three baselines: the dense stages have their own tiny-budget test (test_dense_e2e)
    return make_repo(tmp_path_factory.mktemp("pipeline"), extra_params={"methods": BASELINES})


def test_repro_then_noop_then_param_change_reruns_only_downstream(repo):
    first = run(["dvc", "repro", "report"], repo)
    ran = stages_run(first.stdout)
    assert {"ingest", "validate", "tfidf", "label_prior", "tfidf_zeroshot", "tfidf_knn", "train_xr_linear@xr_linear",
            "predict_xr_linear@xr_linear", "report"} <= set(ran)
    assert {"evaluate@label_prior", "evaluate@tfidf_zeroshot", "evaluate@tfidf_knn", "evaluate@xr_linear"} <= set(ran)

    meta = json.loads((repo / "data/processed/meta.json").read_text())
    # 3 training documents: one became the validation split (whole documents move)
    assert meta["counts"]["trn"]["groups"] == 2 and meta["counts"]["val"]["groups"] == 1
    assert meta["counts"]["tst"]["groups"] == 1
    assert meta["counts"]["n_labels"] == 25819
    for m in BASELINES:
        metrics = json.loads((repo / f"metrics/{m}.json").read_text())
        assert 0 <= metrics["P@1"] <= 100 and metrics["n_test"] == meta["counts"]["tst"]["instances"]
    table = (repo / "reports/comparison.md").read_text()
    assert "| tfidf_knn |" in table and "| label_prior |" in table and "| xr_linear |" in table
    assert (repo / "reports/validation/report.html").read_text().count("<tr class=") >= 10

    second = run(["dvc", "repro", "report"], repo)
    assert stages_run(second.stdout) == []
    assert "up to date" in second.stdout

    set_param(repo, "tfidf_knn.n_neighbors", 5)
    third = run(["dvc", "repro", "report"], repo)
    assert sorted(stages_run(third.stdout)) == ["evaluate@tfidf_knn", "report", "tfidf_knn"]
    # DVC sees the changed parameter and what it changed
    diff = run(["dvc", "params", "diff"], repo).stdout
    assert "tfidf_knn.n_neighbors" in diff


def test_ablations_have_their_own_report_outside_the_main_one(repo):
    run(["dvc", "repro", "report"], repo)
    set_param(repo, "ablations", ["tfidf_knn"])
    # the main report does not depend on the ablation list
    assert stages_run(run(["dvc", "repro", "report"], repo).stdout) == []
    ran = stages_run(run(["dvc", "repro", "report_ablations"], repo).stdout)
    assert sorted(ran) == ["evaluate_ablation@tfidf_knn", "report_ablations"]
    abl = json.loads((repo / "ablations/metrics/tfidf_knn.json").read_text())
    main = json.loads((repo / "metrics/tfidf_knn.json").read_text())
    assert abl["P@1"] == main["P@1"]  # same predictions, same evaluation, another place
    assert (repo / "ablations/plots/tfidf_knn/at_k.json").exists()
    table = (repo / "reports/ablations.md").read_text()
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "method" not in line]
    assert rows == BASELINES + ["tfidf_knn"]


def test_critical_validation_failure_stops_the_pipeline(tmp_path):
    data = write_xc_dataset(tmp_path / "bad_dataset", ["alpha label", "beta label", "gamma label"],
                            ["first training text", "second training text", "third training text"], ["a test text"],
                            ["0:1.0 1:1.0", "", "2:1.0"], ["1:1.0"])  # training row 2 has no label: critical
    repo = make_repo(tmp_path / "repo", dataset_dir=data, trn_docs=0, tst_docs=0, extra_params={"methods": BASELINES})
    p = run(["dvc", "repro", "report"], repo, check=False)
    assert p.returncode != 0
    err = p.stderr + p.stdout
    assert "data validation failed: trn: every training instance has at least one label (1 unexpected)" in err
    assert "Running stage 'tfidf'" not in p.stdout
    summary = json.loads((repo / "reports/validation/summary.json").read_text())
    assert summary["success"] is False and summary["metrics"]["critical_failures"] == 1


def test_malformed_dataset_fails_ingest_with_one_line(tmp_path):
    data = write_xc_dataset(tmp_path / "bad_dataset", ["alpha", "beta"], ["one", "two"], ["three"],
                            ["0:1.0", "7:1.0"], ["1:1.0"])
    repo = make_repo(tmp_path / "repo", dataset_dir=data, trn_docs=0, tst_docs=0)
    p = run(["python", "-m", "stages.ingest"], repo, check=False)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [f"error: {data / 'trn_X_Y.txt'}:3: label id 7 out of range [0, 2)"]
    assert not (repo / "data/processed").exists()
    assert not list((repo / "data").glob(".*tmp*")) if (repo / "data").exists() else True


def test_selection_reads_validation_only_and_keeps_the_reference_on_a_tie(repo):
    """`dvc repro selection` on the baselines: validation predictions and metrics only, no test evaluation,
    and a choice between candidates decided by the paired-bootstrap rule."""
    set_param(repo, "selection", {"metric": "P@5", "alpha": 0.05, "choices": {
        "baseline": {"method": "tfidf", "knob": "which TF-IDF baseline", "reference": "zeroshot", "default": "knn",
                     "candidates": {"zeroshot": "tfidf_zeroshot", "knn": "tfidf_knn"}},
        "same": {"method": "tfidf", "knob": "a candidate against itself", "reference": "a", "default": "a",
                 "candidates": {"a": "label_prior", "b": "label_prior"}}}})
    run(["git", "add", "-A"], repo)
    ran = stages_run(run(["dvc", "repro", "selection"], repo).stdout)
    assert "selection" in ran and "evaluate_val@tfidf_knn" in ran
    assert not [r for r in ran if r.startswith(("evaluate@", "report"))], ran
    sel = json.loads((repo / "reports/selection.json").read_text())
    by = {c["name"]: c for c in sel["choices"]}
    knn = by["baseline"]
    assert knn["complete"] and knn["best"] == "knn" and knn["p_value"] < 0.05  # kNN is far ahead of zero-shot
    assert knn["chosen"] == "knn" and knn["default_is_chosen"]
    same = by["same"]
    assert same["chosen"] == "a" and same["default_is_chosen"]       # identical candidates: the reference stays
    val_n = json.loads((repo / "data/processed/meta.json").read_text())["counts"]["val"]["instances"]
    assert json.loads((repo / "metrics_val/tfidf_knn.json").read_text())["n_test"] == val_n
    md = (repo / "reports/selection.md").read_text()
    assert "validation" in md and "tfidf_knn" in md
