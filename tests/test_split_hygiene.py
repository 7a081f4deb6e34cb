"""The test split is read only to report: no training, selection or feature stage may depend on it.

Checks the real dvc.yaml/params.yaml of this repository through DVC's own stage index (foreach
expanded), so a stage added later with a test-split dependency fails here.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]

# stages allowed to read test files: data preparation (ingest writes the splits, validate checks them),
# prediction (writes top-k for the test texts, never reads test labels) and evaluation / reporting; the
# package stage records the test metrics in a package's manifest (the promotion gate reads validation only)
TEST_READERS = {"ingest", "validate", "label_prior", "tfidf_zeroshot", "tfidf_knn", "predict", "predict_unidec",
                "predict_xr_linear", "name_match", "name_match_prior", "fuse", "fuse_zero_shot", "fuse_ensemble",
                "evaluate", "evaluate_ablation", "evaluate_seed", "report", "report_ablations", "report_seeds",
                "package"}
# outputs that hold test material: any dependency on them (or on a folder holding them) reads the test split
TEST_MATERIAL = ("data/processed", "metrics", "plots/eval", "evaluation/tst", "evaluation/ablations",
                 "evaluation/seeds", "seeds/metrics", "ablations/metrics", "ablations/plots", "reports/validation/summary.json",
                 "reports/validation/report.html", "reports/comparison.md", "reports/paired.json")


def _base(stage) -> str:
    return stage.name.split("@")[0]


def _reads_test(rel: str, dataset_dir: str) -> bool:
    parts = Path(rel).parts
    if any(p.startswith("tst") for p in parts) or rel == "data/processed/meta.json":
        return True
    if rel in TEST_MATERIAL or any(rel.startswith(m + "/") and not rel.startswith("data/processed/")
                                   for m in TEST_MATERIAL):
        return True
    if rel == "predictions" or (len(parts) == 2 and parts[0] == "predictions"):  # a whole predictions folder
        return True
    return rel == dataset_dir or rel in ("evaluation",)


@pytest.fixture(scope="module")
def dvc_index():
    from dvc.repo import Repo

    repo = Repo(str(REPO))
    try:
        yield repo.index
    finally:
        repo.close()


def _rel(path: str) -> str:
    import os

    return os.path.relpath(os.path.realpath(path), os.path.realpath(REPO))


def test_only_prediction_and_evaluation_stages_depend_on_test_files(dvc_index) -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    dataset_dir = _rel(str(REPO / params["data"]["dataset_dir"]))
    offenders = []
    for stage in dvc_index.stages:
        if _base(stage) in TEST_READERS:
            continue
        for dep in stage.deps:
            rel = _rel(dep.fs_path)
            if _reads_test(rel, dataset_dir):
                offenders.append(f"{stage.name} depends on {rel}")
    assert not offenders, "stages that must not read the test split depend on it:\n" + "\n".join(offenders)


def test_no_training_stage_is_downstream_of_a_test_reader(dvc_index) -> None:
    """Transitively too: nothing upstream of a training (or feature) stage reads the test split, apart
    from the data preparation (ingest, validate) that writes and checks every split. (Validation
    evaluation and selection sit downstream of prediction stages that also predict test rows; the
    direct-dependency test above shows they read only the validation files.)"""
    graph = dvc_index.graph  # DVC: an edge stage -> the stage that produces one of its dependencies
    by_name = {s.name: s for s in dvc_index.stages}
    assert any(n.name == "ingest" for n in nx.descendants(graph, by_name["train@dexml"])), \
        "graph direction changed: train@dexml should reach ingest"
    prep = {"ingest", "validate"}
    offenders = []
    trains = [s for s in dvc_index.stages
              if any(_rel(o.fs_path).split("/")[0] in ("models", "checkpoints", "data") for o in s.outs)]
    assert len(trains) > 20
    for stage in trains:
        if _base(stage) in TEST_READERS:
            continue
        upstream = {_base(s) for s in nx.descendants(graph, stage)}
        bad = sorted(upstream & (TEST_READERS - prep))
        if bad:
            offenders.append(f"{stage.name} is downstream of {bad}")
    assert not offenders, "\n".join(offenders)


def test_the_checker_flags_a_test_dependency() -> None:
    """The rule itself: these paths read the test split, these do not."""
    ds = "../shared/datasets/semcor-wn30"
    for rel in ("data/processed", "data/processed/tst.jsonl", "data/processed/tst_Y.npz", "data/processed/meta.json",
                "metrics", "evaluation/tst", "predictions/dexml", "predictions/dexml/tst_topk.npz", ds,
                "reports/validation/summary.json"):
        assert _reads_test(rel, ds), rel
    for rel in ("data/processed/trn.jsonl", "data/processed/val_Y.npz", "data/processed/lbl.jsonl",
                "metrics_val", "evaluation/val", "predictions/dexml/val_topk.npz", "models/dexml",
                "reports/validation/gate.json", "data/maclr_pairs"):
        assert not _reads_test(rel, ds), rel


def test_selection_candidates_are_predicted_and_validated() -> None:
    """Every run a choice compares has validation predictions and metrics; every reported run has test ones."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    predicted = {**params["predictions"], **params["unidec_predictions"]}
    for suffix in ("_de_only", "_clf_only"):
        predicted.update({f"{r}{suffix}": v for r, v in params["unidec_predictions"].items()})
    predicted.update({m: "val tst" for m in ("label_prior", "tfidf_zeroshot", "tfidf_knn", "name_match",
                                              "name_match_prior")})
    predicted.update(params["xr_linear_predictions"])
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    predicted["name_match_uncased"] = " ".join(stages["name_match_uncased"]["cmd"].split()[4:])   # its splits
    predicted.update({f"{r}_hybrid": "val tst" for r in params["hybrid"]["runs"]})
    predicted.update({f"{r}_zs_hybrid": "val tst" for r in params["hybrid"]["zero_shot_runs"]})
    if params["hybrid"]["ensemble"]["members"]:
        predicted[params["hybrid"]["ensemble"]["name"]] = "val tst"
    validated = set(params["validated"])
    for name, choice in params["selection"]["choices"].items():
        assert choice["reference"] in choice["candidates"], name
        assert choice["default"] in choice["candidates"], name
        for value, run in choice["candidates"].items():
            if run is None:   # a value only a seed study trained (of the validation split: the study checks it)
                assert value in choice["seed_study"]["sides"], name
                continue
            assert run in validated, f"{name}: {run} is not in params 'validated'"
            assert "val" in predicted[run].split(), f"{name}: {run} has no validation predictions"
    for run in params["reported"]:
        assert "tst" in predicted[run].split(), run
    for base, extra in params["report"]["seeds"].items():
        assert base in params["reported"] and all(r in params["seed_runs"] for r in extra), base
    for run in params["seed_runs"]:
        assert "tst" in predicted[run].split(), run


def test_the_pipeline_files_make_one_graph(dvc_index) -> None:
    """The stage groups of pipelines/*/dvc.yaml run in the repository root with the root params, DVC joins them
    to dvc.yaml's stages, and the output guard (xmc.io) reads their outputs as outputs, not as inputs."""
    from xmc.io import _declared_paths, _pipeline_stamp, pipeline_files

    files = pipeline_files(REPO)
    assert files[0] == REPO / "dvc.yaml" and len(files) > 1
    for f in files[1:]:
        doc = yaml.safe_load(f.read_text())
        assert doc["vars"] == ["../../params.yaml"], f
        for name, st in doc["stages"].items():
            assert (REPO / f.parent / (st.get("do") or st)["wdir"]).resolve() == REPO, (f, name)
    by_file = {(Path(s.dvcfile.path).resolve(), s.name.split("@")[0]) for s in dvc_index.stages}
    for group in ("predict", "predict_unidec", "fuse", "fuse_zero_shot", "evaluate", "evaluate_val", "evaluate_seed",
                  "evaluate_ablation", "package"):
        assert any(g == group and f != REPO / "dvc.yaml" for f, g in by_file), group
    assert {s.name.split("@")[0] for s in dvc_index.stages} >= {"ingest", "train", "report", "evaluate", "package"}
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    inputs, outs = _declared_paths(REPO, _pipeline_stamp(REPO))
    out_paths = {o for o, _ in outs}
    run = params["validated"][0]
    assert REPO / "evaluation" / "val" / f"{run}.npz" in out_paths
    assert REPO / "packages" / params["packages"][0] in out_paths
    hybrid = next(iter(params["hybrid"]["runs"]))
    assert REPO / "predictions" / run in out_paths and REPO / "indexes" / f"{hybrid}_hybrid" in out_paths
    assert not inputs & {REPO / "evaluation" / "val", REPO / "metrics_val", REPO / "metrics"}, inputs
