"""The fuse stage's work: a run's predictions + label-name matches -> the run's hybrid predictions and predictor.

Fusion weights are fit on the validation split only. The validation predictions of the hybrid are cross-fitted
(weights fit on the other folds of validation documents), so its validation metrics are not in-sample; the
test predictions use the weights fit on the whole validation split, through the same ranker the model package's
``hybrid`` predictor runs.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from xmc.logs import kv

log = logging.getLogger(__name__)
SUFFIX = "_hybrid"
ZERO_SHOT_SUFFIX = "_zs_hybrid"


def validation_folds(groups: list[Any] | None, n_rows: int, n_folds: int) -> np.ndarray:
    """Fold of each validation row: whole documents (groups) go together, round-robin in sorted order;
    rows without a group are split by position."""
    keys = sorted({str(g) for g in groups if g is not None}) if groups else []
    if len(keys) < n_folds:  # fewer documents than folds: contiguous blocks of rows
        return (np.arange(n_rows) * n_folds // max(1, n_rows)).astype(np.int64)
    fold_of = {g: i % n_folds for i, g in enumerate(keys)}
    return np.array([fold_of[str(g)] if g is not None else i % n_folds for i, g in enumerate(groups)], np.int64)


def fuse_run(params: dict[str, Any], name: str, root: str | Path = ".", zero_shot: bool = False,
             with_predictor: bool = True) -> dict[str, Any]:
    """``with_predictor``: also write ``indexes/<run>_hybrid`` (the model package's hybrid predictor over the run's
    index); without it only the predictions are written (a run trained elsewhere whose index is not here, e.g. the
    GPU profiles). ``zero_shot``: read no training data (``<run>_zs_hybrid``): the fusion is the label-name retriever's
    zero-shot score plus a weighted method score (:func:`xmc.lexical.hybrid.zero_shot_fusion`), the two weights
    chosen on the validation split from ``hybrid.zero_shot`` grids; otherwise (``<run>_hybrid``) a logistic
    fusion fit on validation, with the training label counts among its features."""
    from xmc.data import load_processed
    from xmc.errors import ConfigError
    from xmc.io import atomic_dir, read_json, write_json
    from xmc.lexical.hybrid import CandidateTable, HybridRanker, choose_zero_shot_fusion, fit_fusion, top_k
    from xmc.methods.base import PREDICTOR_SECTION
    from xmc.package.predictors import HybridPredictor
    from xmc.predictions import TopK

    root = Path(root)
    cfg, names_cfg = params["hybrid"], params["label_names"]
    k = params["evaluate"]["top_k"]
    base_dir = root / "predictions" / name
    out_name = name + (ZERO_SHOT_SUFFIX if zero_shot else SUFFIX)
    zs = cfg["zero_shot"]
    # the splits the base run predicts (params predictions): a selection candidate has only "val", and its
    # hybrid then ranks only the validation split too
    splits = tuple(str(params["predictions"].get(name) or params["unidec_predictions"].get(
        name.removesuffix("_de_only").removesuffix("_clf_only")) or "val tst").split())
    if "val" not in splits:
        raise ConfigError(f"params.yaml: predictions.{name} must include val (the fusion is fit there)")
    for split in splits:
        if not (base_dir / f"{split}_topk.npz").is_file():
            raise ConfigError(f"{base_dir / f'{split}_topk.npz'}: missing (run the prediction stage of {name})")
    if zero_shot:  # no training split is read: the label counts the ranker keeps are zeros (weight 0 anyway)
        ds = load_processed(root / params["data"]["processed_dir"], splits=splits, without_training=True)
        counts = np.zeros(len(ds.label_texts))
    else:
        ds = load_processed(root / params["data"]["processed_dir"], splits=("trn", *splits))
        counts = np.asarray(ds.trn.Y.sum(0)).ravel()
    t0 = time.perf_counter()
    ranker = HybridRanker(ds.label_texts, names_cfg["mode"], counts, max_words=names_cfg["max_words"],
                          cased_names=names_cfg["cased_names"])
    val = TopK.load(base_dir / "val_topk.npz")
    table = ranker.table(ds.val.texts, val.scores, val.indices)
    folds = validation_folds(ds.val.groups, len(ds.val), cfg["cross_fit_folds"])
    cross = np.zeros(len(table.rows))
    chosen: dict[str, Any] = {}

    def fit(rows: np.ndarray):
        if zero_shot:
            w, info = choose_zero_shot_fusion(table, ds.val.Y, rows, zs["method_weight"], zs["matched_bonus"],
                                              zs["precision_k"])
            return w, info
        keep = np.isin(table.rows, rows)
        return fit_fusion(CandidateTable(table.rows[keep], table.labels[keep], table.X[keep]), ds.val.Y, cfg["C"]), {}

    for f in range(cfg["cross_fit_folds"]):
        held = folds[table.rows] == f
        if held.any() and (~held).any():
            w, info = fit(np.flatnonzero(folds != f))
            cross[held] = w.score(table.X[held])
            if info:
                chosen[f"fold_{f}"] = info
    ranker.weights, info = fit(np.arange(len(ds.val)))
    if info:
        chosen["all"] = info
    fit_seconds = time.perf_counter() - t0
    D, I = top_k(table, cross, len(ds.val), k)
    TopK(I.astype(np.int32), D).save(root / "predictions" / out_name / "val_topk.npz")
    t0 = time.perf_counter()
    if "tst" in splits:
        tst = TopK.load(base_dir / "tst_topk.npz")
        D, I = ranker.rank(ds.tst.texts, tst.scores, tst.indices, k)
        TopK(I.astype(np.int32), D).save(root / "predictions" / out_name / "tst_topk.npz")
    rank_seconds = time.perf_counter() - t0 if "tst" in splits else None
    if with_predictor:
        with atomic_dir(root / "indexes" / out_name) as tmp:
            section = HybridPredictor.build(root / "indexes" / name, tmp, ds.label_texts,
                                            {"ranker": ranker, "base_k": k})
            (tmp / PREDICTOR_SECTION).write_text(json.dumps(section, indent=2) + "\n")
    base_timing = read_json(base_dir / "timing.json") if (base_dir / "timing.json").is_file() else {}
    summary = {"train_seconds": round(float(base_timing.get("train_seconds", 0.0)) + fit_seconds, 2),
               "fusion_fit_seconds": round(fit_seconds, 2),
               "predict_seconds": (round(float(base_timing.get("predict_seconds") or 0.0) + rank_seconds, 2)
                                   if rank_seconds is not None else None), "splits": list(splits),
               "predictor": "hybrid", "base": name, "candidates_per_text": round(len(table.rows) / max(1, len(ds.val)), 1),
               "fusion": ranker.weights.to_json(), "cross_fit_folds": cfg["cross_fit_folds"],
               "zero_shot": zero_shot, **({"chosen_on_validation": chosen} if chosen else {})}
    write_json(root / "predictions" / out_name / "timing.json", summary)
    log.info("fused %s with label names: %.1f candidates per text, weights %s", name, summary["candidates_per_text"],
             kv(dict(zip(ranker.weights.features, ranker.weights.weights.tolist())), 3))
    return summary
