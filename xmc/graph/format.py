"""The graph-metadata input format (RAMEN): anchor sets with bipartite query->anchor and label->anchor edges.

A user produces these files from their own logs (co-session queries, co-clicked items, hyperlinks,
category trees) and puts them in one directory. Each *anchor set* ``<set>`` is:

``<set>_anchors.jsonl``
    one JSON object per line, ``{"id": "<anchor id>", "text": "<anchor text>"}``; ids unique, texts
    non-empty. Anchors are auxiliary items with text (a co-session query, a category, a linked page).
``<set>_query_edges.tsv`` (optional)
    ``src_row<TAB>anchor_id[<TAB>weight]``: training instance number ``src_row`` (0-based row of the
    processed training split, i.e. of ``trn.jsonl``) is linked to anchor ``anchor_id``.
``<set>_label_edges.tsv`` (optional)
    the same for labels: ``src_row`` is the 0-based label number (row of ``lbl.jsonl``).

At least one of the two edge files must exist. ``weight`` is an optional positive float (default 1;
the graph stage writes random-walk visit shares there). Lines starting with ``#`` and empty lines
are skipped. Duplicate edges are merged (weights summed). Every error is one line ``path:line: msg``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xmc.data.formats import iter_decoded_lines, read_json_lines
from xmc.errors import DataFormatError
from xmc.io import atomic_file

SIDES = ("query", "label")


@dataclass
class AnchorSet:
    """One anchor set: anchor ids/texts and, per side, an (n_side_rows x n_anchors) CSR edge matrix."""

    name: str
    anchor_ids: list[str]
    anchor_texts: list[str]
    edges: dict[str, sp.csr_matrix] = field(default_factory=dict)  # side -> edges (absent side = no graph)

    def __post_init__(self) -> None:
        if len(self.anchor_ids) != len(self.anchor_texts):
            raise ValueError(f"anchor set {self.name!r}: {len(self.anchor_ids)} ids vs {len(self.anchor_texts)} texts")
        for side, E in self.edges.items():
            if side not in SIDES:
                raise ValueError(f"anchor set {self.name!r}: unknown side {side!r}")
            if E.shape[1] != len(self.anchor_ids):
                raise ValueError(f"anchor set {self.name!r}: {side} edges have {E.shape[1]} columns, "
                                 f"{len(self.anchor_ids)} anchors")

    @property
    def n_anchors(self) -> int:
        return len(self.anchor_ids)


def _anchors_path(d: Path, name: str) -> Path:
    return d / f"{name}_anchors.jsonl"


def _edges_path(d: Path, name: str, side: str) -> Path:
    return d / f"{name}_{side}_edges.tsv"


def discover_sets(directory: str | Path) -> list[str]:
    """Names of the anchor sets in ``directory`` (one per ``<set>_anchors.jsonl``), sorted."""
    return sorted(p.name[: -len("_anchors.jsonl")] for p in Path(directory).glob("*_anchors.jsonl"))


def read_anchors(path: str | Path) -> tuple[list[str], list[str]]:
    path = Path(path)
    if not path.exists():
        raise DataFormatError(path, None, "anchor file not found")
    ids: list[str] = []
    texts: list[str] = []
    seen: dict[str, int] = {}
    for n, row in read_json_lines(path, empty=None):   # the dataset reader's checks: errors name the line
        if "id" not in row or "text" not in row:
            raise DataFormatError(path, n, 'expected an object {"id": ..., "text": ...}')
        aid, text = str(row["id"]), row["text"]
        if not isinstance(text, str) or not text.strip():
            raise DataFormatError(path, n, f"anchor {aid!r} has an empty or non-string text")
        if aid in seen:
            raise DataFormatError(path, n, f"duplicate anchor id {aid!r} (first on line {seen[aid]})")
        seen[aid] = n
        ids.append(aid)
        texts.append(text)
    if not ids:
        raise DataFormatError(path, None, "no anchors")
    return ids, texts


def read_edges(path: str | Path, n_rows: int, anchor_index: dict[str, int]) -> sp.csr_matrix:
    """Edge file -> (n_rows x n_anchors) CSR; ``src_row`` must be in [0, n_rows), anchors must exist."""
    path = Path(path)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for n, s in iter_decoded_lines(path, empty=None):
        if not s.strip() or s.startswith("#"):
            continue
        parts = s.split("\t")
        if len(parts) not in (2, 3):
            raise DataFormatError(path, n, f"expected 'src_row<TAB>anchor_id[<TAB>weight]', got {len(parts)} "
                                           "tab-separated fields")
        try:
            r = int(parts[0])
        except ValueError:
            raise DataFormatError(path, n, f"src_row {parts[0]!r} is not an integer") from None
        if not 0 <= r < n_rows:
            raise DataFormatError(path, n, f"src_row {r} out of range [0, {n_rows})")
        a = anchor_index.get(parts[1])
        if a is None:
            raise DataFormatError(path, n, f"unknown anchor id {parts[1]!r} (not in the anchors file)")
        w = 1.0
        if len(parts) == 3:
            try:
                w = float(parts[2])
            except ValueError:
                raise DataFormatError(path, n, f"weight {parts[2]!r} is not a number") from None
            if not (w > 0 and math.isfinite(w)):
                raise DataFormatError(path, n, f"weight must be a positive finite number, got {parts[2]!r}")
        rows.append(r)
        cols.append(a)
        vals.append(w)
    E = sp.csr_matrix((np.asarray(vals, np.float32), (np.asarray(rows, np.int64), np.asarray(cols, np.int64))),
                      shape=(n_rows, len(anchor_index)))
    E.sum_duplicates()
    return E


def load_anchor_set(directory: str | Path, name: str, n_queries: int, n_labels: int) -> AnchorSet:
    d = Path(directory)
    ids, texts = read_anchors(_anchors_path(d, name))
    index = {a: i for i, a in enumerate(ids)}
    edges: dict[str, sp.csr_matrix] = {}
    for side, n_rows in (("query", n_queries), ("label", n_labels)):
        p = _edges_path(d, name, side)
        if p.exists():
            edges[side] = read_edges(p, n_rows, index)
    if not edges:
        raise DataFormatError(_anchors_path(d, name), None,
                              f"anchor set {name!r} has neither {name}_query_edges.tsv nor {name}_label_edges.tsv")
    return AnchorSet(name, ids, texts, edges)


def load_graph_dir(directory: str | Path, n_queries: int, n_labels: int,
                   names: list[str] | None = None) -> dict[str, AnchorSet]:
    """Every anchor set in ``directory`` (or the ``names`` given)."""
    d = Path(directory)
    if not d.is_dir():
        raise DataFormatError(d, None, "graph directory not found")
    names = names if names is not None else discover_sets(d)
    if not names:
        raise DataFormatError(d, None, "no anchor sets (no <set>_anchors.jsonl files)")
    return {n: load_anchor_set(d, n, n_queries, n_labels) for n in names}


def save_anchor_set(aset: AnchorSet, directory: str | Path) -> None:
    """Write an anchor set in the documented format (weights written when not all 1)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    with atomic_file(_anchors_path(d, aset.name)) as fh:
        for aid, text in zip(aset.anchor_ids, aset.anchor_texts):
            fh.write(json.dumps({"id": aid, "text": text}, ensure_ascii=False) + "\n")
    for side, E in aset.edges.items():
        E = E.tocsr()
        unit = bool(np.all(E.data == 1.0))
        with atomic_file(_edges_path(d, aset.name, side)) as fh:
            for r in range(E.shape[0]):
                for j in range(E.indptr[r], E.indptr[r + 1]):
                    a = aset.anchor_ids[E.indices[j]]
                    fh.write(f"{r}\t{a}\n" if unit else f"{r}\t{a}\t{E.data[j]:.6g}\n")
