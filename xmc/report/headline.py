"""The headline metrics files: what ``dvc metrics show`` reads (``metrics/key_metrics/<run>.json``, and
``metrics_val/key_metrics/<run>.json`` for the validation split).

A run's full record stays ``metrics/<run>.json`` (every P@k, nDCG@k, PSP@k, R@k, the counts, the 95 % intervals
``ci95`` and a hybrid's ``by_name_match`` breakdown): the report, the lab, the registry and the tests read it. DVC
flattens every nested key of a declared metrics file into a column (a hybrid's breakdown alone is 16), so the
files declared under ``metrics:`` in dvc.yaml are these few scalars, one row of a table a terminal can show.

One-off conversion of results written before the headline files existed (or to check them)::

    python -m xmc.report.headline results/semcor-wn30 results/debian-relations

writes ``key_metrics/<run>.json`` beside every ``metrics/<run>.json`` and ``metrics_val/<run>.json`` of each folder,
exactly what the package, fuse and evaluate stages write after each evaluation.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from xmc.io import read_json, write_json

# the report's ranking metrics (and the registry gate's P@1, P@5, PSP@5); the rest stays in the full record
HEADLINE_METRICS = ("P@1", "P@5", "nDCG@5", "PSP@5", "R@100")
# under metrics/ (and metrics_val/): committed with them by the nightly flow (flows.registry.RESULT_PATHS)
HEADLINE_DIR = "key_metrics"
# the folders of a results/<data.name>/ that hold full records: test, validation
METRICS_DIRS = ("metrics", "metrics_val")


def headline_path(metrics_file: str | Path) -> Path:
    """``metrics/<run>.json`` -> ``metrics/key_metrics/<run>.json`` (the same for ``metrics_val/``)."""
    p = Path(metrics_file)
    return p.parent / HEADLINE_DIR / p.name


def headline(metrics: dict[str, Any]) -> dict[str, float]:
    """The headline scalars of a full record, in :data:`HEADLINE_METRICS` order (a metric it lacks or holds as
    no number is left out: a DVC column of "-" says so)."""
    out: dict[str, float] = {}
    for k in HEADLINE_METRICS:
        v = metrics.get(k)
        # bool is an int: never a metric
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = v
    return out


def write_headline(metrics_file: str | Path) -> Path:
    """Write the headline file of the full record ``metrics_file``; returns its path."""
    out = headline_path(metrics_file)
    write_json(out, headline(read_json(metrics_file)))
    return out


def write_headlines(metrics_files: Iterable[str | Path]) -> list[Path]:
    """:func:`write_headline` of each file, in order."""
    return [write_headline(f) for f in metrics_files]


def full_records(results_dir: str | Path) -> list[Path]:
    """Every full record (``metrics/<run>.json``, ``metrics_val/<run>.json``) of one ``results/<data.name>/``."""
    root = Path(results_dir)
    return [f for d in METRICS_DIRS for f in sorted((root / d).glob("*.json"))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m xmc.report.headline", description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="results/<data.name>/ folders")
    args = ap.parse_args(argv)
    for r in args.results:
        written = write_headlines(full_records(r))
        print(f"{r}: {len(written)} headline files")


if __name__ == "__main__":
    main()
