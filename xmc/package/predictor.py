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

This module holds the interface and the kinds' registry, and imports no torch: each kind's class is imported from its
module (:data:`PREDICTOR_MODULES`) when a package of that kind is built or loaded, so a TF-IDF, label-prior or
label-name package (and a hybrid of one) predicts without loading torch or the encoders.
"""

from __future__ import annotations

import importlib
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import faiss
import numpy as np

from xmc.errors import ConfigError, DataFormatError
from xmc.io import read_json_file
from xmc.models.layout import is_astra_model, is_unidec_model



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


# kind -> the module holding its class (each module's PREDICTORS maps its kinds to their classes)
PREDICTOR_MODULES = {
    "dense": "xmc.package.predictors", "unidec": "xmc.package.predictors",
    **{kind: "xmc.package.lexical_predictors"
       for kind in ("tfidf_zeroshot", "tfidf_knn", "label_prior", "label_names", "hybrid")},
    "shortlist": "xmc.package.shortlist_predictor",
}
PREDICTOR_KINDS = tuple(PREDICTOR_MODULES)


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
    if isinstance(kind, str) and kind in PREDICTOR_MODULES:
        return importlib.import_module(PREDICTOR_MODULES[kind]).PREDICTORS[kind]
    raise DataFormatError(where, None, f"unknown predictor kind {kind!r} (expected one of {', '.join(PREDICTOR_KINDS)})")


__all__ = ["MANIFEST_BOUNDS", "PACKAGE_FILES", "PREDICTOR_KINDS", "PREDICTOR_MODULES", "Predictor", "kind_of_source",
           "predictor_class"]
