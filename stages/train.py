"""Train one run of any method -> models/<run>/ (+ checkpoints/<run>/ to resume, plots/train/<run>/).

Usage: ``python -m stages.train <run>`` (a run of params ``runs``); a killed run resumes from its last checkpoint.
With ``train.nproc_per_node`` > 1 the stage relaunches itself under torchrun (data parallel,
``xmc.trainer.distributed``). ``xmc train`` calls the same harness (``xmc.methods.harness.train_run``).
"""

from __future__ import annotations

import os
import sys

from xmc.config import load_params, run_entry_point
from xmc.config.runs import resolve_run
from xmc.encoders.cache import configure_from_params
from xmc.errors import ConfigError
from xmc.methods.base import ranks_of
from xmc.methods.harness import train_run
from xmc.workspace import product_workspace


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
    ranks = ranks_of(run)
    if ranks > 1 and "WORLD_SIZE" not in os.environ:
        relaunch_under_torchrun(ranks, sys.argv[1:])
    train_run(params, run, product_workspace(params))


if __name__ == "__main__":
    run_entry_point(main)
