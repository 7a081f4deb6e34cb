"""Train one run of any method -> models/<run>/ (+ checkpoints/<run>/ to resume, plots/train/<run>/).

Usage: ``python -m stages.train <run>``. The run is looked up in params.yaml wherever its method keeps
its runs (``runs``, ``ramen.runs``, ``unidec.runs``, ``astra.runs``, ``maclr.runs``, ``maclr.fewshot.runs``,
``pretrained``, ``st_mnrl``); a killed run resumes from its last checkpoint. With ``train.nproc_per_node`` > 1
the stage relaunches itself under torchrun (data parallel, ``xmc.train.distributed``).
"""

from __future__ import annotations

import os
import sys

from xmc.config import load_params, run_entry_point
from xmc.errors import ConfigError


def main() -> None:
    if len(sys.argv) != 2:
        raise ConfigError("usage: python -m stages.train <run>")
    from xmc.methods.base import ranks_of, train_run
    from xmc.methods.runs import find_run

    params = load_params()
    from xmc.encoders.cache import configure_from_params

    configure_from_params(params)   # large encodings are reused across stages (params.yaml: encode_cache)
    ranks = ranks_of(find_run(params, sys.argv[1]))
    if ranks > 1 and "WORLD_SIZE" not in os.environ:
        # data parallel: this process becomes torchrun, which starts one process per rank running this stage
        # (xmc.train.distributed); the ranks stop if the launcher dies
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               "-m", "stages.train", sys.argv[1]]
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, cmd)
    train_run(params, sys.argv[1])


if __name__ == "__main__":
    run_entry_point(main)
