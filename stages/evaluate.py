"""Evaluate one prediction's top-k on the validation and test splits (xmc.evaluation): what the linear peer's
stage runs after predicting in its own environment (every packaged run is evaluated by its package stage).

Usage: ``python -m stages.evaluate <name> [val] [tst]`` -> metrics_val/<name>.json, metrics/<name>.json,
evaluation/{val,tst}/<name>.npz, plots/eval/<name>/, and the headline of each split's metrics
(metrics/key_metrics/<name>.json, metrics_val/key_metrics/<name>.json: what ``dvc metrics show`` reads).
"""

from __future__ import annotations

import sys

from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.evaluation import evaluate_and_write
from xmc.io import read_json
from xmc.predictions import run_and_splits
from xmc.report.headline import write_headlines
from xmc.workspace import product_workspace


def main() -> None:
    name, splits = run_and_splits(sys.argv[1:], "python -m stages.evaluate <name> [val] [tst]")
    params = load_params()
    ws = product_workspace(params)
    timing_file = ws.predictions(name) / "timing.json"
    for split in splits:
        if not (ws.predictions(name) / f"{split}_topk.npz").is_file():
            raise ConfigError(f"{ws.predictions(name) / f'{split}_topk.npz'}: no predictions of {name!r}")
    ds = load_processed(ws.processed, splits=("trn", *splits))
    timing = read_json(timing_file) if timing_file.is_file() else None
    written = evaluate_and_write(ws, name, ds, splits, params, timing)
    write_headlines(ws.metrics(name, split) for split in written)


if __name__ == "__main__":
    run_entry_point(main)
