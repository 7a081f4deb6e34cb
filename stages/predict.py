"""Predict with one run of any method: build its predictor (label index) and write top-k predictions.

Usage: ``python -m stages.predict <run> [val] [tst]`` -> ``indexes/<name>/`` (the predictor the model package
ships: encoder + ANN index, UniDEC's heads, the TF-IDF matrices...) and ``predictions/<name>/<split>_topk.npz``
+ ``timing.json`` for each split named (default both). ``<name>`` is the run, or each of its variants (UniDEC:
``<run>``, ``<run>_de_only``, ``<run>_clf_only``) where the run is listed under params ``unidec_predictions``
(DVC stage ``predict_unidec@<run>``, which declares the three); a UniDEC run listed under ``predictions``
(``predict@<run>``) predicts its main space only. Selection candidates predict ``val`` only: the test split is
read by the runs that are reported, once.
"""

from __future__ import annotations

import sys

from xmc.config import load_params, run_entry_point
from xmc.predictions import run_and_splits


def main() -> None:
    name, splits = run_and_splits(sys.argv[1:], "python -m stages.predict <run> [val] [tst]")
    from xmc.methods.base import predict_run

    params = load_params()
    from xmc.encoders.cache import configure_from_params

    configure_from_params(params)   # large encodings are reused across stages (params.yaml: encode_cache)
    # the stage's declared outputs: predict_unidec@<run> every space, predict@<run> the run's own
    predict_run(params, name, splits, all_variants=name in params["unidec_predictions"])


if __name__ == "__main__":
    run_entry_point(main)
