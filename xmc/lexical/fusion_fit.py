"""Fitting a hybrid's fusion on the validation candidates (scikit-learn): logistic weights or gradient-boosted trees,
exported as plain arrays that :mod:`xmc.lexical.hybrid` scores with no scikit-learn (a package predicts without it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression

from xmc.lexical.hybrid import (HYBRID_FEATURES, BoostedTreesFusion, CandidateTable, Fusion, FusionWeights,
                                monotone_constraints)


def fit_boosted_fusion(table: CandidateTable, gold: sp.csr_matrix, settings: dict[str, Any],
                       features: tuple[str, ...] = HYBRID_FEATURES, seed: int = 0, C: float = 1.0,
                       monotone: bool = False) -> Fusion:
    """Gradient-boosted trees for "candidate is a true label" on the candidates of the given texts (``settings``:
    params ``hybrid.boosted_trees``; early stopping holds out ``validation_fraction`` of the candidates; ``monotone``:
    the trees keep the directions of :func:`monotone_constraints`). With fewer than ``2 * min_samples_leaf`` true or
    false candidates it returns the logistic fusion (strength ``C``) instead."""
    y = np.asarray(gold[table.rows, table.labels]).ravel() > 0
    if min(int(y.sum()), int((~y).sum())) < 2 * settings["min_samples_leaf"]:
        # too few true (or false) candidates for a tree to split them off: the logistic fusion
        return fit_fusion(table, gold, C, features)
    st = dict(settings)   # the fields of xmc.config.schema.BoostedTreesFusionConfig, the estimator's own names
    cst = monotone_constraints(features) if monotone else None
    clf = HistGradientBoostingClassifier(**st, monotonic_cst=cst, random_state=seed).fit(table.X, y)
    if cst:
        st["monotone"] = dict(zip(features, cst))
    trees = []
    for (tree,) in clf._predictors:   # binary: one tree per boosting iteration
        nodes = tree.nodes
        if nodes["is_categorical"].any():
            raise RuntimeError("categorical splits are not supported by the exported fusion")
        trees.append({"feature": np.where(nodes["is_leaf"] == 1, -1, nodes["feature_idx"]).astype(np.int64),
                      "threshold": nodes["num_threshold"].astype(np.float64),
                      "missing_left": nodes["missing_go_to_left"].astype(bool),
                      "left": nodes["left"].astype(np.int64), "right": nodes["right"].astype(np.int64),
                      "value": np.where(nodes["is_leaf"] == 1, nodes["value"], 0.0).astype(np.float64)})
    return BoostedTreesFusion(trees, float(np.ravel(clf._baseline_prediction)[0]), features,
                              {**st, "n_iter": int(clf.n_iter_)})


def fit_fusion(table: CandidateTable, gold: sp.csr_matrix, C: float = 1.0,
               features: tuple[str, ...] = HYBRID_FEATURES) -> FusionWeights:
    """Logistic regression of "candidate is a true label" on the candidates of the given texts (``features``: the
    table's columns, :func:`hybrid_features`)."""
    y = np.asarray(gold[table.rows, table.labels]).ravel() > 0
    mean = table.X.mean(0) if len(table.rows) else np.zeros(len(features))
    scale = table.X.std(0) if len(table.rows) else np.ones(len(features))
    scale[scale == 0] = 1.0
    if y.all() or not y.any():  # nothing to learn from (no true or no false candidate): keep the (first) run's order
        w = np.zeros(len(features))
        w[0] = 1.0   # the first run's method_score
        return FusionWeights(w, 0.0, mean, scale, features)
    clf = LogisticRegression(C=C, max_iter=5000).fit((table.X - mean) / scale, y)
    return FusionWeights(clf.coef_[0].astype(np.float64), float(clf.intercept_[0]), mean, scale, features)


__all__ = ["fit_boosted_fusion", "fit_fusion"]
