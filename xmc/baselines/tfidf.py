"""TF-IDF features over instance and label texts, and the baselines built on them."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import CountVectorizer, TfidfTransformer, TfidfVectorizer

from xmc.config.schema import TfidfConfig, filled
from xmc.errors import DataFormatError
from xmc.io import atomic_dir, save_csr, save_npz_deterministic
# the baselines' prediction needs no scikit-learn: it lives with the query encoder (re-exported here)
from xmc.tfidf import LabelPrior, TfidfTextEncoder, knn_label_voting, label_prior_predict, tfidf_zero_shot


TFIDF_SPLITS = ("trn", "val", "lbl")  # what the tfidf stage transforms; test rows are transformed at prediction


class _TfidfVectorizer(TfidfVectorizer):
    """scikit-learn's TfidfVectorizer with its two passes over the vocabulary made cheaper, for the tens of
    millions of terms that bigrams with ``min_df`` 1 give at 10^6 texts; vocabulary and features unchanged:

    - ``_sort_features`` sorts the terms alone, not (term, index) tuples, so the sort stays on CPython's
      string-comparison fast path (same order: the terms are distinct), and remaps the columns with numpy;
    - ``_limit_features`` returns the counts as they are when ``min_df``, ``max_df`` and ``max_features`` prune no
      term (the defaults), instead of a Python loop over every term and a copy of every column.
    """

    def _sort_features(self, X: sp.spmatrix, vocabulary: dict[str, int]) -> sp.spmatrix:
        terms = sorted(vocabulary)
        old = np.fromiter(map(vocabulary.__getitem__, terms), dtype=np.int64, count=len(terms))
        map_index = np.empty(len(terms), dtype=X.indices.dtype)
        map_index[old] = np.arange(len(terms), dtype=X.indices.dtype)
        vocabulary.clear()   # in place, as scikit-learn's does: the caller keeps this dict as ``vocabulary_``
        vocabulary.update(zip(terms, range(len(terms))))
        X.indices = map_index.take(X.indices, mode="clip")
        return X

    def _limit_features(self, X: sp.spmatrix, vocabulary: dict[str, int], high: float | None = None,
                        low: float | None = None, limit: int | None = None) -> Any:
        if (high is None and low is None and limit is None) or not (sp.issparse(X) and X.format == "csr") \
                or len(vocabulary) == 0:
            return super()._limit_features(X, vocabulary, high, low, limit)
        dfs = np.bincount(X.indices, minlength=X.shape[1])   # scikit-learn's document frequency of CSR counts
        prunes = (high is not None and bool((dfs > high).any())) or (low is not None and bool((dfs < low).any())) \
            or (limit is not None and len(vocabulary) > limit)
        return super()._limit_features(X, vocabulary, high, low, limit) if prunes else X


def _vectorizer(params: dict[str, Any] | None, vocabulary: dict[str, int] | None = None) -> TfidfVectorizer:
    """The vectoriser of a params ``tfidf`` section or of saved ``settings.json`` (partial: the schema's defaults
    fill the rest; ``stop_words`` and ``token_pattern``, when not given, are scikit-learn's own defaults)."""
    cfg = filled(TfidfConfig, params, "tfidf")
    return _TfidfVectorizer(
        ngram_range=(1, cfg["ngram_max"]),
        min_df=cfg["min_df"],
        max_df=cfg["max_df"],
        max_features=cfg["max_features"],
        sublinear_tf=cfg["sublinear_tf"],
        lowercase=True,
        dtype=np.float32,
        vocabulary=vocabulary,
        **{k: cfg[k] for k in TfidfConfig.OPTIONAL if k in cfg},
    )


@dataclass
class TfidfFeatures:
    """L2-normalised TF-IDF rows of training, validation and label texts from one vectoriser.

    The vectoriser is saved as plain data (vocabulary JSON + idf array + its settings), never as a
    pickle, and rebuilt on load; :meth:`transform` embeds further texts (the test split, new queries).
    """

    vectorizer: TfidfVectorizer
    trn: sp.csr_matrix
    val: sp.csr_matrix | None
    lbl: sp.csr_matrix
    params: dict[str, Any] = field(default_factory=dict)

    def transform(self, texts: list[str]) -> sp.csr_matrix:
        return self.vectorizer.transform(list(texts)).tocsr()

    def encoder(self) -> TfidfTextEncoder:
        """The vectoriser's transform without scikit-learn (bit-identical rows): what a package keeps."""
        return TfidfTextEncoder.from_settings(self.params, self.vectorizer.vocabulary_, self.vectorizer.idf_)

    def save(self, out_dir: str | Path) -> None:
        with atomic_dir(out_dir) as tmp:
            (tmp / "vocabulary.json").write_text(vocabulary_json(self.vectorizer.vocabulary_), encoding="utf-8")
            (tmp / "settings.json").write_text(json.dumps(self.params, sort_keys=True, indent=2), encoding="utf-8")
            save_npz_deterministic(tmp / "idf.npz", idf=self.vectorizer.idf_.astype(np.float64))
            for name in TFIDF_SPLITS:
                if getattr(self, name) is not None:
                    save_csr(tmp / f"X_{name}.npz", getattr(self, name))

    @classmethod
    def load(cls, in_dir: str | Path) -> TfidfFeatures:
        d = Path(in_dir)
        for f in ("vocabulary.json", "settings.json", "idf.npz", "X_trn.npz", "X_lbl.npz"):
            if not (d / f).exists():
                raise DataFormatError(d / f, None, "missing from the TF-IDF features (rerun the tfidf stage)")
        params = json.loads((d / "settings.json").read_text(encoding="utf-8"))
        vocab = json.loads((d / "vocabulary.json").read_text(encoding="utf-8"))
        vec = _vectorizer(params, vocabulary=vocab)
        with np.load(d / "idf.npz", allow_pickle=False) as z:
            idf = z["idf"]
        vec.idf_ = idf
        X = {n: sp.load_npz(d / f"X_{n}.npz").tocsr() if (d / f"X_{n}.npz").exists() else None for n in TFIDF_SPLITS}
        return cls(vec, X["trn"], X["val"], X["lbl"], params)


def vocabulary_json(vocabulary: dict[str, int]) -> str:
    """``json.dumps(vocabulary, ensure_ascii=False, sort_keys=True)``, the same bytes, written without a key sort
    when the terms in column order are already sorted, as a fitted vectoriser's are (the sort dominated the save)."""
    n = len(vocabulary)
    terms: list[str | None] = [None] * n
    for t, i in vocabulary.items():
        if not 0 <= i < n or terms[i] is not None:
            terms = []
            break
        terms[i] = t
    if n == 0 or not terms or not all(a < b for a, b in zip(terms, itertools.islice(terms, 1, None))):
        return json.dumps({t: int(i) for t, i in vocabulary.items()}, ensure_ascii=False, sort_keys=True)
    quoted = map(json.encoder.encode_basestring, terms)   # the function json.dumps quotes keys with
    return "{" + ", ".join(f"{q}: {i}" for i, q in enumerate(quoted)) + "}"


def fit_tfidf(trn_texts: list[str], val_texts: list[str] | None, lbl_texts: list[str], params: dict[str, Any]) -> TfidfFeatures:
    """Fit one vectoriser on training instance texts plus label texts (never on validation or test texts)."""
    vec = _vectorizer(params)
    # Training and label texts are tokenised once: the counts that fit the vocabulary and idf are the rows
    # returned (``fit`` then ``transform`` tokenised them twice: 1.43x slower at 10^5 texts). The counts'
    # column indices are sorted before weighting, as ``transform`` leaves them, so every row's norm sums in the
    # same order and the features are bit-identical to ``fit`` + ``transform``.
    counts = CountVectorizer.fit_transform(vec, list(trn_texts) + list(lbl_texts)).tocsr()
    counts.sort_indices()
    weighting = TfidfTransformer(norm=vec.norm, use_idf=vec.use_idf, smooth_idf=vec.smooth_idf,
                                 sublinear_tf=vec.sublinear_tf).fit(counts)
    vec.idf_ = weighting.idf_
    X = sp.csr_matrix(weighting.transform(counts, copy=False))
    n_trn = len(trn_texts)
    settings = {k: v for k, v in filled(TfidfConfig, params, "tfidf").items() if v is not None}
    return TfidfFeatures(vec, X[:n_trn], vec.transform(val_texts).tocsr() if val_texts is not None else None,
                         X[n_trn:], settings)


__all__ = ["TFIDF_SPLITS", "LabelPrior", "TfidfFeatures", "fit_tfidf", "knn_label_voting", "label_prior_predict",
           "tfidf_zero_shot", "vocabulary_json"]
