"""The processed dataset's memory-mapped string columns: same contents as the JSON lines, lazily read."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from xmc.data.columns import TextColumn, take_texts, write_text_column
from xmc.data.dataset import Split, XMCDataset, load_processed, save_processed
from xmc.errors import DataFormatError

TEXTS = ["a cat", "", "naïve café ☕", "x" * 1000, "line\nbreak", "tab\tand \"quotes\""]


def test_column_round_trip_and_indexing(tmp_path):
    assert write_text_column(tmp_path, "t", TEXTS) == len(TEXTS)
    col = TextColumn(tmp_path, "t")
    assert len(col) == len(TEXTS)
    assert list(col) == TEXTS and col == TEXTS and col.to_list() == TEXTS
    assert col[2] == TEXTS[2] and col[-1] == TEXTS[-1] and col[np.int64(3)] == TEXTS[3]
    assert col[1:4] == TEXTS[1:4] and col[::2] == TEXTS[::2]
    assert col[[5, 0, 5]] == [TEXTS[5], TEXTS[0], TEXTS[5]]
    assert col[np.array([2, 1])] == [TEXTS[2], TEXTS[1]]
    assert col[np.array([True, False, False, False, False, True])] == [TEXTS[0], TEXTS[5]]
    with pytest.raises(IndexError):
        col[len(TEXTS)]
    with pytest.raises(IndexError):
        col[[0, 99]]
    assert pickle.loads(pickle.dumps(col)) == TEXTS   # pickles as its paths (DataLoader workers, spawn)
    assert col != TEXTS[:-1] and col != [*TEXTS[:-1], "other"]
    assert col + ["z"] == [*TEXTS, "z"] and ["z"] + col == ["z", *TEXTS] and col + col == TEXTS + TEXTS


def test_a_column_gathers_a_batch_of_rows_as_the_rows_one_by_one(tmp_path):
    """Array indexing (a training step's batch) reads the rows' bytes in one gather: any order, repeats, negative
    ids, empty and multi-byte strings, missing values; take_texts does the same for a column and a list."""
    values = [*TEXTS, None, "ünï", ""]
    write_text_column(tmp_path, "t", values)
    col = TextColumn(tmp_path, "t")
    rng = np.random.default_rng(0)
    for _ in range(20):
        idx = rng.integers(-len(values), len(values), rng.integers(0, 12))
        want = [values[i] for i in idx]
        assert col[idx] == want and take_texts(col, idx) == want and take_texts(values, idx) == want
    assert col[np.array([1, 1, 8])] == ["", "", ""] and col[np.zeros(0, np.int64)] == []


def test_column_with_missing_values_and_empty_column(tmp_path):
    write_text_column(tmp_path, "g", ["d1", None, "d1", None])
    g = TextColumn(tmp_path, "g")
    assert list(g) == ["d1", None, "d1", None] and g[1] is None and g.has_missing() and not g.all_missing()
    write_text_column(tmp_path, "e", ["", ""])
    assert list(TextColumn(tmp_path, "e")) == ["", ""]      # a zero-byte .bin
    write_text_column(tmp_path, "z", [])
    assert len(TextColumn(tmp_path, "z")) == 0 and list(TextColumn(tmp_path, "z")) == []


def test_column_refuses_offsets_that_do_not_match(tmp_path):
    write_text_column(tmp_path, "t", TEXTS)
    with open(tmp_path / "t.bin", "ab") as fh:
        fh.write(b"extra")
    with pytest.raises(DataFormatError, match="t.off.npy.*offsets do not match"):
        TextColumn(tmp_path, "t")
    with pytest.raises(DataFormatError, match="missing"):
        TextColumn(tmp_path, "nope")


def _dataset(n_labels: int = 5) -> XMCDataset:
    def split(k: int, grouped: bool) -> Split:
        Y = sp.csr_matrix((np.ones(k), (np.arange(k), np.arange(k) % n_labels)), shape=(k, n_labels))
        return Split([f"{k}-{i}" for i in range(k)], [f"text {i} é" for i in range(k)], Y,
                     [f"doc{i // 2}" for i in range(k)] if grouped else None)

    return XMCDataset([f"L{j}" for j in range(n_labels)], [f"label {j}" for j in range(n_labels)],
                      split(6, True), split(3, False), val=split(2, True))


def test_load_processed_reads_columns_equal_to_the_json_lines(tmp_path):
    ds = _dataset()
    save_processed(ds, tmp_path / "p")
    got = load_processed(tmp_path / "p", ("trn", "val", "tst"))
    assert isinstance(got.trn.texts, TextColumn) and isinstance(got.label_texts, TextColumn)
    for name in ("trn", "val", "tst"):
        a, b = ds.split(name), got.split(name)
        assert list(b.texts) == list(a.texts) and list(b.uids) == list(a.uids)
        assert (b.groups is None) == (a.groups is None)
        if a.groups is not None:
            assert list(b.groups) == list(a.groups)
    assert list(got.label_texts) == ds.label_texts and list(got.label_uids) == ds.label_uids
    assert got.counts() == ds.counts()


def test_stale_columns_fall_back_to_the_json_lines(tmp_path):
    """Columns written from another version of the record file are not read: DVC tracks the JSON lines."""
    save_processed(_dataset(), tmp_path / "p")
    f = tmp_path / "p" / "trn.jsonl"
    f.write_text(f.read_text(encoding="utf-8").replace("text 0 é", "edited"), encoding="utf-8")
    got = load_processed(tmp_path / "p", ("trn", "val"))
    assert isinstance(got.trn.texts, list) and got.trn.texts[0] == "edited"
    assert isinstance(got.val.texts, TextColumn)     # untouched parts still read their columns


def test_processed_dir_without_columns_still_loads(tmp_path):
    import shutil

    save_processed(_dataset(), tmp_path / "p")
    shutil.rmtree(tmp_path / "p" / "columns")
    got = load_processed(tmp_path / "p", ("trn", "val"))
    assert got.trn.texts[1] == "text 1 é" and list(got.trn.groups)[:2] == ["doc0", "doc0"]
