"""Package one trained run -> packages/<run>/ with its predictions and metrics (xmc.package.build.package_run).

Usage: ``python -m stages.package <run>``. The predictor is built into the package (weights hard-linked from
models/<run>/, the label index over its label vectors), predicts the validation and test splits
(predictions/<run>/) and is evaluated there (metrics_val/<run>.json, metrics/<run>.json, evaluation/): what the
package serves is what is reported. The package's manifest carries both splits' metrics; the headline of each
(``metrics/key_metrics/<run>.json``, ``metrics_val/key_metrics/<run>.json``: what ``dvc metrics show`` reads) is
written from them (xmc.report.headline).
"""

from __future__ import annotations

import sys

from xmc.config import load_params, run_entry_point
from xmc.config.runs import resolve_run
from xmc.encoders.cache import configure_from_params
from xmc.errors import ConfigError
from xmc.machine import set_threads
from xmc.package.build import package_run
from xmc.report.headline import write_headlines
from xmc.workspace import product_workspace


def main() -> None:
    if len(sys.argv) != 2:
        raise ConfigError("usage: python -m stages.package <run>")
    params = load_params()
    run = resolve_run(params, sys.argv[1])
    configure_from_params(params)
    set_threads()
    ws = product_workspace(params)
    done = package_run(params, run.name, ws, run_params=run.config)
    write_headlines(ws.metrics(run.name, split) for split in done["metrics"])


if __name__ == "__main__":
    run_entry_point(main)
