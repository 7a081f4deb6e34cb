"""The canonical processed form every later stage reads.

Layout of a processed directory::

    trn.jsonl  tst.jsonl   {"uid", "text", "group"} per instance (group: document/session or null)
    lbl.jsonl              {"uid", "text"} per label; label id = line number
    trn_Y.npz  tst_Y.npz   CSR (n_instances x n_labels) binary label matrices
    tst_filter.npz         optional CSR of (test row, label) pairs dropped from scoring
    meta.json              counts, source, layout and a content hash
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.errors import DataFormatError
from xmc.io import atomic_dir, save_csr, sha256_files

SPLITS = ("trn", "tst")


@dataclass
class Split:
    """Instances of one split: texts and their label matrix (rows aligned)."""

    uids: list[str]
    texts: list[str]
    Y: sp.csr_matrix
    groups: list[str | None] | None = None

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
    """Train and test instances over one label space with label texts."""

    label_uids: list[str]
    label_texts: list[str]
    trn: Split
    tst: Split
    tst_filter: sp.csr_matrix | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_labels(self) -> int:
        return len(self.label_texts)

    def split(self, name: str) -> Split:
        return {"trn": self.trn, "tst": self.tst}[name]

    def counts(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n_labels": self.n_labels}
        for name in SPLITS:
            s = self.split(name)
            out[name] = {
                "instances": len(s),
                "label_pairs": int(s.Y.nnz),
                "avg_labels_per_instance": round(float(s.Y.nnz) / max(len(s), 1), 3),
                "distinct_labels": int((np.diff(s.Y.tocsc().indptr) > 0).sum()),
                "groups": len({g for g in s.groups}) if s.groups is not None else None,
            }
        out["tst_filter_pairs"] = int(self.tst_filter.nnz) if self.tst_filter is not None else 0
        return out


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False))
            fh.write("\n")


def save_processed(ds: XMCDataset, out_dir: str | Path) -> dict[str, Any]:
    """Write ``ds`` atomically to ``out_dir``; returns the metadata written."""
    out_dir = Path(out_dir)
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
        files = [tmp / f for f in ("trn.jsonl", "tst.jsonl", "lbl.jsonl", "trn_Y.npz", "tst_Y.npz")]
        if ds.tst_filter is not None:
            save_csr(tmp / "tst_filter.npz", ds.tst_filter.tocsr().astype(np.float32))
            files.append(tmp / "tst_filter.npz")
        meta = dict(ds.meta)
        meta["counts"] = ds.counts()
        meta["content_sha256"] = sha256_files(files)
        with open(tmp / "meta.json", "w", encoding="utf-8") as fh:
            json.dump(meta, fh, indent=2)
            fh.write("\n")
    return meta


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataFormatError(path, i, f"invalid JSON: {e.msg}") from None
    return rows


def load_processed(in_dir: str | Path) -> XMCDataset:
    """Read a directory written by :func:`save_processed`."""
    in_dir = Path(in_dir)
    if not (in_dir / "meta.json").exists():
        raise DataFormatError(in_dir / "meta.json", None, "not a processed dataset (run the ingest stage)")
    meta = json.loads((in_dir / "meta.json").read_text(encoding="utf-8"))
    lbl = _read_jsonl(in_dir / "lbl.jsonl")
    splits = {}
    for name in SPLITS:
        rows = _read_jsonl(in_dir / f"{name}.jsonl")
        Y = sp.load_npz(in_dir / f"{name}_Y.npz").tocsr()
        groups = [r.get("group") for r in rows]
        splits[name] = Split(
            uids=[r["uid"] for r in rows],
            texts=[r["text"] for r in rows],
            Y=Y,
            groups=None if all(g is None for g in groups) else groups,
        )
    filt = in_dir / "tst_filter.npz"
    return XMCDataset(
        label_uids=[r["uid"] for r in lbl],
        label_texts=[r["text"] for r in lbl],
        trn=splits["trn"],
        tst=splits["tst"],
        tst_filter=sp.load_npz(filt).tocsr() if filt.exists() else None,
        meta=meta,
    )

