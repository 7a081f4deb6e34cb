"""Sparse top-k of A @ B.T (xmc.sparse_topk): equal to a dense argsort on random matrices (empty rows,
k beyond the nonzeros or the columns, exact ties, negative scores, several blocks); the three TF-IDF
callers equal their former dense-block implementations, kept below as references; and no dense
rows x columns block is ever allocated (2,000,000 columns under 64 MB)."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from xmc.baselines.tfidf import fit_tfidf, knn_label_voting, tfidf_zero_shot
from xmc.maclr.pseudo import tfidf_topk
from xmc.predictions import TopK, topk_from_scores, topk_from_sparse
from xmc.sparse_topk import csr_topk, row_blocks, sparse_product_topk


# ---- references ----------------------------------------------------------------------------------
def dense_reference(S: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every column ranked by (score descending, column id ascending); -1 / -inf past the last column."""
    n, m = S.shape
    idx = np.full((n, k), -1, np.int32)
    sc = np.full((n, k), -np.inf, np.float32)
    for i in range(n):
        order = np.lexsort((np.arange(m), -S[i]))[:k]
        idx[i, : order.size], sc[i, : order.size] = order, S[i, order]
    return idx, sc


def old_tfidf_zero_shot(X_query, X_label, k, chunk=512):
    XT = X_label.T.tocsc()
    parts = [topk_from_scores((X_query[s : s + chunk] @ XT).toarray(), k) for s in range(0, X_query.shape[0], chunk)]
    return TopK(np.vstack([p.indices for p in parts]), np.vstack([p.scores for p in parts]))


def old_knn_label_voting(X_query, X_train, Y_train, n_neighbors, k, chunk=512, power=1.0):
    XT = X_train.T.tocsc()
    parts = []
    for s in range(0, X_query.shape[0], chunk):
        sims = (X_query[s : s + chunk] @ XT).toarray()
        nn = topk_from_scores(sims, n_neighbors)
        valid = nn.indices >= 0
        rows = np.repeat(np.arange(sims.shape[0]), n_neighbors).reshape(nn.indices.shape)[valid]
        W = sp.csr_matrix((np.maximum(nn.scores[valid], 0) ** power, (rows, nn.indices[valid])),
                          shape=(sims.shape[0], X_train.shape[0]))
        parts.append(topk_from_sparse((W @ Y_train).tocsr(), k))
    return TopK(np.vstack([p.indices for p in parts]), np.vstack([p.scores for p in parts]))


def old_tfidf_topk(X_inst, X_lbl, k, min_score=0.0, chunk=1024):
    top = old_tfidf_zero_shot(X_inst.tocsr(), X_lbl.tocsr(), k, chunk=chunk)
    ids, scores = top.indices.astype(np.int32), top.scores.astype(np.float32)
    drop = (ids < 0) | ~(scores > min_score)
    ids[drop], scores[drop] = -1, 0.0
    return ids, scores


def assert_same(new: TopK, ref: TopK) -> None:
    assert new.indices.dtype == ref.indices.dtype == np.int32 and new.scores.dtype == ref.scores.dtype == np.float32
    assert new.indices.shape == ref.indices.shape
    np.testing.assert_array_equal(new.indices, ref.indices)
    np.testing.assert_array_equal(new.scores, ref.scores)  # same sparse products: bit-identical scores


# ---- random matrices ------------------------------------------------------------------------------
def random_pair(rng, n, m, V, density, integer=False, signed=False, empty_rows=0.2):
    """A (n x V), B (m x V); small integer values make many exact ties, signed ones negative scores."""
    def one(rows):
        M = sp.random(rows, V, density=density, format="csr", rng=rng, dtype=np.float32)
        if integer:
            M.data = rng.integers(1, 3, M.nnz).astype(np.float32)
        if signed:
            M.data *= rng.choice(np.array([-1, 1], np.float32), M.nnz)
        return M
    A, B = one(n), one(m)
    A = sp.diags((rng.random(n) >= empty_rows).astype(np.float32)) @ A  # some queries match nothing
    A.eliminate_zeros()
    return A.tocsr(), B.tocsr()


CASES = [  # n, m, V, density, k, integer, signed
    (40, 60, 30, 0.05, 5, False, False),
    (40, 60, 30, 0.05, 25, True, False),    # k > most rows' nonzeros: zero fill, ties
    (30, 12, 20, 0.1, 20, True, False),     # k > m: -1 / -inf padding
    (50, 80, 15, 0.3, 7, True, True),       # dense-ish, ties, negative scores rank below the zeros
    (25, 40, 10, 0.5, 40, False, True),     # k = m with negatives
    (60, 200, 50, 0.02, 3, True, False),
    (1, 5, 5, 0.0, 3, False, False),        # no nonzero at all
]


@pytest.mark.parametrize("n,m,V,density,k,integer,signed", CASES)
@pytest.mark.parametrize("max_rows,budget", [(4096, 1 << 24), (7, 1 << 24), (4096, 40)])
def test_sparse_product_topk_equals_the_dense_argsort(n, m, V, density, k, integer, signed, max_rows, budget):
    rng = np.random.default_rng(n * 1000 + m + k)
    A, B = random_pair(rng, n, m, V, density, integer, signed)
    S = (A @ B.T).toarray()
    idx, sc = dense_reference(S, k)
    top = sparse_product_topk(A, B, k, max_rows=max_rows, nnz_budget=budget)
    np.testing.assert_array_equal(top.indices, idx)
    np.testing.assert_allclose(top.scores, sc, atol=1e-6)
    assert_same(top, topk_from_scores(S, k))  # and the dense routine the callers used before


@pytest.mark.parametrize("k", [1, 3, 10, 100])
def test_csr_topk_stored_entries_only_equals_topk_from_sparse(k):
    rng = np.random.default_rng(k)
    S = sp.random(50, 70, density=0.1, format="csr", rng=rng, dtype=np.float32)
    S.data = np.round(S.data * 4) - 1  # ties, negatives and stored zeros (candidates here)
    S.indices = S.indices.copy()
    for i in range(0, 50, 3):  # unsorted indices within rows
        lo, hi = S.indptr[i], S.indptr[i + 1]
        S.indices[lo:hi], S.data[lo:hi] = S.indices[lo:hi][::-1].copy(), S.data[lo:hi][::-1].copy()
    S.has_sorted_indices = False
    assert_same(csr_topk(S, k, zeros_are_candidates=False), topk_from_sparse(S, k))
    assert_same(csr_topk(S, k), topk_from_scores(S.toarray(), k))


def test_unsorted_product_indices_and_long_rows_split_into_padded_blocks(monkeypatch):
    import xmc.sparse_topk as st

    monkeypatch.setattr(st, "_PAD_BLOCK", 64)  # several padded blocks, each row length class split
    rng = np.random.default_rng(5)
    A, B = random_pair(rng, 80, 300, 40, 0.15, integer=True)
    S = (A @ B.T).tocsr()
    assert not S.has_sorted_indices  # scipy's matmul leaves rows unsorted: the routine must not rely on it
    for k in (1, 4, 33, 299, 300, 301):
        assert_same(csr_topk(S, k), topk_from_scores(S.toarray(), k))


def test_row_blocks_keep_the_product_within_the_budget():
    rng = np.random.default_rng(2)
    A, B = random_pair(rng, 300, 500, 60, 0.05)
    BT = B.T.tocsr()
    blocks = row_blocks(A, BT, max_rows=50, nnz_budget=800)
    assert blocks[0][0] == 0 and blocks[-1][1] == 300 and all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    for s, e in blocks:
        assert e - s <= 50
        assert (A[s:e] @ BT).nnz <= 800 or e - s == 1


def test_no_query_rows_gives_an_empty_top_k():
    A, B = sp.csr_matrix((0, 5), dtype=np.float32), sp.random(4, 5, density=0.5, format="csr", dtype=np.float32)
    top = sparse_product_topk(A, B, 3)
    assert top.indices.shape == top.scores.shape == (0, 3)
    Y = sp.csr_matrix(np.eye(4, dtype=np.float32))
    assert knn_label_voting(A, B, Y, 2, 3).indices.shape == (0, 3)


def test_two_million_columns_allocate_no_dense_block():
    """2,000 queries x 2,000,000 labels: a dense float32 block of even 64 rows would be 512 MB."""
    rng = np.random.default_rng(0)
    n, m, V, k = 2000, 2_000_000, 50_000, 10

    def rows_of(n_rows, per_row):
        M = sp.csr_matrix((rng.random(n_rows * per_row, dtype=np.float32), rng.integers(0, V, n_rows * per_row),
                           np.arange(0, n_rows * per_row + 1, per_row)), shape=(n_rows, V))
        M.sum_duplicates()
        return M
    A, B = rows_of(n, 5), rows_of(m, 2)
    tracemalloc.start()
    t0 = time.perf_counter()
    top = sparse_product_topk(A, B, k, max_rows=512)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # B.T as CSR (~32 MB for 4M entries) + small per-block arrays; a dense block would be >= 4 GB
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.1f} MB"
    assert elapsed < 30, elapsed
    # spot check a few rows against their own exact dense row
    for i in (0, 1, n - 1):
        row = (A[i] @ B.T).toarray()
        idx, sc = dense_reference(row, k)
        np.testing.assert_array_equal(top.indices[i], idx[0])
        np.testing.assert_array_equal(top.scores[i], sc[0])


# ---- the three callers, old dense-block code vs new ------------------------------------------------
def _corpus(seed: int = 0):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(400)]
    p = 1 / np.arange(1, 401) ** 1.1
    p /= p.sum()

    def text(lo, hi):
        return " ".join(rng.choice(words, rng.integers(lo, hi), p=p))
    labels = [text(2, 8) for _ in range(300)]
    labels += labels[:20]  # duplicate label texts: exact score ties across label ids
    inst = [text(3, 15) for _ in range(250)] + ["zzzz qqqq", "", "w399 w398"]  # no match, empty, rare terms
    f = fit_tfidf(inst, None, labels, {})
    Y = sp.random(len(inst), len(labels), density=0.01, format="csr", rng=rng, dtype=np.float32)
    Y.data[:] = 1.0
    return f, Y


@pytest.fixture(scope="module")
def corpus():
    return _corpus()


@pytest.mark.parametrize("k,chunk", [(1, 512), (5, 512), (50, 17), (400, 64)])
def test_tfidf_zero_shot_equals_the_dense_block_version(corpus, k, chunk):
    f, _ = corpus
    assert_same(tfidf_zero_shot(f.trn, f.lbl, k, chunk=chunk), old_tfidf_zero_shot(f.trn, f.lbl, k, chunk=chunk))


@pytest.mark.parametrize("k,min_score", [(2, 0.0), (10, 0.05), (30, -1.0), (400, 0.0)])
def test_maclr_tfidf_topk_equals_the_dense_block_version(corpus, k, min_score):
    f, _ = corpus
    ids, sc = tfidf_topk(f.trn, f.lbl, k, min_score)
    ref_ids, ref_sc = old_tfidf_topk(f.trn, f.lbl, k, min_score)
    assert ids.dtype == ref_ids.dtype == np.int32 and sc.dtype == ref_sc.dtype == np.float32
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(sc, ref_sc)


@pytest.mark.parametrize("n_neighbors,k,power,chunk", [(10, 5, 1.0, 512), (3, 20, 2.0, 33), (40, 10, 0.0, 100),
                                                      (300, 8, 1.0, 512)])
def test_knn_label_voting_equals_the_dense_block_version(corpus, n_neighbors, k, power, chunk):
    f, Y = corpus
    Q = f.transform(["w1 w2 w3", "zzzz", "w5 w5 w7 w100", "w0"] * 5) if chunk == 33 else f.trn
    new = knn_label_voting(Q, f.trn, Y, n_neighbors, k, chunk=chunk, power=power)
    assert_same(new, old_knn_label_voting(Q, f.trn, Y, n_neighbors, k, chunk=chunk, power=power))


def test_prune_postings_keeps_each_terms_largest_entries():
    from xmc.sparse_topk import prune_postings

    rng = np.random.default_rng(3)
    B = sp.random(300, 40, density=0.2, format="csr", random_state=4, dtype=np.float64)
    B.data = np.round(B.data, 1)   # exact ties at the cut are kept
    P = prune_postings(B, 5)
    dense, kept = B.toarray(), P.toarray()
    for t in range(B.shape[1]):
        col = dense[:, t][dense[:, t] != 0]
        cut = np.sort(col)[::-1][min(5, len(col)) - 1] if len(col) else 0
        want = np.where(dense[:, t] >= cut, dense[:, t], 0) if len(col) > 5 else dense[:, t]
        assert np.array_equal(kept[:, t], want)
    assert (np.diff(P.tocsc().indptr) >= np.minimum(5, np.diff(B.tocsc().indptr))).all()
    assert prune_postings(B, 0) is B and prune_postings(B, 10_000).nnz == B.nnz
    # a query's product with the pruned side has at most (its terms x cap) nonzeros
    q = sp.csr_matrix(rng.random((1, 40)) * (rng.random((1, 40)) < 0.2))
    assert (q @ P.T).nnz <= q.nnz * 5 + 5 * 40


@pytest.mark.parametrize("params", [{}, {"ngram_max": 1, "sublinear_tf": False}, {"min_df": 2, "max_df": 0.5},
                                    {"max_features": 150, "ngram_max": 3}, {"stop_words": ["w0", "w1"]}])
def test_fit_tfidf_tokenises_once_and_equals_fit_then_transform(params):
    """The features of the training and label texts come from the counts that fit the vocabulary; they must be
    the bytes that scikit-learn's fit followed by transform gives, whatever the pruning and weighting knobs."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from xmc.baselines.tfidf import _vectorizer

    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(300)]
    p = 1 / np.arange(1, 301) ** 1.05
    p /= p.sum()
    trn = [" ".join(rng.choice(words, rng.integers(1, 20), p=p)) for _ in range(400)] + ["", "zzzz"]
    lbl = [" ".join(rng.choice(words, rng.integers(2, 9), p=p)) for _ in range(120)]
    val = [" ".join(rng.choice(words, rng.integers(1, 12), p=p)) for _ in range(50)] + ["unseen words only"]
    got = fit_tfidf(trn, val, lbl, params)
    ref = TfidfVectorizer(**_vectorizer(params).get_params()).fit(trn + lbl)   # scikit-learn's own passes
    assert got.vectorizer.vocabulary_ == ref.vocabulary_
    np.testing.assert_array_equal(got.vectorizer.idf_, ref.idf_)
    for name, texts in (("trn", trn), ("val", val), ("lbl", lbl)):
        mine, want = getattr(got, name), sp.csr_matrix(ref.transform(texts))
        assert isinstance(mine, sp.csr_matrix) and mine.has_sorted_indices and mine.dtype == want.dtype == np.float32
        for part in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(mine, part), getattr(want, part), err_msg=f"{name}.{part} {params}")


@pytest.mark.parametrize("vocabulary", [{}, {"b": 1, "a": 0}, {"zeta": 2, "\u00e9t\u00e9": 3, "a \\ \"q\"": 0, "abc": 1},
                                        {"b": 0, "a": 1}, {"a": 0, "b": 2}, {"a": 1, "b": 1}])
def test_vocabulary_json_is_json_dumps_with_sorted_keys(vocabulary):
    """The TF-IDF stage writes its vocabulary without a json key sort when the column order is the terms' order;
    the bytes must be those of the sorting dump (DVC hashes them), for any vocabulary (the others take the dump)."""
    import json

    from xmc.baselines.tfidf import vocabulary_json

    assert vocabulary_json(vocabulary) == json.dumps(vocabulary, ensure_ascii=False, sort_keys=True)
