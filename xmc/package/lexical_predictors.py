"""The predictors that read text lexically: TF-IDF (zero-shot cosine, k-NN voting), the label prior, label names,
and a predictor fused with name matches (the hybrids, whose base predictors load through
:func:`~xmc.package.predictor.predictor_class`).

None of them needs torch or an encoder: :func:`xmc.package.predictor.predictor_class` imports this module for a
package of one of these kinds, and a dense package's (or a TF-IDF shortlist's,
:mod:`xmc.package.shortlist_predictor`) module only where one is loaded.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from xmc.config.schema import TfidfKnnConfig, TfidfZeroShotConfig, filled
from xmc.errors import ConfigError, DataFormatError
from xmc.io import read_json_file, save_csr
from xmc.lexical import LabelNameMatcher, parse_label_names, zero_shot_name_scores
from xmc.lexical.hybrid import HybridRanker, fusion_from_json, hybrid_features
from xmc.lexical.names import MODES
from xmc.package.predictor import PACKAGE_FILES, Predictor, _inside, _link_or_copy, _setting, predictor_class
from xmc.sparse_topk import prune_postings, transposed_operand
from xmc.tfidf import TfidfTextEncoder, knn_label_voting, label_prior_predict, tfidf_zero_shot

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------
# TF-IDF baselines and the label prior
# ------------------------------------------------------------------------------------------------
def _load_vectorizer(d: Path) -> TfidfTextEncoder:
    """The TF-IDF transform the tfidf stage saved in ``d`` (vocabulary, idf, settings), without scikit-learn."""
    params = read_json_file(d / "settings.json", "TF-IDF settings")
    vocab = read_json_file(d / "vocabulary.json", "a TF-IDF vocabulary")
    if not isinstance(vocab, dict) or not isinstance(params, dict):
        raise DataFormatError(d / "vocabulary.json", None, "not a TF-IDF vocabulary (a JSON object)")
    with np.load(d / "idf.npz", allow_pickle=False) as z:
        idf = z["idf"]
    if len(idf) != len(vocab):
        raise DataFormatError(d / "idf.npz", None, f"{len(idf)} idf values for {len(vocab)} terms")
    try:
        return TfidfTextEncoder.from_settings(params, vocab, idf)
    except ValueError as e:
        raise DataFormatError(d / "settings.json", None, str(e)) from None


def _copy_vectorizer(src: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in ("vocabulary.json", "settings.json", "idf.npz"):
        if not (src / f).exists():
            raise DataFormatError(src / f, None, "missing from the TF-IDF features (rerun the tfidf stage)")
        _link_or_copy(src / f, out / f)


def _load_csr(path: Path) -> sp.csr_matrix:
    try:
        return sp.load_npz(path).tocsr()
    except (OSError, ValueError) as e:
        raise DataFormatError(path, None, f"not a sparse matrix ({str(e)[:120]})") from None


def _save_postings(src: Path, dest: Path, X: sp.csr_matrix, max_per_term: int) -> None:
    """The item side of a TF-IDF predictor, its postings capped at ``max_per_term`` per term (0: copied as is)."""
    if max_per_term <= 0:
        _link_or_copy(src, dest)
        return
    pruned = prune_postings(X, max_per_term)
    log.info("%s: postings capped at %d per term keep %d of %d entries (%.1f%%)", src.name, max_per_term,
             pruned.nnz, X.nnz, 100.0 * pruned.nnz / max(X.nnz, 1))
    save_csr(dest, pruned)


def build_tfidf_labels(tfidf: Path, out: Path, n_labels: int, max_per_term: int) -> None:
    """The label side of a TF-IDF predictor into ``out``: the vectoriser and the label rows, postings capped."""
    _copy_vectorizer(tfidf, out)
    X = _load_csr(tfidf / "X_lbl.npz")
    if X.shape[0] != n_labels:
        raise DataFormatError(tfidf / "X_lbl.npz", None, f"{X.shape[0]} label rows for {n_labels} labels")
    _save_postings(tfidf / "X_lbl.npz", out / "X_lbl.npz", X, max_per_term)


def load_tfidf_labels(d: Path, n_labels: int) -> tuple[Any, sp.csr_matrix]:
    """(vectoriser, label rows) as :func:`build_tfidf_labels` wrote them."""
    X = _load_csr(d / "X_lbl.npz")
    if X.shape[0] != n_labels:
        raise DataFormatError(d / "X_lbl.npz", None, f"{X.shape[0]} label rows for {n_labels} labels")
    return _load_vectorizer(d), X


class TfidfZeroShotPredictor(Predictor):
    """Cosine between TF-IDF vectors of the text and of each label text; no training labels."""

    kind = "tfidf_zeroshot"

    def __init__(self, vectorizer: Any, X_label: sp.csr_matrix) -> None:
        # transposed once, not per request (0.5 s at 10^6 labels)
        self.vectorizer, self.X_label_T = vectorizer, transposed_operand(X_label)

    @classmethod
    def build(cls, source: Path, out: Path, label_texts: list[str], options: dict[str, Any]) -> dict[str, Any]:
        """``source``: the tfidf_zeroshot model folder (the TF-IDF vectoriser and label rows); ``options["config"]``:
        the run's settings."""
        cap = filled(TfidfZeroShotConfig, options.get("config"), "tfidf_zeroshot")["max_postings_per_term"]
        build_tfidf_labels(source, out / "tfidf", len(label_texts), cap)
        return {"kind": cls.kind, "tfidf": "tfidf", "max_postings_per_term": cap}

    @classmethod
    def load(cls, root: Path, section: dict[str, Any], label_texts: list[str]) -> TfidfZeroShotPredictor:
        return cls(*load_tfidf_labels(_inside(root, section, "tfidf", "tfidf"), len(label_texts)))

    def search(self, texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        top = tfidf_zero_shot(self.vectorizer.transform(texts).tocsr(), None, k, X_label_T=self.X_label_T)
        return top.scores.astype(np.float32), top.indices.astype(np.int64)


class TfidfKNNPredictor(Predictor):
    """The most similar training instances (TF-IDF cosine) vote for their labels with sim**power."""

    kind = "tfidf_knn"

    def __init__(self, vectorizer: Any, X_train: sp.csr_matrix, Y_train: sp.csr_matrix, n_neighbors: int,
                 power: float) -> None:
        self.vectorizer, self.X_train, self.Y_train = vectorizer, X_train, Y_train
        self.n_neighbors, self.power = n_neighbors, power

    @classmethod
    def build(cls, source: Path, out: Path, label_texts: list[str], options: dict[str, Any]) -> dict[str, Any]:
        """``source``: the tfidf_knn model folder (vectoriser, training rows and their labels); ``options["config"]``:
        the run's settings."""
        _copy_vectorizer(source, out / "tfidf")
        X = _load_csr(source / "X_trn.npz")
        Y = _load_csr(source / "Y_trn.npz")
        if Y.shape != (X.shape[0], len(label_texts)):
            raise DataFormatError(source / "X_trn.npz", None, f"{X.shape[0]} training rows but the label matrix is "
                                  f"{Y.shape[0]} x {Y.shape[1]} for {len(label_texts)} labels")
        knn = filled(TfidfKnnConfig, options.get("config"), "tfidf_knn")
        _save_postings(source / "X_trn.npz", out / "tfidf" / "X_trn.npz", X, knn["max_postings_per_term"])
        _link_or_copy(source / "Y_trn.npz", out / "tfidf" / "Y_trn.npz")
        return {"kind": cls.kind, "tfidf": "tfidf", "n_neighbors": knn["n_neighbors"], "power": knn["power"],
                "max_postings_per_term": knn["max_postings_per_term"]}

    @classmethod
    def load(cls, root: Path, section: dict[str, Any], label_texts: list[str]) -> TfidfKNNPredictor:
        d = _inside(root, section, "tfidf", "tfidf")
        X, Y = _load_csr(d / "X_trn.npz"), _load_csr(d / "Y_trn.npz")
        if Y.shape != (X.shape[0], len(label_texts)):
            raise DataFormatError(d / "Y_trn.npz", None, f"shape {Y.shape} does not fit {X.shape[0]} training rows "
                                  f"and {len(label_texts)} labels")
        power = section.get("power", 1.0)
        if isinstance(power, bool) or not isinstance(power, (int, float)) or not 0 <= power <= 100:
            raise DataFormatError(root / "manifest.json", None, f"predictor power {repr(power)[:40]} is not a number "
                                  "in [0, 100]")
        return cls(_load_vectorizer(d), X, Y, _setting(section, "n_neighbors", 0, root), float(power))

    def search(self, texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        top = knn_label_voting(self.vectorizer.transform(texts).tocsr(), self.X_train, self.Y_train,
                               self.n_neighbors, k, power=self.power)
        return top.scores.astype(np.float32), top.indices.astype(np.int64)


class LabelPriorPredictor(Predictor):
    """The most frequent training labels, whatever the text."""

    kind = "label_prior"

    def __init__(self, freq: np.ndarray) -> None:
        self.freq = freq

    @classmethod
    def build(cls, source: Path, out: Path, label_texts: list[str], options: dict[str, Any]) -> dict[str, Any]:
        """``source``: the label_prior model folder (its training label frequencies)."""
        out.mkdir(parents=True, exist_ok=True)
        cls.load(source, {"frequencies": "label_prior.npz"}, label_texts)   # checked before it is shipped
        _link_or_copy(source / "label_prior.npz", out / "label_prior.npz")
        return {"kind": cls.kind, "frequencies": "label_prior.npz"}

    @classmethod
    def load(cls, root: Path, section: dict[str, Any], label_texts: list[str]) -> LabelPriorPredictor:
        path = _inside(root, section, "frequencies", "label_prior.npz")
        try:
            with np.load(path, allow_pickle=False) as z:
                freq = np.asarray(z["freq"], np.float32)
        except (OSError, ValueError, KeyError) as e:
            raise DataFormatError(path, None, f"not a label-frequency file ({str(e)[:120]})") from None
        if freq.shape != (len(label_texts),):
            raise DataFormatError(path, None, f"{freq.size} frequencies for {len(label_texts)} labels")
        return cls(freq)

    def search(self, texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        top = label_prior_predict(self.freq, len(texts), k)
        return top.scores.astype(np.float32), top.indices.astype(np.int64)


# ------------------------------------------------------------------------------------------------
# label names: the lexical retriever, and a method's predictor fused with name matches
# ------------------------------------------------------------------------------------------------
def _load_counts(path: Path, n_labels: int) -> np.ndarray:
    try:
        with np.load(path, allow_pickle=False) as z:
            counts = np.asarray(z["counts"], np.float64)
    except (OSError, ValueError, KeyError) as e:
        raise DataFormatError(path, None, f"not a label-count file ({str(e)[:120]})") from None
    if counts.shape != (n_labels,):
        raise DataFormatError(path, None, f"{counts.size} counts for {n_labels} labels")
    return counts


def _load_label_array(path: Path, key: str, n_labels: int, what: str) -> np.ndarray:
    """A per-label float array saved under ``key`` (a fusion's name precisions), checked finite and one per label."""
    try:
        with np.load(path, allow_pickle=False) as z:
            values = np.asarray(z[key], np.float64)
    except (OSError, ValueError, KeyError) as e:
        raise DataFormatError(path, None, f"not a {what} file ({str(e)[:120]})") from None
    if values.shape != (n_labels,) or not np.isfinite(values).all():
        raise DataFormatError(path, None, f"{values.size} {what} values for {n_labels} labels (or not finite)")
    return values


def _lexical_settings(section: dict[str, Any], where: Path) -> dict[str, Any]:
    mode, words = section.get("label_names"), section.get("max_words")
    cased = section.get("cased_names", False)   # packages written before the option matched case-blind
    if mode not in MODES or not isinstance(words, int) or words < 1 or not isinstance(cased, bool):
        raise DataFormatError(where, None, "not a label-name predictor description (label_names, max_words, cased_names)")
    return {"mode": mode, "max_words": words, "cased_names": cased}


class LabelNamePredictor(Predictor):
    """Labels whose names occur in the text (lemmatised, up to ``max_words`` words). ``ranking``: ``zero_shot``
    (longer, then less ambiguous matches first, the part of speech agreeing; no training data) or ``prior``
    (the label's training count first: the most frequent sense of each matched word)."""

    kind = "label_names"

    def __init__(self, matcher: Any, ranking: str, counts: np.ndarray | None) -> None:
        self.matcher, self.ranking, self.counts = matcher, ranking, counts

    @classmethod
    def build(cls, source: Path, out: Path, label_texts: list[str], options: dict[str, Any]) -> dict[str, Any]:
        """``source``: the name_match model folder (its training label counts for the prior ranking);
        ``options["config"]``: ``ranking`` and ``label_names``."""
        config = options.get("config") or {}
        ranking = config.get("ranking", "zero_shot")
        if ranking not in ("zero_shot", "prior"):
            raise ConfigError(f"label-name ranking must be zero_shot or prior (got {ranking!r})")
        settings = config.get("label_names") or {}
        names = parse_label_names(label_texts, settings.get("mode", "auto"))
        matcher = LabelNameMatcher(names, int(settings.get("max_words", 4)), label_texts,
                                   bool(settings.get("cased_names", True)))
        out.mkdir(parents=True, exist_ok=True)
        if ranking == "prior":  # only this ranking reads training labels
            _load_counts(source / "train_counts.npz", len(label_texts))
            _link_or_copy(source / "train_counts.npz", out / "train_counts.npz")
        return {"kind": cls.kind, "ranking": ranking, "label_names": names.mode, "max_words": matcher.max_words,
                "cased_names": matcher.cased_names,
                "names": int(len(matcher.by_name))}

    @classmethod
    def load(cls, root: Path, section: dict[str, Any], label_texts: list[str]) -> LabelNamePredictor:
        st = _lexical_settings(section, root)
        matcher = LabelNameMatcher(parse_label_names(label_texts, st["mode"]), st["max_words"], label_texts,
                                   st["cased_names"])
        ranking = section.get("ranking")
        counts = _load_counts(root / "train_counts.npz", len(label_texts)) if ranking == "prior" else None
        return cls(matcher, ranking, counts)

    def search(self, texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        D = np.full((len(texts), k), -np.inf, np.float32)
        I = np.full((len(texts), k), -1, np.int64)
        for r, text in enumerate(texts):
            found = self.matcher.match(text)
            if not found:
                continue
            if self.ranking == "prior":
                lids = np.fromiter(found, np.int64, len(found))
                sc = np.log1p(self.counts[lids]) + 1e-3 * np.array([found[l].words for l in lids])
            else:
                lids, sc = zero_shot_name_scores(found)
            order = np.lexsort((lids, -sc))[:k]
            I[r, : len(order)], D[r, : len(order)] = lids[order], sc[order]
        return D, I


class HybridPredictor(Predictor):
    """A method's predictor (``base/``) whose top-``base_k`` is merged with the labels named in the text and
    re-scored by fusion weights fit on the validation split (:mod:`xmc.lexical.hybrid`). An ensemble hybrid has
    several base predictors (``bases/<run>/``, section ``members``), each searched for its top-``base_k``, and one
    fusion over all their scores."""

    kind = "hybrid"

    def __init__(self, base: Predictor | dict[str, Predictor], ranker: Any, base_k: int) -> None:
        # one base predictor, or {member run: its predictor} in the ranker's member order
        self.bases = base if isinstance(base, dict) else {"": base}
        self.ranker, self.base_k = ranker, base_k

    @classmethod
    def build(cls, source: Path | dict[str, Path], out: Path, label_texts: list[str],
              options: dict[str, Any]) -> dict[str, Any]:
        """``source``: the base run's model package (``packages/<run>/``), or {member run: its package} for an
        ensemble; ``options["ranker"]``: a fitted :class:`xmc.lexical.hybrid.HybridRanker` (with those members).
        The base's predictor files are hard links of the base package's: one copy on disk, and a copied hybrid
        package still holds everything it predicts with."""
        ranker = options["ranker"]
        common = {"kind": cls.kind, "base_k": int(options["base_k"]), "fusion": "fusion",
                  "label_names": ranker.names.mode, "max_words": ranker.matcher.max_words,
                  "cased_names": ranker.matcher.cased_names}

        def copy_base(folder: Path, dest: Path) -> dict[str, Any]:   # the base's files; its section goes inline
            manifest = read_json_file(folder / "manifest.json", "a package manifest")
            section = manifest.get("predictor") if isinstance(manifest, dict) else None
            if not isinstance(section, dict):
                raise DataFormatError(folder / "manifest.json", None, "no predictor section")
            shutil.copytree(folder, dest, copy_function=_link_or_copy,
                            ignore=lambda d, names: [n for n in names if Path(d) == folder and n in PACKAGE_FILES])
            return section

        if isinstance(source, dict) and list(source) != list(ranker.members or ()):
            raise ValueError(f"the ranker fuses {ranker.members}, the sources are {list(source)}")
        ranker.save(out / "fusion")
        if isinstance(source, dict):
            return {**common, "members": [{"name": n, "base": copy_base(f, out / "bases" / n)} for n, f in source.items()]}
        return {**common, "base": copy_base(source, out / "base")}

    @classmethod
    def load(cls, root: Path, section: dict[str, Any], label_texts: list[str]) -> HybridPredictor:
        st = _lexical_settings(section, root)

        def load_base(where: Path, base_section: Any) -> Predictor:
            if not isinstance(base_section, dict) or base_section.get("kind") in (None, cls.kind):
                raise DataFormatError(root, None, "a hybrid predictor needs a base predictor section")
            return predictor_class(base_section["kind"], root).load(where, base_section, label_texts)

        members = section.get("members")
        if members is not None:   # an ensemble hybrid
            if not isinstance(members, list) or len(members) < 2 or not all(
                    isinstance(m, dict) and isinstance(m.get("name"), str) for m in members):
                raise DataFormatError(root, None, "an ensemble hybrid's members must be a list of {name, base}")
            names = [m["name"] for m in members]
            bases: Predictor | dict[str, Predictor] = {
                m["name"]: load_base(root / "bases" / m["name"], m.get("base")) for m in members}
        else:
            names = None
            bases = load_base(root / "base", section.get("base"))
        fusion = read_json_file(_inside(root, section, "fusion", "fusion") / "fusion.json", "fusion weights")
        try:
            weights = fusion_from_json(fusion, hybrid_features(names))
        except (KeyError, TypeError, ValueError) as e:
            raise DataFormatError(root / "fusion" / "fusion.json", None, f"not fusion weights ({str(e)[:120]})") from None
        counts = _load_counts(root / "fusion" / "train_counts.npz", len(label_texts))
        precision = _load_label_array(root / "fusion" / "name_precision.npz", "precision", len(label_texts),
                                      "name precision")
        bonus = fusion.get("first_bonus", 0.0)
        if not isinstance(bonus, (int, float)) or isinstance(bonus, bool) or not np.isfinite(bonus) or bonus < 0:
            raise DataFormatError(root / "fusion" / "fusion.json", None, f"first_bonus {bonus!r} is not a number >= 0")
        ranker = HybridRanker(label_texts, st["mode"], counts, weights, st["max_words"], st["cased_names"], names,
                              name_precision=precision, first_bonus=float(bonus))
        return cls(bases, ranker, _setting(section, "base_k", 100, root))

    def search(self, texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.ranker.rank_many(texts, [b.search(texts, self.base_k) for b in self.bases.values()], k)


PREDICTORS: dict[str, type[Predictor]] = {p.kind: p for p in (
    TfidfZeroShotPredictor, TfidfKNNPredictor, LabelPriorPredictor, LabelNamePredictor, HybridPredictor)}

__all__ = ["PREDICTORS", "HybridPredictor", "LabelNamePredictor", "LabelPriorPredictor", "TfidfKNNPredictor",
           "TfidfZeroShotPredictor", "build_tfidf_labels", "load_tfidf_labels"]
