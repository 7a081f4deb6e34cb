"""The pieces every metric is computed from: which predicted labels are hits, the filter of (row, label) pairs
dropped from scoring, and the inverse propensities of PSP@k. Below :mod:`xmc.metrics` and
:mod:`xmc.metrics.bootstrap`, which both read them."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from xmc.predictions import TopK


def inverse_propensity(train_label_freq: np.ndarray, n_train: int, a: float = 0.55, b: float = 1.5) -> np.ndarray:
    """1 / p_l for every label (Jain et al., 2016)."""
    c = (np.log(n_train) - 1.0) * (b + 1.0) ** a
    return 1.0 + c * (np.asarray(train_label_freq, dtype=np.float64) + b) ** (-a)


def _apply_filter(pred: TopK, Y: sp.csr_matrix, filt: sp.csr_matrix | None) -> tuple[np.ndarray, sp.csr_matrix]:
    idx = pred.indices.astype(np.int64)
    if filt is None or filt.nnz == 0:
        return idx, Y
    filt = filt.tocsr()
    L = Y.shape[1]
    fkeys = np.sort(np.repeat(np.arange(filt.shape[0]), np.diff(filt.indptr)) * L + filt.indices)
    keys = np.arange(idx.shape[0])[:, None] * L + idx
    drop = np.isin(keys, fkeys) & (idx >= 0)
    out = np.full_like(idx, -1)
    for i in np.flatnonzero(drop.any(1)):
        kept = idx[i][~drop[i]]
        out[i, : len(kept)] = kept
    rows_clean = ~drop.any(1)
    out[rows_clean] = idx[rows_clean]
    Yf = (Y - Y.multiply(filt)).tocsr()
    Yf.eliminate_zeros()
    return out, Yf


def hit_matrix(idx: np.ndarray, Y: sp.csr_matrix) -> np.ndarray:
    """hits[i, j] = 1 if predicted label idx[i, j] is a positive of row i."""
    Y = Y.tocsr()
    L = Y.shape[1]
    true_keys = np.repeat(np.arange(Y.shape[0], dtype=np.int64), np.diff(Y.indptr)) * L + Y.indices
    true_keys.sort()
    keys = np.arange(idx.shape[0], dtype=np.int64)[:, None] * L + idx
    pos = np.searchsorted(true_keys, keys)
    pos = np.minimum(pos, max(len(true_keys) - 1, 0))
    found = (true_keys[pos] == keys) if len(true_keys) else np.zeros_like(keys, dtype=bool)
    return (found & (idx >= 0)).astype(np.float64)
