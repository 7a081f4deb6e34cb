"""Dense stages through DVC on a tiny real slice: train, index, evaluate, report; kill and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.pipeline_repo import PACKAGES, SEMCOR, assert_packages_predict_like_the_pipeline, env, make_repo, run, stages_run
from xmc.trainer.checkpoint import load_checkpoint

pytestmark = pytest.mark.skipif(not SEMCOR.exists(), reason="../shared/datasets/semcor-wn30 not present")

TINY = {
    "dual_encoder.train.max_steps_per_epoch": 3,
    "dual_encoder.train.batch_size": 16,
    "dual_encoder.train.checkpoint_every_steps": 1,
    "bow_encoder.train.epochs": 2,
    # MiniLM on 16 tokens a side (semcor sentences run to ~30): the same code path, about half its compute
    "dual_encoder.encoder.max_len_query": 16,
    "dual_encoder.encoder.max_len_label": 16,
    "pretrained.minilm_zeroshot.encoder.max_len_query": 16,
    "pretrained.minilm_zeroshot.encoder.max_len_label": 16,
    "bow_encoder.encoder.n_buckets": 4096,
    # the DEXML family only: the other methods have their own tiny end-to-end test (test_methods_e2e); the
    # bag-of-words loss and sampler variants are unit-tested (test_losses, test_training) and kept out of the
    # CI's longest file
    "methods": ["minilm_zeroshot", "st_mnrl", "dexml", "dexml_bow"],
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    # 3 training documents: one becomes the validation split, two leave more than 8 steps of 16 per epoch
    return make_repo(tmp_path_factory.mktemp("dense"), trn_docs=3, tst_docs=1, labels="used", extra_params=TINY)


def test_dense_methods_train_index_and_land_in_the_report(repo):
    p = run(["dvc", "repro", "report"], repo, timeout=900)
    ran = set(stages_run(p.stdout))
    for name in ("dexml", "dexml_bow"):
        assert f"train@{name}" in ran and f"predict@{name}" in ran and f"evaluate@{name}" in ran
    assert {"train_st_mnrl", "train_pretrained@minilm_zeroshot", "predict@st_mnrl"} <= ran
    table = (repo / "reports/comparison.md").read_text()
    for m in ("minilm_zeroshot", "st_mnrl", "dexml", "dexml_bow"):
        assert f"| {m} |" in table
    # the trained DEXML model is a sentence-transformers folder and differs from the base model
    from sentence_transformers import SentenceTransformer

    a = SentenceTransformer(str(repo / "models/dexml"), device="cpu").encode(["a test sentence"])
    b = SentenceTransformer(str(repo / "models/minilm_zeroshot"), device="cpu").encode(["a test sentence"])
    assert abs(a - b).max() > 1e-4
    dex = json.loads((repo / "metrics/dexml.json").read_text())
    assert dex["train_seconds"] > 0 and dex["n_test"] > 0
    summary = json.loads((repo / "models/dexml/train_summary.json").read_text())
    assert summary["steps"] == 3 and summary["refreshed_at_epochs"] == [0]
    card = (repo / "models/dexml/README.md").read_text()   # not sentence-transformers' generic card
    assert card.startswith("# dexml: a sentence encoder trained by xmc") and "Base model" not in card
    live = repo / "plots/train/dexml_bow"
    assert (live / "plots/metrics/train/loss.tsv").read_text().split("\n")[0].split("\t") == ["step", "loss"]
    assert {"P@1", "P@5", "PSP@5", "R@100"} <= set(json.loads((live / "metrics.json").read_text())["val"])
    # `dvc metrics show` lists the training record next to the methods' test metrics
    shown = run(["dvc", "metrics", "show", "--json"], repo).stdout
    assert "plots/train/dexml_bow/metrics.json" in shown and "metrics/dexml_bow.json" in shown
    assert stages_run(run(["dvc", "repro", "report"], repo).stdout) == []
    packaged = ["minilm_zeroshot", "st_mnrl", "dexml", "dexml_bow"]
    assert {f"package@{m}" for m in packaged} <= set(stages_run(run(["dvc", "repro", PACKAGES], repo, timeout=900).stdout))
    assert_packages_predict_like_the_pipeline(repo, packaged)


def test_killed_training_resumes_from_last_checkpoint(repo):
    from tests.pipeline_repo import set_param

    set_param(repo, "dual_encoder.train.max_steps_per_epoch", 8)
    ckpt = repo / "checkpoints/dexml/checkpoint.pt"
    proc = subprocess.Popen(["dvc", "repro", "train@dexml"], cwd=repo, env=env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    step = 0
    try:
        while time.time() < deadline and proc.poll() is None:
            if ckpt.exists():
                try:
                    state = load_checkpoint(ckpt)
                    step = state["step_in_epoch"]
                except Exception:  # being replaced right now
                    step = 0
                if 2 <= step < 8 and state["global_step"] == step:
                    break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # kill dvc and the training process mid-epoch
        proc.wait(timeout=30)
    assert 2 <= step < 8, "training did not reach a mid-epoch checkpoint in time"
    p = run(["dvc", "repro", "train@dexml"], repo, timeout=600)
    assert "resumed from" in p.stderr
    summary = json.loads((repo / "models/dexml/train_summary.json").read_text())
    assert summary["steps"] == 8
