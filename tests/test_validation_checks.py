"""The GX checks that compare a split with training (texts, uids, documents) on a small in-memory dataset."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from xmc.data.dataset import Split, XMCDataset
from xmc.validation import validate_dataset


def _Y(rows: int) -> sp.csr_matrix:
    return sp.csr_matrix(np.eye(rows, 3, dtype=np.float32))


def _dataset(val_texts, val_uids, val_groups, tst_texts):
    trn = Split(["t0", "t1", "t2"], ["the cat sat", "a dog ran", "birds fly"], _Y(3), groups=["d0", "d0", "d1"])
    val = Split(val_uids, val_texts, _Y(len(val_texts)), groups=val_groups)
    tst = Split([f"s{i}" for i in range(len(tst_texts))], tst_texts, _Y(len(tst_texts)))
    return XMCDataset(["x", "y", "z"], ["label x", "label y", "label z"], trn, tst, val=val)


def _check(summary, table, description):
    return next(c for c in summary.checks if c.table == table and c.description == description)


def test_overlap_with_training_is_found_with_its_examples():
    ds = _dataset(["a dog ran", "new words", "birds fly"], ["v0", "t1", "v2"], ["d9", "d1", None],
                  ["the cat sat", "unseen"])
    s = validate_dataset(ds, None)
    texts = _check(s, "val", "validation texts do not also occur in training")
    assert not texts.success and texts.unexpected_count == 2
    assert sorted(texts.unexpected_sample) == ["a dog ran", "birds fly"]
    assert _check(s, "tst", "test texts do not also occur in training").unexpected_count == 1
    uids = _check(s, "val", "uids are disjoint from training")
    assert not uids.success and uids.unexpected_sample == ["t1"] and uids.severity == "critical"
    groups = _check(s, "val", "validation documents (groups) do not occur in training")
    assert not groups.success and groups.unexpected_sample == ["d1"]
    assert s.critical_failures


def test_disjoint_splits_pass():
    ds = _dataset(["new words", "more words"], ["v0", "v1"], ["d7", "d8"], ["unseen"])
    s = validate_dataset(ds, None)
    for table, description in (("val", "validation texts do not also occur in training"),
                               ("tst", "test texts do not also occur in training"),
                               ("val", "uids are disjoint from training"),
                               ("val", "validation documents (groups) do not occur in training")):
        c = _check(s, table, description)
        assert c.success and c.unexpected_count == 0, (table, description)
