"""Package one trained run -> packages/<run>/ with its predictions and metrics (xmc.package.build.package_run).

Usage: ``python -m stages.package <run>``. The predictor is built into the package (weights hard-linked from
models/<run>/, the label index over its label vectors), predicts the validation and test splits
(predictions/<run>/) and is evaluated there (metrics_val/<run>.json, metrics/<run>.json, evaluation/): what the
package serves is what is reported. The package's manifest carries both splits' metrics.
"""

from __future__ import annotations

import sys

from xmc.config import load_params, run_entry_point
from xmc.config.runs import resolve_run
from xmc.encoders.cache import configure_from_params
from xmc.errors import ConfigError
from xmc.machine import set_threads
from xmc.package.build import package_run
from xmc.workspace import product_workspace


def main() -> None:
    if len(sys.argv) != 2:
        raise ConfigError("usage: python -m stages.package <run>")
    params = load_params()
    run = resolve_run(params, sys.argv[1])
    configure_from_params(params)
    set_threads()
    package_run(params, run.name, product_workspace(params), run_params=run.config)


if __name__ == "__main__":
    run_entry_point(main)
