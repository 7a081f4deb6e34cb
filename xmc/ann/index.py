"""One small interface over faiss: build, search, save, load.

``kind``: ``exact`` (IndexFlatIP, the default: up to a few hundred thousand labels it is fast
and has recall 1), ``hnsw`` (IndexHNSWFlat, inner product) or ``ivf`` (IndexIVFFlat).
GPU faiss is used for exact and IVF when it is installed and a GPU is present.

``storage``: ``float32`` or ``float16`` (faiss' fp16 scalar quantizer: half the memory and package size; its
effect on recall@100 is measured by ``bench/index_storage.py``), or ``auto`` (float16 for the approximate
index that ``auto`` chooses above ``auto_exact_max`` labels, float32 otherwise). Vectors are added in blocks
converted to float32 one at a time, so a float16 or memory-mapped array is never copied whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from xmc.errors import ConfigError
from xmc.io import atomic_dir


def gpu_available() -> bool:
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class ANNIndex:
    def __init__(self, kind: str = "exact", hnsw_m: int = 32, ef_construction: int = 200, ef_search: int = 128,
                 nlist: int | None = None, nprobe: int = 32, use_gpu: str | bool = "auto", threads: int | None = None,
                 auto_exact_max: int = 200_000, storage: str = "float32") -> None:
        if kind not in ("exact", "hnsw", "ivf", "auto"):
            raise ConfigError(f"unknown index kind {kind!r} (expected exact, hnsw, ivf or auto)")
        if storage not in ("float32", "float16", "auto"):
            raise ConfigError(f"unknown index storage {storage!r} (expected float32, float16 or auto)")
        self.storage = storage
        # auto: chosen at build from the number of vectors: exact up to auto_exact_max, IVF above. IVF, not HNSW:
        # at 10^5 clustered vectors (d 256) IVF (nprobe 32) built in 10 s against HNSW's 92 s (M 32,
        # efConstruction 200) with higher recall@100 (0.86 vs 0.85) and faster search; at 10^6 an HNSW build took
        # over 20 minutes, and training re-mines with a new index every refresh (bench/index_choice.json)
        self.kind, self.hnsw_m, self.ef_construction, self.ef_search = kind, hnsw_m, ef_construction, ef_search
        self.auto_exact_max = int(auto_exact_max)
        self.nlist, self.nprobe, self.use_gpu, self.threads = nlist, nprobe, use_gpu, threads
        self.index: Any = None
        self.on_gpu = False

    @classmethod
    def from_params(cls, icfg: dict[str, Any] | None) -> ANNIndex:
        """An (unbuilt) index from the params ``index`` section (kind, hnsw_m, ef_search, nprobe; partial: the
        schema's defaults fill the rest)."""
        from xmc.config.schema import IndexConfig, filled

        icfg = filled(IndexConfig, icfg, "index")
        return cls(kind=icfg["kind"], hnsw_m=icfg["hnsw_m"], ef_search=icfg["ef_search"], nprobe=icfg["nprobe"],
                   auto_exact_max=icfg["auto_exact_max"], storage=icfg["storage"])

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "hnsw_m": self.hnsw_m, "ef_construction": self.ef_construction,
                "ef_search": self.ef_search, "nlist": self.nlist, "nprobe": self.nprobe,
                "auto_exact_max": self.auto_exact_max, "storage": self.storage}

    def build(self, vectors: np.ndarray, block: int = 65536) -> ANNIndex:
        """Index ``vectors`` (n x d, any float dtype, in memory or memory-mapped), added ``block`` rows at a time."""
        import faiss

        if self.threads:
            faiss.omp_set_num_threads(self.threads)
        if vectors.ndim != 2:
            raise ValueError(f"expected an n x d array of vectors, got shape {vectors.shape}")
        n, d = vectors.shape
        auto_kind = self.kind == "auto"
        if auto_kind:
            self.kind = "exact" if n <= self.auto_exact_max else "ivf"
        if self.storage == "auto":
            self.storage = "float16" if self.kind != "exact" and n > self.auto_exact_max else "float32"
        want_gpu = self.use_gpu is True or (self.use_gpu == "auto" and gpu_available())
        if want_gpu and self.kind == "exact" and self.storage == "float16":
            self.storage = "float32"   # faiss moves no flat scalar-quantizer index to a GPU
        fp16 = self.storage == "float16"
        metric = faiss.METRIC_INNER_PRODUCT
        if self.kind == "exact":
            index = (faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_fp16, metric) if fp16
                     else faiss.IndexFlatIP(d))
        elif self.kind == "hnsw":
            index = (faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_fp16, self.hnsw_m, metric) if fp16
                     else faiss.IndexHNSWFlat(d, self.hnsw_m, metric))
            index.hnsw.efConstruction = self.ef_construction
        else:
            nlist = self.nlist or max(1, int(4 * np.sqrt(n)))
            self._quantizer = faiss.IndexFlatIP(d)   # kept alive: the IVF index refers to it
            index = (faiss.IndexIVFScalarQuantizer(self._quantizer, d, nlist, faiss.ScalarQuantizer.QT_fp16, metric)
                     if fp16 else faiss.IndexIVFFlat(self._quantizer, d, nlist, metric))
        if want_gpu and self.kind != "hnsw" and gpu_available():
            self._res = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(self._res, 0, index)
            self.on_gpu = True
        if not index.is_trained:   # IVF centroids (and a scalar quantizer's ranges) from a sample of the rows
            rows = np.sort(np.random.default_rng(0).choice(n, min(n, 256 * 1024), replace=False)) if n else np.zeros(0, int)
            index.train(np.ascontiguousarray(vectors[rows], dtype=np.float32))
        for s in range(0, n, block):
            index.add(np.ascontiguousarray(vectors[s : s + block], dtype=np.float32))
        self.index = index
        self._apply_search_params()
        return self

    def _apply_search_params(self) -> None:
        import faiss

        if self.kind == "hnsw":
            self.index.hnsw.efSearch = max(self.ef_search, 1)
        elif self.kind == "ivf":
            if self.on_gpu:
                faiss.GpuParameterSpace().set_index_parameter(self.index, "nprobe", self.nprobe)
            else:
                self.index.nprobe = self.nprobe

    def vectors(self) -> np.ndarray:
        """The indexed vectors (flat storage of every kind here; IVF gets its direct map made first)."""
        import faiss

        index = faiss.index_gpu_to_cpu(self.index) if self.on_gpu else self.index
        if self.kind == "ivf":
            index.make_direct_map()
        return index.reconstruct_n(0, index.ntotal)

    def recall_against_exact(self, queries: np.ndarray, ids: np.ndarray, k: int) -> float:
        """Mean |approximate top-k ∩ exact top-k| / k for these queries (``ids``: this index's answers)."""
        exact = ANNIndex(kind="exact", use_gpu=False).build(self.vectors())
        _, truth = exact.search(queries, k)
        hits = [len(set(a[:k][a[:k] >= 0]) & set(t[t >= 0])) / max(1, int((t >= 0).sum())) for a, t in zip(ids, truth)]
        return float(np.mean(hits)) if hits else 1.0

    @property
    def ntotal(self) -> int:
        return 0 if self.index is None else int(self.index.ntotal)

    def search(self, queries: np.ndarray, k: int, batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids), each (n, k); ids are -1 where fewer than k results exist."""
        if self.index is None:
            raise RuntimeError("index not built")
        q = np.ascontiguousarray(queries, dtype=np.float32)
        k_eff = min(k, self.ntotal)
        if self.kind == "hnsw":
            self.index.hnsw.efSearch = max(self.ef_search, k_eff)
        out_s, out_i = [], []
        for s in range(0, len(q), batch_size):
            D, I = self.index.search(q[s : s + batch_size], k_eff)
            out_s.append(D)
            out_i.append(I)
        D = np.concatenate(out_s) if out_s else np.zeros((0, k_eff), np.float32)
        I = np.concatenate(out_i) if out_i else np.zeros((0, k_eff), np.int64)
        if k_eff < k:
            D = np.pad(D, ((0, 0), (0, k - k_eff)), constant_values=-np.inf)
            I = np.pad(I, ((0, 0), (0, k - k_eff)), constant_values=-1)
        return D.astype(np.float32), I.astype(np.int64)

    def save(self, path: str | Path) -> None:
        import faiss

        index = faiss.index_gpu_to_cpu(self.index) if self.on_gpu else self.index
        with atomic_dir(path) as tmp:
            faiss.write_index(index, str(tmp / "index.faiss"))
            (tmp / "index.json").write_text(json.dumps(self.config(), indent=2))

    @classmethod
    def load(cls, path: str | Path, use_gpu: str | bool = "auto") -> ANNIndex:
        import faiss

        path = Path(path)
        if not (path / "index.faiss").exists():
            raise ConfigError(f"{path / 'index.faiss'}: index not found")
        from xmc.errors import DataFormatError

        try:
            settings = json.loads((path / "index.json").read_text(encoding="utf-8"))
            obj = cls(**settings, use_gpu=use_gpu)
        except (OSError, ValueError, TypeError) as e:
            raise DataFormatError(path / "index.json", None, f"not an index description ({str(e)[:120]})") from None
        try:
            index = faiss.read_index(str(path / "index.faiss"))
        except RuntimeError as e:  # faiss reports a truncated or foreign file as a RuntimeError
            first = str(e).strip().splitlines()[-1][:160] if str(e).strip() else "unreadable"
            raise DataFormatError(path / "index.faiss", None, f"not a faiss index ({first}); rerun the index stage") from None
        if (use_gpu is True or (use_gpu == "auto" and gpu_available())) and obj.kind != "hnsw":
            obj._res = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(obj._res, 0, index)
            obj.on_gpu = True
        obj.index = index
        obj._apply_search_params()
        return obj
