"""Pseudo (instance, label) pairs from raw text: TF-IDF top-k, inverse-cloze pairs, dense top-k.

* TF-IDF pseudo positives (MACLR Stage II, "TFIDF" view): each training instance's top-k labels
  by cosine between the instance's and the label's TF-IDF vectors, above a score floor.
* Inverse Cloze Task pairs (MACLR Stage I): with titles, (context = content, pseudo label = title)
  as in the paper; without titles (semcor-wn30: one instance = one sentence of a document), the
  instance's sentence is the pseudo label and its neighbouring sentences of the same document are
  the context, the original ICT of Lee et al. (2019) with the sentence removed from its context.
* Dense pseudo positives (Stage II, "E" view): the Stage-I encoder's top-k labels per instance.

Everything is written to one versioned folder (:class:`PseudoPairs`) together with the texts, so
the training stage reads that folder and nothing that holds ground-truth pairs.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.ann import ANNIndex
from xmc.data.formats import read_json_lines   # the dataset readers' checks: errors name the file and line
from xmc.errors import ConfigError, DataFormatError
from xmc.io import atomic_dir, write_json
from xmc.sparse_topk import sparse_product_topk

log = logging.getLogger(__name__)

FORMAT = "maclr-pseudo-pairs"
VERSION = 1


# ---- TF-IDF and dense top-k -------------------------------------------------------------------
def tfidf_topk(X_inst: sp.csr_matrix, X_lbl: sp.csr_matrix, k: int, min_score: float = 0.0,
               chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` labels per instance by TF-IDF cosine (rows are L2-normalised); -1 / 0 pad slots whose
    score is <= ``min_score`` (an instance sharing no term with any label gets no pseudo label).

    Blocks of at most ``chunk`` instances are scored as sparse products (never instances x labels
    dense), so the cost follows the nonzero cosines even with millions of labels."""
    top = sparse_product_topk(X_inst, X_lbl, k, max_rows=chunk, desc="tfidf pseudo pairs")
    ids, scores = top.indices.astype(np.int32), top.scores.astype(np.float32)
    drop = (ids < 0) | ~(scores > min_score)
    ids[drop], scores[drop] = -1, 0.0
    return ids, scores


def dense_topk(inst_vecs: np.ndarray, label_vecs: np.ndarray, k: int, index_kind: str = "exact") -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` labels per instance by inner product of encoder vectors (exact MIPS by default)."""
    D, I = ANNIndex(kind=index_kind).build(label_vecs).search(inst_vecs, k)
    return I.astype(np.int32), D.astype(np.float32)


def topk_to_csr(ids: np.ndarray, n_labels: int, rows: np.ndarray | None = None, n_rows: int | None = None) -> sp.csr_matrix:
    """(n x k) label ids (-1 = none) -> binary CSR; ``rows`` maps each row of ``ids`` to an instance."""
    n = ids.shape[0]
    rows = np.arange(n) if rows is None else np.asarray(rows)
    r = np.repeat(rows, ids.shape[1])
    c = ids.ravel()
    keep = c >= 0
    M = sp.csr_matrix((np.ones(int(keep.sum()), np.float32), (r[keep], c[keep])),
                      shape=(n_rows if n_rows is not None else n, n_labels))
    M.sum_duplicates()
    M.data[:] = 1.0
    return M


def union_pairs(*mats: sp.csr_matrix) -> sp.csr_matrix:
    """Union of binary pseudo-positive matrices (a pair from either view is a positive)."""
    out = mats[0].copy().tocsr()
    for m in mats[1:]:
        out = out + m.tocsr()
    out.data[:] = 1.0
    out.eliminate_zeros()
    return out.tocsr()


def agreed_pairs(a: sp.csr_matrix, b: sp.csr_matrix) -> sp.csr_matrix:
    """Pairs present in both binary pseudo-positive matrices (the views agree)."""
    out = a.tocsr().multiply(b.tocsr()).tocsr()
    out.data[:] = 1.0
    out.eliminate_zeros()
    return out.astype(np.float32)


# ---- inverse-cloze pairs ----------------------------------------------------------------------
@dataclass
class ICTPair:
    instance: int      # training instance the pair comes from
    context: str       # the query side in Stage I
    pseudo_label: str  # the label side in Stage I


def ict_pairs_from_groups(texts: list[str], groups: list[str | None] | None, window: int = 1,
                          min_context: int = 1) -> list[ICTPair]:
    """Sentence-level ICT: instance i's sentence is the pseudo label, the up-to-``window`` sentences on
    each side of it in the same document (``groups``, in corpus order) the context. Instances with fewer
    than ``min_context`` neighbouring sentences (single-sentence documents) give no pair."""
    if groups is None:
        raise DataFormatError(None, None, "ICT pairs without titles need document ids (Split.groups); none in this dataset")
    pairs: list[ICTPair] = []
    n = len(texts)
    start = 0
    while start < n:  # one run of consecutive instances with the same group = one document
        end = start
        while end < n and groups[end] == groups[start]:
            end += 1
        if groups[start] is not None:
            for i in range(start, end):
                ctx = [texts[j] for j in range(max(start, i - window), min(end, i + window + 1)) if j != i]
                if len(ctx) >= min_context:
                    pairs.append(ICTPair(i, " ".join(ctx), texts[i]))
        start = end
    return pairs


def ict_pairs_from_titles(titles: list[str], contents: list[str], remove_title_prob: float = 0.9,
                          seed: int = 0, min_sentences: int = 2) -> list[ICTPair]:
    """MACLR's title ICT: pseudo label = title, context = content. As in the MACLR code, the title string
    is deleted from each content sentence with probability ``remove_title_prob`` (one draw per
    sentence), and instances with fewer than ``min_sentences`` content sentences are skipped."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i, (title, content) in enumerate(zip(titles, contents)):
        title, content = (title or "").strip(), (content or "").strip()
        if not title or not content:
            continue
        sents = [s for s in re.split(r"(?<=[.!?])\s+", content) if s]
        if len(sents) < min_sentences:
            continue
        kept = [s.replace(title, " ") if rng.random() < remove_title_prob else s for s in sents]
        ctx = re.sub(r"\s+", " ", " ".join(kept)).strip()
        if ctx:
            pairs.append(ICTPair(i, ctx, title))
    return pairs


# ---- the versioned pairs folder ---------------------------------------------------------------
def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [rec for _, rec in read_json_lines(path, empty=None)]


@dataclass
class PseudoPairs:
    """Everything the zero-shot training stage reads: texts, ICT pairs, TF-IDF top-k (no ground truth)."""

    texts: list[str]
    label_texts: list[str]
    ict: list[ICTPair]
    tfidf_ids: np.ndarray     # (n_instances x k) int32, -1 = none
    tfidf_scores: np.ndarray  # (n_instances x k) float32
    meta: dict[str, Any] = field(default_factory=dict)
    # the label-name view (labels whose names occur in the instance, zero-shot ranking; xmc.lexical), where the
    # dataset's labels have names apart from their descriptions; None otherwise
    names_ids: np.ndarray | None = None     # (n_instances x k) int32, -1 = none
    names_scores: np.ndarray | None = None  # (n_instances x k) float32

    def tfidf_matrix(self) -> sp.csr_matrix:
        return topk_to_csr(self.tfidf_ids, len(self.label_texts))

    def sparse_view(self, view: str) -> np.ndarray:
        """The top-k label ids of a sparse view: ``tfidf`` (sentence ↔ whole label text) or ``label_names``."""
        if view == "tfidf":
            return self.tfidf_ids
        if view == "label_names":
            if self.names_ids is None:
                raise ConfigError("maclr stage2.sparse_view 'label_names': the pseudo pairs have no label-name view "
                                  "(the dataset's labels have no names apart from their text, or maclr.pairs.names_k is 0)")
            return self.names_ids
        raise ConfigError(f"maclr stage2.sparse_view must be tfidf or label_names (got {view!r})")

    def counts(self) -> dict[str, Any]:
        out: dict[str, Any] = {"instances": len(self.texts), "labels": len(self.label_texts), "ict_pairs": len(self.ict)}
        for view, ids in (("tfidf", self.tfidf_ids), ("names", self.names_ids)):
            if ids is None:
                continue
            per = (ids >= 0).sum(1)
            out.update({f"{view}_pairs": int(per.sum()), f"instances_with_{view}_pairs": int((per > 0).sum()),
                        f"{view}_distinct_labels": int(len(np.unique(ids[ids >= 0])))})
        return out

    def sample(self, n: int = 3, seed: int = 0) -> list[dict[str, Any]]:
        rng = np.random.default_rng(seed)
        out = []
        for p in (self.ict[int(j)] for j in rng.choice(len(self.ict), min(n, len(self.ict)), replace=False)):
            ids = self.tfidf_ids[p.instance]
            row = {"instance": self.texts[p.instance], "ict_context": p.context[:300],
                   "tfidf_labels": [self.label_texts[j][:100] for j in ids[ids >= 0]]}
            if self.names_ids is not None:
                nids = self.names_ids[p.instance]
                row["name_match_labels"] = [self.label_texts[j][:100] for j in nids[nids >= 0]]
            out.append(row)
        return out

    def save(self, out_dir: str | Path) -> None:
        with atomic_dir(out_dir) as tmp:
            _write_jsonl(tmp / "instances.jsonl", [{"text": t} for t in self.texts])
            _write_jsonl(tmp / "labels.jsonl", [{"text": t} for t in self.label_texts])
            _write_jsonl(tmp / "ict.jsonl", [{"i": p.instance, "context": p.context, "label": p.pseudo_label}
                                              for p in self.ict])
            np.savez(tmp / "tfidf_topk.npz", ids=self.tfidf_ids, scores=self.tfidf_scores)
            if self.names_ids is not None:
                np.savez(tmp / "names_topk.npz", ids=self.names_ids, scores=self.names_scores)
            write_json(tmp / "meta.json", {"format": FORMAT, "version": VERSION, **self.meta,
                                           "counts": self.counts(), "sample": self.sample()})

    @classmethod
    def load(cls, in_dir: str | Path) -> PseudoPairs:
        d = Path(in_dir)
        meta_path = d / "meta.json"
        if not meta_path.exists():
            raise DataFormatError(meta_path, None, "not a pseudo-pairs folder (run the maclr_pseudo_pairs stage)")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise DataFormatError(meta_path, None, f"expected {FORMAT} v{VERSION}, found "
                                  f"{meta.get('format')} v{meta.get('version')} (rerun the maclr_pseudo_pairs stage)")
        top = np.load(d / "tfidf_topk.npz")
        names = np.load(d / "names_topk.npz") if (d / "names_topk.npz").exists() else None
        return cls(texts=[r["text"] for r in _read_jsonl(d / "instances.jsonl")],
                   label_texts=[r["text"] for r in _read_jsonl(d / "labels.jsonl")],
                   ict=[ICTPair(int(r["i"]), r["context"], r["label"]) for r in _read_jsonl(d / "ict.jsonl")],
                   tfidf_ids=top["ids"], tfidf_scores=top["scores"], meta=meta,
                   names_ids=None if names is None else names["ids"],
                   names_scores=None if names is None else names["scores"])
