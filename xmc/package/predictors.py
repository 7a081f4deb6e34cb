"""The dense predictors of :mod:`xmc.package.predictor`'s interface: ``dense`` (an encoder and an ANN index over label
vectors: DEXML, the MNRL peer, MACLR, RAMEN, the zero-shot encoder; ASTRA, whose label vectors are its classifiers
and whose queries get a constant 1 appended for the bias column) and ``unidec`` (UniDEC's encoder and two heads; its
``space``, ``concat``, ``de`` or ``clf``, picks the index)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmc.ann import ANNIndex
from xmc.config.schema import IndexConfig, filled
from xmc.encoders.build import load_encoder
from xmc.errors import ConfigError, DataFormatError
from xmc.models.astra import is_astra_model, load_astra
from xmc.models.device import on_inference_device
from xmc.models.unidec import SPACES, UniDECInference
from xmc.package.predictor import Predictor, _copy_tree, _inside, _search, _setting



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
        with torch.inference_mode():  # no autograd graph at prediction time
            q = self.encoder.encode(texts, "query", self.batch_size, False)
        if self.append_constant is not None:
            q = np.hstack([q, np.full((len(q), 1), self.append_constant, np.float32)])
        return np.ascontiguousarray(q, dtype=np.float32)

    def search(self, texts: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return _search(self.index, self.query_vectors(texts), k)


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

__all__ = ["PREDICTORS", "DensePredictor", "UniDECPredictor"]
