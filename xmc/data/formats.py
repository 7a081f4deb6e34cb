"""Readers for the standard XMC dataset layouts.

Supported (see README "Pointing the pipeline at another dataset"):

* XC repository raw text: ``trn.raw.txt``/``tst.raw.txt``/``lbl.raw.txt`` or the
  NGAME/Renée names ``trn_X.txt``/``tst_X.txt``/``Y.txt``; one text per line, optionally
  ``uid<sep>text`` with ``uid_separator`` (e.g. ``->``); plus sparse label files
  ``trn_X_Y.txt``/``tst_X_Y.txt`` (header ``n_rows n_labels``, rows ``lid:val ...``),
  optional ``filter_labels_{train,val,test}.txt`` (``row label`` pairs of that split dropped from scoring) and an
  optional per-row metadata sidecar ``trn.jsonl``/``tst.jsonl`` with ``uid`` and ``doc``.
* JSON lines: ``trn.json[.gz]``/``tst.json[.gz]``/``lbl.json[.gz]`` with ``uid``,
  ``title``, ``content`` and, for instances, ``target_ind`` (label row numbers).

A dataset that ships its own validation split adds ``val.raw.txt``/``val_X.txt`` +
``val_X_Y.txt`` (XC raw) or ``val.json[.gz]`` (JSON lines); otherwise the ingest stage
carves one out of the training split by document group (:func:`xmc.data.split_validation`).

Every reader raises :class:`~xmc.errors.DataFormatError` naming the file and line.
"""

from __future__ import annotations

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


def read_sparse_labels(path: str | Path, n_labels: int | None = None) -> sp.csr_matrix:
    """XC sparse label file: header ``n_rows n_labels``, then ``lid:val`` tokens per row.

    Rows may be empty (an instance without labels). Values are binarised: any listed
    label is positive, as in the XC benchmarks.
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
    indptr, indices = [0], []
    row = 0
    for n, line in lines:
        row += 1
        if row > n_rows:
            if line.strip():
                raise DataFormatError(path, n, f"more rows than the header's {n_rows}")
            continue
        for tok in line.split():
            lid_s, _, val_s = tok.partition(":")
            if not (lid_s.isascii() and len(lid_s) <= 12):
                raise DataFormatError(path, n, f"bad token {tok[:40]!r}: expected 'label_id:value'")
            try:
                lid = int(lid_s)
                if val_s:
                    float(val_s)
            except ValueError:
                raise DataFormatError(path, n, f"bad token {tok[:40]!r}: expected 'label_id:value'") from None
            if not 0 <= lid < n_cols:
                raise DataFormatError(path, n, f"label id {lid} out of range [0, {n_cols})")
            indices.append(lid)
        indptr.append(len(indices))
    if row < n_rows:
        raise DataFormatError(path, None, f"header says {n_rows} rows but the file has {row}")
    data = np.ones(len(indices), dtype=np.float32)
    Y = sp.csr_matrix((data, np.asarray(indices, dtype=np.int32), np.asarray(indptr, dtype=np.int64)), shape=(n_rows, n_cols))
    Y.sum_duplicates()
    Y.data[:] = 1.0
    return Y


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
        if len(parts) != 2 or not all(p.lstrip("-").isascii() and p.lstrip("-").isdigit() and len(p) <= 12
                                      for p in parts):
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
        if "uid" not in rec:
            raise DataFormatError(path, n, "missing 'uid'")
        uids.append(str(rec["uid"]))
        groups.append(None if rec.get("doc") is None else str(rec["doc"]))
    return uids, groups


def load_xc_raw(d: Path, uid_separator: str | None = None) -> XMCDataset:
    lbl_path = _first_existing(d, TEXT_NAMES["lbl"])
    label_uids, label_texts = read_text_lines(lbl_path, uid_separator)
    L = len(label_texts)
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
        label_uids.append(str(rec.get("uid", len(label_uids))))
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
            if not isinstance(tgt, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tgt):
                raise DataFormatError(path, n, "'target_ind' must be a list of integers")
            for t in tgt:
                if not 0 <= t < L:
                    raise DataFormatError(path, n, f"label id {t} out of range [0, {L})")
            uids.append(str(rec.get("uid", len(uids))))
            texts.append(_record_text(path, n, rec, text_fields))
            groups.append(None if rec.get("doc") is None else str(rec["doc"]))
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
