"""A lexical shortlist re-ranked by a dense model: each text's top ``shortlist_k`` labels by TF-IDF cosine with
the label texts (postings capped), ordered by the model's own inner products.

Why: above ``index.auto_exact_max`` a dense run searches an approximate index calibrated to recall@100 against
exact search. Bag-of-words label vectors have little structure for a partition or a graph to follow, so at
recall 0.9 that index is a scan of every label (docs/scale.md), and prediction costs O(texts x labels). A
capped inverted index bounds a text's work by (its terms x ``max_postings_per_term``) whatever the number of
labels, and the re-rank by ``shortlist_k`` inner products. It is a different ranking, not an approximation of
exact search: labels that share no kept term with the text are never returned. So the prediction stage keeps
it only where it ranks the validation split at least as well as exact search (``xmc.methods.base.predict_run``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from xmc.sparse_topk import sparse_product_topk, transposed_operand


def shortlist_candidates(X_query: sp.csr_matrix, X_label: sp.csr_matrix | None, shortlist_k: int,
                         X_label_T: sp.csr_matrix | None = None) -> np.ndarray:
    """Per query row, the ids of its (at most) ``shortlist_k`` labels of highest TF-IDF cosine among the labels
    sharing a term with it, best first; -1 pads rows with fewer (a query sharing no term gets none).
    ``X_label_T``: ``X_label`` already transposed (:func:`xmc.sparse_topk.transposed_operand`)."""
    top = sparse_product_topk(X_query, X_label, shortlist_k, zeros_are_candidates=False, BT=X_label_T)
    ids = top.indices.astype(np.int64)
    return np.where(np.isfinite(top.scores), ids, -1)


def rerank(queries: np.ndarray, vectors: np.ndarray, candidates: np.ndarray, k: int,
           rows_per_block: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """The top-``k`` of each row's candidates by inner product with its query vector: (scores, ids), best first,
    exact ties to the lower id; -inf / -1 pad rows with fewer than ``k`` candidates.

    ``vectors`` may be float16 or memory-mapped: only the candidates' rows are read (a block of queries at a time,
    ``rows_per_block`` x ``shortlist_k`` x d floats)."""
    n = len(queries)
    D = np.full((n, k), -np.inf, np.float32)
    ids = np.full((n, k), -1, np.int64)
    if n == 0 or candidates.shape[1] == 0:
        return D, ids
    q = np.ascontiguousarray(queries, dtype=np.float32)
    for s in range(0, n, rows_per_block):
        c = candidates[s : s + rows_per_block]
        valid = c >= 0
        gathered = np.asarray(vectors[np.where(valid, c, 0)], dtype=np.float32)     # (b, K, d)
        sc = np.matmul(gathered, q[s : s + rows_per_block, :, None])[..., 0]         # (b, K)
        sc[~valid] = -np.inf
        # order by score, then by label id (ties); invalid slots (-inf) last
        order = np.lexsort((np.where(valid, c, np.iinfo(np.int64).max), -sc), axis=-1)[:, :k]
        kk = order.shape[1]
        D[s : s + rows_per_block, :kk] = np.take_along_axis(sc, order, 1)
        ids[s : s + rows_per_block, :kk] = np.take_along_axis(c, order, 1)
    ids[~np.isfinite(D)] = -1
    return D, ids


# Below this many texts, exact search over every label runs as matrix products in blocks (torch) rather than
# faiss' flat search, which costs about as much for 5 texts as for 500 at k = 100 (10^6 x 256 labels, 2 cores:
# 1.7 s for 70 texts against 0.62 s; 2.8 against 5.7 ms per text for 2,000)
SMALL_FULL_SEARCH = 256


def full_search(queries: np.ndarray, vectors: np.ndarray, k: int, block: int = 131072) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` over every label for a few texts: (scores, ids), best first (ties as torch.topk orders
    them); ``vectors`` float32 (n x d), read ``block`` rows at a time."""
    q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
    kk = min(k, len(vectors))
    best_s, best_i = [], []
    with torch.inference_mode():
        for s in range(0, len(vectors), block):
            S = q @ torch.from_numpy(np.ascontiguousarray(vectors[s : s + block], dtype=np.float32)).T
            v, i = torch.topk(S, min(kk, S.shape[1]), dim=1)
            best_s.append(v)
            best_i.append(i + s)
        v, i = torch.topk(torch.cat(best_s, 1), kk, dim=1)
        ids = torch.gather(torch.cat(best_i, 1), 1, i)
    D = np.full((len(queries), k), -np.inf, np.float32)
    I = np.full((len(queries), k), -1, np.int64)
    D[:, :kk], I[:, :kk] = v.numpy(), ids.numpy()
    return D, I


class TfidfShortlist:
    """The TF-IDF side of a shortlist: the fitted vectoriser and the label rows (postings already capped)."""

    def __init__(self, vectorizer: Any, X_label: sp.csr_matrix, shortlist_k: int) -> None:
        if shortlist_k <= 0:
            raise ValueError(f"shortlist_k must be positive, got {shortlist_k}")

        self.vectorizer, self.shortlist_k = vectorizer, int(shortlist_k)
        self.X_label_T = transposed_operand(X_label)   # once, not per batch of texts

    def candidates(self, texts: list[str], shortlist_k: int | None = None) -> np.ndarray:
        """(texts x shortlist_k) label ids, best TF-IDF cosine first, -1 padded; ``shortlist_k`` None: this one's."""
        return shortlist_candidates(self.vectorizer.transform(texts).tocsr(), None, shortlist_k or self.shortlist_k,
                                    self.X_label_T)


__all__ = ["SMALL_FULL_SEARCH", "TfidfShortlist", "full_search", "rerank", "shortlist_candidates"]
