"""Per-instance contributions, bootstrap intervals and the paired bootstrap on synthetic data."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from xmc.metrics import evaluate_topk
from xmc.metrics.bootstrap import (
    InstanceContributions,
    bootstrap_intervals,
    bootstrap_settings,
    bootstrap_weights,
    instance_contributions,
    paired_bootstrap,
    verdict,
)
from xmc.predictions import TopK

KS, RECALL_KS = (1, 3, 5), (4, 10)


def random_case(seed: int, n: int = 90, L: int = 40, k: int = 12
                ) -> tuple[TopK, sp.csr_matrix, np.ndarray, sp.csr_matrix]:
    """Predictions that hit some positives, rows without positives, unseen labels, padding and a filter."""
    rng = np.random.default_rng(seed)
    Y = (rng.random((n, L)) < 0.08).astype(np.float32)
    Y[:6] = 0  # rows without positives
    freq = rng.integers(0, 4, L)  # about a quarter of the labels unseen in training
    idx = np.empty((n, k), np.int32)
    for i in range(n):
        pos = np.flatnonzero(Y[i])
        rng.shuffle(pos)
        rest = rng.permutation(np.setdiff1d(np.arange(L), pos[:2]))
        idx[i] = np.concatenate([pos[:2], rest])[:k] if rng.random() < 0.5 else rng.permutation(L)[:k]
    idx[:, 9:][rng.random((n, k - 9)) < 0.4] = -1  # short rows
    scores = np.where(idx >= 0, -np.arange(k, dtype=np.float32)[None, :], -np.inf).astype(np.float32)
    filt = (rng.random((n, L)) < 0.05).astype(np.float32)
    filt[7, np.flatnonzero(Y[7])[:1]] = 1  # the filter removes a true pair too
    return TopK(idx, scores), sp.csr_matrix(Y), freq, sp.csr_matrix(filt)


@pytest.mark.parametrize("use_filter", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_values_equal_evaluate_topk(seed, use_filter):
    pred, Y, freq, filt = random_case(seed)
    f = filt if use_filter else None
    ref = evaluate_topk(pred, Y, freq, 500, ks=KS, recall_ks=RECALL_KS, a=0.6, b=2.0, filt=f)["metrics"]
    c = instance_contributions(pred, Y, freq, 500, ks=KS, recall_ks=RECALL_KS, a=0.6, b=2.0, filt=f)
    assert ref["unseen_test_pairs"] > 0 and ref["n_test_without_labels"] >= 6  # the case covers what it claims
    float_names = [k for k, v in ref.items() if isinstance(v, float)]
    assert c.names == float_names
    vals = c.values()
    for name in float_names:
        assert vals[name] == pytest.approx(ref[name], abs=1e-9), name
    assert c.n == Y.shape[0] and c.num.shape == (len(float_names), Y.shape[0])


def test_values_zero_when_nothing_to_divide():
    c = InstanceContributions(["R@10", "unseen_R@100"], np.zeros((2, 3)), np.array([[1.0, 0, 0], [0, 0, 0]]))
    assert c.values() == {"R@10": 0.0, "unseen_R@100": 0.0}


def test_bootstrap_weights_are_resamples_and_deterministic():
    w = bootstrap_weights(50, 40, seed=3)
    assert w.shape == (40, 50) and (w.sum(1) == 50).all() and (w >= 0).all()
    assert (w == bootstrap_weights(50, 40, seed=3)).all()
    assert not (w == bootstrap_weights(50, 40, seed=4)).all()
    assert (w > 1).any() and (w == 0).any()  # with replacement: some repeated, some left out


def _bernoulli(n: int, p: float, seed: int) -> InstanceContributions:
    x = (np.random.default_rng(seed).random(n) < p).astype(np.float64)
    return InstanceContributions(["P@1"], x[None, :], np.ones((1, n)))


def test_intervals_contain_the_estimate_and_shrink_with_n():
    widths = []
    for n in (200, 5000):
        c = _bernoulli(n, 0.4, seed=n)
        lo, hi = bootstrap_intervals(c, n_resamples=400, seed=0)["P@1"]
        assert lo <= c.values()["P@1"] <= hi
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 3  # ~ 1/sqrt(n): 5x narrower expected
    # the 95 % interval of a proportion is about +-1.96 sd
    assert widths[1] == pytest.approx(2 * 1.96 * 100 * np.sqrt(0.4 * 0.6 / 5000), rel=0.2)


def test_intervals_on_real_contributions_are_deterministic_and_level_matters():
    pred, Y, freq, filt = random_case(5)
    c = instance_contributions(pred, Y, freq, 500, ks=KS, recall_ks=RECALL_KS, filt=filt)
    ci = bootstrap_intervals(c, n_resamples=300, seed=7)
    assert ci == bootstrap_intervals(c, n_resamples=300, seed=7)
    assert ci != bootstrap_intervals(c, n_resamples=300, seed=8)
    narrow = bootstrap_intervals(c, n_resamples=300, seed=7, level=0.5)
    vals = c.values()
    for m in c.names:
        assert ci[m][0] <= vals[m] + 1e-9 and vals[m] - 1e-9 <= ci[m][1]
        assert ci[m][1] - ci[m][0] >= narrow[m][1] - narrow[m][0]
    assert all(isinstance(x, float) and round(x, 2) == x for v in ci.values() for x in v)


def test_identical_methods_tie_with_p_one():
    c = _bernoulli(300, 0.3, seed=1)
    r = paired_bootstrap(c, c, "P@1", n_resamples=200, seed=0)
    assert r["diff"] == 0 and r["p_value"] == 1.0 and r["ci95"] == [0.0, 0.0]
    assert verdict(r["p_value"], r["diff"]) == "tie"


def test_clearly_better_method_is_significant():
    n = 2000
    rng = np.random.default_rng(0)
    base = (rng.random(n) < 0.3).astype(np.float64)
    better = np.maximum(base, rng.random(n) < 0.3)  # hits added on 30 % of the rows
    a = InstanceContributions(["P@1"], better[None], np.ones((1, n)))
    b = InstanceContributions(["P@1"], base[None], np.ones((1, n)))
    r = paired_bootstrap(a, b, "P@1", n_resamples=500, seed=0)
    assert r["p_value"] < 0.01 and r["diff"] > 15
    assert r["ci95"][0] > 0 and r["ci95"][0] <= r["diff"] <= r["ci95"][1]
    assert set(r) >= {"metric", "a", "b", "diff", "ci95", "p_value"}
    assert r["a"] == pytest.approx(100 * better.mean(), abs=1e-4)
    assert r["b"] == pytest.approx(100 * base.mean(), abs=1e-4)
    assert verdict(r["p_value"], r["diff"]) == "A better"
    rev = paired_bootstrap(b, a, "P@1", n_resamples=500, seed=0)
    assert rev["diff"] == -r["diff"] and verdict(rev["p_value"], rev["diff"]) == "B better"
    assert r == paired_bootstrap(a, b, "P@1", n_resamples=500, seed=0)  # deterministic


def test_small_difference_is_a_tie():
    n = 300
    rng = np.random.default_rng(2)
    base = (rng.random(n) < 0.3).astype(np.float64)
    other = base.copy()
    other[np.flatnonzero(base == 0)[:2]] = 1  # two more hits out of 300
    a = InstanceContributions(["P@1"], other[None], np.ones((1, n)))
    b = InstanceContributions(["P@1"], base[None], np.ones((1, n)))
    r = paired_bootstrap(a, b, "P@1", n_resamples=500, seed=0)
    assert r["diff"] > 0 and r["p_value"] >= 0.05 and verdict(r["p_value"], r["diff"]) == "tie"


def test_paired_needs_the_same_instances_and_a_known_metric():
    with pytest.raises(ValueError, match="same instances"):
        paired_bootstrap(_bernoulli(10, 0.5, 0), _bernoulli(11, 0.5, 0), "P@1")
    with pytest.raises(KeyError, match="P@5"):
        paired_bootstrap(_bernoulli(10, 0.5, 0), _bernoulli(10, 0.5, 1), "P@5")


def test_verdict_rules():
    assert verdict(0.01, 1.0) == "A better"
    assert verdict(0.01, -1.0) == "B better"
    assert verdict(0.05, 1.0) == "tie"  # p >= alpha
    assert verdict(0.2, 1.0, alpha=0.25) == "A better"


def test_save_load_round_trip_is_deterministic(tmp_path):
    pred, Y, freq, filt = random_case(3)
    c = instance_contributions(pred, Y, freq, 500, ks=KS, recall_ks=RECALL_KS, filt=filt)
    c.save(tmp_path / "a.npz")
    c.save(tmp_path / "sub" / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "sub" / "b.npz").read_bytes()
    back = InstanceContributions.load(tmp_path / "a.npz")
    assert back.names == c.names and np.array_equal(back.num, c.num) and np.array_equal(back.den, c.den)
    assert back.values() == c.values()
    with np.load(tmp_path / "a.npz", allow_pickle=False) as z:
        assert z["names"].dtype.kind == "U"


def test_bootstrap_settings_defaults_and_overrides():
    assert bootstrap_settings({}) == {"n_resamples": 1000, "seed": 0, "level": 0.95, "unit": "documents"}
    given = {"evaluate": {"bootstrap": {"seed": 3, "unit": "instances"}}}
    assert bootstrap_settings(given) == {"n_resamples": 1000, "seed": 3, "level": 0.95, "unit": "instances"}


def test_contrib_path_keeps_splits_apart():
    from pathlib import Path

    from xmc.metrics.bootstrap import contrib_path

    assert contrib_path("m", "val") == Path("evaluation/val/m.npz")
    assert contrib_path("m") == Path("evaluation/tst/m.npz")
    assert contrib_path("m", "tst", ablation=True) == Path("evaluation/ablations/m.npz")
    assert contrib_path("m", "tst", group="seeds") == Path("evaluation/seeds/m.npz")
    with pytest.raises(ValueError):
        contrib_path("m", "trn")


def test_cached_resample_blocks_are_the_streamed_ones_and_read_only():
    from xmc.metrics.bootstrap import _float_blocks, _weight_blocks

    streamed = np.concatenate([b.astype(np.float64) for b in _weight_blocks(300, 50, 7)])
    first, again = _float_blocks(300, 50, 7), _float_blocks(300, 50, 7)
    assert first is again                                   # drawn once per process
    assert np.array_equal(np.concatenate(first), streamed)
    assert not first[0].flags.writeable
    a, b = _bernoulli(300, 0.6, 1), _bernoulli(300, 0.5, 2)
    assert paired_bootstrap(a, b, "P@1", n_resamples=50, seed=7) == paired_bootstrap(a, b, "P@1", n_resamples=50, seed=7)


def _clustered(n_docs: int = 20, per_doc: int = 20, seed: int = 0):
    """One metric whose per-instance values share a strong per-document effect (sentences of one text)."""
    from xmc.metrics.bootstrap import InstanceContributions

    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(n_docs), per_doc)
    num = np.clip(0.5 + rng.normal(0, 0.3, n_docs)[g] + rng.normal(0, 0.1, len(g)), 0, 1)[None]
    return InstanceContributions(["P@1"], num, np.ones_like(num), g)


def test_documents_as_units_widen_intervals_of_clustered_rows_and_equal_instances_when_each_row_is_one():
    from dataclasses import replace

    from xmc.metrics.bootstrap import bootstrap_intervals

    c = _clustered()
    lo_i, hi_i = bootstrap_intervals(c, unit="instances")["P@1"]
    lo_d, hi_d = bootstrap_intervals(c)["P@1"]          # documents: the default
    assert (hi_d - lo_d) > 2.5 * (hi_i - lo_i)
    own = replace(c, groups=np.arange(c.n))              # every instance its own document: the same draws
    assert bootstrap_intervals(own) == bootstrap_intervals(c, unit="instances")
    assert bootstrap_intervals(replace(c, groups=None)) == bootstrap_intervals(c, unit="instances")


def test_document_codes_and_groups_survive_save_and_load(tmp_path):
    from xmc.metrics.bootstrap import InstanceContributions, document_codes

    assert document_codes(["a", "a", None, "b", None, "a"], 6).tolist() == [0, 0, 1, 2, 3, 0]
    assert document_codes(None, 3) is None
    with pytest.raises(ValueError):
        document_codes(["a"], 2)
    c = _clustered()
    c.save(tmp_path / "c.npz")
    back = InstanceContributions.load(tmp_path / "c.npz")
    assert (back.groups == c.groups).all() and np.array_equal(back.num, c.num)


def test_paired_bootstrap_over_documents_and_its_refusal_of_other_documents():
    from dataclasses import replace

    from xmc.metrics.bootstrap import paired_bootstrap

    a = _clustered(seed=0)
    b = replace(a, num=np.clip(a.num - 0.02, 0, 1))
    r = paired_bootstrap(a, b, "P@1")
    assert r["unit"] == "documents" and r["n_units"] == 20 and r["n"] == 400
    assert paired_bootstrap(a, b, "P@1", unit="instances")["unit"] == "instances"
    with pytest.raises(ValueError, match="same documents"):
        paired_bootstrap(a, replace(b, groups=np.arange(b.n)), "P@1")
    assert paired_bootstrap(a, replace(b, groups=np.arange(b.n)), "P@1", unit="instances")["unit"] == "instances"
    # a side evaluated without documents: the pair is drawn over instances, and says so
    assert paired_bootstrap(a, replace(b, groups=None), "P@1")["unit"] == "instances"


def test_holm_adjusted_p_values():
    from xmc.metrics.bootstrap import holm_adjusted

    assert holm_adjusted([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm_adjusted([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm_adjusted([]) == []


def test_a_seed_bootstrap_interval_holds_the_spread_over_training_seeds():
    from xmc.metrics.bootstrap import bootstrap_intervals, seed_bootstrap_intervals

    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(40), 5)
    hits = (rng.random(200) < 0.5).astype(float)
    one = InstanceContributions(["P@1"], hits[None], np.ones((1, 200)), groups)
    # the same run twice: exactly the data's interval
    assert seed_bootstrap_intervals([one, one], 500, 0) == bootstrap_intervals(one, 500, 0)
    # a second seed 20 points better: the interval of "a run" spans both seeds' values
    better = hits.copy()
    better[rng.permutation(np.flatnonzero(hits == 0))[:40]] = 1
    two = InstanceContributions(["P@1"], better[None], np.ones((1, 200)), groups)
    lo, hi = seed_bootstrap_intervals([one, two], 500, 0)["P@1"]
    assert lo < one.values()["P@1"] < two.values()["P@1"] < hi
    assert hi - lo > bootstrap_intervals(one, 500, 0)["P@1"][1] - bootstrap_intervals(one, 500, 0)["P@1"][0]
