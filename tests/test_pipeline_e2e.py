"""`dvc repro` end to end in a temporary git repository on a small real slice of semcor-wn30: the product pipeline
narrowed to the baselines and the linear peer, what reruns after which change, and the lab beside it."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.pipeline_repo import SEMCOR, make_repo, run, set_param, stages_run, write_xc_dataset, results_of, lab_results_of

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
    meta = json.loads((results_of(repo) / "data/processed/meta.json").read_text())
    # 3 training documents: one became the validation split (whole documents move)
    assert meta["counts"]["trn"]["groups"] == 2 and meta["counts"]["val"]["groups"] == 1
    assert meta["counts"]["tst"]["groups"] == 1
    assert meta["counts"]["n_labels"] == 25819
    for m in ROWS:
        metrics = json.loads((results_of(repo) / f"metrics/{m}.json").read_text())
        assert 0 <= metrics["P@1"] <= 100 and metrics["n_test"] == meta["counts"]["tst"]["instances"]
        val = json.loads((results_of(repo) / f"metrics_val/{m}.json").read_text())
        assert val["n_test"] == meta["counts"]["val"]["instances"]
    # the results table is the first one; the hybrids' by-name-match table below it names the hybrids again
    table = (results_of(repo) / "reports/comparison.md").read_text().split("\n### ")[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "method" not in line
            and "---" not in line and line.split("|")[1].strip() in ROWS]
    assert rows == ROWS
    assert (results_of(repo) / "reports/validation/report.html").read_text().count("<tr class=") >= 10
    # every run and hybrid is a package whose manifest carries both splits' metrics; the linear peer is not
    for m in ("label_prior", "tfidf_knn", "tfidf_knn_hybrid"):
        manifest = json.loads((results_of(repo) / "packages" / m / "manifest.json").read_text())
        assert set(manifest["metrics"]) == {"val", "tst"}
    assert not (results_of(repo) / "packages" / "xr_linear").exists()

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
    # the registry and the reader of texts to predict are no part of a package: editing them rebuilds nothing
    # (the plan stage reads all of xmc/ and finds every plan as it was)
    for rel in ("xmc/package/registry.py", "xmc/package/inputs.py"):
        f = repo / rel
        f.write_text(f.read_text() + "\n# an edit of code that names or feeds packages\n")
    assert stages_run(run(["dvc", "repro"], repo).stdout) == ["plan"]
    astra = repo / "xmc/methods/astra.py"   # no run of this pipeline is an ASTRA run
    astra.write_text(astra.read_text() + "\n# an edit of another method\n")
    assert stages_run(run(["dvc", "repro"], repo).stdout) == ["plan"]
    plans = {p.name for p in (results_of(repo) / "plans").iterdir()}
    assert plans == {f"{r}.json" for r in BASELINES}
    plan = json.loads((results_of(repo) / "plans/tfidf_knn.json").read_text())
    assert "xmc/methods/baselines.py" in plan["code"] and "xmc/package/predictors.py" not in plan["code"]
    # a baseline's training reads none of the trainer's code (only the harness's training log and memory release):
    # editing the trainer, a loss or an encoder leaves its model as it was
    neural = ("xmc/trainer/trainer.py", "xmc/trainer/objective.py", "xmc/trainer/distributed.py", "xmc/losses/",
              "xmc/encoders/base.py", "xmc/methods/peers.py", "xmc/methods/trainer_method.py", "xmc/parallel.py")
    assert not [f for f in plan["code"] if f.startswith(neural)], plan["code"]
    assert any(p.endswith("data/tfidf") for p in plan["inputs"])


def test_lab_reads_the_product_and_decides_on_validation_only(repo):
    """A lab run trained on the product's data (its results in lab/results/<data.name>/runs/), the selection between a product run and
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
    product = results_of(repo).relative_to(repo).as_posix()
    before = run(["git", "status", "--porcelain", "--", product], repo).stdout
    ran = stages_run(run(["dvc", "repro", "-s", "lab/dvc.yaml:plan", "lab/dvc.yaml:run@tfidf_knn_k3",
                          "lab/dvc.yaml:selection"], repo).stdout)
    assert ran == ["plan", "run@tfidf_knn_k3", "selection"]
    assert run(["git", "status", "--porcelain", "--", product], repo).stdout == before
    res = lab_results_of(repo) / "runs/tfidf_knn_k3"
    assert (res / "metrics_val/tfidf_knn_k3.json").is_file() and not (res / "metrics/tfidf_knn_k3.json").exists()
    assert not (res / "models").exists() and not (res / "packages").exists()   # only the results are kept
    sel = json.loads((lab_results_of(repo) / "reports/selection.json").read_text())
    by = {c["name"]: c for c in sel["choices"]}
    assert by["knn_neighbours"]["complete"] and by["knn_neighbours"]["chosen"] in ("3", "10")
    assert by["same"]["chosen"] == "a" and by["same"]["default_is_chosen"]   # identical candidates: the reference
    val_n = json.loads((results_of(repo) / "data/processed/meta.json").read_text())["counts"]["val"]["instances"]
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
    summary = json.loads((results_of(repo) / "reports/validation/summary.json").read_text())
    assert summary["success"] is False and summary["metrics"]["critical_failures"] == 1


def test_malformed_dataset_fails_ingest_with_one_line(tmp_path):
    data = write_xc_dataset(tmp_path / "bad_dataset", ["alpha", "beta"], ["one", "two"], ["three"],
                            ["0:1.0", "7:1.0"], ["1:1.0"])
    repo = make_repo(tmp_path / "repo", dataset_dir=data, trn_docs=0, tst_docs=0)
    p = run(["python", "-m", "stages.ingest"], repo, check=False)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [f"error: {data / 'trn_X_Y.txt'}:3: label id 7 out of range [0, 2)"]
    assert not (results_of(repo) / "data/processed").exists()
    assert not (results_of(repo) / "dataset.json").exists()
    assert not list(results_of(repo).glob("**/.*tmp*")) if results_of(repo).exists() else True


def _files(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_on_another_dataset_leaves_this_ones_outputs_byte_identical(repo, tmp_path):
    """Every output of a dataset is under results/<data.name>/: a run on another dataset (its own name, as
    `make run DATASET=...` sets it) writes its own folder and leaves every file of this one, committed or not,
    byte for byte as it was; another dataset under this one's name is refused by the first stage with one line,
    before DVC removes anything."""
    run(["dvc", "repro"], repo)
    mine = results_of(repo)
    assert mine.name == "semcor-wn30"
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", "the semcor-wn30 slice's results"], repo, check=False)
    before = _files(mine)
    assert {"dataset.json", "metrics/tfidf_knn.json", "metrics_val/tfidf_knn.json", "reports/comparison.md",
            "data/processed/trn.jsonl", "packages/tfidf_knn/manifest.json"} <= set(before)
    labels = ["alpha (n): the first letter", "beta (n): the second letter", "gamma (n): the third letter",
              "delta (n): a river mouth", "omega (n): the last letter"]
    trn = [f"{w} text number {i} about {labels[i % 5].split()[0]}" for i, w in enumerate(["one", "two", "three"] * 10)]
    trn_rows = [f"{i % 5}:1.0" for i in range(30)]
    other = write_xc_dataset(tmp_path / "toy-data", labels, trn, ["a test about beta", "gamma here", "the delta"],
                             trn_rows, ["1:1.0", "2:1.0", "3:1.0"])
    set_param(repo, "data.subsample", {"trn": 0, "tst": 0, "unit": "documents", "labels": "all"})
    # the other dataset under this one's name: refused before anything of this folder is touched
    set_param(repo, "data.dataset_dir", str(other))
    p = run(["dvc", "repro"], repo, check=False)
    assert p.returncode != 0
    assert f"{mine.relative_to(repo) / 'dataset.json'}: {mine.relative_to(repo)}/ holds the outputs of" in p.stderr + p.stdout
    assert "Running stage 'ingest'" not in p.stdout and _files(mine) == before
    # under its own name (what `make run DATASET=<folder>` sets): its own folder, this one untouched
    run(["python", "-m", "xmc.config.use_dataset", str(other)], repo)
    ran = stages_run(run(["dvc", "repro"], repo).stdout)
    assert {"claim", "ingest", "train@tfidf_knn", "package@tfidf_knn", "report"} <= set(ran)
    theirs = results_of(repo)
    assert theirs.name == "toy-data" and theirs != mine
    assert json.loads((theirs / "metrics/tfidf_knn.json").read_text())["n_test"] == 3
    assert "XMC comparison on toy-data" in (theirs / "reports/comparison.md").read_text()
    assert _files(mine) == before
    assert run(["git", "status", "--porcelain", "--", mine.relative_to(repo).as_posix()], repo).stdout == ""
    assert run(["dvc", "metrics", "show", "--json"], repo).stdout.count("semcor-wn30") == 0   # this dataset's only
