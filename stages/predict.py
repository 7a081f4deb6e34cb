"""Predict with one run of any method: build its predictor (label index) and write top-k predictions.

Usage: ``python -m stages.predict <run> [val] [tst]`` -> ``indexes/<name>/`` (the predictor the model package
ships: encoder + ANN index, UniDEC's heads, the TF-IDF matrices...) and ``predictions/<name>/<split>_topk.npz``
+ ``timing.json`` for each split named (default both). ``<name>`` is the run, or each of its variants (UniDEC:
``<run>``, ``<run>_de_only``, ``<run>_clf_only``). Selection candidates predict ``val`` only: the test split is
read by the runs that are reported, once.
"""

from __future__ import annotations

import sys

from xmc.config import load_params, run_entry_point
from xmc.predictions import run_and_splits


def main() -> None:
    name, splits = run_and_splits(sys.argv[1:], "python -m stages.predict <run> [val] [tst]")
    from xmc.methods.base import predict_run

    predict_run(load_params(), name, splits)


if __name__ == "__main__":
    run_entry_point(main)
