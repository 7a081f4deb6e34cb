"""`dvc repro` end to end in a temporary git repository on a small real slice of semcor-wn30: the product pipeline
narrowed to the baselines and the linear peer, what reruns after which change, and the lab beside it."""

from __future__ import annotations

import json

import pytest

from tests.pipeline_repo import SEMCOR, make_repo, run, set_param, stages_run, write_xc_dataset

pytestmark = pytest.mark.skipif(not SEMCOR.exists(), reason="../shared/datasets/semcor-wn30 not present")

BASELINES = {"label_prior": {"method": "label_prior"}, "tfidf_zeroshot": {"method": "tfidf_zeroshot"},
             "tfidf_knn": {"method": "tfidf_knn"}}
ROWS = ["label_prior", "tfidf_zeroshot", "tfidf_knn", "xr_linear", "tfidf_knn_hybrid"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    # the baselines, the linear peer and one hybrid (the dense runs have their own tiny-budget tests)
    return make_repo(tmp_path_factory.mktemp("pipeline"), extra_params={"runs": BASELINES}, lab=True)


def test_repro_then_noop_then_param_change_reruns_only_downstream(repo):
    first = run(["dvc", "repro"], repo)
    ran = stages_run(first.stdout)
    assert {"ingest", "validate", "tfidf", "plan", "train@label_prior", "train@tfidf_knn", "package@label_prior",
            "package@tfidf_zeroshot", "package@tfidf_knn", "xr_linear@xr_linear", "fuse@tfidf_knn_hybrid",
            "report"} <= set(ran)
    meta = json.loads((repo / "data/processed/meta.json").read_text())
    # 3 training documents: one became the validation split (whole documents move)
    assert meta["counts"]["trn"]["groups"] == 2 and meta["counts"]["val"]["groups"] == 1
    assert meta["counts"]["tst"]["groups"] == 1
    assert meta["counts"]["n_labels"] == 25819
    for m in ROWS:
        metrics = json.loads((repo / f"metrics/{m}.json").read_text())
        assert 0 <= metrics["P@1"] <= 100 and metrics["n_test"] == meta["counts"]["tst"]["instances"]
        val = json.loads((repo / f"metrics_val/{m}.json").read_text())
        assert val["n_test"] == meta["counts"]["val"]["instances"]
    # the results table is the first one; the hybrids' by-name-match table below it names the hybrids again
    table = (repo / "reports/comparison.md").read_text().split("\n### ")[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "method" not in line
            and "---" not in line and line.split("|")[1].strip() in ROWS]
    assert rows == ROWS
    assert (repo / "reports/validation/report.html").read_text().count("<tr class=") >= 10
    # every run and hybrid is a package whose manifest carries both splits' metrics; the linear peer is not
    for m in ("label_prior", "tfidf_knn", "tfidf_knn_hybrid"):
        manifest = json.loads((repo / "packages" / m / "manifest.json").read_text())
        assert set(manifest["metrics"]) == {"val", "tst"}
    assert not (repo / "packages" / "xr_linear").exists()

    second = run(["dvc", "repro"], repo)
    assert stages_run(second.stdout) == []
    set_param(repo, "runs.tfidf_knn.n_neighbors", 5)
    third = sorted(stages_run(run(["dvc", "repro"], repo).stdout))
    # the plan is rewritten, and only the run whose settings changed is retrained, with what reads it
    assert third == ["fuse@tfidf_knn_hybrid", "package@tfidf_knn", "plan", "report", "train@tfidf_knn"]
    assert "runs.tfidf_knn.n_neighbors" in run(["dvc", "params", "diff"], repo).stdout


def test_prediction_code_and_another_method_do_not_retrain_a_run(repo):
    """A training depends on its plan only: the settings, data and code its training reads. Editing code that only
    predicts repackages the runs and retrains none; editing one method's training code retrains that method only."""
    run(["dvc", "repro"], repo)
    predictors = repo / "xmc/package/predictors.py"
    predictors.write_text(predictors.read_text() + "\n# an edit of prediction code\n")
    ran = set(stages_run(run(["dvc", "repro"], repo).stdout))
    assert "plan" in ran and {"package@label_prior", "package@tfidf_knn", "fuse@tfidf_knn_hybrid"} <= ran
    assert not [s for s in ran if s.startswith("train@")], ran
    astra = repo / "xmc/methods/astra.py"   # no run of this pipeline is an ASTRA run
    astra.write_text(astra.read_text() + "\n# an edit of another method\n")
    assert stages_run(run(["dvc", "repro"], repo).stdout) == ["plan"]
    plans = {p.name for p in (repo / "plans").iterdir()}
    assert plans == {f"{r}.json" for r in BASELINES}
    plan = json.loads((repo / "plans/tfidf_knn.json").read_text())
    assert "xmc/methods/peers.py" in plan["code"] and "xmc/package/predictors.py" not in plan["code"]
    assert any(p.endswith("data/tfidf") for p in plan["inputs"])


def test_lab_reads_the_product_and_decides_on_validation_only(repo):
    """A lab run trained on the product's data (its results in lab/runs/), the selection between a product run and
    a lab run on the validation split, and nothing of the lab in the product's outputs."""
    run(["dvc", "repro"], repo)
    lab = repo / "lab/params.yaml"
    lab.write_text(json.dumps({
        "runs": {"tfidf_knn_k3": {"method": "tfidf_knn", "n_neighbors": 3}}, "from_product": {}, "hybrids": {},
        "xr_linear": {},
        "ensemble": {"name": "ensemble_hybrid", "members": []},
        "selection": {"metric": "P@5", "alpha": 0.05, "choices": {
            "knn_neighbours": {"method": "tfidf_knn", "knob": "tfidf_knn: n_neighbors", "reference": "3",
                               "default": "10", "candidates": {"3": "tfidf_knn_k3", "10": "tfidf_knn"}},
            "same": {"method": "tfidf", "knob": "a candidate against itself", "reference": "a", "default": "a",
                     "candidates": {"a": "label_prior", "b": "label_prior"}}}}}))
    run(["git", "add", "-A"], repo)
    before = run(["git", "status", "--porcelain", "--", "metrics", "metrics_val", "reports"], repo).stdout
    ran = stages_run(run(["dvc", "repro", "-s", "lab/dvc.yaml:plan", "lab/dvc.yaml:run@tfidf_knn_k3",
                          "lab/dvc.yaml:selection"], repo).stdout)
    assert ran == ["plan", "run@tfidf_knn_k3", "selection"]
    assert run(["git", "status", "--porcelain", "--", "metrics", "metrics_val", "reports"], repo).stdout == before
    res = repo / "lab/runs/tfidf_knn_k3"
    assert (res / "metrics_val/tfidf_knn_k3.json").is_file() and not (res / "metrics/tfidf_knn_k3.json").exists()
    assert not (res / "models").exists() and not (res / "packages").exists()   # only the results are kept
    sel = json.loads((repo / "lab/reports/selection.json").read_text())
    by = {c["name"]: c for c in sel["choices"]}
    assert by["knn_neighbours"]["complete"] and by["knn_neighbours"]["chosen"] in ("3", "10")
    assert by["same"]["chosen"] == "a" and by["same"]["default_is_chosen"]   # identical candidates: the reference
    val_n = json.loads((repo / "data/processed/meta.json").read_text())["counts"]["val"]["instances"]
    assert json.loads((res / "metrics_val/tfidf_knn_k3.json").read_text())["n_test"] == val_n


def test_critical_validation_failure_stops_the_pipeline(tmp_path):
    data = write_xc_dataset(tmp_path / "bad_dataset", ["alpha label", "beta label", "gamma label"],
                            ["first training text", "second training text", "third training text"], ["a test text"],
                            ["0:1.0 1:1.0", "", "2:1.0"], ["1:1.0"])  # training row 2 has no label: critical
    repo = make_repo(tmp_path / "repo", dataset_dir=data, trn_docs=0, tst_docs=0, extra_params={"runs": BASELINES})
    p = run(["dvc", "repro"], repo, check=False)
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
