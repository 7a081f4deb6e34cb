"""Metrics against hand-computed cases.

Expected values are literals worked out by hand (derivations in the comments), except the
propensity weights, which are computed with ``math`` straight from the formula
1/p_l = 1 + C (N_l + B)^-A, C = (ln N - 1)(B + 1)^A.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from xmc.metrics import _apply_filter, evaluate_topk, hit_matrix, inverse_propensity
from xmc.predictions import TopK, topk_from_scores, topk_from_sparse


def csr(rows: list[list[int]], n_labels: int) -> sp.csr_matrix:
    r = [i for i, labs in enumerate(rows) for _ in labs]
    c = [lab for labs in rows for lab in labs]
    return sp.csr_matrix((np.ones(len(c), np.float32), (r, c)), shape=(len(rows), n_labels))


def topk(indices: list[list[int]]) -> TopK:
    idx = np.asarray(indices, dtype=np.int32)
    # scores only need to be consistent with the order; metrics read indices
    sc = np.where(idx >= 0, -np.arange(idx.shape[1], dtype=np.float32)[None, :], -np.inf).astype(np.float32)
    return TopK(idx, sc)


def w(n_l: float, n: int = 100, a: float = 0.55, b: float = 1.5) -> float:
    """Inverse propensity of one label, straight from Jain et al. (2016)."""
    c = (math.log(n) - 1.0) * (b + 1.0) ** a
    return 1.0 + c * (n_l + b) ** (-a)


# --------------------------------------------------------------------------------------
# The main tiny case: L = 6 labels, 3 test rows, top-3 predictions.
#
#   row 0: truth {0, 5}   pred [0, 3, 5]    hits [1, 0, 1]
#   row 1: truth {1}      pred [1, -1, -1]  hits [1, 0, 0]  (fewer positives than k; padded)
#   row 2: truth {}       pred [3, 4, -1]   hits [0, 0, 0]  (row without labels)
#
# Padding trap: hit_matrix keys are row*L + label, so the -1 in row 1 has key 1*6-1 = 5,
# which is exactly the key of the true pair (row 0, label 5). It must not count as a hit.
#
# train_label_freq = [10, 0, 50, 3, 1, 0], n_train = 100 -> labels 1 and 5 are unseen.
# --------------------------------------------------------------------------------------
L = 6
Y_MAIN = [[0, 5], [1], []]
PRED_MAIN = [[0, 3, 5], [1, -1, -1], [3, 4, -1]]
FREQ_MAIN = np.array([10, 0, 50, 3, 1, 0])


@pytest.fixture
def main_result() -> dict:
    return evaluate_topk(topk(PRED_MAIN), csr(Y_MAIN, L), FREQ_MAIN, 100, ks=(1, 3), recall_ks=(2,))


def test_hit_matrix_main_case_and_padding_never_hits():
    hits = hit_matrix(np.asarray(PRED_MAIN, dtype=np.int64), csr(Y_MAIN, L))
    assert hits.tolist() == [[1, 0, 1], [1, 0, 0], [0, 0, 0]]


def test_hit_matrix_padding_in_first_row_and_empty_truth():
    # key of -1 in row 0 is -1 (before every key); no truth at all -> nothing is a hit
    assert hit_matrix(np.array([[-1, 0]]), csr([[0]], 3)).tolist() == [[0, 1]]
    assert hit_matrix(np.array([[0, 1], [2, -1]]), csr([[], []], 3)).tolist() == [[0, 0], [0, 0]]


def test_precision_at_k(main_result):
    m = main_result["metrics"]
    # P@1: top-1 hits 1, 1, 0 over 3 rows (the label-less row counts as 0): 2/3
    assert m["P@1"] == pytest.approx(66.666666667)
    # P@3: hits 2 + 1 + 0 = 3 over 3 rows * 3 slots: 3/9
    assert m["P@3"] == pytest.approx(33.333333333)


def test_ndcg_at_k_ideal_dcg_uses_min_k_npos(main_result):
    m = main_result["metrics"]
    # nDCG@1: 1, 1, 0 -> 2/3
    assert m["nDCG@1"] == pytest.approx(66.666666667)
    # nDCG@3:
    #   row 0: DCG = 1/log2(2) + 1/log2(4) = 1.5; IDCG over min(3, 2) = 2 positives
    #          = 1 + 1/log2(3) = 1.6309297536 -> 0.9197207891
    #   row 1: DCG = 1; IDCG over min(3, 1) = 1 positive = 1 -> 1.0 (not 1/1.63+0.5)
    #   row 2: no positives -> 0
    #   mean = (0.9197207891 + 1 + 0) / 3 = 0.6399069297
    assert m["nDCG@3"] == pytest.approx(63.99069297, rel=1e-8)


def test_recall_excludes_rows_without_labels(main_result):
    m = main_result["metrics"]
    # R@2: row 0 top-2 [0, 3] -> 1/2; row 1 top-2 [1, -1] -> 1/1; row 2 excluded
    # mean over 2 rows = 0.75 (including row 2 would give 0.5)
    assert m["R@2"] == pytest.approx(75.0)
    assert m["n_test"] == 3
    assert m["n_test_without_labels"] == 1


def test_unseen_recall_and_frequency_buckets(main_result):
    m, buckets = main_result["metrics"], main_result["recall_by_frequency"]
    # unseen labels (train freq 0): 1 and 5. Test pairs: (row0, 5), (row1, 1) -> 2 pairs.
    # Within top-2 (max recall k): (row1, 1) found at rank 1; (row0, 5) only at rank 3.
    assert m["unseen_test_pairs"] == 2
    assert m["unseen_R@2"] == pytest.approx(50.0)
    # label 0 (freq 10) -> bucket 6-20: 1 pair, found at rank 1. Other buckets have no pairs.
    assert buckets == [
        {"bucket": "0 (unseen)", "test_pairs": 2, "recall@2": pytest.approx(50.0)},
        {"bucket": "1", "test_pairs": 0, "recall@2": None},
        {"bucket": "2-5", "test_pairs": 0, "recall@2": None},
        {"bucket": "6-20", "test_pairs": 1, "recall@2": pytest.approx(100.0)},
        {"bucket": "21-100", "test_pairs": 0, "recall@2": None},
        {"bucket": ">100", "test_pairs": 0, "recall@2": None},
    ]


def test_bucket_boundaries_are_inclusive():
    # One row holding 9 labels whose training frequencies sit on every bucket edge.
    freq = np.array([0, 1, 2, 5, 6, 20, 21, 100, 101])
    Y = csr([list(range(9))], 9)
    # top-4 = [0, 3, 5, 8] -> one hit each in buckets unseen, 2-5, 6-20, >100
    res = evaluate_topk(topk([[0, 3, 5, 8]]), Y, freq, 1000, ks=(1,), recall_ks=(4,))
    got = [(b["bucket"], b["test_pairs"], b["recall@4"]) for b in res["recall_by_frequency"]]
    assert got == [
        ("0 (unseen)", 1, 100.0),  # label 0
        ("1", 1, 0.0),  # label 1
        ("2-5", 2, 50.0),  # labels 2, 3 (3 found)
        ("6-20", 2, 50.0),  # labels 4, 5 (5 found)
        ("21-100", 2, 0.0),  # labels 6, 7
        (">100", 1, 100.0),  # label 8
    ]
    assert res["metrics"]["unseen_R@4"] == 100.0
    # R@4 = 4 of 9 positives
    assert res["metrics"]["R@4"] == pytest.approx(44.444444444)


def test_unseen_recall_is_zero_when_there_are_no_unseen_pairs():
    res = evaluate_topk(topk([[0]]), csr([[0]], 2), np.array([3, 0]), 10, ks=(1,), recall_ks=(1,))
    assert res["metrics"]["unseen_test_pairs"] == 0
    assert res["metrics"]["unseen_R@1"] == 0.0
    assert res["recall_by_frequency"][0]["recall@1"] is None


# ---------------------------------------------------------------- propensity / PSP@k


def test_inverse_propensity_matches_formula():
    freq = np.array([0, 1, 3, 10, 50])
    got = inverse_propensity(freq, 100)
    assert got == pytest.approx([w(0), w(1), w(3), w(10), w(50)], rel=1e-12)
    # By hand: for N_l = 1, (N_l + B)^-A = (B + 1)^-A cancels C's (B + 1)^A,
    # so 1/p = 1 + ln N - 1 = ln N (for any A, B).
    assert got[1] == pytest.approx(math.log(100), rel=1e-12)
    # rarer labels weigh more
    assert list(got) == sorted(got, reverse=True)
    # same identity with A = 1, B = 0.5, N = 10: C = (ln 10 - 1) * 1.5; 1 + C / 1.5 = ln 10
    assert inverse_propensity(np.array([1.0]), 10, a=1.0, b=0.5)[0] == pytest.approx(math.log(10))


def test_psp_normalised_by_best_achievable(main_result):
    m = main_result["metrics"]
    w0, w1, w5 = w(10), w(0), w(0)  # label 0 seen 10 times; 1 and 5 unseen
    # PSP@1: weighted top-1 hits: row0 label 0 (w0), row1 label 1 (w1)  -> w0 + w1
    #        best top-1 per row: row0 max(w0, w5) = w5 (rarer), row1 w1 -> w5 + w1
    #        ratio of sums (not a mean of per-row ratios)
    assert m["PSP@1"] == pytest.approx(100 * (w0 + w1) / (w5 + w1), rel=1e-10)
    assert m["PSP@1"] == pytest.approx(72.1436, abs=1e-3)
    # PSP@3: every positive is in the top 3 -> w0 + w5 + w1 over the same best sum -> 100
    assert m["PSP@3"] == pytest.approx(100.0)


def test_psp_perfect_ranking_of_rarest_positives_is_100():
    freq = np.array([50, 0, 3, 1, 200, 7])
    # row 0 positives {0 (freq 50), 1 (freq 0), 2 (freq 3)}; rarest first: 1, 2, then 0
    # row 1 positives {3 (freq 1)}
    Y = csr([[0, 1, 2], [3]], 6)
    res = evaluate_topk(topk([[1, 2, 4], [3, 4, 5]]), Y, freq, 100, ks=(1, 2), recall_ks=(3,))
    m = res["metrics"]
    assert m["PSP@1"] == pytest.approx(100.0)
    assert m["PSP@2"] == pytest.approx(100.0)
    # ... although precision is not perfect: P@2 = (2 + 1) / 4
    assert m["P@2"] == pytest.approx(75.0)
    # swapping the two rarest in row 0 keeps PSP@2 at 100 but lowers PSP@1:
    # (w(3) + w(1)) / (w(0) + w(1))
    res = evaluate_topk(topk([[2, 1, 4], [3, 4, 5]]), Y, freq, 100, ks=(1, 2), recall_ks=(3,))
    assert res["metrics"]["PSP@2"] == pytest.approx(100.0)
    assert res["metrics"]["PSP@1"] == pytest.approx(100 * (w(3) + w(1)) / (w(0) + w(1)), rel=1e-10)
    assert res["metrics"]["PSP@1"] < 100.0


def test_row_without_labels_contributes_zero():
    freq = np.array([50, 0, 3, 1, 200, 7])
    Y = csr([[0, 1, 2], [3]], 6)
    base = evaluate_topk(topk([[2, 1, 4], [3, 4, 5]]), Y, freq, 100, ks=(1, 2), recall_ks=(3,))["metrics"]
    Y3 = csr([[0, 1, 2], [3], []], 6)
    more = evaluate_topk(topk([[2, 1, 4], [3, 4, 5], [0, 1, 2]]), Y3, freq, 100, ks=(1, 2), recall_ks=(3,))["metrics"]
    # P and nDCG: same sums over 3 rows instead of 2
    assert more["P@1"] == pytest.approx(base["P@1"] * 2 / 3)
    assert more["nDCG@2"] == pytest.approx(base["nDCG@2"] * 2 / 3)
    # PSP: nothing added to numerator or denominator
    assert more["PSP@1"] == pytest.approx(base["PSP@1"])
    # R@k: the label-less row is left out of the average
    assert more["R@3"] == pytest.approx(base["R@3"])
    assert (base["n_test_without_labels"], more["n_test_without_labels"]) == (0, 1)


def test_all_rows_without_labels_give_zeros():
    res = evaluate_topk(topk([[0, 1], [1, -1]]), csr([[], []], 3), np.array([1, 1, 0]), 10, ks=(1, 2), recall_ks=(2,))
    m = res["metrics"]
    assert (m["P@1"], m["nDCG@2"], m["PSP@2"], m["R@2"], m["unseen_R@2"]) == (0.0, 0.0, 0.0, 0.0, 0.0)
    assert m["n_test_without_labels"] == 2


# ----------------------------------------------------------------------------- filter


# Two rows, L = 5, top-3.
#   row 0: truth {2, 3}; filter (0, 0) (not a positive); pred [0, 2, 3] -> [2, 3, -1]
#   row 1: truth {1, 4}; filter (1, 4) (a positive);     pred [4, 0, 1] -> [0, 1, -1], truth {1}
FILT = csr([[0], [4]], 5)
Y_F = csr([[2, 3], [1, 4]], 5)
PRED_F = [[0, 2, 3], [4, 0, 1]]


def test_filter_removes_pairs_and_shifts_predictions_up():
    idx, Yf = _apply_filter(topk(PRED_F), Y_F, FILT)
    assert idx.tolist() == [[2, 3, -1], [0, 1, -1]]
    assert Yf.toarray().tolist() == [[0, 0, 1, 1, 0], [0, 1, 0, 0, 0]]


def test_filter_in_evaluate_topk():
    freq = np.ones(5)
    m = evaluate_topk(topk(PRED_F), Y_F, freq, 10, ks=(1, 2), recall_ks=(3,), filt=FILT)["metrics"]
    # after filtering: row 0 [2, 3] hits [1, 1]; row 1 [0, 1] hits [0, 1]
    assert m["P@1"] == pytest.approx(50.0)  # (1 + 0) / 2
    assert m["P@2"] == pytest.approx(75.0)  # (2 + 1) / 4
    # nDCG@2: row 0 perfect = 1; row 1 DCG 1/log2(3), IDCG over min(2, 1) = 1 -> 0.6309297536
    assert m["nDCG@2"] == pytest.approx(81.54648768, rel=1e-8)
    # R@3: row 0 2/2; row 1 1/1 -> 100. Had label 4 stayed in row 1's truth (it left the
    # predictions with the filter) it would be (1 + 1/2) / 2 = 75.
    assert m["R@3"] == pytest.approx(100.0)
    # without the filter: row 0 top-2 [0, 2] -> 1 hit; row 1 top-2 [4, 0] -> 1 hit -> P@2 = 2/4;
    # nDCG@2 (both rows have 2 positives, IDCG = 1 + a with a = 1/log2 3):
    #   row 0 hit at rank 2: a / (1 + a); row 1 hit at rank 1: 1 / (1 + a); sum = 1 -> mean 0.5
    m0 = evaluate_topk(topk(PRED_F), Y_F, freq, 10, ks=(1, 2), recall_ks=(3,))["metrics"]
    assert m0["P@2"] == pytest.approx(50.0)
    assert m0["nDCG@2"] == pytest.approx(50.0, rel=1e-10)


def test_empty_filter_is_a_no_op():
    idx, Yf = _apply_filter(topk(PRED_F), Y_F, sp.csr_matrix((2, 5), dtype=np.float32))
    assert idx.tolist() == PRED_F
    assert Yf is Y_F


# ------------------------------------------------------------------------ input checks


def test_evaluate_topk_rejects_too_few_columns():
    with pytest.raises(ValueError, match="top-3.*top-5"):
        evaluate_topk(topk([[0, 1, 2]]), csr([[0]], 6), np.ones(6), 10, ks=(1, 5), recall_ks=(2,))
    with pytest.raises(ValueError, match="top-3.*top-10"):
        evaluate_topk(topk([[0, 1, 2]]), csr([[0]], 6), np.ones(6), 10, ks=(1,), recall_ks=(10,))


def test_evaluate_topk_rejects_row_count_mismatch():
    with pytest.raises(ValueError, match="2 rows.*3"):
        evaluate_topk(topk([[0], [1]]), csr([[0], [1], [2]], 6), np.ones(6), 10, ks=(1,), recall_ks=(1,))


# ------------------------------------------------------------------- top-k extraction


def test_topk_from_scores_orders_and_breaks_ties_by_lower_label_id():
    scores = np.array([
        [0.5, 0.9, 0.5, 0.9, 0.1],  # two ties: 0.9 (1, 3), 0.5 (0, 2)
        [0.0, 0.0, 0.0, 0.0, 0.0],  # all tied
        [0.1, 0.2, 0.3, 0.4, 0.5],
    ])
    t = topk_from_scores(scores, 5)
    assert t.indices.tolist() == [[1, 3, 0, 2, 4], [0, 1, 2, 3, 4], [4, 3, 2, 1, 0]]
    assert t.scores[0].tolist() == pytest.approx([0.9, 0.9, 0.5, 0.5, 0.1])
    assert t.indices.dtype == np.int32 and t.scores.dtype == np.float32
    # k < L, tie fully inside the top-k
    t = topk_from_scores(scores[:1], 2)
    assert t.indices.tolist() == [[1, 3]]


def test_topk_from_scores_pads_when_k_exceeds_labels():
    t = topk_from_scores(np.array([[1.0, 2.0], [3.0, 3.0]]), 4)
    assert t.indices.tolist() == [[1, 0, -1, -1], [0, 1, -1, -1]]
    assert np.isneginf(t.scores[:, 2:]).all()


def test_topk_from_scores_ties_at_the_cut_prefer_lower_label_id():
    # 1000 equal scores: the top-3 must be labels 0, 1, 2 (lower id first)
    assert topk_from_scores(np.zeros((1, 1000)), 3).indices.tolist() == [[0, 1, 2]]
    # small case: 2.0 at labels 0, 2, 5, 6 -> top-3 = 0, 2, 5
    s = np.array([[2.0, 1.0, 2.0, 0.0, 1.0, 2.0, 2.0, 1.0]])
    assert topk_from_scores(s, 3).indices.tolist() == [[0, 2, 5]]


def test_topk_from_sparse_ties_padding_and_empty_rows():
    S = sp.csr_matrix(np.array([
        [0.0, 0.7, 0.0, 0.7, 0.2],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [0.3, 0.0, 0.0, 0.0, 0.0],
    ]))
    t = topk_from_sparse(S, 3)
    assert t.indices.tolist() == [[1, 3, 4], [-1, -1, -1], [0, -1, -1]]
    assert t.scores[0].tolist() == pytest.approx([0.7, 0.7, 0.2])
    assert np.isneginf(t.scores[1]).all()
    # 300 equal stored scores: lower ids first
    S = sp.csr_matrix(np.ones((1, 300)))
    assert topk_from_sparse(S, 3).indices.tolist() == [[0, 1, 2]]


def test_topk_save_load_and_to_csr(tmp_path):
    t = TopK(np.array([[2, 0, -1]], np.int32), np.array([[0.9, 0.5, -np.inf]], np.float32))
    t.save(tmp_path / "p.npz")
    u = TopK.load(tmp_path / "p.npz")
    assert u.indices.tolist() == [[2, 0, -1]] and u.k == 3
    assert t.to_csr(4).toarray().tolist() == [[pytest.approx(0.5), 0.0, pytest.approx(0.9), 0.0]]
    with pytest.raises(ValueError):
        TopK(np.zeros((2, 3), np.int32), np.zeros((2, 2), np.float32))
