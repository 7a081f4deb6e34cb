"""Fuse one run's predictions with label-name matches -> predictions/<run>_hybrid/ and indexes/<run>_hybrid/.

Usage: ``python -m stages.fuse <run>`` for each run in params ``hybrid.runs``. A prediction stage: candidates are
the run's top-k ∪ the labels whose names occur in the text; the fusion weights are fit on the validation split
(validation predictions cross-fitted by document) and applied to the test texts (xmc.lexical.fuse).
"""

from __future__ import annotations

import sys

from xmc.config import load_params, run_entry_point
from xmc.errors import ConfigError


def main() -> None:
    if len(sys.argv) != 2:
        raise ConfigError("usage: python -m stages.fuse <run>")
    params = load_params()
    name = sys.argv[1]
    if name not in params["hybrid"]["runs"]:
        raise ConfigError(f"params.yaml: {name!r} is not in hybrid.runs (have: {', '.join(params['hybrid']['runs'])})")
    from xmc.lexical.fuse import fuse_run
    from xmc.methods.base import set_threads

    set_threads()
    fuse_run(params, name)


if __name__ == "__main__":
    run_entry_point(main)
