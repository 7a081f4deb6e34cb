"""The linear one-vs-all peer: PECOS XR-Linear on the pipeline's own TF-IDF features and splits.

Usage (in the PECOS virtual environment the Makefile creates, ``.venv-pecos``: libpecos needs numpy < 2 and
scipy < 1.14, so it cannot share the main environment)::

    .venv-pecos/bin/python -m stages.xr_linear train <run>               -> models/<run>/
    .venv-pecos/bin/python -m stages.xr_linear predict <run> [val] [tst] -> predictions/<run>/{split}_topk.npz + timing

A run is ``params.yaml: xr_linear.defaults`` with the overrides of ``xr_linear.runs.<run>``: the reported peer
``xr_linear`` and the selection candidates that decide its settings on the validation split (they predict val
only: ``xr_linear_predictions``). Training reads the training split's TF-IDF rows (``data/tfidf/X_trn.npz``, the
vectoriser fit on training and label texts) and its label matrix; prediction transforms the texts of the splits
named with the same saved vectoriser, as the TF-IDF baselines do (``xmc.peers.xr_linear``).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from xmc.config import load_params, run_entry_point
from xmc.errors import ConfigError

log = logging.getLogger("stages.xr_linear")
USAGE = "python -m stages.xr_linear train <run> | predict <run> [val] [tst]"


def train(params: dict[str, Any], run: str) -> dict[str, Any]:
    import numpy as np
    import scipy.sparse as sp

    from xmc.data import load_processed
    from xmc.io import atomic_dir, write_json
    from xmc.peers.xr_linear import fit_xr_linear, require_libpecos, xr_linear_settings

    cfg = xr_linear_settings(params, run)
    require_libpecos()   # before the data loads
    X = sp.load_npz("data/tfidf/X_trn.npz").tocsr().astype(np.float32)
    Y = load_processed(params["data"]["processed_dir"], splits=("trn",)).trn.Y.tocsr().astype(np.float32)
    if X.shape[0] != Y.shape[0]:
        raise ConfigError(f"data/tfidf/X_trn.npz has {X.shape[0]} rows, the training labels {Y.shape[0]}: rerun tfidf")
    t0 = time.perf_counter()
    model = fit_xr_linear(X, Y, cfg)
    seconds = time.perf_counter() - t0
    summary = {"run": run, "method": "xr_linear", "train_seconds": round(seconds, 2), "settings": cfg,
               "labels": int(Y.shape[1]), "features": int(X.shape[1])}
    with atomic_dir(Path("models") / run) as tmp:
        model.save(str(tmp / "model"))
        write_json(tmp / "train_summary.json", summary)
    log.info("trained XR-Linear %s in %.1f s", run, seconds)
    return summary


def predict(params: dict[str, Any], run: str, splits: tuple[str, ...]) -> dict[str, Any]:
    from xmc.baselines import TfidfFeatures
    from xmc.data import load_processed
    from xmc.io import atomic_dir, read_json, write_json
    from xmc.peers.xr_linear import load_xr_linear, rank_xr_linear, xr_linear_settings

    cfg = xr_linear_settings(params, run)
    k = params["evaluate"]["top_k"]
    model_dir = Path("models") / run
    if not (model_dir / "model").is_dir():
        raise ConfigError(f"{model_dir / 'model'}: model folder not found (run the train_xr_linear@{run} stage first)")
    model = load_xr_linear(str(model_dir / "model"))
    feats = TfidfFeatures.load("data/tfidf")
    ds = load_processed(params["data"]["processed_dir"], splits=("trn", *splits))
    by_split = {}
    with atomic_dir(Path("predictions") / run) as tmp:
        for split in splits:
            t0 = time.perf_counter()
            rank_xr_linear(model, feats.transform(ds.split(split).texts), cfg, k).save(tmp / f"{split}_topk.npz")
            by_split[split] = round(time.perf_counter() - t0, 2)
        timing = {"train_seconds": read_json(model_dir / "train_summary.json")["train_seconds"],
                  "predict_seconds": by_split.get("tst", by_split.get("val")), "predict_seconds_by_split": by_split,
                  "predictor": "xr_linear", "beam_size": cfg["beam_size"]}
        write_json(tmp / "timing.json", timing)
    return timing


def main() -> None:
    from xmc.predictions import run_and_splits

    argv = sys.argv[1:]
    if argv[:1] == ["train"] and len(argv) == 2:
        train(load_params(), argv[1])
    elif argv[:1] == ["predict"] and len(argv) >= 2:
        run, splits = run_and_splits(argv[1:], USAGE)
        predict(load_params(), run, splits)
    else:
        raise ConfigError(f"usage: {USAGE}")


if __name__ == "__main__":
    run_entry_point(main)
