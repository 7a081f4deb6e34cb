"""The canonical processed form every later stage reads.

Layout of a processed directory (one file per split and column, so that a DVC stage can
declare exactly the splits it reads: training stages never depend on a test file)::

    trn.jsonl  val.jsonl  tst.jsonl        {"uid", "text", "group"} per instance (group: document/session or null)
    lbl.jsonl                              {"uid", "text"} per label; label id = line number
    trn_Y.npz  val_Y.npz  tst_Y.npz        CSR (n_instances x n_labels) binary label matrices
    tst_filter.npz  val_filter.npz         optional CSRs of (row, label) pairs dropped from scoring (the dataset's
                                           ``filter_labels_test.txt``, and the validation rows of its
                                           ``filter_labels_train.txt``: e.g. an item's own label)
    columns/<part>/{uid,text,group}.*      the same records as memory-mapped string columns (xmc.data.columns),
                                           written with them; read when their manifest's hash of the record
                                           file matches it (the JSON lines stay the record and the DVC deps)
    source.json                            layout, source directory and text fields (no split contents)
    meta.json                              counts, source, layout, the validation carve-out and
                                           per-split content hashes (for reports; training does not read it)

``val`` is the split every choice is made on: shipped by the dataset, or carved out of the
training split by document group (:func:`split_validation`).
"""

from __future__ import annotations

import json
import logging
import shutil
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.data.columns import TextColumn, read_columns_manifest, write_columns_manifest, write_text_column
from xmc.data.lines import check_regular_file, iter_decoded_lines
from xmc.errors import DataFormatError
from xmc.io import atomic_dir, save_csr, sha256_files

SPLITS = ("trn", "val", "tst")
# files of each part of a processed directory; a stage that loads some splits reads only these
SPLIT_FILES = {"trn": ("trn.jsonl", "trn_Y.npz"), "val": ("val.jsonl", "val_Y.npz"), "tst": ("tst.jsonl", "tst_Y.npz"),
               "lbl": ("lbl.jsonl",)}
# the optional scoring filter of a split (not of trn: nothing scores the training split)
FILTER_FILES = {"val": "val_filter.npz", "tst": "tst_filter.npz"}


@dataclass
class Split:
    """Instances of one split: texts and their label matrix (rows aligned)."""

    uids: Sequence[str]
    texts: Sequence[str]
    Y: sp.csr_matrix
    groups: Sequence[str | None] | None = None

    def __post_init__(self) -> None:
        if len(self.uids) != len(self.texts) or self.Y.shape[0] != len(self.texts):
            raise ValueError(
                f"split is misaligned: {len(self.uids)} uids, {len(self.texts)} texts, "
                f"{self.Y.shape[0]} label rows"
            )

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class XMCDataset:
    """Train, validation and test instances over one label space with label texts.

    A dataset loaded for training holds ``trn`` and ``val`` only (``tst`` is None), so no
    training code can read the test split by accident.

    ``tst_filter``, ``val_filter``: (row, label) pairs of that split dropped from the ranking before scoring;
    ``trn_filter``: the training rows' pairs as read, before :func:`split_validation` moves the validation rows'
    into ``val_filter``.
    """

    label_uids: Sequence[str]
    label_texts: Sequence[str]
    trn: Split
    tst: Split | None
    tst_filter: sp.csr_matrix | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    val: Split | None = None
    val_filter: sp.csr_matrix | None = None
    trn_filter: sp.csr_matrix | None = None

    def scoring_filter(self, name: str) -> sp.csr_matrix | None:
        """The pairs of split ``name`` dropped from the ranking before scoring (None: none)."""
        return {"val": self.val_filter, "tst": self.tst_filter}.get(name)

    @property
    def n_labels(self) -> int:
        return len(self.label_texts)

    def split(self, name: str) -> Split:
        s = {"trn": self.trn, "val": self.val, "tst": self.tst}[name]
        if s is None:
            raise KeyError(f"split {name!r} was not loaded")
        return s

    def has(self, name: str) -> bool:
        return {"trn": self.trn, "val": self.val, "tst": self.tst}[name] is not None

    def counts(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n_labels": self.n_labels}
        for name in SPLITS:
            if not self.has(name):
                continue
            s = self.split(name)
            out[name] = {
                "instances": len(s),
                "label_pairs": int(s.Y.nnz),
                "avg_labels_per_instance": round(float(s.Y.nnz) / max(len(s), 1), 3),
                "distinct_labels": int((np.diff(s.Y.tocsc().indptr) > 0).sum()),
                "groups": len({g for g in s.groups}) if s.groups is not None else None,
            }
        out["tst_filter_pairs"] = int(self.tst_filter.nnz) if self.tst_filter is not None else 0
        out["val_filter_pairs"] = int(self.val_filter.nnz) if self.val_filter is not None else 0
        return out


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False))
            fh.write("\n")


# label-side files of a dataset that some methods read beyond the label texts (RAMEN's label graph: the
# dataset's hypernym edges and its label records with their WordNet ids), kept in <processed>/label_side/
LABEL_SIDE_FILES = ("label_graph.tsv", "lbl.jsonl")


def label_side_files(dataset_dir: str | Path) -> dict[str, Path]:
    """The dataset's label-side files to keep: present only where the dataset ships a label graph."""
    d = Path(dataset_dir)
    if not (d / "label_graph.tsv").is_file():
        return {}
    return {name: d / name for name in LABEL_SIDE_FILES if (d / name).is_file()}


def save_processed(ds: XMCDataset, out_dir: str | Path, side_files: dict[str, Path] | None = None) -> dict[str, Any]:
    """Write ``ds`` atomically to ``out_dir``; returns the metadata written.

    ``side_files`` (name -> source path) are copied into ``out_dir/label_side/``, which always exists (with a
    ``manifest.json`` of what it holds), so a stage can depend on it whatever the dataset ships."""
    out_dir = Path(out_dir)
    if ds.val is None:
        raise ValueError("a processed dataset needs a validation split (see split_validation)")
    with atomic_dir(out_dir) as tmp:
        for name in SPLITS:
            s = ds.split(name)
            groups = s.groups if s.groups is not None else [None] * len(s)
            _write_jsonl(
                tmp / f"{name}.jsonl",
                [{"uid": u, "text": t, "group": g} for u, t, g in zip(s.uids, s.texts, groups)],
            )
            save_csr(tmp / f"{name}_Y.npz", s.Y.tocsr().astype(np.float32))
        _write_jsonl(tmp / "lbl.jsonl", [{"uid": u, "text": t} for u, t in zip(ds.label_uids, ds.label_texts)])
        _write_columns(tmp, ds)
        for part, fname in FILTER_FILES.items():
            if ds.scoring_filter(part) is not None:
                save_csr(tmp / fname, ds.scoring_filter(part).tocsr().astype(np.float32))
        side = tmp / "label_side"
        side.mkdir()
        for name, src in sorted((side_files or {}).items()):
            shutil.copyfile(src, side / name)
        (side / "manifest.json").write_text(json.dumps({"files": sorted(side_files or {})}, indent=2) + "\n")
        meta = dict(ds.meta)
        meta["counts"] = ds.counts()
        meta["sha256"] = {part: sha256_files([tmp / f for f in files]) for part, files in SPLIT_FILES.items()}
        meta["content_sha256"] = sha256_files([tmp / f for files in SPLIT_FILES.values() for f in files])
        source = {k: meta[k] for k in ("layout", "source", "text_fields") if k in meta}
        (tmp / "source.json").write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
        with open(tmp / "meta.json", "w", encoding="utf-8") as fh:
            json.dump(meta, fh, indent=2)
            fh.write("\n")
    return meta


def _write_columns(tmp: Path, ds: XMCDataset) -> None:
    cols = tmp / "columns"
    sources, rows = {}, {}
    for name in SPLITS:
        s = ds.split(name)
        d = cols / name
        rows[name] = write_text_column(d, "uid", s.uids)
        write_text_column(d, "text", s.texts)
        write_text_column(d, "group", s.groups if s.groups is not None else [None] * len(s))
        sources[name] = sha256_files([tmp / f"{name}.jsonl"])
    rows["lbl"] = write_text_column(cols / "lbl", "uid", ds.label_uids)
    write_text_column(cols / "lbl", "text", ds.label_texts)
    sources["lbl"] = sha256_files([tmp / "lbl.jsonl"])
    write_columns_manifest(cols, sources, rows)


def _column_dir(in_dir: Path, part: str) -> Path | None:
    """The columns of ``part`` when they were written from the record file now in ``in_dir`` (else None: parse it)."""
    manifest = read_columns_manifest(in_dir / "columns")
    if not manifest or part not in manifest.get("sources_sha256", {}):
        return None
    if manifest["sources_sha256"][part] != sha256_files([in_dir / f"{part}.jsonl"]):
        logging.getLogger(__name__).warning("%s changed after its columns were written: reading the JSON lines",
                                            in_dir / f"{part}.jsonl")
        return None
    return in_dir / "columns" / part


def _read_part(in_dir: Path, part: str) -> tuple[Sequence[str], Sequence[str], Sequence[str | None] | None]:
    """(uids, texts, groups or None) of one part: memory-mapped columns when current, else the parsed JSON lines."""
    d = _column_dir(in_dir, part)
    if d is not None:
        uids, texts = TextColumn(d, "uid"), TextColumn(d, "text")
        if len(uids) != len(texts):
            raise DataFormatError(d / "text.off.npy", None, f"{len(texts)} texts but {len(uids)} uids; rerun the ingest stage")
        groups = None
        if part != "lbl":
            g = TextColumn(d, "group")
            groups = None if g.all_missing() or len(g) == 0 else g
        return uids, texts, groups
    rows = _read_jsonl(in_dir / f"{part}.jsonl")
    groups_l = [r.get("group") for r in rows] if part != "lbl" else []
    return ([r["uid"] for r in rows], [r["text"] for r in rows],
            None if all(g is None for g in groups_l) else groups_l)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A processed JSON-lines file: one object with a string ``uid`` and ``text`` per line."""
    rows = []
    for i, line in iter_decoded_lines(path):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFormatError(path, i, f"invalid JSON: {e.msg}") from None
        except (RecursionError, ValueError) as e:
            raise DataFormatError(path, i, f"invalid JSON ({type(e).__name__})") from None
        if not isinstance(row, dict) or not isinstance(row.get("uid"), str) or not isinstance(row.get("text"), str):
            raise DataFormatError(path, i, "expected an object with string 'uid' and 'text' (rerun the ingest stage)")
        rows.append(row)
    return rows


def load_processed(in_dir: str | Path, splits: tuple[str, ...] = SPLITS, without_training: bool = False) -> XMCDataset:
    """Read a directory written by :func:`save_processed`: the label texts and the given ``splits``.

    ``without_training``: a zero-shot stage that must not read the training split (texts or labels) leaves
    ``trn`` out of ``splits``; the dataset's ``trn`` is then an empty split.

    Only the files of those splits are opened. ``meta["content_sha256"]`` is a hash of exactly
    those files (a checkpoint fingerprint of a training run changes with its data, not with the
    test split); the directory's ``meta.json`` is read only when the test split is requested.
    """
    in_dir = Path(in_dir)
    unknown = set(splits) - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown splits {sorted(unknown)} (known: {SPLITS})")
    if "trn" not in splits and not without_training:
        raise ValueError("load_processed needs the training split (or without_training=True)")
    if "trn" in splits and without_training:
        raise ValueError("without_training=True but the training split was asked for")
    for part in ("lbl", *splits):
        for f in SPLIT_FILES[part]:
            if not (in_dir / f).exists():
                raise DataFormatError(in_dir / f, None, "missing from the processed dataset (rerun the ingest stage)")
    label_uids, label_texts, _ = _read_part(in_dir, "lbl")
    loaded: dict[str, Split] = {}
    for name in splits:
        uids, texts, groups = _read_part(in_dir, name)
        Y = _load_csr(in_dir / f"{name}_Y.npz")
        if Y.shape[0] != len(texts):
            raise DataFormatError(in_dir / f"{name}_Y.npz", None, f"{Y.shape[0]} rows but {name}.jsonl has {len(texts)} lines")
        try:
            loaded[name] = Split(uids=uids, texts=texts, Y=Y, groups=groups)
        except (KeyError, ValueError) as e:
            raise DataFormatError(in_dir / f"{name}.jsonl", None, f"not a processed split ({e})") from None
        if Y.shape[1] != len(label_texts):
            raise DataFormatError(in_dir / f"{name}_Y.npz", None,
                                  f"{Y.shape[1]} label columns but lbl.jsonl has {len(label_texts)} labels")
    meta: dict[str, Any] = {}
    if "tst" in splits and (in_dir / "meta.json").exists():
        meta = json.loads((in_dir / "meta.json").read_text(encoding="utf-8"))
    meta["splits_loaded"] = list(splits)
    meta["content_sha256"] = sha256_files([in_dir / f for part in ("lbl", *sorted(splits)) for f in SPLIT_FILES[part]]
                                          + [in_dir / f for part, f in sorted(FILTER_FILES.items())
                                             if part in splits and (in_dir / f).exists()])
    filters = {part: _load_csr(in_dir / f) if (part in splits and (in_dir / f).exists()) else None
               for part, f in FILTER_FILES.items()}
    for part, F in filters.items():
        if F is not None and F.shape != loaded[part].Y.shape:
            raise DataFormatError(in_dir / FILTER_FILES[part], None,
                                  f"shape {F.shape} but {part}_Y.npz is {loaded[part].Y.shape}; rerun the ingest stage")
    return XMCDataset(
        label_uids=label_uids,
        label_texts=label_texts,
        trn=loaded["trn"] if "trn" in loaded else Split([], [], sp.csr_matrix((0, len(label_texts)), dtype=np.float32)),
        tst=loaded.get("tst"),
        tst_filter=filters["tst"],
        meta=meta,
        val=loaded.get("val"),
        val_filter=filters["val"],
    )


def _load_csr(path: Path) -> sp.csr_matrix:
    check_regular_file(path)
    try:
        Y = sp.load_npz(path).tocsr()
        Y.check_format(full_check=True)
        return Y
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:120]
        raise DataFormatError(path, None, f"not a sparse label matrix ({first}); rerun the stage that wrote it") from None


def split_validation(ds: XMCDataset, fraction: float, seed: int = 0) -> XMCDataset:
    """Carve a validation split out of ``ds.trn`` by document group.

    Whole groups go to validation (about ``fraction`` of the training groups, chosen by a seeded
    permutation), so no validation instance shares a document with a training instance; instances
    without a group are split by row with the same fraction. Deterministic for a given seed.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must be in (0, 1), got {fraction}")
    trn = ds.trn
    n = len(trn)
    rng = np.random.default_rng(seed)
    is_val = np.zeros(n, dtype=bool)
    groups = trn.groups if trn.groups is not None else [None] * n
    grouped = np.array([g is not None for g in groups])
    names = sorted({g for g in groups if g is not None})
    if names:
        n_val_groups = min(max(1, int(round(fraction * len(names)))), len(names) - 1) if len(names) > 1 else 0
        chosen = {names[i] for i in rng.permutation(len(names))[:n_val_groups]}
        is_val |= np.array([g in chosen for g in groups])
    loose = np.flatnonzero(~grouped)
    if len(loose):
        n_val_rows = min(max(1, int(round(fraction * len(loose)))), len(loose) - 1) if len(loose) > 1 else 0
        is_val[rng.permutation(loose)[:n_val_rows]] = True
    if not is_val.any() or is_val.all():
        raise ValueError(f"cannot carve a validation split out of {n} training instances in {len(names)} groups")

    def take(mask: np.ndarray) -> Split:
        idx = np.flatnonzero(mask)
        return Split([trn.uids[i] for i in idx], [trn.texts[i] for i in idx], trn.Y[idx].tocsr(),
                     [trn.groups[i] for i in idx] if trn.groups is not None else None)

    def take_filter(mask: np.ndarray) -> sp.csr_matrix | None:
        return ds.trn_filter.tocsr()[np.flatnonzero(mask)].tocsr() if ds.trn_filter is not None else None

    meta = dict(ds.meta)
    meta["validation"] = {"source": "carved from trn", "unit": "groups" if names else "rows", "fraction": fraction,
                          "seed": seed, "groups": len({g for g, v in zip(groups, is_val) if v and g is not None}),
                          "instances": int(is_val.sum())}
    return XMCDataset(ds.label_uids, ds.label_texts, take(~is_val), ds.tst, ds.tst_filter, meta, val=take(is_val),
                      val_filter=take_filter(is_val), trn_filter=take_filter(~is_val))
