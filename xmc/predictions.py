"""Top-k predictions: the one format every method writes and the evaluate stage reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xmc.errors import ConfigError
from xmc.io import save_npz_deterministic


@dataclass
class TopK:
    """Per-row label ids sorted by decreasing score; ``-1`` pads rows with fewer labels."""

    indices: np.ndarray  # (n, k) int32
    scores: np.ndarray  # (n, k) float32

    def __post_init__(self) -> None:
        if self.indices.shape != self.scores.shape or self.indices.ndim != 2:
            raise ValueError(f"indices {self.indices.shape} and scores {self.scores.shape} must be equal 2-d shapes")

    @property
    def k(self) -> int:
        return self.indices.shape[1]

    def save(self, path: str | Path) -> None:
        save_npz_deterministic(path, indices=self.indices.astype(np.int32), scores=self.scores.astype(np.float32))

    @classmethod
    def load(cls, path: str | Path) -> TopK:
        with np.load(path) as z:
            return cls(z["indices"], z["scores"])

    def to_csr(self, n_labels: int) -> sp.csr_matrix:
        n, k = self.indices.shape
        mask = self.indices >= 0
        rows = np.repeat(np.arange(n), k).reshape(n, k)[mask]
        return sp.csr_matrix((self.scores[mask], (rows, self.indices[mask])), shape=(n, n_labels))


def topk_from_scores(scores: np.ndarray, k: int) -> TopK:
    """Top-k of a dense (n, L) score block, sorted descending (ties broken by lower label id)."""
    n, L = scores.shape
    k_eff = min(k, L)
    part = np.argpartition(-scores, k_eff - 1, axis=1)[:, :k_eff] if k_eff < L else np.tile(np.arange(L), (n, 1))
    part_scores = np.take_along_axis(scores, part, axis=1)
    if k_eff < L:
        # argpartition picks arbitrarily among labels tied at the cut: redo those rows so the
        # lowest label ids win, as everywhere else
        kth = part_scores.min(axis=1, keepdims=True)
        tied_rows = np.flatnonzero((scores >= kth).sum(axis=1) > k_eff)
        for r in tied_rows:
            above = np.flatnonzero(scores[r] > kth[r, 0])
            at = np.flatnonzero(scores[r] == kth[r, 0])[: k_eff - len(above)]
            part[r] = np.concatenate([above, at])
            part_scores[r] = scores[r, part[r]]
    # lexsort: primary key score (desc), secondary label id (asc) for deterministic ties
    order = np.lexsort((part, -part_scores), axis=1)
    idx = np.take_along_axis(part, order, axis=1).astype(np.int32)
    sc = np.take_along_axis(part_scores, order, axis=1).astype(np.float32)
    if k_eff < k:
        idx = np.pad(idx, ((0, 0), (0, k - k_eff)), constant_values=-1)
        sc = np.pad(sc, ((0, 0), (0, k - k_eff)), constant_values=-np.inf)
    return TopK(idx, sc)


def topk_from_sparse(S: sp.csr_matrix, k: int) -> TopK:
    """Top-k of each row of a sparse score matrix (missing entries are not candidates)."""
    S = S.tocsr()
    n = S.shape[0]
    idx = np.full((n, k), -1, np.int32)
    sc = np.full((n, k), -np.inf, np.float32)
    for i in range(n):
        lo, hi = S.indptr[i], S.indptr[i + 1]
        if lo == hi:
            continue
        cols, vals = S.indices[lo:hi], S.data[lo:hi]
        order = np.lexsort((cols, -vals))[:k]
        idx[i, : len(order)] = cols[order]
        sc[i, : len(order)] = vals[order]
    return TopK(idx, sc)


PREDICTED_SPLITS = ("val", "tst")


def run_and_splits(argv: list[str], usage: str) -> tuple[str, tuple[str, ...]]:
    """``<run> [val] [tst]`` of a prediction stage's command line (default: both splits)."""
    if not argv:
        raise ConfigError(f"usage: {usage}")
    name, splits = argv[0], tuple(argv[1:]) or PREDICTED_SPLITS
    if set(splits) - set(PREDICTED_SPLITS):
        raise ConfigError(f"splits to predict must be val and/or tst, not {' '.join(splits)}")
    return name, splits
