"""Baselines -> predictions/<method>/ (top-k on the validation and test splits + timing).

Usage: ``python -m stages.baseline {label_prior|tfidf_zeroshot|tfidf_knn}``. A prediction stage: it reads
the test texts (and transforms them with the TF-IDF vectoriser fit on training data), never test labels.
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
from xmc.predictions import TopK

BASELINES = ("label_prior", "tfidf_zeroshot", "tfidf_knn")


def main() -> None:
    method = sys.argv[1] if len(sys.argv) > 1 else ""
    if method not in BASELINES:
        raise ConfigError(f"unknown baseline {method!r}: expected one of {', '.join(BASELINES)}")
    params = load_params()
    k = int(params["evaluate"]["top_k"])
    ds = load_processed(params["data"].get("processed_dir", "data/processed"), splits=("trn", "val", "tst"))
    train_seconds = 0.0
    t0 = time.perf_counter()
    preds: dict[str, TopK] = {}
    if method == "label_prior":
        freq = np.asarray(ds.trn.Y.sum(0)).ravel()
        train_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        preds = {s: label_prior_predict(freq, len(ds.split(s)), k) for s in ("val", "tst")}
    else:
        feats = TfidfFeatures.load("data/tfidf")
        train_seconds = read_json("data/tfidf_timing.json")["fit_seconds"]
        X = {"val": feats.val if feats.val is not None else feats.transform(ds.val.texts), "tst": feats.transform(ds.tst.texts)}
        for split, Xq in X.items():
            if method == "tfidf_zeroshot":
                preds[split] = tfidf_zero_shot(Xq, feats.lbl, k)
            else:
                knn = params["tfidf_knn"]
                preds[split] = knn_label_voting(Xq, feats.trn, ds.trn.Y, int(knn["n_neighbors"]), k,
                                                power=float(knn.get("power", 1.0)))
    predict_seconds = time.perf_counter() - t0
    out = Path("predictions") / method
    for split, pred in preds.items():
        pred.save(out / f"{split}_topk.npz")
    write_json(out / "timing.json", {"train_seconds": round(train_seconds, 3), "predict_seconds": round(predict_seconds, 3)})


if __name__ == "__main__":
    run_entry_point(main)
