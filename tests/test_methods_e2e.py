"""RAMEN, UniDEC, ASTRA and MACLR through DVC on a tiny real slice: every stage runs, lands in the report,
and a second `dvc repro` does nothing."""

from __future__ import annotations

import json

import pytest

from tests.pipeline_repo import PACKAGES, SEMCOR, assert_packages_predict_like_the_pipeline, make_repo, run, set_param, stages_run

pytestmark = pytest.mark.skipif(not SEMCOR.exists(), reason="../shared/datasets/semcor-wn30 not present")

SMALL_BOW = {"kind": "bow", "dim": 32, "n_buckets": 4096, "ngram_max": 2, "tied": True, "dropout": 0.0}
METHODS = ["astra", "ramen", "unidec", "unidec_de_only", "unidec_clf_only", "maclr", "astra_hybrid", "unidec_de_only_hybrid",
           "name_match", "name_match_prior"]
TINY = {
    "methods": METHODS,
    "predictions": {"ramen": "val tst", "maclr": "val tst", "astra": "val tst"},
    "unidec_predictions": {"unidec": "val tst"},
    "hybrid.runs": {"astra": "astra", "unidec_de_only": "unidec_de_only"},
    "packages": METHODS,
    # ASTRA
    "astra.defaults.encoder": SMALL_BOW,
    "astra.defaults.train.epochs": 3,
    "astra.defaults.negatives.start_epoch": 1,
    "astra.defaults.negatives.hard_negatives": 4,
    "astra.defaults.negatives.uniform_negatives": 16,
    "astra.runs": {"astra": {}},
    # RAMEN
    "ramen.defaults.encoder": SMALL_BOW,
    "ramen.defaults.train.epochs": 3,
    "ramen.defaults.pruning.warmup_epochs": 1,
    "ramen.graph.wordnet_dir": str(SEMCOR.parent / "wordnet30"),
    "ramen.graph.walk.walks": 1,
    "ramen.graph.walk.hops": 50,
    "ramen.runs": {"ramen": {}},
    # UniDEC
    "unidec.defaults.encoder": SMALL_BOW,
    "unidec.defaults.model.dim": 16,
    "unidec.defaults.train.epochs": 2,
    "unidec.defaults.train.eval_every_epochs": 0,
    "unidec.runs": {"unidec": {}},
    # MACLR on the small bag-of-words encoder, with the default's dropout (the label regulariser's dropout twin): its
    # MiniLM start is the same trainer and encoder code that test_dense_e2e runs through DVC, here a minute longer
    "maclr.defaults.encoder": {**SMALL_BOW, "dropout": 0.1},
    "maclr.defaults.stage1.train.max_steps_per_epoch": 2,
    "maclr.defaults.stage1.train.batch_size": 8,
    "maclr.defaults.stage1.train.checkpoint_every_steps": 0,
    "maclr.defaults.stage1.t_k": 1,
    "maclr.defaults.stage1.t_update": 1,
    "maclr.defaults.stage1.k0": 2,
    "maclr.defaults.stage1.cluster_pool": 0,
    "maclr.defaults.stage1.label_negatives": 4,
    "maclr.defaults.stage2.max_instances": 16,
    "maclr.defaults.stage2.train.max_steps_per_epoch": 2,
    "maclr.defaults.stage2.train.batch_size": 8,
    "maclr.defaults.stage2.train.checkpoint_every_steps": 0,
    "maclr.runs": {"maclr": {}},
    "maclr.fewshot.runs": {},
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("methods"), trn_docs=2, tst_docs=1, labels="used", extra_params=TINY)


def test_every_method_trains_predicts_and_lands_in_the_report(repo):
    p = run(["dvc", "repro", "report"], repo, timeout=900)
    ran = set(stages_run(p.stdout))
    expected = {"graph", "train_ramen@ramen", "predict@ramen", "train_unidec@unidec", "predict_unidec@unidec", "train_astra@astra",
                "predict@astra", "maclr_pseudo_pairs", "train_maclr@maclr", "predict@maclr", "fuse@astra",
                "fuse@unidec_de_only", "name_match", "name_match_prior"} | {f"evaluate@{m}" for m in METHODS}
    assert expected <= ran, expected - ran
    table = (repo / "reports/comparison.md").read_text()
    for m in METHODS:
        assert f"| {m} |" in table
        metrics = json.loads((repo / f"metrics/{m}.json").read_text())
        assert metrics["n_test"] > 0 and 0.0 <= metrics["P@1"] <= 100.0
    astra = json.loads((repo / "models/astra/train_summary.json").read_text())
    assert astra["refreshed_at_epochs"] == [1, 2] and astra["epochs"] == 3
    assert (repo / "plots/train/astra/plots/metrics/train/uniform.tsv").is_file()   # ASTRA's loss parts, live
    assert "stage2" in json.loads((repo / "plots/train/maclr/metrics.json").read_text())
    assert (repo / "reports/validation/graph.html").exists()
    assert stages_run(run(["dvc", "repro", "report"], repo).stdout) == []
    # every method's model package predicts through the public API exactly what the pipeline predicted
    ran = set(stages_run(run(["dvc", "repro", PACKAGES], repo, timeout=900).stdout))
    assert {f"package@{m}" for m in METHODS} <= ran
    assert_packages_predict_like_the_pipeline(repo, METHODS)


def test_graph_stage_reruns_only_when_the_graph_or_its_params_change(repo):
    run(["dvc", "repro", "graph"], repo)
    set_param(repo, "ramen.defaults.regulariser.lambda_x", 0.25)   # a training knob: the graph stays
    assert stages_run(run(["dvc", "repro", "graph"], repo).stdout) == []
    set_param(repo, "ramen.graph.walk.top_k", 2)                  # a walk knob: the graph is rebuilt
    assert stages_run(run(["dvc", "repro", "graph"], repo).stdout) == ["graph"]
