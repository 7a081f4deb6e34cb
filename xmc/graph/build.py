"""Builders that derive RAMEN anchor sets for a dataset that has no graph files of its own.

semcor-wn30 (sentences labelled with WordNet senses) gets two anchor sets:

``wordnet`` (label -> anchor)
    each label synset is linked to the synsets it points to in WordNet: its hypernyms (from the
    dataset's ``label_graph.tsv``, instance hypernyms included) and the relations in ``relations``
    (pointer symbols of ``edges.tsv``: ``+`` derivationally related form, ``&`` similar to, ``#m/#p/#s``
    holonyms, ``^`` also see, ...). Anchor text = "lemmas (pos): definition", the label-text format.
``relations`` (label -> anchor), for "item -> related items" data (debian-relations, LF-AmazonTitles)
    where labels are items of the same catalogue: a label that is also a training instance (the same text) is
    linked to that instance's training labels, the labels' own relations. Anchor text = the label text. Only the
    training split's labels are read.
``cooccurrence`` (label -> anchor), for data with no label graph of its own
    each label is linked to the labels it shares training instances with most often (at least ``min_count``
    instances, at most ``top_k`` per label). Built only where no other label set could be (``graph.cooccurrence``):
    the one label graph every multi-label training split has, so RAMEN's label regulariser has edges everywhere.
``document`` (query -> anchor)
    each training sentence is linked to the other sentences of its document within ``window``
    sentences (the analogue of co-session queries); anchors are the training sentences themselves.
    Test sentences are never used, so nothing of the test split reaches training.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from xmc.data.dataset import Split
from xmc.data.formats import iter_decoded_lines, read_json_lines
from xmc.errors import ConfigError, DataFormatError
from xmc.graph.format import AnchorSet

log = logging.getLogger(__name__)


def synset_text(s: dict) -> str:
    """Same format as the dataset's label texts: ``lemma, lemma (pos): definition``."""
    return f"{', '.join(s['lemmas'])} ({s['pos']}): {s['definition']}"


def _read_jsonl(path: Path) -> list[dict]:
    return [r for _, r in read_json_lines(path, empty=None)]


def _label_records(path: Path) -> list[tuple[int, int, str]]:
    """(line, lid, synset id) of each label record; ``lid`` defaults to the record's 0-based row."""
    out = []
    for row, (n, r) in enumerate(read_json_lines(path, empty=None)):
        if not isinstance(r.get("id"), str):
            raise DataFormatError(path, n, "expected an object with a string 'id' (the label's WordNet synset)")
        lid = r.get("lid", row)
        try:
            if isinstance(lid, bool):
                raise TypeError
            lid = int(lid)
        except (TypeError, ValueError):
            raise DataFormatError(path, n, f"lid {lid!r} is not an integer") from None
        out.append((n, lid, r["id"]))
    return out


def label_synsets(dataset_dir: str | Path, n_labels: int, label_uids: list[str] | None = None) -> list[str]:
    """Synset id of each label row, from the raw dataset's ``lbl.jsonl`` (``lid`` -> ``id``).

    ``label_uids`` (the processed labels' uids: the records' ``id``s, or the raw ``lid``s of a dataset ingested
    without them) maps a subsampled label space (``data.subsample.labels: used``) back to the raw rows."""
    path = Path(dataset_dir) / "lbl.jsonl"
    if not path.exists():
        raise ConfigError(f"{path}: needed to map labels to WordNet synsets (not found)")
    records = _label_records(path)
    if label_uids is not None:
        by_lid = {str(lid): sid for _, lid, sid in records}
        by_lid.update({sid: sid for _, _, sid in records})   # a label's uid is its record's id since ingest reads it
        # labels of an open label space (data.open_labels) beyond the dataset's own have their catalogue id as uid
        by_lid.update({u: u for u in label_uids if u not in by_lid and not u.isdigit()})
        missing = [u for u in label_uids if u not in by_lid]
        if missing:
            raise DataFormatError(path, None, f"{len(missing)} processed labels have no lid here (first uid: {missing[0]})")
        return [by_lid[u] for u in label_uids]
    out: list[str | None] = [None] * n_labels
    for n, lid, sid in records:
        if not 0 <= lid < n_labels:
            raise DataFormatError(path, n, f"lid {lid} out of range [0, {n_labels})")
        out[lid] = sid
    missing_rows = [i for i, s in enumerate(out) if s is None]
    if missing_rows:
        raise DataFormatError(path, None, f"{len(missing_rows)} labels without a synset id (first: {missing_rows[0]})")
    return out  # type: ignore[return-value]


def wordnet_label_set(dataset_dir: str | Path, wordnet_dir: str | Path, n_labels: int,
                      relations: list[str], hypernym_levels: int = 1, name: str = "wordnet",
                      label_uids: list[str] | None = None) -> AnchorSet:
    """label -> anchor edges from WordNet hypernyms (``hypernym_levels`` up) plus ``relations``."""
    dataset_dir, wordnet_dir = Path(dataset_dir), Path(wordnet_dir)
    lab_syn = label_synsets(dataset_dir, n_labels, label_uids)
    synsets = {r["id"]: r for r in _read_jsonl(wordnet_dir / "synsets.jsonl")}
    # hypernyms: the dataset's label graph (child -> parent, upward closure of the labels)
    parents: dict[str, set[str]] = defaultdict(set)
    lg = dataset_dir / "label_graph.tsv"
    for n, line in iter_decoded_lines(lg):
        parts = line.split("\t")
        if n == 1:
            if parts[:3] != ["child", "relation", "parent"]:
                raise DataFormatError(lg, 1, f"expected header 'child<TAB>relation<TAB>parent...', got {parts[:3]}")
            continue
        if len(parts) < 3:
            raise DataFormatError(lg, n, f"expected at least 3 tab-separated fields, got {len(parts)}")
        if "hypernym" in parts[1]:
            parents[parts[0]].add(parts[2])
    # the other relations: WordNet pointers (src, symbol, dst)
    rel = set(relations)
    related: dict[str, set[str]] = defaultdict(set)
    if rel:
        ep = wordnet_dir / "edges.tsv"
        for n, line in iter_decoded_lines(ep):
            if n == 1:   # the header
                continue
            parts = line.split("\t")
            if len(parts) != 3:
                raise DataFormatError(ep, n, f"expected 'src<TAB>pointer<TAB>dst', got {len(parts)} fields")
            if parts[1] in rel:
                related[parts[0]].add(parts[2])
    anchor_index: dict[str, int] = {}
    rows: list[int] = []
    cols: list[int] = []
    counts = {"hypernym": 0, "other": 0}
    for lid, s in enumerate(lab_syn):
        targets: list[tuple[str, str]] = []
        frontier = {s}
        for _ in range(hypernym_levels):
            frontier = {p for f in frontier for p in parents.get(f, ())}
            targets += [(p, "hypernym") for p in sorted(frontier)]
        targets += [(t, "other") for t in sorted(related.get(s, ()))]
        seen: set[str] = set()
        for t, kind in targets:
            if t == s or t in seen or t not in synsets:
                continue
            seen.add(t)
            a = anchor_index.setdefault(t, len(anchor_index))
            rows.append(lid)
            cols.append(a)
            counts[kind] += 1
    ids = list(anchor_index)
    texts = [synset_text(synsets[a]) for a in ids]
    E = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n_labels, len(ids)))
    log.info("wordnet anchor set: %d anchors, %d label edges (%s)", len(ids), E.nnz, counts)
    return AnchorSet(name, ids, texts, {"label": E})


def item_relations_label_set(trn: Split, label_texts: list[str], label_uids: list[str],
                             name: str = "relations") -> AnchorSet:
    """label -> anchor edges from each label to the training labels of the training instances whose text is that
    label's text (labels that are items themselves); the anchors are the labels reached, by their own text."""
    by_text: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trn.texts):
        by_text[t].append(i)
    Y = trn.Y.tocsr()
    rows: list[int] = []
    cols: list[int] = []
    anchor_index: dict[int, int] = {}
    matched = 0
    for lid, text in enumerate(label_texts):
        members = by_text.get(text)
        if not members:
            continue
        matched += 1
        targets = sorted({int(j) for i in members for j in Y.indices[Y.indptr[i]:Y.indptr[i + 1]]} - {lid})
        for j in targets:
            rows.append(lid)
            cols.append(anchor_index.setdefault(j, len(anchor_index)))
    ids = list(anchor_index)
    E = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(label_texts), len(ids)))
    log.info("relations anchor set: %d of %d labels are training items, %d anchors, %d label edges",
             matched, len(label_texts), len(ids), E.nnz)
    return AnchorSet(name, [label_uids[j] for j in ids], [label_texts[j] for j in ids], {"label": E})


def label_cooccurrence_set(trn: Split, label_texts: list[str], label_uids: list[str], top_k: int = 10,
                           min_count: int = 2, name: str = "cooccurrence") -> AnchorSet:
    """label -> anchor edges from each label to the ``top_k`` labels it co-occurs with on the most training instances
    (at least ``min_count``; ties by label id); the anchors are the labels reached, by their own text."""
    Y = trn.Y.tocsc().astype(np.float32)
    Y.data[:] = 1.0
    C = (Y.T @ Y).tocsr()   # label x label: the training instances two labels share
    C.setdiag(0)
    C.eliminate_zeros()
    rows: list[int] = []
    cols: list[int] = []
    anchor_index: dict[int, int] = {}
    for lid in range(C.shape[0]):
        idx, cnt = C.indices[C.indptr[lid]:C.indptr[lid + 1]], C.data[C.indptr[lid]:C.indptr[lid + 1]]
        keep = cnt >= min_count
        idx, cnt = idx[keep], cnt[keep]
        for j in idx[np.lexsort((idx, -cnt))][:top_k]:
            rows.append(lid)
            cols.append(anchor_index.setdefault(int(j), len(anchor_index)))
    ids = list(anchor_index)
    E = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(label_texts), len(ids)))
    log.info("co-occurrence anchor set: %d of %d labels linked, %d anchors, %d label edges",
             int((np.diff(E.indptr) > 0).sum()), len(label_texts), len(ids), E.nnz)
    return AnchorSet(name, [label_uids[j] for j in ids], [label_texts[j] for j in ids], {"label": E})


def document_query_set(trn: Split, window: int = 2, name: str = "document") -> AnchorSet:
    """query -> anchor edges to the other sentences of the same document within ``window`` positions."""
    if trn.groups is None:
        raise ConfigError("the document anchor set needs document ids (Split.groups); this dataset has none")
    by_doc: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(trn.groups):
        if g is not None:
            by_doc[g].append(i)
    rows: list[int] = []
    cols: list[int] = []
    for members in by_doc.values():
        for p, i in enumerate(members):
            lo, hi = max(0, p - window), min(len(members), p + window + 1)
            for j in members[lo:hi]:
                if j != i:
                    rows.append(i)
                    cols.append(j)
    n = len(trn)
    E = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n, n))
    log.info("document anchor set: %d anchors, %d query edges from %d documents", n, E.nnz, len(by_doc))
    return AnchorSet(name, list(trn.uids), list(trn.texts), {"query": E})
