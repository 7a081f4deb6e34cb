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
- ``label_names``, ``shortlist``, ``hybrid``: the label-name retriever, a dense predictor ranking a TF-IDF
  shortlist, and a predictor fused with name matches.

The last six live in :mod:`xmc.package.lexical_predictors`, imported only when a package of theirs loads.
"""

from __future__ import annotations

import importlib
import logging
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import faiss
import numpy as np
import torch

from xmc.ann import ANNIndex
from xmc.config.schema import IndexConfig, filled
from xmc.encoders.build import load_encoder
from xmc.errors import ConfigError, DataFormatError
from xmc.io import read_json_file
from xmc.models.astra import is_astra_model, load_astra
from xmc.models.device import on_inference_device
from xmc.models.unidec import SPACES, UniDECInference, is_unidec_model

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


PREDICTORS: dict[str, type[Predictor]] = {p.kind: p for p in (DensePredictor, UniDECPredictor)}
# kinds whose module is imported only when a package of that kind loads: their TF-IDF vectoriser and fusion
# trees come with scikit-learn (1.2 s of imports), which a dense or UniDEC package never needs
ELSEWHERE = {kind: "xmc.package.lexical_predictors" for kind in ("tfidf_zeroshot", "tfidf_knn", "label_prior",
                                                                  "label_names", "shortlist", "hybrid")}
PREDICTOR_KINDS = (*PREDICTORS, *ELSEWHERE)


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
    """The predictor class of ``kind`` (a package manifest's ``predictor.kind``; ``where`` names the package)."""
    if kind in PREDICTORS:
        return PREDICTORS[kind]
    if isinstance(kind, str) and kind in ELSEWHERE:
        return importlib.import_module(ELSEWHERE[kind]).LEXICAL_PREDICTORS[kind]
    raise DataFormatError(where, None, f"unknown predictor kind {kind!r} (expected one of {', '.join(PREDICTOR_KINDS)})")


__all__ = ["ELSEWHERE", "PREDICTORS", "PREDICTOR_KINDS", "DensePredictor", "Predictor", "UniDECPredictor",
           "kind_of_source", "predictor_class"]
