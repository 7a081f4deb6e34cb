"""Row-wise top-k of a sparse product ``A @ B.T`` without dense (rows x columns) score blocks.

TF-IDF zero-shot, the MACLR TF-IDF pseudo pairs and TF-IDF kNN score every query against every
label (or training instance), but a query shares terms with only a few of them. Multiplying a
chunk of query rows by ``B.T`` with scipy's sparse matmul gives a CSR that holds only the nonzero
scores, so time and memory follow the product's nonzeros, not ``rows x m`` (``m`` up to millions).

The results equal :func:`xmc.predictions.topk_from_scores` on the dense product (zeros are
candidates: a row with fewer than ``k`` nonzero scores is filled with score-0 columns, lowest ids
first; ``-1`` / ``-inf`` pad only where ``k`` exceeds the number of columns), or, with
``zeros_are_candidates=False``, :func:`xmc.predictions.topk_from_sparse` (only stored entries).
Either way rows are sorted by decreasing score and exact ties go to the lower column id.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp
from tqdm import tqdm

from xmc.predictions import TopK

# Nonzeros of one chunk's product (upper bound: the sum over the chunk's terms of their posting
# lengths, capped at m per row). 2**24 entries are ~130 MB of float32 data + int32 indices, plus
# about as much again in per-entry temporaries of the selection: a few hundred MB whatever m is,
# and large enough that per-chunk overhead (scipy allocates O(m) scratch per matmul) is amortised.
NNZ_BUDGET = 1 << 24
# Largest padded (rows x width) block used to find each long row's k-th largest score.
_PAD_BLOCK = 1 << 22


def _pad_value(dtype: np.dtype) -> float | int:
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def _kth_largest(indptr: np.ndarray, data: np.ndarray, lens: np.ndarray, k: int) -> np.ndarray | None:
    """Per row, the k-th largest stored value (pad value for rows with <= k entries); ``None`` if no row
    has more than k entries. Rows are grouped by length so each padded 2-D block is at most twice the
    entries it holds and at most ``_PAD_BLOCK`` cells, whatever the number of columns."""
    big = np.flatnonzero(lens > k)
    if big.size == 0:
        return None
    pad = _pad_value(data.dtype)
    kth = np.full(lens.shape[0], pad, dtype=data.dtype)
    big = big[np.argsort(lens[big], kind="stable")]
    Ls = lens[big]
    i = 0
    while i < big.size:
        w = int(Ls[i])
        e = min(big.size, i + max(1, _PAD_BLOCK // (2 * w)), int(np.searchsorted(Ls, 2 * w, side="left")))
        g, Lg = big[i:e], Ls[i:e]
        width = int(Lg[-1])
        offs = np.arange(int(Lg.sum())) - np.repeat(np.cumsum(Lg) - Lg, Lg)
        block = np.full((g.size, width), pad, dtype=data.dtype)
        block[np.repeat(np.arange(g.size), Lg), offs] = data[np.repeat(indptr[g], Lg) + offs]
        kth[g] = np.partition(block, width - k, axis=1)[:, width - k]
        i = e
    return kth


def _first_missing(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray, count: np.ndarray, m: int,
                   sorted_indices: bool) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``rows``, its ``count`` smallest column ids that hold no stored entry (the
    score-0 columns a dense top-k would rank next), as (row, column) pairs.

    With the row's stored columns sorted as c_0 < c_1 < ..., d_t = c_t - t columns are missing
    before c_t, so the j-th missing column is j + #{t : d_t <= j}: one searchsorted, no loop."""
    lens = np.diff(indptr)[rows]
    starts = np.cumsum(lens) - lens
    M1 = np.int64(m) + 1
    rl = np.repeat(np.arange(rows.size, dtype=np.int64), lens)
    rank = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(starts, lens)
    cols = indices[np.repeat(indptr[rows].astype(np.int64), lens) + rank].astype(np.int64)
    key = rl * M1 + cols
    if not sorted_indices:
        key.sort()
    dkey = key - rank  # = row * (m + 1) + d_t, nondecreasing
    tr = np.repeat(np.arange(rows.size, dtype=np.int64), count)
    j = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    missing = j + np.searchsorted(dkey, tr * M1 + j, side="right") - starts[tr]
    return rows[tr], missing


def csr_topk(S: sp.csr_matrix, k: int, zeros_are_candidates: bool = True) -> TopK:
    """Top-``k`` columns of each row of a sparse score matrix, vectorised over the stored entries.

    ``zeros_are_candidates=True``: as :func:`~xmc.predictions.topk_from_scores` on ``S.toarray()``
    (unstored columns score 0); ``False``: as :func:`~xmc.predictions.topk_from_sparse`. Memory is
    O(nnz(S) + rows * k): only each row's top ``k`` stored entries (plus exact ties at the cut) and at
    most ``k`` zero columns per row are ever sorted.
    """
    S = S.tocsr()
    n, m = S.shape
    if zeros_are_candidates and S.nnz and not S.data.all():
        S = S.copy()
        S.eliminate_zeros()  # stored zeros rank with the unstored ones, by column id
    data = S.data if np.issubdtype(S.data.dtype, np.floating) or np.issubdtype(S.data.dtype, np.signedinteger) \
        else S.data.astype(np.float64)
    indptr = S.indptr.astype(np.int64)
    lens = np.diff(indptr)
    kth = _kth_largest(indptr, data, lens, k)
    if kth is None:
        cand = np.arange(data.size, dtype=np.int64)
    else:
        cand = np.flatnonzero(data >= np.repeat(kth, lens))
    rows = np.searchsorted(indptr, cand, side="right") - 1
    cols = S.indices[cand].astype(np.int64)
    vals = data[cand]
    if zeros_are_candidates:
        # every positive score of a row with fewer than k positives is a candidate, so the candidates'
        # positives count min(k, positives); the next ranks are score-0 columns, lowest ids first
        npos = np.bincount(rows[vals > 0], minlength=n)
        need = np.minimum(np.maximum(k - npos, 0), m - lens)
        fill = np.flatnonzero(need > 0)
        if fill.size:
            zr, zc = _first_missing(indptr, S.indices, fill, need[fill], m, S.has_sorted_indices)
            rows, cols = np.concatenate([rows, zr]), np.concatenate([cols, zc])
            vals = np.concatenate([vals, np.zeros(zr.size, dtype=vals.dtype)])
    order = np.lexsort((cols, -vals, rows))  # by row, score descending, then lower column id
    rows, cols, vals = rows[order], cols[order], vals[order]
    rank = np.arange(rows.size) - np.searchsorted(rows, rows, side="left")
    keep = rank < k
    idx = np.full((n, k), -1, np.int32)
    sc = np.full((n, k), -np.inf, np.float32)
    idx[rows[keep], rank[keep]] = cols[keep]
    sc[rows[keep], rank[keep]] = vals[keep]
    return TopK(idx, sc)


def prune_postings(B: sp.csr_matrix, max_per_term: int) -> sp.csr_matrix:
    """Static index pruning (Carmel et al., 2001): each column (term) of ``B`` (items x terms) keeps only its
    ``max_per_term`` largest entries (and exact ties at the cut); 0 keeps everything.

    An exact sparse product costs the sum of the query terms' posting lengths, which grows with the number of
    items: with a fixed vocabulary, scoring every query against every label or training instance is quadratic in
    the data size. Capped postings bound a query's work by (its terms x ``max_per_term``); an item loses a term's
    contribution only where that term weighs less in it than in ``max_per_term`` other items."""
    if max_per_term <= 0 or B.nnz == 0:
        return B
    C = B.tocsc()
    C.sort_indices()
    indptr = C.indptr.astype(np.int64)
    lens = np.diff(indptr)
    kth = _kth_largest(indptr, C.data, lens, max_per_term)
    if kth is None:
        return B
    keep = C.data >= np.repeat(kth, lens)
    cols = np.repeat(np.arange(C.shape[1]), lens)[keep]
    pruned = sp.csc_matrix((C.data[keep], C.indices[keep], np.concatenate([[0], np.cumsum(np.bincount(cols, minlength=C.shape[1]))])),
                           shape=C.shape)
    return pruned.tocsr()


def row_blocks(A: sp.csr_matrix, BT: sp.csr_matrix, max_rows: int,
               nnz_budget: int = NNZ_BUDGET) -> list[tuple[int, int]]:
    """Consecutive row ranges of ``A`` whose product with ``BT`` stays within ``nnz_budget`` nonzeros.

    A row's product nonzeros are bounded by the sum of ``BT``'s row lengths over the row's terms (the
    matmul's work) and by ``m``; a block grows until that bound would exceed the budget or it holds
    ``max_rows`` rows (one row at least, however dense)."""
    n, m = A.shape[0], BT.shape[1]
    post = np.diff(BT.indptr).astype(np.int64)
    est = np.empty(n, np.int64)
    step = 1 << 16
    for s in range(0, n, step):
        e = min(n, s + step)
        lo, hi = int(A.indptr[s]), int(A.indptr[e])
        w = np.concatenate([[0], np.cumsum(post[A.indices[lo:hi]])])
        ip = A.indptr[s : e + 1] - lo
        est[s:e] = w[ip[1:]] - w[ip[:-1]]
    np.minimum(est, m, out=est)
    cum = np.concatenate([[0], np.cumsum(est)])
    blocks, s = [], 0
    while s < n:
        e = min(n, s + max(1, max_rows), int(np.searchsorted(cum, cum[s] + nnz_budget, side="right")) - 1)
        e = max(e, s + 1)
        blocks.append((s, e))
        s = e
    return blocks


def transposed_operand(B: sp.spmatrix) -> sp.csr_matrix:
    """``B.T`` as CSR (V x m): the right operand of every block's product. A caller that multiplies many query
    batches by the same ``B`` computes it once and passes it as ``BT`` (at 10^6 labels the transpose is 0.5 s)."""
    return B.tocsr().T.tocsr()


def iter_sparse_product_topk(A: sp.spmatrix, B: sp.spmatrix | None, k: int, *, zeros_are_candidates: bool = True,
                             max_rows: int = 4096, nnz_budget: int = NNZ_BUDGET, desc: str | None = None,
                             BT: sp.csr_matrix | None = None) -> Iterator[tuple[int, TopK]]:
    """(first row, top-k of those rows) for consecutive row blocks of ``A @ B.T`` (``A``: n x V,
    ``B``: m x V, or ``BT`` = :func:`transposed_operand` of it), each block computed as a sparse product; see
    :func:`row_blocks` for the sizes."""
    A = A.tocsr()
    if BT is None:
        BT = transposed_operand(B)   # once: a CSC right operand would be converted again in every matmul
    blocks = row_blocks(A, BT, max_rows, nnz_budget)
    if desc is not None:
        blocks = tqdm(blocks, desc=desc, unit="chunk", leave=False)
    for s, e in blocks:
        yield s, csr_topk(A[s:e] @ BT, k, zeros_are_candidates)


def sparse_product_topk(A: sp.spmatrix, B: sp.spmatrix | None, k: int, *, zeros_are_candidates: bool = True,
                        max_rows: int = 4096, nnz_budget: int = NNZ_BUDGET, desc: str | None = None,
                        BT: sp.csr_matrix | None = None) -> TopK:
    """Top-``k`` columns of every row of ``A @ B.T``, equal to ``topk_from_scores((A @ B.T).toarray(), k)``
    (or ``topk_from_sparse`` with ``zeros_are_candidates=False``) at memory bounded by ``nnz_budget``."""
    parts = [t for _, t in iter_sparse_product_topk(A, B, k, zeros_are_candidates=zeros_are_candidates,
                                                    max_rows=max_rows, nnz_budget=nnz_budget, desc=desc, BT=BT)]
    if not parts:
        return TopK(np.full((0, k), -1, np.int32), np.full((0, k), -np.inf, np.float32))
    return TopK(np.vstack([p.indices for p in parts]), np.vstack([p.scores for p in parts]))
