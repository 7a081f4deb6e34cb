"""The cross-fitting folds of lab/bench/sparse_dense_ranker.py: a training sentence's embedding must come from an
encoder that saw neither it nor the rest of its document."""

from __future__ import annotations

import numpy as np
import pytest

from lab.bench.sparse_dense_ranker import group_folds


def test_folds_keep_each_document_whole_and_are_balanced():
    groups = [f"doc{i // 3}" for i in range(60)] + [None] * 7      # 20 documents of 3 sentences, 7 loose rows
    fold = group_folds(groups, 5, seed=3)
    assert fold.shape == (67,) and set(fold.tolist()) == set(range(5))
    for g in {g for g in groups if g is not None}:
        assert len({int(f) for f, h in zip(fold, groups) if h == g}) == 1, g
    units_per_fold = [len({g if g is not None else i for i, (g, f) in enumerate(zip(groups, fold)) if f == k})
                      for k in range(5)]
    assert max(units_per_fold) - min(units_per_fold) <= 1          # 27 units dealt to 5 folds
    assert np.array_equal(fold, group_folds(groups, 5, seed=3))
    assert not np.array_equal(fold, group_folds(groups, 5, seed=4))


def test_too_few_groups_or_folds_is_refused():
    with pytest.raises(ValueError, match="cannot fill"):
        group_folds(["a", "a", "b"], 3)
    with pytest.raises(ValueError, match="at least 2"):
        group_folds(["a", "b"], 1)
