"""Dense runs through DVC on a tiny real slice: the MiniLM encoder off the shelf and the DEXML bag-of-words run,
trained, packaged, evaluated and reported; a killed training resumes from its last checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.pipeline_repo import SEMCOR, assert_packages_predict_like_the_pipeline, env, make_repo, run, stages_run, results_of
from xmc.trainer.checkpoint import load_checkpoint

pytestmark = pytest.mark.skipif(not SEMCOR.exists(), reason="../shared/datasets/semcor-wn30 not present")

SMALL_BOW = {"kind": "bow", "dim": 32, "n_buckets": 4096, "ngram_max": 2, "tied": True, "dropout": 0.0}
TINY = {
    # MiniLM on 16 tokens a side (semcor sentences run to ~30): the same code path, about half its compute
    "runs": {"minilm_zeroshot": {"method": "pretrained", "encoder": {"max_len_query": 16, "max_len_label": 16}},
             "dexml_bow": {"method": "dexml", "encoder": SMALL_BOW,
                           "train": {"epochs": 2, "checkpoint_every_steps": 1, "checkpoint_interval_minutes": 0}}},
    "hybrids": {"dexml_bow_hybrid": {"base": "dexml_bow"}},
    "xr_linear": {},
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    # 3 training documents: one becomes the validation split
    return make_repo(tmp_path_factory.mktemp("dense"), trn_docs=3, tst_docs=1, labels="used", extra_params=TINY)


def test_dense_runs_train_package_and_land_in_the_report(repo):
    p = run(["dvc", "repro"], repo, timeout=900)
    ran = set(stages_run(p.stdout))
    for name in ("minilm_zeroshot", "dexml_bow"):
        assert f"train@{name}" in ran and f"package@{name}" in ran
    assert "fuse@dexml_bow_hybrid" in ran
    table = (results_of(repo) / "reports/comparison.md").read_text()
    for m in ("minilm_zeroshot", "dexml_bow", "dexml_bow_hybrid"):
        assert f"| {m} |" in table
    dex = json.loads((results_of(repo) / "metrics/dexml_bow.json").read_text())
    assert dex["train_seconds"] > 0 and dex["n_test"] > 0
    live = results_of(repo) / "plots/train/dexml_bow"
    assert (live / "plots/metrics/train/loss.tsv").read_text().split("\n")[0].split("\t") == ["step", "loss"]
    assert {"P@1", "P@5", "PSP@5", "R@100"} <= set(json.loads((live / "metrics.json").read_text())["val"])
    # `dvc metrics show` lists the evaluations, not the training records
    shown = run(["dvc", "metrics", "show", "--json"], repo).stdout
    assert "metrics/dexml_bow.json" in shown and "plots/train/dexml_bow/metrics.json" not in shown
    # one copy of the weights: the package and the hybrid's package hold hard links of the trained table
    table_file = results_of(repo) / "models/dexml_bow/bow_encoder.pt"
    for linked in (results_of(repo) / "packages/dexml_bow/encoder/bow_encoder.pt",
                   results_of(repo) / "packages/dexml_bow_hybrid/base/encoder/bow_encoder.pt"):
        assert linked.stat().st_ino == table_file.stat().st_ino, linked
    assert stages_run(run(["dvc", "repro"], repo).stdout) == []
    assert_packages_predict_like_the_pipeline(repo, ["minilm_zeroshot", "dexml_bow", "dexml_bow_hybrid"])


def test_killed_training_resumes_from_last_checkpoint(repo):
    from tests.pipeline_repo import set_param

    # enough epochs that the run is still going when its second checkpoint is seen (a step here takes
    # milliseconds): the kill must land mid-run
    set_param(repo, "runs.dexml_bow.train.epochs", 40)
    ckpt = results_of(repo) / "checkpoints/dexml_bow/checkpoint.pt"
    proc = subprocess.Popen(["dvc", "repro", "train@dexml_bow"], cwd=repo, env=env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    step = 0
    try:
        while time.time() < deadline and proc.poll() is None:
            if ckpt.exists():
                try:
                    state = load_checkpoint(ckpt)
                    step = state["global_step"]
                except Exception:  # being replaced right now
                    step = 0
                if step >= 2:
                    break
            time.sleep(0.02)
    finally:
        finished = proc.poll() is not None
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # kill dvc and the training process mid-run
        except ProcessLookupError:  # the whole group had already exited
            pass
        proc.wait(timeout=30)
    assert not finished, f"the training exited (rc {proc.returncode}) before it could be killed mid-run"
    assert step >= 2, "training did not reach a checkpoint in time"
    p = run(["dvc", "repro", "train@dexml_bow"], repo, timeout=600)
    assert "resumed from" in p.stderr
    summary = json.loads((results_of(repo) / "models/dexml_bow/train_summary.json").read_text())
    assert summary["epochs"] == 40
