"""Row-wise set membership of label ids, without a dense B x L mask.

``out[b, j]`` tells whether ``items[b, j]`` is among the labels of row ``b``. Each (row, label) pair is a key
``row * L + label``; the keys of the sets are sorted once and the items are found by binary search, so memory is
O(pairs + items) whatever L is. Used to drop positives from mined shortlists, to tell sampled negatives that are
positives, and to redraw uniform negatives that collide with hard ones.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def _lookup(keys: np.ndarray, q: np.ndarray) -> np.ndarray:
    if not keys.size:
        return np.zeros(q.shape, bool)
    keys = np.sort(keys, kind="stable")
    at = np.searchsorted(keys, q).clip(max=len(keys) - 1)
    return keys[at] == q


def in_csr_rows(Y: sp.csr_matrix, items: np.ndarray, n_labels: int | None = None) -> np.ndarray:
    """``items[b, j]`` among the stored columns of row ``b`` of ``Y`` (len(items) == Y.shape[0]); ids < 0 never are."""
    Y = Y.tocsr()
    items = np.asarray(items)
    L = int(n_labels if n_labels is not None else max(int(Y.shape[1]), int(items.max(initial=-1)) + 1, 1))
    rows = np.arange(Y.shape[0], dtype=np.int64)
    keys = np.repeat(rows, np.diff(Y.indptr)) * L + Y.indices
    q = rows[:, None] * L + np.maximum(items, 0)
    return _lookup(keys, q) & (items >= 0)


def in_padded_rows(sets: np.ndarray, items: np.ndarray, n_labels: int) -> np.ndarray:
    """``items[b, j]`` among ``sets[b]`` (a row of label ids, -1 = none)."""
    rows = np.arange(len(items), dtype=np.int64)[:, None]
    keys = (rows * n_labels + sets)[sets >= 0]
    return _lookup(keys, rows * n_labels + np.maximum(items, 0)) & (items >= 0)
