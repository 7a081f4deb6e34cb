"""Readers for the standard XMC dataset layouts.

Supported (see README "Pointing the pipeline at another dataset"):

* XC repository raw text: ``trn.raw.txt``/``tst.raw.txt``/``lbl.raw.txt`` or the
  NGAME/Renée names ``trn_X.txt``/``tst_X.txt``/``Y.txt``; one text per line, optionally
  ``uid<sep>text`` with ``uid_separator`` (e.g. ``->``); plus sparse label files
  ``trn_X_Y.txt``/``tst_X_Y.txt`` (header ``n_rows n_labels``, rows ``lid:val ...``),
  optional ``filter_labels_{train,val,test}.txt`` (``row label`` pairs of that split dropped from scoring) and an
  optional per-row metadata sidecar ``trn.jsonl``/``tst.jsonl`` with ``uid`` and ``doc``, and an optional
  ``lbl.jsonl`` (one record per label row, in order) whose ``id`` (or ``uid``) is the label's id.
* JSON lines: ``trn.json[.gz]``/``tst.json[.gz]``/``lbl.json[.gz]`` with ``uid``,
  ``title``, ``content`` and, for instances, ``target_ind`` (label row numbers).

A dataset that ships its own validation split adds ``val.raw.txt``/``val_X.txt`` +
``val_X_Y.txt`` (XC raw) or ``val.json[.gz]`` (JSON lines); otherwise the ingest stage
carves one out of the training split by document group (:func:`xmc.data.split_validation`).

Every reader raises :class:`~xmc.errors.DataFormatError` naming the file and line. A label id is plain ASCII decimal
digits (never ``2_28``, ``+5`` or ``٣``) and a relevance value a finite number > 0 (:func:`read_sparse_labels`); a
JSON label row (``target_ind``) is a JSON integer, a ``uid``/``doc`` a string or an integer; JSON lines are strict
(:func:`xmc.data.lines.parse_json_line`: no duplicate key, no ``\\u0000`` or lone surrogate); a UTF-8 byte order mark
opening a file is dropped (:func:`xmc.data.lines.checked_lines`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.data.dataset import Split, XMCDataset
from xmc.data.lines import iter_decoded_lines, read_json_lines
from xmc.errors import DataFormatError

TEXT_NAMES = {"trn": ("trn.raw.txt", "trn_X.txt"), "val": ("val.raw.txt", "val_X.txt"), "tst": ("tst.raw.txt", "tst_X.txt"),
              "lbl": ("lbl.raw.txt", "Y.txt")}
JSON_NAMES = {s: (f"{s}.json", f"{s}.json.gz") for s in ("trn", "val", "tst", "lbl")}


def read_text_lines(path: str | Path, uid_separator: str | None = None, allow_empty: bool = False) -> tuple[list[str], list[str]]:
    """One text per line; returns (uids, texts). Without a separator the uid is the row number."""
    path = Path(path)
    uids, texts = [], []
    for n, line in iter_decoded_lines(path):
        if uid_separator:
            uid, sep, text = line.partition(uid_separator)
            if not sep:
                raise DataFormatError(path, n, f"missing uid separator {uid_separator!r}")
            uid = uid.strip()
        else:
            uid, text = str(n - 1), line
        text = text.strip()
        if not text and not allow_empty:
            raise DataFormatError(path, n, "empty text")
        uids.append(uid)
        texts.append(text)
    return uids, texts


# A label id is 1-12 plain ASCII digits (int() would also take "2_28", "+5", " 5", "٣"); a value is a plain decimal
# number, optionally with an exponent ("1.", "nan", "inf", "-1", "0x1" are not). re.ASCII: \s and digits are ASCII.
# Possessive quantifiers: the same language as the plain ones, matched without backtracking state (2x faster).
_LABEL_ID = r"[0-9]{1,12}+"
_VALUE = r"(?>[0-9]++(?:\.[0-9]++)?+|\.[0-9]++)(?:[eE][+-]?+[0-9]++)?+"
_LABEL_ID_RE, _VALUE_RE = re.compile(_LABEL_ID, re.ASCII), re.compile(_VALUE, re.ASCII)
_PAIR_ROW = re.compile(rf"\s*+(?:{_LABEL_ID}:{_VALUE}(?:\s++{_LABEL_ID}:{_VALUE})*+)?+\s*+", re.ASCII)
_BARE_ROW = re.compile(rf"\s*+{_LABEL_ID}(?:\s++{_LABEL_ID})*+\s*+", re.ASCII)
_FILTER_NUMBER = re.compile(r"-?[0-9]{1,12}+", re.ASCII)
_VALUE_RULE = "a relevance value is a finite number > 0"
_ROWS_PER_BLOCK = 1 << 16   # rows whose tokens are split and converted at once (bounds the token strings held)


def _bad_row(line: str, n_cols: int) -> str:
    """Why a label row matches neither row form: the first bad token (the slow path of an error only)."""
    toks = line.split()
    pairs = any(":" in t for t in toks)
    for tok in toks:
        lid, colon, val = tok.partition(":")
        bad = f"bad token {tok[:40]!r}: "
        if _FILTER_NUMBER.fullmatch(lid) and lid.startswith("-"):
            return f"label id {lid} out of range [0, {n_cols})"
        if not _LABEL_ID_RE.fullmatch(lid):
            return bad + "a label id is 1-12 ASCII digits"
        if not colon:
            if pairs:
                return bad + "a label id without ':value' among 'label_id:value' tokens (a truncated row?)"
            continue
        if not _VALUE_RE.fullmatch(val):
            if val.lower().lstrip("+-") in ("nan", "inf", "infinity") or val.startswith("-"):
                return bad + _VALUE_RULE
            return bad + "the value is not a decimal number (a truncated row?)"
    return f"bad row {line[:60]!r}: expected 'label_id:value' tokens separated by ASCII spaces"


def read_sparse_labels(path: str | Path, n_labels: int | None = None) -> sp.csr_matrix:
    """XC sparse label file: header ``n_rows n_labels``, then one row per line of ``label_id:value`` tokens.

    A label id is 1-12 ASCII decimal digits, below ``n_labels``; a value is a plain decimal number (``1``, ``0.5``,
    ``2e-3``) that must be finite and > 0: a listed label with relevance 0 (or NaN, inf, a negative value) is refused,
    not dropped, since binarising would make it positive. Rows may be empty (an instance without labels); a row may
    instead list bare label ids (``3 7``), but not mix both forms (``12:1.0 3`` is a row cut mid-token). Values are
    binarised: any listed label is positive, as in the XC benchmarks.
    """
    path = Path(path)
    lines = iter_decoded_lines(path)
    _, header = next(lines)
    parts = header.split()
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() and len(p) <= 12 for p in parts):
        raise DataFormatError(path, 1, f"bad header {header[:60]!r}: expected 'n_rows n_labels'")
    n_rows, n_cols = int(parts[0]), int(parts[1])
    if n_labels is not None and n_cols != n_labels:
        raise DataFormatError(path, 1, f"header says {n_cols} labels but the label file has {n_labels}")
    # each row is checked by one regex match and converted a block at a time: no int() / float() call per token
    blocks: list[np.ndarray] = []   # label ids of each block of rows
    counts: list[list[int]] = []    # tokens per row, per block
    block: list[str] = []
    row = 0
    for n, line in lines:
        row += 1
        if row > n_rows:
            if line.strip():
                raise DataFormatError(path, n, f"more rows than the header's {n_rows}")
            continue
        if _PAIR_ROW.fullmatch(line) is None:
            if _BARE_ROW.fullmatch(line) is None:
                # an earlier line's problem in this block is the one to report
                _check_block(path, block, counts, row - 1 - len(block), n_cols, blocks)
                raise DataFormatError(path, n, _bad_row(line, n_cols))
            line = " ".join(f"{t}:1" for t in line.split())
        block.append(line)
        if len(block) == _ROWS_PER_BLOCK:
            _check_block(path, block, counts, row - len(block), n_cols, blocks)
    _check_block(path, block, counts, min(row, n_rows) - len(block), n_cols, blocks)
    if row < n_rows:
        raise DataFormatError(path, None, f"header says {n_rows} rows but the file has {row}")
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.fromiter((c for block_counts in counts for c in block_counts), np.int64, n_rows), out=indptr[1:])
    indices = np.concatenate(blocks) if blocks else np.zeros(0, np.int64)
    data = np.ones(len(indices), dtype=np.float32)
    idx_dtype = np.int32 if n_cols <= np.iinfo(np.int32).max else np.int64
    Y = sp.csr_matrix((data, indices.astype(idx_dtype), indptr), shape=(n_rows, n_cols))
    Y.sum_duplicates()
    Y.data[:] = 1.0
    return Y


def _check_block(path: Path, block: list[str], counts: list[list[int]], first_row: int, n_cols: int,
                 out: list[np.ndarray]) -> None:
    """Convert the rows in ``block`` (already matched by ``_PAIR_ROW``; row ``first_row`` is line ``first_row + 2``)
    to label ids appended to ``out`` and tokens per row appended to ``counts``, then empty ``block``; refuse an id
    out of range or a value not finite and > 0, at its line."""
    if not block:
        return
    row_counts = [line.count(":") for line in block]
    toks = " ".join(block).replace(":", " ").split()
    ids = np.array(toks[0::2], dtype=np.int64)   # plain ASCII digits, so no int() surprises
    values = toks[1::2]
    # values are binarised, so only their validity matters: check each distinct string once (mostly just "1.0")
    bad_values = {v for v in set(values) if not 0.0 < float(v) < math.inf}
    problems = []
    out_of_range = np.flatnonzero(ids >= n_cols)
    if out_of_range.size:
        k = int(out_of_range[0])
        problems.append((k, f"label id {int(ids[k])} out of range [0, {n_cols})"))
    if bad_values:
        k = next(i for i, v in enumerate(values) if v in bad_values)
        problems.append((k, f"bad token {f'{toks[2 * k]}:{values[k]}'[:40]!r}: {_VALUE_RULE}"))
    if problems:
        k, message = min(problems)
        ends = np.cumsum(row_counts)
        raise DataFormatError(path, first_row + int(np.searchsorted(ends, k, side="right")) + 2, message)
    out.append(ids)
    counts.append(row_counts)
    block.clear()


FILTER_NAMES = {"trn": "filter_labels_train.txt", "val": "filter_labels_val.txt", "tst": "filter_labels_test.txt"}


def _scoring_filters(d: Path, splits: dict[str, Split], n_labels: int) -> dict[str, sp.csr_matrix | None]:
    """Each split's ``filter_labels_<split>.txt`` where the dataset ships one (the training one is carried into the
    carved validation split's)."""
    out: dict[str, sp.csr_matrix | None] = {}
    for name, fname in FILTER_NAMES.items():
        path, part = d / fname, splits.get(name)
        out[name] = read_filter_pairs(path, len(part), n_labels) if part is not None and len(part) and path.exists() else None
    return out


def read_filter_pairs(path: str | Path, n_rows: int, n_labels: int) -> sp.csr_matrix:
    """``filter_labels_<split>.txt``: whitespace-separated ``row label_id`` pairs (rows of that split)."""
    path = Path(path)
    rows, cols = [], []
    for n, line in iter_decoded_lines(path):
        if not line.strip():
            continue
        parts = line.split()
        # a sign is taken only to say "out of range" of a negative number ("--5" or "+5" are no numbers)
        if len(parts) != 2 or not all(_FILTER_NUMBER.fullmatch(p) for p in parts):
            raise DataFormatError(path, n, f"expected 'row label_id', got {line[:60]!r}")
        r, c = int(parts[0]), int(parts[1])
        if not 0 <= r < n_rows:
            raise DataFormatError(path, n, f"row {r} out of range [0, {n_rows})")
        if not 0 <= c < n_labels:
            raise DataFormatError(path, n, f"label id {c} out of range [0, {n_labels})")
        rows.append(r)
        cols.append(c)
    M = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n_rows, n_labels))
    M.sum_duplicates()
    M.data[:] = 1.0
    return M


def json_split_file(d: str | Path, split: str) -> Path | None:
    """The JSON-lines file of ``split`` (trn, val, tst, lbl) in dataset folder ``d`` (plain or gzipped), or None."""
    return _first_existing(Path(d), JSON_NAMES[split])


def _first_existing(d: Path, names: tuple[str, ...]) -> Path | None:
    for name in names:
        if (d / name).exists():
            return d / name
    return None


def detect_layout(d: str | Path) -> str:
    """``xc_raw`` or ``jsonl``; raises if the directory holds neither."""
    d = Path(d)
    if not d.is_dir():
        raise DataFormatError(d, None, "dataset directory not found")
    if all(_first_existing(d, TEXT_NAMES[s]) for s in ("trn", "lbl")) and (d / "trn_X_Y.txt").exists():
        return "xc_raw"
    if all(_first_existing(d, JSON_NAMES[s]) for s in ("trn", "lbl")):
        return "jsonl"
    if any(_first_existing(d, TEXT_NAMES[s]) for s in ("trn", "lbl")) and not (d / "trn_X_Y.txt").exists():
        raise DataFormatError(d / "trn_X_Y.txt", None, "missing: the training labels (a dataset needs them)")
    raise DataFormatError(
        d, None,
        "no known layout: expected trn.raw.txt|trn_X.txt, lbl.raw.txt|Y.txt and trn_X_Y.txt, optionally "
        "tst.raw.txt + tst_X_Y.txt (XC raw), or trn.json[.gz] and lbl.json[.gz], optionally tst.json[.gz] (JSON lines)",
    )


def _empty_split(n_labels: int) -> Split:
    """The test split of a dataset that ships none: nothing to report on, the rest runs."""
    return Split(uids=[], texts=[], Y=sp.csr_matrix((0, n_labels), dtype=np.float32))


def _read_sidecar(path: Path, texts: list[str]) -> tuple[list[str], list[str | None]] | None:
    """Optional per-row metadata (uid, doc) aligned with the raw text file."""
    if not path.exists():
        return None
    recs = read_json_lines(path)
    if len(recs) != len(texts):
        raise DataFormatError(path, None, f"{len(recs)} records but the text file has {len(texts)} rows")
    uids, groups = [], []
    for (n, rec), text in zip(recs, texts):
        # the raw row is the record's text, or "<uid>: <text>" (a title-prefixed raw file: debian-relations)
        if "text" in rec and text not in (str(rec["text"]).strip(), f"{rec.get('uid')}: {str(rec['text']).strip()}"):
            raise DataFormatError(path, n, "text differs from the raw text file's row (files misaligned)")
        uid = _id_field(path, n, rec, "uid")
        if uid is None:
            raise DataFormatError(path, n, "missing 'uid'")
        uids.append(uid)
        groups.append(_id_field(path, n, rec, "doc"))
    return uids, groups


def _read_label_ids(path: Path, n_labels: int) -> list[str] | None:
    """The dataset's own id of each label row from the optional ``lbl.jsonl`` sidecar (``id``, else ``uid``; an
    ``lid``, where given, must be the row), so that predictions name a label as the dataset does (``08420278-n``,
    a package name) and not by its line number. None without a sidecar."""
    if not path.is_file():
        return None
    recs = read_json_lines(path)
    if len(recs) != n_labels:
        raise DataFormatError(path, None, f"{len(recs)} label records but the label text file has {n_labels} rows")
    ids: list[str] = []
    first_line: dict[str, int] = {}
    for row, (n, rec) in enumerate(recs):
        key = "id" if "id" in rec else "uid"
        value = rec.get(key)
        if isinstance(value, bool) or not isinstance(value, str | int) or not str(value).strip():
            raise DataFormatError(path, n, "expected a label id: a non-empty string 'id' (or 'uid')")
        lid = rec.get("lid", row)
        if isinstance(lid, bool) or lid != row:
            raise DataFormatError(path, n, f"lid {lid!r} but this is label row {row}: records must be in label order")
        uid = str(value).strip()
        if uid in first_line:
            raise DataFormatError(path, n, f"label id {uid!r} already given on line {first_line[uid]}")
        first_line[uid] = n
        ids.append(uid)
    return ids


def load_xc_raw(d: Path, uid_separator: str | None = None) -> XMCDataset:
    lbl_path = _first_existing(d, TEXT_NAMES["lbl"])
    label_uids, label_texts = read_text_lines(lbl_path, uid_separator)
    L = len(label_texts)
    if not uid_separator:   # a separator gives each line its own id; otherwise the sidecar's, else the row number
        label_uids = _read_label_ids(d / "lbl.jsonl", L) or label_uids
    splits = {}
    names = ["trn"] + [s for s in ("tst", "val") if _first_existing(d, TEXT_NAMES[s])]
    for name in names:
        text_path = _first_existing(d, TEXT_NAMES[name])
        uids, texts = read_text_lines(text_path, uid_separator)
        y_path = d / f"{name}_X_Y.txt"
        Y = read_sparse_labels(y_path, n_labels=L)
        if Y.shape[0] != len(texts):
            raise DataFormatError(y_path, 1, f"header says {Y.shape[0]} rows but {text_path.name} has {len(texts)} texts")
        groups = None
        side = _read_sidecar(d / f"{name}.jsonl", texts)
        if side is not None:
            uids, groups = side
        splits[name] = Split(uids=uids, texts=texts, Y=Y, groups=groups)
    if "tst" not in splits:
        splits["tst"] = _empty_split(L)
    filt = _scoring_filters(d, splits, L)
    return XMCDataset(label_uids, label_texts, splits["trn"], splits["tst"], filt["tst"],
                      meta={"layout": "xc_raw", "source": str(d)}, val=splits.get("val"), val_filter=filt["val"],
                      trn_filter=filt["trn"])


def _id_field(path: Path, n: int, rec: dict[str, Any], key: str) -> str | None:
    """A record's ``uid`` or ``doc`` as a string (None where absent or null): a JSON string or integer, not a bool,
    a float (``3.0`` would read as "3.0"), a list or an object."""
    v = rec.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, str | int):
        raise DataFormatError(path, n, f"{key!r} must be a string or an integer, not {type(v).__name__}")
    return str(v)


def _record_text(path: Path, n: int, rec: dict[str, Any], text_fields: list[str]) -> str:
    parts = []
    for f in text_fields:
        v = rec.get(f)
        if v is None:
            continue
        if not isinstance(v, str):
            raise DataFormatError(path, n, f"field {f!r} is not a string")
        if v.strip():
            parts.append(v.strip())
    text = " ".join(parts)
    if not text:
        raise DataFormatError(path, n, f"empty text (fields {text_fields})")
    return text


def load_jsonl(d: Path, text_fields: list[str]) -> XMCDataset:
    lbl_path = _first_existing(d, JSON_NAMES["lbl"])
    label_uids, label_texts = [], []
    for n, rec in read_json_lines(lbl_path):
        uid = _id_field(lbl_path, n, rec, "uid")
        label_uids.append(str(len(label_uids)) if uid is None else uid)
        label_texts.append(_record_text(lbl_path, n, rec, text_fields))
    L = len(label_texts)
    splits = {}
    names = ["trn"] + [s for s in ("tst", "val") if _first_existing(d, JSON_NAMES[s])]
    for name in names:
        path = _first_existing(d, JSON_NAMES[name])
        uids, texts, groups, indptr, indices = [], [], [], [0], []
        for n, rec in read_json_lines(path):
            if "target_ind" not in rec:
                raise DataFormatError(path, n, "missing 'target_ind'")
            tgt = rec["target_ind"]
            if not isinstance(tgt, list):
                raise DataFormatError(path, n, f"'target_ind' must be a list of integers, not {type(tgt).__name__}")
            # a label row is a JSON integer: not true (a bool is an int in Python), 3.7, 3.0 or "2_28"
            for t in tgt:
                if isinstance(t, bool) or not isinstance(t, int):
                    raise DataFormatError(path, n, f"'target_ind' must be a list of integers, got {json.dumps(t)[:40]}")
            for t in tgt:
                if not 0 <= t < L:
                    raise DataFormatError(path, n, f"label id {t} out of range [0, {L})")
            uid = _id_field(path, n, rec, "uid")
            uids.append(str(len(uids)) if uid is None else uid)
            texts.append(_record_text(path, n, rec, text_fields))
            groups.append(_id_field(path, n, rec, "doc"))
            indices.extend(sorted(set(tgt)))
            indptr.append(len(indices))
        Y = sp.csr_matrix((np.ones(len(indices), np.float32), np.asarray(indices, np.int32), np.asarray(indptr, np.int64)),
                          shape=(len(texts), L))
        splits[name] = Split(uids, texts, Y, None if all(g is None for g in groups) else groups)
    if "tst" not in splits:
        splits["tst"] = _empty_split(L)
    filt = _scoring_filters(d, splits, L)
    return XMCDataset(label_uids, label_texts, splits["trn"], splits["tst"], filt["tst"],
                      meta={"layout": "jsonl", "source": str(d), "text_fields": text_fields}, val=splits.get("val"),
                      val_filter=filt["val"], trn_filter=filt["trn"])


def load_dataset_dir(d: str | Path, layout: str = "auto", uid_separator: str | None = None,
                     text_fields: list[str] | None = None) -> XMCDataset:
    """Load any supported layout into an :class:`XMCDataset`."""
    d = Path(d)
    layout = detect_layout(d) if layout == "auto" else layout
    if layout == "xc_raw":
        return load_xc_raw(d, uid_separator)
    if layout == "jsonl":
        return load_jsonl(d, text_fields or ["title", "content"])
    raise DataFormatError(d, None, f"unknown layout {layout!r} (expected auto, xc_raw or jsonl)")
