"""A dense predictor ranking each text's TF-IDF shortlist (kind ``shortlist``): for label sets past
``index.auto_exact_max`` where validation keeps it. Apart from :mod:`xmc.package.lexical_predictors` because it
encodes queries (torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from xmc.ann.shortlist import SMALL_FULL_SEARCH, TfidfShortlist, full_search, rerank
from xmc.errors import DataFormatError
from xmc.io import read_json_file
from xmc.package.lexical_predictors import build_tfidf_labels, load_tfidf_labels
from xmc.package.predictor import Predictor, _copy_tree, _inside, _search, _setting, predictor_class


class ShortlistPredictor(Predictor):
    """A dense predictor (``base/``: encoder + exact index, UniDEC's heads...) that ranks only each text's TF-IDF
    shortlist (``tfidf/``: the vectoriser and the label rows, postings capped) by its own inner products
    (:mod:`xmc.ann.shortlist`). A text with fewer than k shortlisted labels (no shared term) is searched over
    every label instead. The prediction stage builds it above ``index.auto_exact_max`` where validation keeps it."""

    kind = "shortlist"

    def __init__(self, base: Predictor, shortlist: Any) -> None:
        self.base, self.shortlist = base, shortlist
        self._vectors: np.ndarray | None = None
        self.full_searches = 0   # texts searched over every label (fewer than k shortlisted)

    @classmethod
    def build(cls, source: Path, out: Path, label_texts: list[str], options: dict[str, Any]) -> dict[str, Any]:
        """``source``: a dense or UniDEC predictor folder built with an exact index (``predictor.json`` inside);
        ``options``: ``tfidf_dir`` (the tfidf stage's output), ``shortlist_k``, ``max_postings_per_term``."""
        base = read_json_file(source / "predictor.json", "a predictor description")
        if base.get("kind") not in ("dense", "unidec"):
            raise DataFormatError(source / "predictor.json", None, f"a shortlist re-ranks a dense or unidec "
                                  f"predictor, not {base.get('kind')!r}")
        _copy_tree(source, out / "base")
        (out / "base" / "predictor.json").unlink(missing_ok=True)
        cap = int(options["max_postings_per_term"])
        build_tfidf_labels(Path(options["tfidf_dir"]), out / "tfidf", len(label_texts), cap)
        return {"kind": cls.kind, "base": base, "tfidf": "tfidf", "shortlist_k": int(options["shortlist_k"]),
                "max_postings_per_term": cap}

    @classmethod
    def load(cls, root: Path, section: dict[str, Any], label_texts: list[str]) -> ShortlistPredictor:
        base_section = section.get("base")
        if not isinstance(base_section, dict) or base_section.get("kind") not in ("dense", "unidec"):
            raise DataFormatError(root, None, "a shortlist predictor needs a dense or unidec base section")
        base = predictor_class(base_section["kind"], root).load(root / "base", base_section, label_texts)
        vectorizer, X = load_tfidf_labels(_inside(root, section, "tfidf", "tfidf"), len(label_texts))
        return cls(base, TfidfShortlist(vectorizer, X, _setting(section, "shortlist_k", 200, root)))

    @property
    def index(self) -> Any:
        return self.base.index

    def query_vectors(self, texts: list[str]) -> np.ndarray:
        return self.base.query_vectors(texts)

    def label_vectors(self) -> np.ndarray:
        if self._vectors is None:
            self._vectors = self.base.index.vectors()
        return self._vectors

    def search(self, texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.rank(self.query_vectors(texts), self.shortlist.candidates(texts), k)

    def rank(self, q: np.ndarray, cand: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The top-``k`` of each row's candidate labels (``cand``, -1 padded) by inner product with its query vector
        ``q``; a row with fewer than ``k`` candidates is searched over every label."""
        D, I = rerank(q, self.label_vectors(), cand, k)
        short = np.flatnonzero((cand >= 0).sum(1) < min(k, self.index.ntotal))
        if short.size:   # no shortlist to rank: the exact search over every label
            self.full_searches += int(short.size)
            D[short], I[short] = (full_search(q[short], self.label_vectors(), k) if short.size < SMALL_FULL_SEARCH
                                  else _search(self.index, q[short], k))
        return D, I


PREDICTORS: dict[str, type[Predictor]] = {ShortlistPredictor.kind: ShortlistPredictor}

__all__ = ["PREDICTORS", "ShortlistPredictor"]
