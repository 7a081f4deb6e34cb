"""One rank of a two-rank test run, launched by the real launcher:
``torchrun --nproc_per_node 2 -m tests.distributed_worker METHOD OPTIONS_JSON OUT_DIR RESULT_JSON``.

It joins the process group torchrun describes (gloo, one thread per rank), runs ``tests.test_distributed.TRAIN
[METHOD]`` and ends the rank as ``stages.train`` does (:func:`xmc.parallel.exit_rank`)."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch

from xmc.parallel import exit_rank, init_from_env


def main(argv: list[str]) -> None:
    method, options, out, result = argv
    torch.set_num_threads(1)
    init_from_env("gloo")
    from tests.test_distributed import TRAIN

    try:
        TRAIN[method](json.loads(options), Path(out), Path(result))
    except BaseException:
        traceback.print_exc()
        exit_rank(1)
    exit_rank(0)


if __name__ == "__main__":
    main(sys.argv[1:])
