"""Fuse runs with the label-name matches -> packages/<hybrid>/ with its predictions and metrics (xmc.package.fuse).

Usage: ``python -m stages.fuse <hybrid>`` for each hybrid of params ``hybrids``: its base run's top-k ∪ the
labels named in the text, re-scored by a fusion fit on validation, or chosen there without training labels for
``fusion: valtuned``. The headline of each split's metrics (``metrics/key_metrics/<hybrid>.json``, and
``metrics_val/``: what ``dvc metrics show`` reads) is written from the full record (xmc.report.headline).
"""

from __future__ import annotations

import sys

from xmc.config import load_params, run_entry_point
from xmc.errors import ConfigError
from xmc.machine import set_threads
from xmc.package.fuse import fuse
from xmc.report.headline import write_headlines
from xmc.workspace import product_workspace


def main() -> None:
    args = sys.argv[1:]
    params = load_params()
    set_threads()
    if len(args) != 1:
        raise ConfigError("usage: python -m stages.fuse <hybrid>")
    hybrids = params["hybrids"]
    if args[0] not in hybrids:
        raise ConfigError(f"params.yaml: {args[0]!r} is not under hybrids (have: {', '.join(hybrids)})")
    h = hybrids[args[0]]
    ws = product_workspace(params)
    summary = fuse(params, args[0], [h["base"]], ws, valtuned=h["fusion"] == "valtuned")
    write_headlines(ws.metrics(args[0], split) for split in summary["splits"])


if __name__ == "__main__":
    run_entry_point(main)
