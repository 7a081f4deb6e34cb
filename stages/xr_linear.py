"""The linear one-vs-all peer: PECOS XR-Linear on the pipeline's own TF-IDF features and splits.

Usage (in the PECOS virtual environment the Makefile creates, ``.venv-pecos``: libpecos needs numpy < 2 and
scipy < 1.14, so it cannot share the main environment)::

    .venv-pecos/bin/python -m stages.xr_linear train          -> models/xr_linear/
    .venv-pecos/bin/python -m stages.xr_linear predict val tst -> predictions/xr_linear/{split}_topk.npz + timing

Training reads the training split's TF-IDF rows (``data/tfidf/X_trn.npz``, the vectoriser fit on training and
label texts) and its label matrix; prediction transforms the texts of the splits named with the same saved
vectoriser, as the TF-IDF baselines do. Settings: params ``xr_linear`` (PIFA label embedding, hierarchical
k-means label tree, one squared-hinge linear model per tree node, beam search).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from xmc.config import load_params, run_entry_point
from xmc.errors import ConfigError

log = logging.getLogger("stages.xr_linear")
MODEL_DIR = Path("models/xr_linear")
OUT = Path("predictions/xr_linear")


def _pecos() -> Any:
    try:
        from pecos.xmc import Indexer, LabelEmbeddingFactory
        from pecos.xmc.xlinear.model import XLinearModel
    except ImportError:
        raise ConfigError("libpecos is not installed in this environment: run the stage with .venv-pecos/bin/python "
                          "(`make setup` creates it)") from None
    return Indexer, LabelEmbeddingFactory, XLinearModel


def train(params: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import scipy.sparse as sp

    from xmc.data import load_processed
    from xmc.io import atomic_dir

    Indexer, LabelEmbeddingFactory, XLinearModel = _pecos()
    cfg = params["xr_linear"]
    X = sp.load_npz("data/tfidf/X_trn.npz").tocsr().astype(np.float32)
    Y = load_processed(params["data"]["processed_dir"], splits=("trn",)).trn.Y.tocsr().astype(np.float32)
    if X.shape[0] != Y.shape[0]:
        raise ConfigError(f"data/tfidf/X_trn.npz has {X.shape[0]} rows, the training labels {Y.shape[0]}: rerun tfidf")
    t0 = time.perf_counter()
    label_feat = LabelEmbeddingFactory.create(Y, X, method=cfg["label_embedding"])
    tree = Indexer.gen(label_feat, indexer_type="hierarchicalkmeans", nr_splits=cfg["nr_splits"],
                       max_leaf_size=cfg["max_leaf_size"], seed=cfg["seed"], threads=cfg["threads"])
    model = XLinearModel.train(X, Y, C=tree, threshold=cfg["threshold"], Cp=cfg["Cp"], Cn=cfg["Cn"],
                               solver_type=cfg["solver_type"], threads=cfg["threads"])
    seconds = time.perf_counter() - t0
    summary = {"run": "xr_linear", "method": "xr_linear", "train_seconds": round(seconds, 2),
               "tree_depth": int(len(tree)), "labels": int(Y.shape[1]), "features": int(X.shape[1])}
    with atomic_dir(MODEL_DIR) as tmp:
        model.save(str(tmp / "model"))
        (tmp / "train_summary.json").write_text(json.dumps(summary, indent=2))
    log.info("trained XR-Linear in %.1f s (%d tree levels)", seconds, len(tree))
    return summary


def predict(params: dict[str, Any], splits: tuple[str, ...]) -> dict[str, Any]:
    import numpy as np

    from xmc.baselines import TfidfFeatures
    from xmc.data import load_processed
    from xmc.io import read_json, write_json
    from xmc.predictions import topk_from_sparse

    *_, XLinearModel = _pecos()
    cfg = params["xr_linear"]
    k = params["evaluate"]["top_k"]
    if not (MODEL_DIR / "model").is_dir():
        raise ConfigError(f"{MODEL_DIR / 'model'}: model folder not found (run the train_xr_linear stage first)")
    model = XLinearModel.load(str(MODEL_DIR / "model"), is_predict_only=True)
    feats = TfidfFeatures.load("data/tfidf")
    ds = load_processed(params["data"]["processed_dir"], splits=("trn", *splits))
    by_split = {}
    for split in splits:
        t0 = time.perf_counter()
        X = feats.transform(ds.split(split).texts).tocsr().astype(np.float32)
        S = model.predict(X, beam_size=cfg["beam_size"], only_topk=k, post_processor=cfg["post_processor"],
                          threads=cfg["threads"])
        topk_from_sparse(S, k).save(OUT / f"{split}_topk.npz")
        by_split[split] = round(time.perf_counter() - t0, 2)
    timing = {"train_seconds": read_json(MODEL_DIR / "train_summary.json")["train_seconds"],
              "predict_seconds": by_split.get("tst", by_split.get("val")), "predict_seconds_by_split": by_split,
              "predictor": "xr_linear", "beam_size": cfg["beam_size"]}
    write_json(OUT / "timing.json", timing)
    return timing


def main() -> None:
    from xmc.predictions import run_and_splits

    argv = sys.argv[1:]
    usage = "python -m stages.xr_linear train | predict [val] [tst]"
    if argv[:1] == ["train"] and len(argv) == 1:
        train(load_params())
    elif argv[:1] == ["predict"]:
        _, splits = run_and_splits(["xr_linear", *argv[1:]], usage)
        predict(load_params(), splits)
    else:
        raise ConfigError(f"usage: {usage}")


if __name__ == "__main__":
    run_entry_point(main)
