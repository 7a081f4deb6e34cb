"""Score a lab run's predictions (xmc.evaluation) into its results folder: the linear-peer variants, which predict
in their own environment. Usage: ``python -m lab.stages.evaluate <run> [val] [tst]``."""

from __future__ import annotations

import sys

from lab.results import lab_workspace
from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.evaluation import evaluate_and_write
from xmc.io import read_json
from xmc.predictions import run_and_splits


def main() -> None:
    name, splits = run_and_splits(sys.argv[1:], "python -m lab.stages.evaluate <run> [val] [tst]")
    params = load_params()
    ws = lab_workspace(name)
    timing = ws.predictions(name) / "timing.json"
    ds = load_processed(ws.processed, splits=("trn", *splits))
    evaluate_and_write(ws, name, ds, splits, params, read_json(timing) if timing.is_file() else None)


if __name__ == "__main__":
    run_entry_point(main)
