"""kill -9 in the middle of writing an output: the rerun completes and its outputs equal an uninterrupted run.

Each stage runs as its own process (``python -m stages.<stage>``) with ``XMC_KILL_AT=<point>[:n]``, which makes
it SIGKILL itself at that point: after the new output is complete in its temporary folder but before it
replaces the old one, between the two renames of that replacement, and while a training checkpoint is
being written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline_repo import ROOT, results_of
from tests.test_bad_inputs import write_dataset

TINY_RUN = ("  tiny_bow: {method: dexml, encoder: {kind: bow, dim: 16, n_buckets: 4096, ngram_max: 1, seed: 0}, "
            "negatives: {kind: in_batch, max_positives_per_query: 0}, "
            "train: {epochs: 3, batch_size: 8, lr: 0.05, max_steps_per_epoch: 0, checkpoint_every_steps: 1, "
            "checkpoint_interval_minutes: 0, eval_every_epochs: 0, seed: 0}}\n")


def run(repo: Path, args: list[str], kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), XMC_THREADS="1")
    env.pop("XMC_KILL_AT", None)
    if kill_at:
        env["XMC_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=300)


def digest(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in skip}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name) if parent.exists() else []


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    r = tmp_path_factory.mktemp("kill")
    shutil.copy2(ROOT / "dvc.yaml", r / "dvc.yaml")
    d = write_dataset(r.parent / f"{r.name}_dataset")
    text = (ROOT / "params.yaml").read_text()
    text = text.replace("dataset_dir: ../shared/datasets/semcor-wn30", f"dataset_dir: {d}")
    text = text.replace("    fraction: 0.1 ", "    fraction: 0.25")
    assert "runs:\n  label_prior: {method: label_prior}\n" in text
    text = text.replace("runs:\n  label_prior: {method: label_prior}\n",
                        "runs:\n  label_prior: {method: label_prior}\n" + TINY_RUN)
    (r / "params.yaml").write_text(text)
    return r


def test_ingest_killed_before_or_during_replace_reruns_to_the_same_output(repo):
    p = run(repo, ["stages.ingest"])
    assert p.returncode == 0, p.stderr
    reference = digest(results_of(repo) / "data/processed")
    for point in ("atomic_dir.before_replace", "atomic_dir.between_renames"):
        killed = run(repo, ["stages.ingest"], kill_at=point)
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr[-2000:])
        assert leftovers(results_of(repo) / "data"), f"{point}: the kill should leave a temporary behind"
        p = run(repo, ["stages.ingest"])
        assert p.returncode == 0, p.stderr
        assert digest(results_of(repo) / "data/processed") == reference, point
        assert leftovers(results_of(repo) / "data") == [], point


def _package_outputs(repo: Path) -> dict[str, str]:
    """The package's predictor files and the predictions (the manifest, its card and the test metrics carry the
    prediction seconds, which differ between runs)."""
    return (digest(results_of(repo) / "packages/tiny_bow", skip=("manifest.json", "README.md"))
            | digest(results_of(repo) / "predictions/tiny_bow", skip=("timing.json",))
            | digest(results_of(repo) / "metrics_val") | digest(results_of(repo) / "evaluation"))


def test_package_killed_while_writing_reruns_to_the_same_output(repo):
    if not (results_of(repo) / "data/processed").exists():
        assert run(repo, ["stages.ingest"]).returncode == 0
    if not (results_of(repo) / "models/tiny_bow").exists():
        assert run(repo, ["stages.train", "tiny_bow"]).returncode == 0
    p = run(repo, ["stages.package", "tiny_bow"])
    assert p.returncode == 0, p.stderr
    reference = _package_outputs(repo)
    assert any(k.startswith("encoder/") for k in reference) and "val_topk.npz" in reference
    killed = run(repo, ["stages.package", "tiny_bow"], kill_at="atomic_dir.before_replace")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert leftovers(results_of(repo) / "packages"), "the kill should leave the new package's temporary behind"
    p = run(repo, ["stages.package", "tiny_bow"])
    assert p.returncode == 0, p.stderr
    assert _package_outputs(repo) == reference
    assert leftovers(results_of(repo) / "packages") == [] and leftovers(results_of(repo) / "predictions") == []


def test_training_killed_while_writing_a_checkpoint_resumes_to_the_same_model(repo):
    import torch

    if not (results_of(repo) / "data/processed").exists():
        assert run(repo, ["stages.ingest"]).returncode == 0
    shutil.rmtree(results_of(repo) / "models/tiny_bow", ignore_errors=True)
    shutil.rmtree(results_of(repo) / "checkpoints/tiny_bow", ignore_errors=True)
    p = run(repo, ["stages.train", "tiny_bow"])
    assert p.returncode == 0, p.stderr
    reference = torch.load(results_of(repo) / "models/tiny_bow/bow_encoder.pt", weights_only=True)
    shutil.rmtree(results_of(repo) / "models/tiny_bow")
    shutil.rmtree(results_of(repo) / "checkpoints/tiny_bow")
    # killed on the 4th checkpoint write: the 3rd checkpoint is on disk, the 4th only half-way
    killed = run(repo, ["stages.train", "tiny_bow"], kill_at="checkpoint.before_replace:4")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (results_of(repo) / "checkpoints/tiny_bow/checkpoint.pt").exists() and not (results_of(repo) / "models/tiny_bow").exists()
    assert list((results_of(repo) / "checkpoints/tiny_bow").glob(".checkpoint.pt.tmp-*"))
    p = run(repo, ["stages.train", "tiny_bow"])
    assert p.returncode == 0, p.stderr
    assert "resumed from" in p.stderr
    resumed = torch.load(results_of(repo) / "models/tiny_bow/bow_encoder.pt", weights_only=True)
    assert resumed.keys() == reference.keys()
    for k in reference:
        assert torch.equal(resumed[k], reference[k]), k
    assert not list((results_of(repo) / "checkpoints/tiny_bow").glob(".checkpoint.pt.tmp-*"))
