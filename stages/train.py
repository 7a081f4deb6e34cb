"""Train one run of any method -> models/<run>/ (+ checkpoints/<run>/ to resume, plots/train/<run>/).

Usage: ``python -m stages.train <run>``. The run is looked up in params.yaml wherever its method keeps
its runs (``runs``, ``ramen.runs``, ``unidec.runs``, ``astra.runs``, ``maclr.runs``, ``maclr.fewshot.runs``,
``pretrained``, ``st_mnrl``); a killed run resumes from its last checkpoint.
"""

from __future__ import annotations

import sys

from xmc.config import load_params, run_entry_point
from xmc.errors import ConfigError


def main() -> None:
    if len(sys.argv) != 2:
        raise ConfigError("usage: python -m stages.train <run>")
    from xmc.methods.base import train_run

    train_run(load_params(), sys.argv[1])


if __name__ == "__main__":
    run_entry_point(main)
