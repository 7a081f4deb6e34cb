"""What a model package predicts with: one small class per kind of scorer, all with the same two calls.

A predictor is built once from a trained model (``build``: writes its files into the package folder and
returns its manifest section) and loaded from a package (``load``); ``search(texts, k)`` returns the
(scores, label ids) of the top-k labels, ids ``-1`` where fewer than k labels exist. The package layer
(:mod:`xmc.package.package`) adds label uids and texts, input checks and batching.

Kinds:
- ``dense``: an encoder and an ANN index over label vectors (DEXML, the MNRL peer, MACLR, RAMEN, the
  zero-shot encoder; ASTRA, whose label vectors are its classifiers and whose queries get a constant 1
  appended for the bias column).
- ``unidec``: UniDEC's encoder and two heads; its ``space`` (``concat``, ``de`` or ``clf``) picks the index.
- ``tfidf_zeroshot`` / ``tfidf_knn``: the TF-IDF vectoriser (plain data, no pickle) and the label or
  training-instance matrices.
- ``label_prior``: the training label frequencies.
"""

from __future__ import annotations

import logging
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import faiss
import numpy as np
import scipy.sparse as sp
import torch

from xmc.ann import ANNIndex
from xmc.ann.shortlist import SMALL_FULL_SEARCH, TfidfShortlist, full_search, rerank
from xmc.baselines.tfidf import _vectorizer, knn_label_voting, label_prior_predict, tfidf_zero_shot
from xmc.config.schema import IndexConfig, TfidfKnnConfig, TfidfZeroShotConfig, filled
from xmc.encoders.build import load_encoder
from xmc.errors import ConfigError, DataFormatError
from xmc.io import read_json_file, save_csr
from xmc.lexical import LabelNameMatcher, parse_label_names, zero_shot_name_scores
from xmc.lexical.names import MODES
from xmc.lexical.hybrid import HybridRanker, fusion_from_json, hybrid_features
from xmc.models.astra import is_astra_model, load_astra
from xmc.models.device import on_inference_device
from xmc.models.unidec import SPACES, UniDECInference, is_unidec_model
from xmc.sparse_topk import prune_postings, transposed_operand

log = logging.getLogger(__name__)


def _link_or_copy(s: str | Path, d: str | Path) -> None:
    """A hard link where the file system allows (the weights are read-only once trained, and DVC stores one
    copy of identical files anyway), else a copy."""
    try:
        Path(d).hardlink_to(s)
    except OSError:
        shutil.copy2(s, d)


# what a package folder holds beside its predictor's files (xmc.package.package)
PACKAGE_FILES = ("manifest.json", "labels.jsonl", "README.md")


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy a model folder into a package folder: hard links where possible (one copy of the weights on disk)."""
    shutil.copytree(src, dst, copy_function=_link_or_copy,
                    ignore=shutil.ignore_patterns("train_summary.json", "model.json", "__pycache__", "README.md"))


SMALL_BATCH = 4  # queries searched on one faiss thread (measured: bench/serve_latency.py)

# the bounds of a manifest's numbers: a package is data, and a negative batch or a billion candidates per text
# (garbage predictions, or memory until the kernel kills the process) is refused when it loads
MANIFEST_BOUNDS = {"encode_batch_size": (1, 65536), "n_neighbors": (1, 100_000), "shortlist_k": (1, 1_000_000),
                   "base_k": (1, 10_000)}


def _setting(section: dict[str, Any], key: str, default: int, where: Path) -> int:
    """An integer of the predictor section within :data:`MANIFEST_BOUNDS`."""
    value = section.get(key, default)
    lo, hi = MANIFEST_BOUNDS[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise DataFormatError(where / "manifest.json", None, f"predictor {key} {repr(value)[:40]} is not an integer "
                              f"in [{lo}, {hi}]: a corrupt or hand-edited package")
    return value


def _inside(root: Path, section: dict[str, Any], key: str, default: str) -> Path:
    """The package's sub-folder named by ``section[key]``: a relative path that stays in the package."""
    rel = section.get(key, default)
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise DataFormatError(root / "manifest.json", None, f"predictor {key} {str(rel)[:80]!r} is not a folder "
                              "inside the package")
    return root / rel


def _search(index: Any, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact search of a few queries is fastest on one thread (waking OpenMP threads costs more than they
    save: 2.5 ms vs 3.6 ms per query over 25,819 x 769 on 2 cores); batches use every core."""
    if len(q) > SMALL_BATCH or index.on_gpu:
        return index.search(q, k)
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        return index.search(q, k)
    finally:
        faiss.omp_set_num_threads(before)


class Predictor(ABC):
    """Top-k label search of one model kind."""

    kind: ClassVar[str]

    @classmethod
    @abstractmethod
    def build(cls, source: Path, out: Path, label_texts: list[str], options: dict[str, Any]) -> dict[str, Any]:
        """Write this predictor's files for the model at ``source`` into ``out``; return its manifest section."""

    @classmethod
    @abstractmethod
    def load(cls, root: Path, section: dict[str, Any], label_texts: list[str]) -> Predictor:
        """The predictor of the package at ``root`` (``section`` = the manifest's ``predictor``)."""

    @abstractmethod
    def search(self, texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores (n, k) float32, label ids (n, k) int64) for ``texts``."""

    def warm_up(self) -> None:
        """Run one tiny prediction so the first request does not pay for lazy initialisation."""
        self.search(["warm up"], 1)


# ------------------------------------------------------------------------------------------------
# dense: encoder + ANN index (dual encoders, ASTRA)
# ------------------------------------------------------------------------------------------------
def _index_settings(options: dict[str, Any]) -> dict[str, Any]:
    """params ``index`` (the ANN kind and knobs, the encoding batch size), schema defaults filled."""
    return filled(IndexConfig, options.get("index"), "index")


def _index_options(options: dict[str, Any]) -> dict[str, Any]:
    icfg = _index_settings(options)
    return {k: icfg[k] for k in ("kind", "hnsw_m", "ef_search", "nprobe", "auto_exact_max", "storage",
                                 "recall_target", "calibration_sample", "equalize_norms", "pq_fallback")}


def _calibration_texts(options: dict[str, Any]) -> list[str] | None:
    """The training queries an approximate index calibrates its search width on (``predictor_options``), or
    None (a package built outside the pipeline keeps the fixed width)."""
    texts = options.get("calibration_texts")
    return list(texts) if texts else None


def _label_vector_file(out: Path, n: int, dim: int, options: dict[str, Any]) -> np.ndarray | None:
    """Where a float16 index is built over many labels, their vectors are encoded into a float16 memory-mapped
    file (deleted once indexed) instead of an n x d float32 array in memory."""
    icfg = _index_settings(options)
    fp16 = icfg["storage"] == "float16" or (icfg["storage"] == "auto" and icfg["kind"] != "exact"
                                              and n > icfg["auto_exact_max"])
    if not fp16:
        return None
    return np.lib.format.open_memmap(out / "label_vectors.f16.npy", mode="w+", dtype=np.float16, shape=(n, dim))


def _untouched(options: dict[str, Any]) -> dict[str, Any]:
    """Option / section ``untouched`` (a bag-of-words encoder's buckets training never moved: ``zero``, the default,
    or ``init``, the rows rebuilt from the seed): the load keyword, and what the section records (only ``init``)."""
    value = options.get("untouched") or "zero"
    if value not in ("zero", "init"):
        raise ConfigError(f"predictor option untouched must be zero or init (got {value!r})")
    return {"untouched": value}


class DensePredictor(Predictor):
    """Query vector = encoder(text) (⊕ a constant for a bias column); labels = the index's vectors."""

    kind = "dense"

    def __init__(self, encoder: Any, index: Any, append_constant: float | None, batch_size: int) -> None:
        self.encoder, self.index, self.append_constant, self.batch_size = encoder, index, append_constant, batch_size

    @classmethod
    def build(cls, source: Path, out: Path, label_texts: list[str], options: dict[str, Any]) -> dict[str, Any]:
        bs = _index_settings(options)["encode_batch_size"]
        untouched = _untouched(options)
        if is_astra_model(source):   # ASTRA: the label vectors are its classifiers [w_l, b_l]
            encoder, vectors = load_astra(source, len(label_texts), **untouched)
            encoder = on_inference_device(encoder)
            _copy_tree(source / "encoder", out / "encoder")
            append: float | None = 1.0
        else:
            encoder = on_inference_device(load_encoder(source, **untouched))
            spill = _label_vector_file(out, len(label_texts), encoder.dim, options)
            vectors = encoder.encode(label_texts, "label", bs, True, out=spill)
            _copy_tree(source, out / "encoder")
            append = None
        index = ANNIndex(**_index_options(options))
        calib = _calibration_texts(options)
        queries = None
        if calib and index.calibrates(len(vectors)):
            encoder.eval()
            with torch.inference_mode():
                queries = cls(encoder, index, append, bs).query_vectors(calib)
        index.build(vectors, queries)
        index.save(out / "index")
        dim = int(vectors.shape[1])
        if isinstance(vectors, np.memmap):
            path = Path(vectors.filename)
            del vectors
            path.unlink()
        return {"kind": cls.kind, "encoder": "encoder", "index": "index", "append_constant": append,
                "dim": dim, "encode_batch_size": bs, **(untouched if untouched["untouched"] != "zero" else {})}

    @classmethod
    def load(cls, root: Path, section: dict[str, Any], label_texts: list[str]) -> DensePredictor:
        encoder = on_inference_device(load_encoder(_inside(root, section, "encoder", "encoder"),
                                                   **_untouched(section)))
        encoder.eval()
        index = ANNIndex.load(_inside(root, section, "index", "index"), use_gpu=section.get("use_gpu", "auto"))
        if index.ntotal != len(label_texts):
            raise DataFormatError(root / "index", None, f"holds {index.ntotal} label vectors but the package has "
                                  f"{len(label_texts)} labels (a package assembled from different runs)")
        append = section.get("append_constant")
        return cls(encoder, index, None if append is None else float(append),
                   _setting(section, "encode_batch_size", 256, root))

    def query_vectors(self, texts: list[str]) -> np.ndarray:
        q = self.encoder.encode(texts, "query", self.batch_size, False)
        if self.append_constant is not None:
            q = np.hstack([q, np.full((len(q), 1), self.append_constant, np.float32)])
        return np.ascontiguousarray(q, dtype=np.float32)

    def search(self, texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():  # no autograd graph at prediction time
            q = self.query_vectors(texts)
        return _search(self.index, q, k)


# ------------------------------------------------------------------------------------------------
# UniDEC: encoder + DE head + classifier head, one index per package for its space
# ------------------------------------------------------------------------------------------------
class UniDECPredictor(Predictor):
    kind = "unidec"

    def __init__(self, model: Any, index: Any, space: str, batch_size: int) -> None:
        self.model, self.index, self.space, self.batch_size = model, index, space, batch_size

    @classmethod
    def build(cls, source: Path, out: Path, label_texts: list[str], options: dict[str, Any]) -> dict[str, Any]:
        space = options.get("space") or "concat"
        if space not in SPACES:
            raise ConfigError(f"package space must be one of {', '.join(SPACES)} (got {space!r})")
        bs = _index_settings(options)["encode_batch_size"]
        untouched = _untouched(options)
        model = on_inference_device(UniDECInference.load(source, label_texts, space=space, **untouched))
        vectors = model.label_space_vectors(space, bs, progress=True)
        calib = _calibration_texts(options)
        index = ANNIndex(**_index_options(options))
        queries = cls(model, None, space, bs).query_vectors(calib) if calib and index.calibrates(len(vectors)) else None
        index.build(vectors, queries)
        _copy_tree(source, out / "model")
        index.save(out / "index")
        return {"kind": cls.kind, "model": "model", "index": "index", "space": space, "dim": int(vectors.shape[1]),
                "encode_batch_size": bs, **(untouched if untouched["untouched"] != "zero" else {})}

    @classmethod
    def load(cls, root: Path, section: dict[str, Any], label_texts: list[str]) -> UniDECPredictor:
        space = section.get("space", "concat")
        model = on_inference_device(UniDECInference.load(_inside(root, section, "model", "model"), label_texts,
                                                         space=space, **_untouched(section)))
        index = ANNIndex.load(_inside(root, section, "index", "index"), use_gpu=section.get("use_gpu", "auto"))
        if index.ntotal != len(label_texts):
            raise DataFormatError(root / "index", None, f"holds {index.ntotal} label vectors but the package has "
                                  f"{len(label_texts)} labels")
        return cls(model, index, space, _setting(section, "encode_batch_size", 256, root))

    def query_vectors(self, texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            q = self.model.query_space_vectors(texts, self.space, self.batch_size, progress=False)
        return np.ascontiguousarray(q, dtype=np.float32)

    def search(self, texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return _search(self.index, self.query_vectors(texts), k)


# ------------------------------------------------------------------------------------------------
# TF-IDF baselines and the label prior
# ------------------------------------------------------------------------------------------------
def _load_vectorizer(d: Path) -> Any:
    params = read_json_file(d / "settings.json", "TF-IDF settings")
    vocab = read_json_file(d / "vocabulary.json", "a TF-IDF vocabulary")
    if not isinstance(vocab, dict) or not isinstance(params, dict):
        raise DataFormatError(d / "vocabulary.json", None, "not a TF-IDF vocabulary (a JSON object)")
    vec = _vectorizer(params, vocabulary=vocab)
    with np.load(d / "idf.npz", allow_pickle=False) as z:
        vec.idf_ = z["idf"]
    if len(vec.idf_) != len(vocab):
        raise DataFormatError(d / "idf.npz", None, f"{len(vec.idf_)} idf values for {len(vocab)} terms")
    return vec


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


def _build_tfidf_labels(tfidf: Path, out: Path, n_labels: int, max_per_term: int) -> None:
    """The label side of a TF-IDF predictor into ``out``: the vectoriser and the label rows, postings capped."""
    _copy_vectorizer(tfidf, out)
    X = _load_csr(tfidf / "X_lbl.npz")
    if X.shape[0] != n_labels:
        raise DataFormatError(tfidf / "X_lbl.npz", None, f"{X.shape[0]} label rows for {n_labels} labels")
    _save_postings(tfidf / "X_lbl.npz", out / "X_lbl.npz", X, max_per_term)


def _load_tfidf_labels(d: Path, n_labels: int) -> tuple[Any, sp.csr_matrix]:
    """(vectoriser, label rows) as :func:`_build_tfidf_labels` wrote them."""
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
        _build_tfidf_labels(source, out / "tfidf", len(label_texts), cap)
        return {"kind": cls.kind, "tfidf": "tfidf", "max_postings_per_term": cap}

    @classmethod
    def load(cls, root: Path, section: dict[str, Any], label_texts: list[str]) -> TfidfZeroShotPredictor:
        return cls(*_load_tfidf_labels(_inside(root, section, "tfidf", "tfidf"), len(label_texts)))

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
        _build_tfidf_labels(Path(options["tfidf_dir"]), out / "tfidf", len(label_texts), cap)
        return {"kind": cls.kind, "base": base, "tfidf": "tfidf", "shortlist_k": int(options["shortlist_k"]),
                "max_postings_per_term": cap}

    @classmethod
    def load(cls, root: Path, section: dict[str, Any], label_texts: list[str]) -> ShortlistPredictor:
        base_section = section.get("base")
        if not isinstance(base_section, dict) or base_section.get("kind") not in ("dense", "unidec"):
            raise DataFormatError(root, None, "a shortlist predictor needs a dense or unidec base section")
        base = predictor_class(base_section["kind"], root).load(root / "base", base_section, label_texts)
        vectorizer, X = _load_tfidf_labels(_inside(root, section, "tfidf", "tfidf"), len(label_texts))
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
        cand = self.shortlist.candidates(texts)
        with torch.inference_mode():
            q = self.query_vectors(texts)
        return self.rank(q, cand, k)

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


PREDICTORS: dict[str, type[Predictor]] = {p.kind: p for p in (DensePredictor, UniDECPredictor, TfidfZeroShotPredictor,
                                                                TfidfKNNPredictor, LabelPriorPredictor,
                                                                LabelNamePredictor, ShortlistPredictor,
                                                                HybridPredictor)}


def kind_of_source(source: Path, name: str) -> str:
    """The predictor kind for a trained model folder (or a baseline's name)."""
    info = source / "model.json"
    if info.is_file():
        kind = (read_json_file(info, "a trained model's description") or {}).get("predictor")
        if isinstance(kind, str):
            return kind
    if name in ("label_prior", "tfidf_zeroshot", "tfidf_knn"):
        return name
    if is_unidec_model(source):
        return "unidec"
    if is_astra_model(source) or (source / "xmc_encoder.json").exists():
        return "dense"
    raise ConfigError(f"{source}: not a trained model folder (no astra.json, unidec.json or xmc_encoder.json)")


def predictor_class(kind: Any, where: Path) -> type[Predictor]:
    if kind not in PREDICTORS:
        raise DataFormatError(where, None, f"unknown predictor kind {kind!r} (expected one of {', '.join(PREDICTORS)})")
    return PREDICTORS[kind]


__all__ = ["PREDICTORS", "DensePredictor", "HybridPredictor", "LabelNamePredictor", "LabelPriorPredictor", "Predictor",
           "ShortlistPredictor", "TfidfKNNPredictor",
           "TfidfZeroShotPredictor", "UniDECPredictor", "kind_of_source", "predictor_class"]
