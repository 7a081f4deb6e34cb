"""Baselines -> predictions/<method>/ (top-k on the test split + timing).

Usage: ``python -m stages.baseline {label_prior|tfidf_zeroshot|tfidf_knn}``
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from xmc.baselines import TfidfFeatures, knn_label_voting, label_prior_predict, tfidf_zero_shot
from xmc.config import load_params, run_entry_point
from xmc.data import load_processed
from xmc.errors import ConfigError
from xmc.io import read_json, write_json


def main() -> None:
    method = sys.argv[1] if len(sys.argv) > 1 else ""
    params = load_params()
    k = int(params["evaluate"]["top_k"])
    ds = load_processed(params["data"].get("processed_dir", "data/processed"))
    train_seconds = 0.0
    t0 = time.perf_counter()
    if method == "label_prior":
        freq = np.asarray(ds.trn.Y.sum(0)).ravel()
        train_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        pred = label_prior_predict(freq, len(ds.tst), k)
    elif method in ("tfidf_zeroshot", "tfidf_knn"):
        feats = TfidfFeatures.load("data/tfidf")
        train_seconds = read_json("data/tfidf_timing.json")["fit_seconds"]
        if method == "tfidf_zeroshot":
            pred = tfidf_zero_shot(feats.tst, feats.lbl, k)
        else:
            knn = params["tfidf_knn"]
            pred = knn_label_voting(feats.tst, feats.trn, ds.trn.Y, int(knn["n_neighbors"]), k, power=float(knn.get("power", 1.0)))
    else:
        raise ConfigError(f"unknown baseline {method!r}: expected label_prior, tfidf_zeroshot or tfidf_knn")
    predict_seconds = time.perf_counter() - t0
    out = Path("predictions") / method
    pred.save(out / "tst_topk.npz")
    write_json(out / "timing.json", {"train_seconds": round(train_seconds, 3), "predict_seconds": round(predict_seconds, 3)})


if __name__ == "__main__":
    run_entry_point(main)
