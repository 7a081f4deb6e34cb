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
from xmc.predictions import TopK, topk_from_scores
from xmc.sparse_topk import csr_topk, iter_sparse_product_topk, sparse_product_topk


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


@dataclass
class LabelPrior:
    """Predicts the most frequent training labels for every instance."""

    freq: np.ndarray

    def predict(self, n_rows: int, k: int) -> TopK:
        return label_prior_predict(self.freq, n_rows, k)


def label_prior_predict(train_label_freq: np.ndarray, n_rows: int, k: int) -> TopK:
    one = topk_from_scores(np.asarray(train_label_freq, dtype=np.float32)[None, :], k)
    return TopK(np.repeat(one.indices, n_rows, 0), np.repeat(one.scores, n_rows, 0))


def tfidf_zero_shot(X_query: sp.csr_matrix, X_label: sp.csr_matrix | None, k: int, chunk: int = 512,
                    X_label_T: sp.csr_matrix | None = None) -> TopK:
    """Cosine between instance and label TF-IDF vectors; no training labels used.

    Scores are sparse products of blocks of at most ``chunk`` query rows (fewer where the block's
    product would pass :data:`xmc.sparse_topk.NNZ_BUDGET` nonzeros): no dense block x labels array,
    so time and memory follow the nonzero scores, with millions of labels. Same ranking as a dense
    top-k: labels sharing no term score 0 and fill rows with fewer than ``k`` matches, lowest ids first.
    ``X_label_T``: ``X_label`` already transposed (:func:`xmc.sparse_topk.transposed_operand`), for repeated calls.
    """
    return sparse_product_topk(X_query, X_label, k, max_rows=chunk, desc="tfidf zero-shot", BT=X_label_T)


def knn_label_voting(X_query: sp.csr_matrix, X_train: sp.csr_matrix, Y_train: sp.csr_matrix, n_neighbors: int, k: int,
                     chunk: int = 512, power: float = 1.0) -> TopK:
    """Each of the ``n_neighbors`` most similar training instances votes for its labels with sim**power.

    Neighbours come from sparse query x training-instance products (see :func:`tfidf_zero_shot`), the
    votes from a sparse (block x N_trn) weight matrix times ``Y_train``: nothing dense in N_trn or L."""
    Y = Y_train.tocsr()
    parts = []
    for _, nn in iter_sparse_product_topk(X_query, X_train, n_neighbors, max_rows=chunk, desc="tfidf kNN"):
        valid = nn.indices >= 0
        rows = np.nonzero(valid)[0]
        W = sp.csr_matrix((np.maximum(nn.scores[valid], 0) ** power, (rows, nn.indices[valid])),
                          shape=(nn.indices.shape[0], X_train.shape[0]))
        parts.append(csr_topk(W @ Y, k, zeros_are_candidates=False))
    if not parts:
        return TopK(np.full((0, k), -1, np.int32), np.full((0, k), -np.inf, np.float32))
    return TopK(np.vstack([p.indices for p in parts]), np.vstack([p.scores for p in parts]))
