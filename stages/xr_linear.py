"""The linear one-vs-all peer: PECOS XR-Linear on the pipeline's own TF-IDF features and splits.

Usage (in the PECOS virtual environment the Makefile creates, ``.venv-pecos``: libpecos needs numpy < 2 and
scipy < 1.14, so it cannot share the main environment)::

    .venv-pecos/bin/python -m stages.xr_linear train <run>               -> models/<run>/
    .venv-pecos/bin/python -m stages.xr_linear predict <run> [val] [tst] -> predictions/<run>/{split}_topk.npz + timing

The runs are params ``xr_linear`` (name -> settings: the product's is ``xr_linear``); the lab runs its variants
through the same functions with their own settings. Training reads the training split's TF-IDF rows (``data/tfidf/X_trn.npz``, the
vectoriser fit on training and label texts) and its label matrix; prediction transforms the texts of the splits
named with the same saved vectoriser, as the TF-IDF baselines do (``xmc.peers.xr_linear``).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.baselines import TfidfFeatures
from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.io import atomic_dir, read_json, write_json
from xmc.peers.xr_linear import fit_xr_linear, load_xr_linear, rank_xr_linear, require_libpecos
from xmc.predictions import run_and_splits
from xmc.workspace import Workspace, product_workspace

log = logging.getLogger("stages.xr_linear")
USAGE = "python -m stages.xr_linear train <run> | predict <run> [val] [tst]"


def train(params: dict[str, Any], cfg: dict[str, Any], run: str, ws: Workspace) -> dict[str, Any]:
    """Fit XR-Linear with settings ``cfg`` on the training split's TF-IDF rows -> ``ws.model(run)``."""
    require_libpecos()   # before the data loads
    X = sp.load_npz(ws.tfidf / "X_trn.npz").tocsr().astype(np.float32)
    Y = load_processed(ws.processed, splits=("trn",)).trn.Y.tocsr().astype(np.float32)
    if X.shape[0] != Y.shape[0]:
        raise ConfigError(f"{ws.tfidf / 'X_trn.npz'} has {X.shape[0]} rows, the training labels {Y.shape[0]}: rerun tfidf")
    t0 = time.perf_counter()
    model = fit_xr_linear(X, Y, cfg)
    seconds = time.perf_counter() - t0
    summary = {"run": run, "method": "xr_linear", "train_seconds": round(seconds, 2), "settings": cfg,
               "labels": int(Y.shape[1]), "features": int(X.shape[1])}
    with atomic_dir(ws.model(run)) as tmp:
        model.save(str(tmp / "model"))
        write_json(tmp / "train_summary.json", summary)
    log.info("trained XR-Linear %s in %.1f s", run, seconds)
    return summary


def predict(params: dict[str, Any], cfg: dict[str, Any], run: str, splits: tuple[str, ...],
            ws: Workspace) -> dict[str, Any]:
    """The top-k of ``splits`` -> ``ws.predictions(run)`` (the evaluation runs in the main environment)."""
    k = params["evaluate"]["top_k"]
    model_dir = ws.model(run)
    if not (model_dir / "model").is_dir():
        raise ConfigError(f"{model_dir / 'model'}: model folder not found (train {run} first)")
    model = load_xr_linear(str(model_dir / "model"))
    feats = TfidfFeatures.load(ws.tfidf)
    ds = load_processed(ws.processed, splits=("trn", *splits))
    by_split = {}
    with atomic_dir(ws.predictions(run)) as tmp:
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
    argv = sys.argv[1:]
    params = load_params()
    if len(argv) < 2 or argv[0] not in ("train", "predict"):
        raise ConfigError(f"usage: {USAGE}")
    run = argv[1]
    if run not in params["xr_linear"]:
        raise ConfigError(f"params.yaml: {run!r} is not under xr_linear (have: {', '.join(params['xr_linear']) or 'none'})")
    cfg = params["xr_linear"][run]
    if argv[0] == "train" and len(argv) == 2:
        train(params, cfg, run, product_workspace(params))
    elif argv[0] == "predict":
        run, splits = run_and_splits(argv[1:], USAGE)
        predict(params, cfg, run, splits, product_workspace(params))
    else:
        raise ConfigError(f"usage: {USAGE}")


if __name__ == "__main__":
    run_entry_point(main)
