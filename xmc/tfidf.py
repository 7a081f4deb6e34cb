"""The TF-IDF side of prediction without scikit-learn: a fitted vectoriser's transform, the TF-IDF baselines' rankings
and the label prior.

The ``tfidf`` stage fits scikit-learn's ``TfidfVectorizer`` (:mod:`xmc.baselines.tfidf`) and saves it as plain data:
``vocabulary.json``, ``idf.npz`` and ``settings.json``. :class:`TfidfTextEncoder` rebuilds its ``transform`` from those
files with the same operations in the same order (lowercase, the token pattern, stop words, word n-grams, float32
counts, sublinear tf, idf, a row's L2 norm summed term by term), so the rows are bit-identical to the
vectoriser's (checked by tests/test_lexical.py) while loading a package, serving it and predicting import neither
scikit-learn nor the scipy.stats and pandas it pulls in (2.5 s of a cold start).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.config.schema import TfidfConfig
from xmc.predictions import TopK, topk_from_scores
from xmc.sparse_topk import csr_topk, iter_sparse_product_topk, sparse_product_topk

# scikit-learn's default token pattern: words of two or more characters
DEFAULT_TOKEN_PATTERN = r"(?u)\b\w\w+\b"

# scikit-learn's ENGLISH_STOP_WORDS (``stop_words: english``; BSD-3-Clause, from the Glasgow Information Retrieval
# Group's list), here so that a package naming the list loads without scikit-learn; a test keeps it equal to theirs
ENGLISH_STOP_WORDS = frozenset({
    "a", "about", "above", "across", "after", "afterwards", "again", "against", "all", "almost", "alone", "along",
    "already", "also", "although", "always", "am", "among", "amongst", "amoungst", "amount", "an", "and", "another",
    "any", "anyhow", "anyone", "anything", "anyway", "anywhere", "are", "around", "as", "at", "back", "be", "became",
    "because", "become", "becomes", "becoming", "been", "before", "beforehand", "behind", "being", "below", "beside",
    "besides", "between", "beyond", "bill", "both", "bottom", "but", "by", "call", "can", "cannot", "cant", "co",
    "con", "could", "couldnt", "cry", "de", "describe", "detail", "do", "done", "down", "due", "during", "each",
    "eg", "eight", "either", "eleven", "else", "elsewhere", "empty", "enough", "etc", "even", "ever", "every",
    "everyone", "everything", "everywhere", "except", "few", "fifteen", "fifty", "fill", "find", "fire", "first",
    "five", "for", "former", "formerly", "forty", "found", "four", "from", "front", "full", "further", "get", "give",
    "go", "had", "has", "hasnt", "have", "he", "hence", "her", "here", "hereafter", "hereby", "herein", "hereupon",
    "hers", "herself", "him", "himself", "his", "how", "however", "hundred", "i", "ie", "if", "in", "inc", "indeed",
    "interest", "into", "is", "it", "its", "itself", "keep", "last", "latter", "latterly", "least", "less", "ltd",
    "made", "many", "may", "me", "meanwhile", "might", "mill", "mine", "more", "moreover", "most", "mostly", "move",
    "much", "must", "my", "myself", "name", "namely", "neither", "never", "nevertheless", "next", "nine", "no",
    "nobody", "none", "noone", "nor", "not", "nothing", "now", "nowhere", "of", "off", "often", "on", "once", "one",
    "only", "onto", "or", "other", "others", "otherwise", "our", "ours", "ourselves", "out", "over", "own", "part",
    "per", "perhaps", "please", "put", "rather", "re", "same", "see", "seem", "seemed", "seeming", "seems",
    "serious", "several", "she", "should", "show", "side", "since", "sincere", "six", "sixty", "so", "some",
    "somehow", "someone", "something", "sometime", "sometimes", "somewhere", "still", "such", "system", "take",
    "ten", "than", "that", "the", "their", "them", "themselves", "then", "thence", "there", "thereafter", "thereby",
    "therefore", "therein", "thereupon", "these", "they", "thick", "thin", "third", "this", "those", "though",
    "three", "through", "throughout", "thru", "thus", "to", "together", "too", "top", "toward", "towards", "twelve",
    "twenty", "two", "un", "under", "until", "up", "upon", "us", "very", "via", "was", "we", "well", "were", "what",
    "whatever", "when", "whence", "whenever", "where", "whereafter", "whereas", "whereby", "wherein", "whereupon",
    "wherever", "whether", "which", "while", "whither", "who", "whoever", "whole", "whom", "whose", "why", "will",
    "with", "within", "without", "would", "yet", "you", "your", "yours", "yourself", "yourselves",
})


def stop_word_set(stop_words: Any) -> frozenset[str] | None:
    """A ``stop_words`` setting (null, ``english`` or a list of words) as the set of words to drop."""
    if stop_words is None:
        return None
    if stop_words == "english":
        return ENGLISH_STOP_WORDS
    if isinstance(stop_words, str):
        raise ValueError(f"not a built-in stop list: {stop_words!r} (expected null, 'english' or a list of words)")
    return frozenset(stop_words)


class TfidfTextEncoder:
    """Texts -> L2-normalised TF-IDF rows (CSR, float32) over a fitted vocabulary and idf."""

    def __init__(self, vocabulary: dict[str, int], idf: np.ndarray, ngram_max: int = 2, sublinear_tf: bool = True,
                 stop_words: Any = None, token_pattern: str | None = None, lowercase: bool = True) -> None:
        if len(idf) != len(vocabulary):
            raise ValueError(f"{len(idf)} idf values for {len(vocabulary)} terms")
        self.vocabulary_ = vocabulary
        self.idf_ = np.asarray(idf)
        self.ngram_max, self.sublinear_tf, self.lowercase = int(ngram_max), bool(sublinear_tf), bool(lowercase)
        self.stop_words = stop_word_set(stop_words)
        pattern = re.compile(token_pattern or DEFAULT_TOKEN_PATTERN)
        if pattern.groups > 1:
            raise ValueError("more than one capturing group in the token pattern: only one may be captured")
        self._tokens = pattern.findall

    @classmethod
    def from_settings(cls, settings: dict[str, Any], vocabulary: dict[str, int], idf: np.ndarray) -> TfidfTextEncoder:
        """From a saved ``settings.json`` (the params ``tfidf`` section as the stage resolved it; a missing key takes
        the schema's default, as the fitted vectoriser did)."""
        cfg = {**TfidfConfig().model_dump(), **settings}
        return cls(vocabulary, idf, ngram_max=cfg["ngram_max"], sublinear_tf=cfg["sublinear_tf"],
                   stop_words=cfg.get("stop_words"), token_pattern=cfg.get("token_pattern"))

    def terms(self, text: str) -> list[str]:
        """The words and word n-grams of ``text`` (n = 1 .. ngram_max), stop words dropped before the n-grams."""
        tokens = self._tokens(text.lower() if self.lowercase else text)
        if self.stop_words is not None:
            tokens = [w for w in tokens if w not in self.stop_words]
        if self.ngram_max == 1:
            return tokens
        out = list(tokens)
        join = " ".join
        for n in range(2, min(self.ngram_max, len(tokens)) + 1):
            out.extend(join(tokens[i: i + n]) for i in range(len(tokens) - n + 1))
        return out

    def counts(self, texts: Iterable[str]) -> sp.csr_matrix:
        """Term counts over the vocabulary (out-of-vocabulary terms dropped), columns sorted within each row."""
        vocab = self.vocabulary_
        indices: list[int] = []
        values: list[int] = []
        indptr = [0]
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"a text must be a string, got {type(text).__name__}")
            row: dict[int, int] = {}
            for term in self.terms(text):
                j = vocab.get(term)
                if j is not None:
                    row[j] = row.get(j, 0) + 1
            indices.extend(row)
            values.extend(row.values())
            indptr.append(len(indices))
        X = sp.csr_matrix((np.asarray(values, dtype=np.float32), np.asarray(indices, dtype=np.int32),
                           np.asarray(indptr, dtype=np.int32 if indptr[-1] < 2**31 else np.int64)),
                          shape=(len(indptr) - 1, len(vocab)), dtype=np.float32)
        X.sort_indices()
        return X

    def transform(self, texts: Sequence[str]) -> sp.csr_matrix:
        X = self.counts(texts)
        data = X.data
        if self.sublinear_tf:
            np.log(data, out=data)
            data += 1.0
        data *= self.idf_[X.indices]   # float32 rows times the float64 idf, rounded back to float32, as scikit-learn
        _normalise_rows_l2(X)
        return X


def _normalise_rows_l2(X: sp.csr_matrix) -> None:
    """Divide each row by its L2 norm in place as scikit-learn's ``normalize`` does for a float32 CSR matrix: each
    square in float32, summed in float64 in column order, each value divided in float64 and rounded back (another
    summation order moves the last bit of some rows)."""
    lengths = np.diff(X.indptr)
    if not len(lengths) or not lengths.max():
        return
    data = X.data
    total = np.zeros(len(lengths), dtype=np.float64)
    starts = X.indptr[:-1]
    order = np.argsort(-lengths, kind="stable")        # longest rows first: the rows with a p-th term are a prefix
    have = np.searchsorted(-lengths[order], -np.arange(int(lengths.max())), side="left")    # rows with > p terms
    for p, n in enumerate(have):   # the p-th term of every row that has one: one vectorised step per position
        rows = order[:n]
        v = data[starts[rows] + p]
        total[rows] += (v * v).astype(np.float64)
    norm = np.repeat(np.sqrt(total), lengths)
    nonzero = norm != 0
    data[nonzero] = (data[nonzero].astype(np.float64) / norm[nonzero]).astype(data.dtype)


# ------------------------------------------------------------------------------------------------
# the TF-IDF baselines' predictions and the label prior
# ------------------------------------------------------------------------------------------------
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


__all__ = ["DEFAULT_TOKEN_PATTERN", "ENGLISH_STOP_WORDS", "LabelPrior", "TfidfTextEncoder", "knn_label_voting",
           "label_prior_predict", "stop_word_set", "tfidf_zero_shot"]
