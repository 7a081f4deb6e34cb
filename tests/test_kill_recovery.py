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
import tempfile
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


@pytest.fixture(scope="module")
def uninterrupted(repo) -> dict:
    """The weights of an uninterrupted training of tiny_bow."""
    import torch

    if not (results_of(repo) / "data/processed").exists():
        assert run(repo, ["stages.ingest"]).returncode == 0
    model, ckpt = results_of(repo) / "models/tiny_bow", results_of(repo) / "checkpoints/tiny_bow"
    shutil.rmtree(model, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    p = run(repo, ["stages.train", "tiny_bow"])
    assert p.returncode == 0, p.stderr
    assert not (ckpt / "checkpoint.pt").exists()   # a finished run keeps no checkpoint
    return torch.load(model / "bow_encoder.pt", weights_only=True)


@pytest.mark.parametrize("point", ["train.before_save", "atomic_dir.before_replace", "train.after_save"])
def test_training_killed_at_its_end_resumes_from_its_checkpoint_to_the_same_model(repo, uninterrupted, point):
    """A kill after the last step (before the model is saved, while its folder replaces the old one, or just after)
    keeps the checkpoint: the rerun resumes from it instead of training from the start, and saves the same weights."""
    import torch

    reference = uninterrupted
    model, ckpt = results_of(repo) / "models/tiny_bow", results_of(repo) / "checkpoints/tiny_bow"
    shutil.rmtree(model, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    killed = run(repo, ["stages.train", "tiny_bow"], kill_at=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (ckpt / "checkpoint.pt").exists(), f"{point}: the checkpoint went before the model was in place"
    p = run(repo, ["stages.train", "tiny_bow"])
    assert p.returncode == 0, p.stderr
    assert "resumed from" in p.stderr, point
    resumed = torch.load(model / "bow_encoder.pt", weights_only=True)
    assert resumed.keys() == reference.keys()
    for k in reference:
        assert torch.equal(resumed[k], reference[k]), (point, k)
    assert not (ckpt / "checkpoint.pt").exists() and leftovers(results_of(repo) / "models") == []


# ------------------------------------------------------------------------------ a full disk
def _can_mount_tmpfs() -> bool:
    """A private mount namespace (``unshare -r -m``) lets a test mount a small tmpfs: a real full disk, no root."""
    if shutil.which("unshare") is None:
        return False
    p = subprocess.run(["unshare", "-r", "-m", "sh", "-c", "d=$(mktemp -d) && mount -t tmpfs -o size=4k none $d"],
                       capture_output=True, timeout=30)
    return p.returncode == 0


def run_on_full_disk(repo: Path, mount_at: Path, size_kib: int, command: list[str], keep: Path | None = None
                     ) -> subprocess.CompletedProcess:
    """``command`` with a ``size_kib`` tmpfs mounted over ``mount_at`` (holding a copy of what ``keep`` held before
    the mount, if given), in a mount namespace of its own: what it writes there fills that small disk, and nothing
    outside sees the mount. The files left on that disk are listed on stderr after ``--- after:``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), XMC_THREADS="1")
    env.pop("XMC_KILL_AT", None)
    mount_at.mkdir(parents=True, exist_ok=True)
    stash = tempfile.mkdtemp(prefix="full-disk-") if keep is not None else None
    if stash is not None:   # the previous outputs go back in first: a full disk must leave them as they were
        shutil.copytree(keep, stash, dirs_exist_ok=True)
    script = (f'mount -t tmpfs -o size={size_kib}k none "{mount_at}" || exit 99; '
              + (f'cp -a "{stash}/." "{mount_at}/" || exit 98; ' if stash else "")
              + f'"$@"; rc=$?; echo "--- after:" >&2; (cd "{mount_at}" && find . -type f | sort) >&2; exit $rc')
    try:
        return subprocess.run(["unshare", "-r", "-m", "sh", "-c", script, "sh", *command], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        if stash is not None:
            shutil.rmtree(stash, ignore_errors=True)


def _files_after(stderr: str) -> list[str]:
    return stderr.split("--- after:\n", 1)[1].split() if "--- after:" in stderr else []


def _error_line(stderr: str) -> str:
    # a progress bar may precede it on the same line (its carriage returns are not newlines)
    return [line[line.index("error:"):] for line in stderr.split("--- after:")[0].splitlines() if "error:" in line][-1]


@pytest.fixture(scope="module")
def trained(repo):
    if not (results_of(repo) / "data/processed").exists():
        assert run(repo, ["stages.ingest"]).returncode == 0
    if not (results_of(repo) / "models/tiny_bow/bow_encoder.pt").exists():
        assert run(repo, ["stages.train", "tiny_bow"]).returncode == 0
    if not (results_of(repo) / "packages/tiny_bow").exists():
        assert run(repo, ["stages.package", "tiny_bow"]).returncode == 0
    return repo


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="no private mount namespace here (unshare -r -m)")
def test_a_full_disk_is_one_line_naming_the_path_and_the_previous_outputs_stay(trained, tmp_path):
    repo, res = trained, results_of(trained)
    # prediction: the output's disk fills up -> one line naming the output, exit 3 (a resource error), no output
    texts = tmp_path / "in.txt"
    texts.write_text("".join(f"a sentence about the river bank number {i}\n" for i in range(400)))
    out_dir = tmp_path / "full"
    p = run_on_full_disk(repo, out_dir, 8, [sys.executable, "-m", "xmc.cli", "predict", str(res / "packages/tiny_bow"),
                                            "--input", str(texts), "--output", str(out_dir / "out.jsonl"), "-k", "20"])
    assert p.returncode == 3, p.stderr[-3000:]
    line = _error_line(p.stderr)
    assert "No space left on device" in line and str(out_dir) in line, line
    assert _files_after(p.stderr) == [], p.stderr[-2000:]   # no half-written output, no temporary
    assert "Traceback" not in p.stderr

    # training: the checkpoint folder's disk is full -> one line naming the checkpoint, exit 3
    shutil.rmtree(res / "checkpoints/tiny_bow", ignore_errors=True)
    before = digest(res / "models/tiny_bow")
    p = run_on_full_disk(repo, res / "checkpoints/tiny_bow", 4, [sys.executable, "-m", "stages.train", "tiny_bow"])
    assert p.returncode == 3, p.stderr[-3000:]
    line = _error_line(p.stderr)
    assert "No space left on device" in line and "checkpoint" in line, line
    assert "Traceback" not in p.stderr and _files_after(p.stderr) == [], p.stderr[-2000:]
    assert digest(res / "models/tiny_bow") == before   # the previous model is untouched

    # training: the model folder's disk holds the previous model but not a second copy -> it stays as it was
    models = res / "models"
    kib = sum(f.stat().st_size for f in (models / "tiny_bow").rglob("*") if f.is_file()) // 1024
    p = run_on_full_disk(repo, models, kib + 24, [sys.executable, "-m", "stages.train", "tiny_bow"], keep=models)
    assert p.returncode == 3, p.stderr[-3000:]
    line = _error_line(p.stderr)
    assert "No space left on device" in line and "models" in line, line
    assert "Traceback" not in p.stderr
    after = _files_after(p.stderr)
    assert all(".tmp-" not in f and ".old-" not in f for f in after), after   # no temporary left behind
    assert sorted(f"./tiny_bow/{k}" for k in before) == sorted(f for f in after if f.startswith("./tiny_bow/"))
