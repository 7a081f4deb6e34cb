"""TF-IDF features over instance and label texts, and the baselines built on them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfVectorizer
from tqdm import tqdm

from xmc.io import atomic_dir, save_csr
from xmc.predictions import TopK, topk_from_scores, topk_from_sparse


@dataclass
class TfidfFeatures:
    """L2-normalised TF-IDF rows for train, test and label texts from one vectoriser."""

    vectorizer: TfidfVectorizer
    trn: sp.csr_matrix
    tst: sp.csr_matrix
    lbl: sp.csr_matrix

    def save(self, out_dir: str | Path) -> None:
        with atomic_dir(out_dir) as tmp:
            joblib.dump(self.vectorizer, tmp / "vectorizer.joblib")
            for name in ("trn", "tst", "lbl"):
                save_csr(tmp / f"X_{name}.npz", getattr(self, name))

    @classmethod
    def load(cls, in_dir: str | Path) -> TfidfFeatures:
        d = Path(in_dir)
        return cls(joblib.load(d / "vectorizer.joblib"), *(sp.load_npz(d / f"X_{n}.npz").tocsr() for n in ("trn", "tst", "lbl")))


def fit_tfidf(trn_texts: list[str], tst_texts: list[str], lbl_texts: list[str], params: dict[str, Any]) -> TfidfFeatures:
    """Fit one vectoriser on training instance texts plus label texts (never on test texts)."""
    vec = TfidfVectorizer(
        ngram_range=(1, int(params.get("ngram_max", 2))),
        min_df=int(params.get("min_df", 1)),
        max_df=float(params.get("max_df", 1.0)),
        max_features=params.get("max_features"),
        sublinear_tf=bool(params.get("sublinear_tf", True)),
        lowercase=True,
        stop_words=params.get("stop_words"),
        token_pattern=params.get("token_pattern", r"(?u)\b\w\w+\b"),
        dtype=np.float32,
    )
    vec.fit(list(trn_texts) + list(lbl_texts))
    return TfidfFeatures(vec, vec.transform(trn_texts).tocsr(), vec.transform(tst_texts).tocsr(), vec.transform(lbl_texts).tocsr())


@dataclass
class LabelPrior:
    """Predicts the most frequent training labels for every instance."""

    freq: np.ndarray

    def predict(self, n_rows: int, k: int) -> TopK:
        return label_prior_predict(self.freq, n_rows, k)


def label_prior_predict(train_label_freq: np.ndarray, n_rows: int, k: int) -> TopK:
    one = topk_from_scores(np.asarray(train_label_freq, dtype=np.float32)[None, :], k)
    return TopK(np.repeat(one.indices, n_rows, 0), np.repeat(one.scores, n_rows, 0))


def tfidf_zero_shot(X_query: sp.csr_matrix, X_label: sp.csr_matrix, k: int, chunk: int = 512) -> TopK:
    """Cosine between instance and label TF-IDF vectors; no training labels used."""
    XT = X_label.T.tocsc()
    parts = []
    for s in tqdm(range(0, X_query.shape[0], chunk), desc="tfidf zero-shot", unit="chunk", leave=False):
        parts.append(topk_from_scores((X_query[s : s + chunk] @ XT).toarray(), k))
    return TopK(np.vstack([p.indices for p in parts]), np.vstack([p.scores for p in parts]))


def knn_label_voting(X_query: sp.csr_matrix, X_train: sp.csr_matrix, Y_train: sp.csr_matrix, n_neighbors: int, k: int,
                     chunk: int = 512, power: float = 1.0) -> TopK:
    """Each of the ``n_neighbors`` most similar training instances votes for its labels with sim**power."""
    XT = X_train.T.tocsc()
    parts = []
    for s in tqdm(range(0, X_query.shape[0], chunk), desc="tfidf kNN", unit="chunk", leave=False):
        sims = (X_query[s : s + chunk] @ XT).toarray()
        nn = topk_from_scores(sims, n_neighbors)
        valid = nn.indices >= 0
        rows = np.repeat(np.arange(sims.shape[0]), n_neighbors).reshape(nn.indices.shape)[valid]
        W = sp.csr_matrix((np.maximum(nn.scores[valid], 0) ** power, (rows, nn.indices[valid])), shape=(sims.shape[0], X_train.shape[0]))
        parts.append(topk_from_sparse((W @ Y_train).tocsr(), k))
    return TopK(np.vstack([p.indices for p in parts]), np.vstack([p.scores for p in parts]))
