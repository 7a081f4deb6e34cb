"""Train one run of any method -> models/<run>/ (+ checkpoints/<run>/ to resume, plots/train/<run>/).

Usage: ``python -m stages.train <run>`` (a run of params ``runs``); a killed run resumes from its last checkpoint.
With ``train.nproc_per_node`` > 1 the stage relaunches itself under torchrun (data parallel,
``xmc.trainer.distributed``). ``xmc train`` calls the same harness (``xmc.methods.harness.train_run``).
Files in plots/train/<run>/ that the training record does not hold (an older writer's ``loss.csv``) are removed
before the run trains.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from xmc.config import load_params, run_entry_point
from xmc.config.runs import resolve_run
from xmc.encoders.cache import configure_from_params
from xmc.errors import ConfigError
from xmc.methods.base import ranks_of
from xmc.methods.harness import train_run
from xmc.ranks import exit_rank
from xmc.workspace import product_workspace

# what a run's training record holds (xmc.trainer.live: DVCLive's summary and histories); the folder persists across
# runs (a killed run resumes its histories), so a file another writer left there would sit beside them as this run's
RECORD_FILES = ("metrics.json",)
RECORD_DIRS = ("plots/metrics",)
log = logging.getLogger("stages.train")


def remove_stale_record_files(record: Path) -> list[Path]:
    """Remove every file under ``record`` (plots/train/<run>/) outside :data:`RECORD_FILES` and
    :data:`RECORD_DIRS`, and the folders left empty; returns the files removed."""
    if not record.is_dir():
        return []
    kept = [record / d for d in RECORD_DIRS]
    stale = [f for f in sorted(record.rglob("*")) if (f.is_file() or f.is_symlink())
             and f.relative_to(record).as_posix() not in RECORD_FILES and not any(f.is_relative_to(k) for k in kept)]
    for f in stale:
        f.unlink()
    for d in sorted((d for d in record.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
        if not any(d.iterdir()) and not any(d == k or k.is_relative_to(d) for k in kept):
            d.rmdir()
    return stale


def relaunch_under_torchrun(ranks: int, argv: list[str], module: str = "stages.train") -> None:
    """Data parallel: this process becomes torchrun, which starts one process per rank running ``module``
    (xmc.trainer.distributed); the ranks stop if the launcher dies."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           "-m", module, *argv]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)


def main() -> None:
    if len(sys.argv) != 2:
        raise ConfigError("usage: python -m stages.train <run>")
    params = load_params()
    run = resolve_run(params, sys.argv[1])
    configure_from_params(params)   # large encodings are reused across stages (params.yaml: encode_cache)
    if os.environ.get("RANK", "0") == "0":   # the launcher or rank 0: the process that writes the record
        for f in remove_stale_record_files(product_workspace(params).training_record(run.name)):
            log.warning("removed %s: not part of the training record (left by an older run)", f)
    ranks = ranks_of(run)
    if ranks > 1 and "WORLD_SIZE" not in os.environ:
        relaunch_under_torchrun(ranks, sys.argv[1:])
    train_run(params, run, product_workspace(params))


if __name__ == "__main__":
    run_entry_point(main, finish=exit_rank)   # a torchrun rank ends without interpreter finalisation (exit_rank)
