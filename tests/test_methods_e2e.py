"""RAMEN, UniDEC, ASTRA, MACLR and the label-name retriever through DVC on a tiny real slice: every stage runs,
lands in the report and in a package that predicts what the pipeline evaluated, and a second `dvc repro` does
nothing."""

from __future__ import annotations

import json

import pytest

from tests.pipeline_repo import SEMCOR, assert_packages_predict_like_the_pipeline, make_repo, run, set_param, stages_run, results_of

pytestmark = pytest.mark.skipif(not SEMCOR.exists(), reason="../shared/datasets/semcor-wn30 not present")

SMALL_BOW = {"kind": "bow", "dim": 32, "n_buckets": 4096, "ngram_max": 2, "tied": True, "dropout": 0.0}
RUNS = {
    "name_match": {"method": "name_match"},
    "name_match_prior": {"method": "name_match", "ranking": "prior"},
    "astra": {"method": "astra", "encoder": SMALL_BOW, "train": {"epochs": 3},
              "negatives": {"start_epoch": 1, "hard_negatives": 4, "uniform_negatives": 16}},
    "ramen": {"method": "ramen", "encoder": SMALL_BOW, "train": {"epochs": 3}, "pruning": {"warmup_epochs": 1}},
    "unidec": {"method": "unidec", "encoder": SMALL_BOW, "model": {"dim": 16},
               "train": {"epochs": 2, "eval_every_epochs": 0}},
    # MACLR on the small bag-of-words encoder, with the default's dropout (the label regulariser's dropout twin): its
    # MiniLM start is the same trainer and encoder code that test_dense_e2e runs through DVC
    "maclr": {"method": "maclr", "encoder": {**SMALL_BOW, "dropout": 0.1},
              "stage1": {"t_k": 1, "t_update": 1, "k0": 2, "cluster_pool": 0, "label_negatives": 4,
                         "train": {"max_steps_per_epoch": 2, "batch_size": 8, "checkpoint_every_steps": 0}},
              "stage2": {"max_instances": 16, "train": {"max_steps_per_epoch": 2, "batch_size": 8,
                                                        "checkpoint_every_steps": 0}}},
}
NAMES = [*RUNS, "astra_hybrid", "maclr_valtuned_hybrid"]
TINY = {"runs": RUNS, "hybrids": {"astra_hybrid": {"base": "astra"},
                                  "maclr_valtuned_hybrid": {"base": "maclr", "fusion": "valtuned"}},
        "xr_linear": {}, "graph.wordnet_dir": str(SEMCOR.parent / "wordnet30"), "graph.walk.walks": 1,
        "graph.walk.hops": 50}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("methods"), trn_docs=2, tst_docs=1, labels="used", extra_params=TINY)


def test_every_method_trains_packages_and_lands_in_the_report(repo):
    p = run(["dvc", "repro"], repo, timeout=900)
    ran = set(stages_run(p.stdout))
    expected = ({"graph", "maclr_pseudo_pairs", "plan", "report"} | {f"train@{r}" for r in RUNS}
                | {f"package@{r}" for r in RUNS} | {"fuse@astra_hybrid", "fuse@maclr_valtuned_hybrid"})
    assert expected <= ran, expected - ran
    table = (results_of(repo) / "reports/comparison.md").read_text()
    for m in NAMES:
        assert f"| {m} |" in table
        metrics = json.loads((results_of(repo) / f"metrics/{m}.json").read_text())
        assert metrics["n_test"] > 0 and 0.0 <= metrics["P@1"] <= 100.0
    astra = json.loads((results_of(repo) / "models/astra/train_summary.json").read_text())
    assert astra["refreshed_at_epochs"] == [1, 2] and astra["epochs"] == 3
    assert (results_of(repo) / "plots/train/astra/plots/metrics/train/uniform.tsv").is_file()   # ASTRA's loss parts, live
    assert "stage2" in json.loads((results_of(repo) / "plots/train/maclr/metrics.json").read_text())
    assert (results_of(repo) / "reports/validation/graph.html").exists()
    # MACLR's plan reads the pseudo pairs and never a label matrix; the zero-shot name matcher reads no training split
    maclr = json.loads((results_of(repo) / "plans/maclr.json").read_text())
    assert [p for p in maclr["inputs"] if p.endswith("maclr_pairs")] and not [p for p in maclr["inputs"] if "_Y" in p]
    assert json.loads((results_of(repo) / "plans/name_match.json").read_text())["inputs"] == {}
    assert stages_run(run(["dvc", "repro"], repo).stdout) == []
    assert_packages_predict_like_the_pipeline(repo, NAMES)


def test_graph_stage_reruns_only_when_the_graph_or_its_params_change(repo):
    run(["dvc", "repro", "graph"], repo)
    set_param(repo, "runs.ramen.regulariser", {"lambda_x": 0.25})   # a training knob: the graph stays
    assert stages_run(run(["dvc", "repro", "graph"], repo).stdout) == []
    set_param(repo, "graph.walk.top_k", 2)                          # a walk knob: the graph is rebuilt
    assert stages_run(run(["dvc", "repro", "graph"], repo).stdout) == ["graph"]
