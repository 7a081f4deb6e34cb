"""An open label space: the dataset's labels plus every label of a larger catalogue it never annotates.

A dataset's label file usually holds only the labels its annotations use (semcor-wn30: the 25,819 synsets tagged in
SemCor); a deployed model ranks over the whole catalogue (all 117,659 WordNet synsets). ``data.open_labels`` names a
JSON-lines catalogue whose records not already among the dataset's labels (by ``id``) are appended after them, so
every label id of the dataset keeps its meaning and the added labels have no training instance: they can only be
found from their text.

A catalogue record is ``{"id", "text"}``, or a WordNet synset ``{"id", "lemmas", "pos", "definition"}`` whose text is
written as the WordNet-labelled datasets write theirs (``lemma, lemma (pos): definition``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import scipy.sparse as sp

from xmc.data.dataset import Split, XMCDataset
from xmc.data.lines import read_json_lines
from xmc.errors import ConfigError, DataFormatError

log = logging.getLogger(__name__)


def catalogue_text(path: Path, line: int, rec: dict[str, Any]) -> str:
    """The label text of one catalogue record."""
    if isinstance(rec.get("text"), str) and rec["text"].strip():
        return rec["text"].strip()
    if isinstance(rec.get("lemmas"), list) and rec["lemmas"] and isinstance(rec.get("definition"), str):
        return f"{', '.join(map(str, rec['lemmas']))} ({rec.get('pos', '?')}): {rec['definition']}"
    raise DataFormatError(path, line, "expected a 'text', or WordNet 'lemmas' and 'definition'")


def dataset_label_ids(dataset_dir: str | Path, n_labels: int, label_uids: list[str]) -> list[str]:
    """The catalogue id of each of the dataset's labels: ``id`` of its ``lbl.jsonl`` record (row ``lid``)."""
    path = Path(dataset_dir) / "lbl.jsonl"
    if not path.is_file():
        raise ConfigError(f"params.yaml: data.open_labels needs the dataset's label ids: {path} (one record with an "
                          f"'id' per label) is missing")
    ids: dict[str, str] = {}
    for row, (n, rec) in enumerate(read_json_lines(path, empty=None)):
        if not isinstance(rec.get("id"), str):
            raise DataFormatError(path, n, "expected a string 'id' (the label's id in the catalogue)")
        ids[str(rec.get("lid", row))] = rec["id"]
    ids.update({v: v for v in list(ids.values())})   # a label's uid is its record's id since ingest reads it
    missing = [u for u in label_uids if u not in ids]
    if missing:
        raise DataFormatError(path, None, f"{len(missing)} of the {n_labels} labels have no record here "
                                          f"(first: label {missing[0]})")
    return [ids[u] for u in label_uids]


def _widen(s: Split | None, n_labels: int) -> Split | None:
    if s is None:
        return None
    Y = sp.csr_matrix((s.Y.data, s.Y.indices, s.Y.indptr), shape=(s.Y.shape[0], n_labels))
    return replace(s, Y=Y)


def open_label_space(ds: XMCDataset, dataset_dir: str | Path, catalogue: str | Path) -> XMCDataset:
    """``ds`` with the catalogue's labels it lacks appended (uid = the catalogue id; its own labels keep theirs)."""
    path = Path(catalogue)
    if not path.is_file():
        raise ConfigError(f"params.yaml: data.open_labels: {path} is not a file")
    have = set(dataset_label_ids(dataset_dir, ds.n_labels, list(ds.label_uids)))
    uids, texts = list(ds.label_uids), list(ds.label_texts)
    taken = set(uids)
    added = 0
    for n, rec in read_json_lines(path, empty=None):
        cid = rec.get("id")
        if not isinstance(cid, str) or not cid:
            raise DataFormatError(path, n, "expected a string 'id'")
        if cid in have:
            continue
        if cid in taken:
            raise DataFormatError(path, n, f"id {cid!r} is already a label uid of the dataset or earlier in this file")
        taken.add(cid)
        uids.append(cid)
        texts.append(catalogue_text(path, n, rec))
        added += 1
    L = len(texts)
    log.info("open label space: %d labels of %s + %d more of %s = %d", ds.n_labels, dataset_dir, added, path, L)
    meta = {**ds.meta, "open_labels": {"catalogue": str(path), "dataset_labels": ds.n_labels, "added": added}}
    def widen_filter(f: sp.csr_matrix | None) -> sp.csr_matrix | None:
        if f is None:
            return None
        f = f.tocsr()
        return sp.csr_matrix((f.data, f.indices, f.indptr), shape=(f.shape[0], L))

    return XMCDataset(uids, texts, _widen(ds.trn, L), _widen(ds.tst, L), widen_filter(ds.tst_filter), meta,
                      val=_widen(ds.val, L), val_filter=widen_filter(ds.val_filter),
                      trn_filter=widen_filter(ds.trn_filter))


__all__ = ["catalogue_text", "dataset_label_ids", "open_label_space"]
