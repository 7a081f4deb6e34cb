"""XMC metrics: P@k, nDCG@k, PSP@k, R@k, unseen-label recall and recall by label frequency.

Conventions (those of the XC repository / pyxclib):

* P@k, nDCG@k and PSP@k are averaged over all test rows; a row without positives
  contributes 0. R@k is averaged over rows with at least one positive.
* PSP@k is normalised by the best achievable value: the ratio of the summed
  propensity-weighted hits to the summed weights of each row's k rarest positives.
* Propensities follow Jain et al. (2016): p_l = 1 / (1 + C (N_l + B)^-A),
  C = (ln N - 1)(B + 1)^A, with N training instances and N_l training occurrences.
* Pairs in the optional filter matrix are removed from both predictions and truth.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.metrics.bootstrap import instance_contributions
from xmc.metrics.hits import _apply_filter, hit_matrix, inverse_propensity
from xmc.predictions import TopK

FREQ_BUCKETS: list[tuple[str, int, float]] = [
    ("0 (unseen)", 0, 0),
    ("1", 1, 1),
    ("2-5", 2, 5),
    ("6-20", 6, 20),
    ("21-100", 21, 100),
    (">100", 101, np.inf),
]


def evaluate_topk(
    pred: TopK,
    Y: sp.csr_matrix,
    train_label_freq: np.ndarray,
    n_train: int,
    ks: tuple[int, ...] = (1, 3, 5),
    recall_ks: tuple[int, ...] = (10, 100),
    a: float = 0.55,
    b: float = 1.5,
    filt: sp.csr_matrix | None = None,
) -> dict[str, Any]:
    """All metrics of one method, as percentages (0-100), plus recall by frequency bucket and the
    per-instance ``contributions`` behind the averaged metrics (for bootstrap intervals and paired tests)."""
    # every averaged metric is a ratio of per-instance sums: one implementation (which also checks the
    # shapes) serves the point values here and the bootstrap intervals / paired tests (xmc.metrics.bootstrap)
    contrib = instance_contributions(pred, Y, train_label_freq, n_train, ks, recall_ks, a, b, filt)
    out: dict[str, Any] = contrib.values()
    idx, Y = _apply_filter(pred, Y.tocsr(), filt)
    n = Y.shape[0]
    has = np.diff(Y.indptr) > 0
    hits = hit_matrix(idx, Y)
    # label-occurrence (micro) recall@100 by training frequency of the label
    k_rec = max(recall_ks)
    freq = np.asarray(train_label_freq)
    hit_labels = idx[:, :k_rec][hits[:, :k_rec] > 0]
    tot_by_label = np.bincount(Y.indices, minlength=Y.shape[1])
    hit_by_label = np.bincount(hit_labels, minlength=Y.shape[1])
    buckets = []
    for name, lo, hi in FREQ_BUCKETS:
        m = (freq >= lo) & (freq <= hi)
        tot, hit = int(tot_by_label[m].sum()), int(hit_by_label[m].sum())
        buckets.append({"bucket": name, "test_pairs": tot, f"recall@{k_rec}": 100 * hit / tot if tot else None})
    unseen = buckets[0]
    # P@k and R@k for every k up to the prediction depth (the curves of the report and of `dvc plots`)
    cum = np.cumsum(hits, axis=1)
    kk = np.arange(1, hits.shape[1] + 1)
    n_pos = np.diff(Y.indptr)[has].astype(np.float64)
    curves = {"k": kk.tolist(),
              "precision": (100 * (cum / kk).mean(0) if n else np.zeros(len(kk))).round(4).tolist(),
              "recall": (100 * (cum[has] / n_pos[:, None]).mean(0) if has.any() else np.zeros(len(kk))).round(4).tolist()}
    out["n_test"] = int(n)
    out["n_test_without_labels"] = int((~has).sum())
    out["unseen_test_pairs"] = unseen["test_pairs"]
    return {"metrics": out, "recall_by_frequency": buckets, "contributions": contrib, "curves": curves}


__all__ = ["FREQ_BUCKETS", "evaluate_topk", "hit_matrix", "inverse_propensity"]
