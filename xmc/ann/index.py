"""One small interface over faiss: build, search, save, load.

``kind``: ``exact`` (IndexFlatIP, the default: up to a few hundred thousand labels it is fast
and has recall 1), ``hnsw`` (IndexHNSWFlat, inner product), ``ivf`` (IndexIVFFlat) or ``pq`` (every vector scanned
as a 4-bit product-quantised code, two dimensions per code, faiss' PQ fast-scan; the best ``k_factor`` × k
candidates re-ranked by their exact inner products: a scan that is cheaper than brute force and needs no
neighbourhood structure in the vectors).
GPU faiss is used for exact and IVF when it is installed and a GPU is present.

``storage``: ``float32`` or ``float16`` (faiss' fp16 scalar quantizer: half the memory and package size; its
effect on recall@100 is measured by ``bench/index_storage.py``), or ``auto`` (float16 for the approximate
index that ``auto`` chooses above ``auto_exact_max`` labels, float32 otherwise). Vectors are added in blocks
converted to float32 one at a time, so a float16 or memory-mapped array is never copied whole.

``recall_target``: an approximate index built with a sample of the queries it will serve (``build(vectors,
queries)``) picks its search width (IVF ``nprobe``, HNSW ``efSearch``) as the smallest on a doubling ladder whose
recall@k against exact search on that sample reaches the target, instead of a fixed width whose recall depends on
how the vectors happen to cluster (at 10^6 one-epoch synthetic label vectors nprobe 32 gave 0.08-0.50). What it
chose and measured is kept in ``calibration`` and saved with the index.

``equalize_norms``: an approximate index over vectors whose norms differ (classifier rows: ASTRA, UniDEC's
classifier space) appends to each vector the coordinate sqrt(M² − ‖v‖²), M the largest norm, and a 0 to each
query, so every indexed vector has norm M and no inner product changes (the MIPS-to-nearest-neighbour reduction
of Bachrach et al., RecSys 2014). IVF clusters and HNSW graphs over vectors of unequal norm are dominated by the
long vectors; at 10^6 ASTRA classifier rows recall@100 went from 0.286 to 0.647 at nprobe 128 of 4,000 lists.
Vectors whose norms already agree (normalised encoders) are left as they are. Off by default: on the 10^5
validation split (``bench/equalize_norms.json``) it reached the recall target with half the lists but landed
nearer the target, a tie in speed at equal recall that cost 0.35 P@1 against the plain index at the same target.

``pq_fallback``: where the calibrated IVF/HNSW width searches no faster than brute force (vectors without
clusters, e.g. a barely trained encoder), a ``pq`` index is built and its ``k_factor`` calibrated to the same
target before the index falls back to exact search. At 10^6 one-epoch DEXML-BoW label vectors (d 256) IVF reached
recall@100 0.768 at 1,024 of 4,000 lists in 7.2 s per 1,000 queries against 9.8 s for brute force, and PQ fast-scan
with exact re-ranking 0.907 / 0.979 at k_factor 4 / 10 in 4.4 / 4.6 s, built in 6 s.

The IVF probe: above ``PROBE_MIN_VECTORS`` an IVF index with a recall target and a fallback adds a tenth of the
vectors to a copy of its trained (empty) lists and calibrates that first. Where the width the target needs is
predicted no faster than brute force, the full index is neither filled nor calibrated and the fallback is built
at once; ``calibration["before"]`` keeps the prediction (``estimated``, ``probe``). On the 10^6 DEXML-BoW vectors the
sample's recall@10 at nprobe 64 / 512 / 1,024 / 2,048 was 0.403 / 0.640 / 0.776 / 0.921 against the full index's
recall@100 of 0.416 / 0.639 / 0.773 / 0.918, and the three prediction indexes that fell back were built 1.42-1.67x
faster (``bench/ivf_probe.json``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import faiss
import numpy as np

from xmc.config.schema import IndexConfig, filled
from xmc.errors import ConfigError, DataFormatError
from xmc.io import atomic_dir

log = logging.getLogger(__name__)


# float16 (scalar-quantizer) storage pads d with zero columns to a multiple of this, faiss' widest SIMD width
FP16_D_MULTIPLE = 16
# kinds with a search width that calibrate() sets to the recall target
CALIBRATED_KINDS = ("ivf", "hnsw", "pq")
# where the calibrated width and brute force are within 2x of each other, each is timed this many times
# (alternating) before one falls back to the other: the fastest of each is compared
TIMING_ROUNDS = 3
# an IVF build over at least this many vectors first probes its trained partition with a sample of them (below)
PROBE_MIN_VECTORS = 100_000
# the probe's share of the vectors: its exact top-(k x share) has the rank quantiles of the full top-k
PROBE_SHARE = 0.1
# the probe times its width on this many of the calibration queries (its recall uses all of them)
PROBE_TIMING_QUERIES = 300


def exact_top_ids(queries: np.ndarray, vectors: np.ndarray, k: int, block: int = 65536) -> np.ndarray:
    """Exact top-k ids by inner product (m x k, best first, -1 pads), reading ``vectors`` ``block`` rows at a time
    (float16 or memory-mapped arrays are converted a block at a time, never copied whole): faiss' brute-force
    search per block, the blocks' top-k merged."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    m = len(q)
    best_s = np.full((m, 0), -np.inf, np.float32)
    best_i = np.full((m, 0), -1, np.int64)
    for s in range(0, len(vectors), block):
        xb = np.ascontiguousarray(vectors[s : s + block], dtype=np.float32)
        D, ids = faiss.knn(q, xb, min(k, len(xb)), metric=faiss.METRIC_INNER_PRODUCT)
        cand_s, cand_i = np.concatenate([best_s, D], 1), np.concatenate([best_i, np.where(ids >= 0, ids + s, -1)], 1)
        if cand_s.shape[1] > k:
            keep = np.argpartition(-cand_s, k - 1, axis=1)[:, :k]
            cand_s, cand_i = np.take_along_axis(cand_s, keep, 1), np.take_along_axis(cand_i, keep, 1)
        best_s, best_i = cand_s, cand_i
    order = np.argsort(-best_s, axis=1, kind="stable")
    out = np.take_along_axis(best_i, order, 1)
    return np.pad(out, ((0, 0), (0, k - out.shape[1])), constant_values=-1) if out.shape[1] < k else out


def recall_of(ids: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |ids ∩ truth| / |truth| (-1 entries ignored): recall@k against exact search."""
    k = truth.shape[1]
    hits = [len(set(a[:k][a[:k] >= 0].tolist()) & set(t[t >= 0].tolist())) / max(1, int((t >= 0).sum()))
            for a, t in zip(ids, truth)]
    return float(np.mean(hits)) if hits else 1.0


def doubling_ladder(top: int) -> list[int]:
    """1, 2, 4, ... up to ``top``, and ``top`` itself: the search widths a calibration tries."""
    return sorted({min(2 ** i, top) for i in range(int(np.ceil(np.log2(max(top, 1)))) + 1)} | {top})


def first_reaching(ladder: list[int], recall_at: Callable[[int], float], target: float) -> int:
    """The first width of ``ladder`` whose ``recall_at(width)`` reaches ``target`` (the last one where none
    does). Recall grows with the width, so a binary search measures a few of them."""
    lo, hi = 0, len(ladder) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if recall_at(ladder[mid]) >= target:
            hi = mid
        else:
            lo = mid + 1
    return ladder[lo]


def gpu_available() -> bool:
    """Whether faiss can put an index on a GPU; ``XMC_FAISS_GPU=0`` keeps every ``auto`` index on the CPU (e.g.
    when the GPU's memory is the training's)."""
    if os.environ.get("XMC_FAISS_GPU", "").strip() == "0":
        return False
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class ANNIndex:
    def __init__(self, kind: str = "exact", hnsw_m: int = 32, ef_construction: int = 200, ef_search: int = 128,
                 nlist: int | None = None, nprobe: int = 32, use_gpu: str | bool = "auto", threads: int | None = None,
                 auto_exact_max: int = 200_000, storage: str = "float32", recall_target: float | None = None,
                 calibration_sample: int = 1000, calibration: dict[str, Any] | None = None,
                 exact_fallback: bool = True, equalize_norms: bool = False, norm_max: float | None = None,
                 pq_fallback: bool = True, k_factor: int = 4, pad: int = 0, kmeans_iters: int | None = None) -> None:
        if kind not in ("exact", "hnsw", "ivf", "pq", "auto"):
            raise ConfigError(f"unknown index kind {kind!r} (expected exact, hnsw, ivf, pq or auto)")
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
        if recall_target is not None and not 0 < recall_target <= 1:
            raise ConfigError(f"index recall_target must be in (0, 1] (got {recall_target})")
        self.recall_target, self.calibration_sample = recall_target, int(calibration_sample)
        self.calibration = calibration
        # a calibrated width that searches no faster than brute force gives way to an exact index
        self.exact_fallback = exact_fallback
        # norm_max: set when the indexed vectors carry the extra norm-equalising coordinate (queries get a 0)
        self.equalize_norms, self.norm_max = bool(equalize_norms), norm_max
        # pq: candidates re-ranked exactly = k_factor x k; pad: zero columns that make d a multiple of 4 (pq: two
        # dimensions per 4-bit code, an even number of codes) or of FP16_D_MULTIPLE (float16 storage); a zero
        # column changes no inner product
        self.pq_fallback, self.k_factor, self.pad = bool(pq_fallback), int(k_factor), int(pad)
        # IVF: k-means iterations of the coarse centroids (None: faiss' 10). A training-time mining index is built
        # anew at every refresh, and at 10^4-10^5 vectors its k-means costs as much as the search it saves
        if kmeans_iters is not None and int(kmeans_iters) < 1:
            raise ConfigError(f"index kmeans_iters must be >= 1 (got {kmeans_iters})")
        self.kmeans_iters = None if kmeans_iters is None else int(kmeans_iters)
        self.index: Any = None
        self.on_gpu = False

    @classmethod
    def from_params(cls, icfg: dict[str, Any] | None) -> ANNIndex:
        """An (unbuilt) index from the params ``index`` section (kind, hnsw_m, ef_search, nprobe; partial: the
        schema's defaults fill the rest)."""
        icfg = filled(IndexConfig, icfg, "index")
        return cls(kind=icfg["kind"], hnsw_m=icfg["hnsw_m"], ef_search=icfg["ef_search"], nprobe=icfg["nprobe"],
                   auto_exact_max=icfg["auto_exact_max"], storage=icfg["storage"],
                   recall_target=icfg["recall_target"], calibration_sample=icfg["calibration_sample"],
                   equalize_norms=icfg["equalize_norms"], pq_fallback=icfg["pq_fallback"])

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, "hnsw_m": self.hnsw_m, "ef_construction": self.ef_construction,
                "ef_search": self.ef_search, "nlist": self.nlist, "nprobe": self.nprobe,
                "auto_exact_max": self.auto_exact_max, "storage": self.storage, "recall_target": self.recall_target,
                "calibration_sample": self.calibration_sample, "calibration": self.calibration,
                "exact_fallback": self.exact_fallback, "equalize_norms": self.equalize_norms, "norm_max": self.norm_max,
                "pq_fallback": self.pq_fallback, "k_factor": self.k_factor, "pad": self.pad,
                "kmeans_iters": self.kmeans_iters}

    def nlist_for(self, n: int) -> int:
        """The IVF lists of a build over ``n`` vectors: ``nlist`` when set, else 4·sqrt(n)."""
        return int(self.nlist or max(1, int(4 * np.sqrt(n))))

    def kind_for(self, n: int) -> str:
        """The kind this index is built as over ``n`` vectors (``auto``: exact up to ``auto_exact_max``, IVF above)."""
        if self.kind != "auto":
            return self.kind
        return "exact" if n <= self.auto_exact_max else "ivf"

    def calibrates(self, n: int) -> bool:
        """Whether a build over ``n`` vectors is approximate with a recall target, i.e. wants calibration queries."""
        return bool(self.recall_target) and self.kind_for(n) in CALIBRATED_KINDS

    def build(self, vectors: np.ndarray, queries: np.ndarray | None = None, recall_k: int = 100,
              block: int = 65536) -> ANNIndex:
        """Index ``vectors`` (n x d, any float dtype, in memory or memory-mapped), added ``block`` rows at a time.
        With ``queries`` (a sample of what it will serve, e.g. training queries) and a ``recall_target``, an
        approximate index then sets its search width by :meth:`calibrate` (recall@``recall_k``)."""
        if self.threads:
            faiss.omp_set_num_threads(self.threads)
        if vectors.ndim != 2:
            raise ValueError(f"expected an n x d array of vectors, got shape {vectors.shape}")
        n, d = vectors.shape
        self.kind = self.kind_for(n)
        if self.storage == "auto":
            self.storage = "float16" if self.kind != "exact" and n > self.auto_exact_max else "float32"
        want_gpu = self.use_gpu is True or (self.use_gpu == "auto" and gpu_available())
        if (want_gpu and self.kind == "exact" and self.storage == "float16") or self.kind == "pq":
            # faiss moves no flat scalar-quantizer index to a GPU; pq re-ranks with float32 vectors
            self.storage = "float32"
        fp16 = self.storage == "float16"
        metric = faiss.METRIC_INNER_PRODUCT
        self.norm_max, self.pad = None, 0
        if self.kind in ("ivf", "hnsw") and self.equalize_norms and n:
            norms = np.concatenate([np.linalg.norm(np.asarray(vectors[s : s + block], dtype=np.float32), axis=1)
                                    for s in range(0, n, block)])
            # norms equal to float precision (a normalised encoder): the extra coordinate would be noise
            if norms.max() - norms.min() > 1e-3 * max(float(norms.max()), 1e-12):
                self.norm_max = float(norms.max())
                d += 1
        if fp16:
            # faiss' fp16 scalar quantizer has SIMD distance code only where d is a multiple of the vector width
            # (8 floats with AVX2, 16 with AVX-512) and decodes one component at a time otherwise: ASTRA's 769-d
            # classifier rows (or any d + 1 with equalized norms) searched several times slower than 784-d ones
            self.pad = -d % FP16_D_MULTIPLE
            d += self.pad
        if self.kind == "exact":
            index = (faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_fp16, metric) if fp16
                     else faiss.IndexFlatIP(d))
        elif self.kind == "pq":
            self.pad = -d % 4
            d += self.pad
            self._pq = faiss.IndexPQFastScan(d, d // 2, 4, metric)   # kept alive: the refine index refers to it
            index = faiss.IndexRefineFlat(self._pq)
        elif self.kind == "hnsw":
            index = (faiss.IndexHNSWSQ(d, faiss.ScalarQuantizer.QT_fp16, self.hnsw_m, metric) if fp16
                     else faiss.IndexHNSWFlat(d, self.hnsw_m, metric))
            index.hnsw.efConstruction = self.ef_construction
        else:
            nlist = self._nlist = self.nlist_for(n)
            self._quantizer = faiss.IndexFlatIP(d)   # kept alive: the IVF index refers to it
            index = (faiss.IndexIVFScalarQuantizer(self._quantizer, d, nlist, faiss.ScalarQuantizer.QT_fp16, metric)
                     if fp16 else faiss.IndexIVFFlat(self._quantizer, d, nlist, metric))
            if self.kmeans_iters is not None:
                index.cp.niter = self.kmeans_iters
        if want_gpu and self.kind in ("exact", "ivf") and gpu_available():
            self._res = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(self._res, 0, index)
            self.on_gpu = True
        if not index.is_trained:   # IVF centroids (and a scalar quantizer's ranges) from a sample of the rows
            rows = np.sort(np.random.default_rng(0).choice(n, min(n, 256 * 1024), replace=False)) if n else np.zeros(0, int)
            index.train(self._stored(vectors[rows]))
        self.index = index
        calibrating = bool(self.kind in CALIBRATED_KINDS and self.recall_target and queries is not None
                           and len(queries) and n)
        exact, probe = None, None
        if (calibrating and self.kind == "ivf" and self.exact_fallback and not self.on_gpu
                and n >= PROBE_MIN_VECTORS):
            # adding every vector and calibrating the width costs minutes at 10^6 (93-182 s of a prediction stage
            # whose vectors then fell back to a PQ scan): a sample of them in the trained lists predicts first
            # whether any width can beat brute force at the recall target
            exact = self._exact_truth(queries, vectors, recall_k)
            probe = self._probe_ivf(vectors, exact[0], recall_k, exact[1])
            if probe["skip"]:
                est = probe["estimated_seconds_per_1000"]
                log.info("ivf index: the probe puts the width the target needs at nprobe %d (recall %.3f on %d "
                         "sampled vectors), %s against %.2f s per 1000 queries for exact search: not built",
                         probe["nprobe"], probe["recall"], probe["vectors"],
                         "every list" if est is None else f"about {est:.2f} s", probe["exact_seconds_per_1000"])
                m = len(exact[0][0])
                first = {"kind": "ivf", "recall_target": self.recall_target, "at_k": int(exact[0][1].shape[1]),
                         "queries": m, "knob": "nprobe", "value": probe["nprobe"], "recall": probe["recall"],
                         "reached": probe["reached"], "equalized_norms": self.norm_max is not None,
                         "search_seconds_per_1000": est,
                         "exact_seconds_per_1000": probe["exact_seconds_per_1000"], "timing_rounds": 1,
                         "tried": probe["tried"], "estimated": True, "probe": probe}
                self._fall_back(queries, vectors, recall_k, exact, first)
                return self
        for s in range(0, n, block):
            index.add(self._stored(vectors[s : s + block]))
        self._apply_search_params()
        if calibrating:
            self.calibrate(queries, vectors, recall_k, _exact=None if exact is None else (exact[0][1], exact[1]))
            if probe is not None:   # predicted faster than brute force: kept next to what the full index measured
                if "before" in self.calibration:   # ... which then fell back after all
                    self.calibration["before"] = {**self.calibration["before"], "probe": probe}
                else:
                    self.calibration = {**self.calibration, "probe": probe}
        return self

    def _calibration_queries(self, queries: np.ndarray) -> np.ndarray:
        """Up to ``calibration_sample`` of ``queries`` (a fixed sample), float32."""
        m = min(self.calibration_sample, len(queries))
        rows = np.sort(np.random.default_rng(0).choice(len(queries), m, replace=False))
        return np.ascontiguousarray(queries[rows], dtype=np.float32)

    def _exact_truth(self, queries: np.ndarray, vectors: np.ndarray,
                     k: int) -> tuple[tuple[np.ndarray, np.ndarray], float]:
        """((calibration queries, their exact top-k ids), seconds the exact search took)."""
        q = self._calibration_queries(queries)
        t0 = time.perf_counter()
        truth = exact_top_ids(q, vectors, max(1, min(k, len(vectors))))
        return (q, truth), time.perf_counter() - t0

    def _probe_ivf(self, vectors: np.ndarray, q_truth: tuple[np.ndarray, np.ndarray], k: int,
                   exact_s: float) -> dict[str, Any]:
        """Whether the trained (still empty) IVF index can reach ``recall_target`` faster than brute force,
        predicted from ``PROBE_SHARE`` of the vectors added to a copy of it. A vector's list does not depend on
        which others are indexed, and the exact top-(k x share) of a uniform sample holds the same rank quantiles
        as the full top-k, so the sample's recall at an ``nprobe`` estimates the full index's. The search time at
        that width is linear in the vectors its lists hold, with an intercept (the coarse search and a per-list
        cost) that does not grow with them: a second sample of the same size added to the copy gives the slope,
        and the full time is extrapolated from the two (samples that fit in the cache make it an underestimate,
        which errs towards building the index). ``skip`` when the target needs every list, or when the estimate is
        no faster than the exact search measured on the same queries."""
        n = len(vectors)
        q, _ = q_truth
        m = len(q)
        size = max(1, int(n * PROBE_SHARE))
        # two disjoint samples: the first estimates the recall, the second the time per added vector
        both = np.random.default_rng(1).choice(n, min(n, 2 * size), replace=False)
        rows, extra = np.sort(both[:size]), np.sort(both[size:])
        share = len(rows) / n
        kk = max(1, int(round(min(k, n) * share)))

        def gathered(r: np.ndarray) -> np.ndarray:
            return np.concatenate([np.asarray(vectors[r[s : s + 65536]], dtype=np.float32)
                                   for s in range(0, len(r), 65536)])

        sample = gathered(rows)
        sub_truth = exact_top_ids(q, sample, kk)
        probe = faiss.clone_index(self.index)
        for s in range(0, len(sample), 65536):
            probe.add(self._stored(sample[s : s + 65536]))
        del sample
        qq = self._query(q)
        nlist = self._nlist
        tried: dict[int, float] = {}   # width -> recall on the sample

        def measure(width: int) -> float:
            probe.nprobe = width
            tried[width] = recall_of(probe.search(qq, kk)[1], sub_truth)
            return tried[width]

        width = first_reaching(doubling_ladder(nlist), measure, self.recall_target)
        recall = tried[width] if width in tried else measure(width)
        found = {"vectors": int(len(rows)), "at_k": kk, "nprobe": int(width), "recall": round(recall, 4),
                 "reached": bool(recall >= self.recall_target),
                 "tried": {str(w): round(r, 4) for w, r in sorted(tried.items())},
                 "exact_seconds_per_1000": round(1000 * exact_s / m, 3)}
        if width >= nlist:
            # every list is a scan of every vector plus the coarse search: never faster than brute force, so no
            # time to estimate (at 10^6 UniDEC's 512-d vectors, timing it cost about 40 s)
            return {**found, "seconds_per_1000": {}, "estimated_seconds_per_1000": None, "skip": True}
        # the time per query from PROBE_TIMING_QUERIES of them, the fastest of two runs with each sample
        qt = qq[:PROBE_TIMING_QUERIES]
        probe.nprobe = width

        def timed() -> float:
            best = float("inf")
            for _ in range(2):
                t = time.perf_counter()
                probe.search(qt, kk)
                best = min(best, time.perf_counter() - t)
            return best * m / len(qt)

        one_s = timed()
        if len(extra):
            for s in range(0, len(extra), 65536):
                probe.add(self._stored(gathered(extra[s : s + 65536])))
        two_s = timed()
        # time = intercept + slope x vectors held; noise can make the second sample look free, never negative
        per_sample_s = max(two_s - one_s, 0.0) if len(extra) else 0.0
        est_s = one_s + per_sample_s * (n - len(rows)) / max(len(extra), 1)
        return {**found, "seconds_per_1000": {str(len(rows)): round(1000 * one_s / m, 3),
                                              str(len(rows) + len(extra)): round(1000 * two_s / m, 3)},
                "estimated_seconds_per_1000": round(1000 * est_s / m, 3), "skip": bool(est_s >= exact_s)}

    def _stored(self, rows: np.ndarray) -> np.ndarray:
        """Rows as the index holds them: float32, with the norm-equalising coordinate when ``norm_max`` is set and
        ``pad`` zero columns."""
        x = np.asarray(rows, dtype=np.float32)
        cols = [x]
        if self.norm_max is not None:
            cols.append(np.sqrt(np.maximum(self.norm_max ** 2 - np.einsum("ij,ij->i", x, x), 0.0))
                        .astype(np.float32)[:, None])
        if self.pad:
            cols.append(np.zeros((len(x), self.pad), np.float32))
        return np.ascontiguousarray(np.hstack(cols) if len(cols) > 1 else x)

    def _query(self, queries: np.ndarray) -> np.ndarray:
        q = np.ascontiguousarray(queries, dtype=np.float32)
        extra = (self.norm_max is not None) + self.pad   # queries get 0 in every added column
        return np.ascontiguousarray(np.hstack([q, np.zeros((len(q), extra), np.float32)])) if extra else q

    def calibrate(self, queries: np.ndarray, vectors: np.ndarray, k: int = 100,
                  _exact: tuple[np.ndarray, float] | None = None) -> dict[str, Any]:
        """The smallest search width (IVF ``nprobe`` / HNSW ``efSearch`` / PQ ``k_factor``) on a doubling ladder
        whose recall@k against exact search, on up to ``calibration_sample`` of ``queries``, reaches
        ``recall_target``; the widest rung (every IVF list: exhaustive) where none does. Recall grows with the
        width, so a binary search over the ladder measures a few rungs. Sets the width and returns (and keeps) what
        was measured. Where that width searches no faster than brute force: a ``pq`` index next (``pq_fallback``),
        then exact search (``exact_fallback``)."""
        if self.kind not in CALIBRATED_KINDS:
            raise ValueError(f"calibrate: a {self.kind} index has no search width")

        q = self._calibration_queries(queries)
        m = len(q)
        k = max(1, min(k, self.ntotal))
        if _exact is None:
            t0 = time.perf_counter()
            truth = exact_top_ids(q, vectors, k)
            exact_s = time.perf_counter() - t0
        else:   # measured by the kind this one falls back from, on the same queries
            truth, exact_s = _exact
        if self.kind == "pq":
            # candidates re-ranked = k_factor x k, at most every vector
            knob, top = "k_factor", max(1, min(256, self.ntotal // k))
            ladder = doubling_ladder(top)
        elif self.kind == "ivf":
            # every list (exhaustive) is the widest rung; faiss' GPU IVF searches at most 2048 lists
            knob, top = "nprobe", min(self._nlist, 2048) if self.on_gpu else self._nlist
            ladder = doubling_ladder(top)
        else:
            knob, top = "ef_search", max(16 * k, 2048)
            ladder = sorted({min(k * 2 ** i, top) for i in range(int(np.ceil(np.log2(top / k))) + 1)})
        tried: dict[int, tuple[float, float]] = {}

        def measure(width: int) -> float:
            setattr(self, knob, width)
            self._apply_search_params()
            t = time.perf_counter()
            ids = self.search(q, k)[1]
            tried[width] = (recall_of(ids, truth), time.perf_counter() - t)
            return tried[width][0]

        width = first_reaching(ladder, measure, self.recall_target)
        recall = tried[width][0] if width in tried else measure(width)
        setattr(self, knob, width)
        self._apply_search_params()
        approx_s = tried[width][1]
        rounds = 1
        if self.exact_fallback and 0.5 < approx_s / max(exact_s, 1e-9) < 2.0:
            # the fallback compares two wall-clock times, so another process on the cores during one of them can
            # flip a close call: time both again, alternating, and compare the fastest of each (noise only adds
            # time). A margin of 2x either way is not a close call (and an exhaustive IVF width timed twice more
            # would cost minutes at 10^6)
            for _ in range(TIMING_ROUNDS - 1):
                t = time.perf_counter()
                self.search(q, k)
                approx_s = min(approx_s, time.perf_counter() - t)
                t = time.perf_counter()
                exact_top_ids(q, vectors, k)
                exact_s = min(exact_s, time.perf_counter() - t)
            rounds = TIMING_ROUNDS
        self.calibration = {
            "kind": self.kind, "recall_target": self.recall_target, "at_k": k, "queries": m, "knob": knob, "value": width,
            "recall": round(recall, 4), "reached": bool(recall >= self.recall_target),
            "equalized_norms": self.norm_max is not None,
            "search_seconds_per_1000": round(1000 * approx_s / m, 3),
            "exact_seconds_per_1000": round(1000 * exact_s / m, 3), "timing_rounds": rounds,
            "tried": {str(w): round(r, 4) for w, (r, _) in sorted(tried.items())}}
        log.info("%s index: %s %d gives recall@%d %.3f against exact on %d queries (target %.2f) in %.2f s per 1000 "
                 "queries, exact search %.2f s%s", self.kind, knob, width, k, recall, m, self.recall_target,
                 1000 * approx_s / m, 1000 * exact_s / m, "" if recall >= self.recall_target else
                 ": not reached below the widest setting, the search is near exhaustive on these vectors")
        if self.exact_fallback and approx_s >= exact_s:
            self._fall_back(queries, vectors, k, ((q, truth), exact_s), dict(self.calibration))
        return self.calibration

    def _fall_back(self, queries: np.ndarray, vectors: np.ndarray, k: int,
                   exact: tuple[tuple[np.ndarray, np.ndarray], float], first: dict[str, Any]) -> None:
        """Vectors that do not cluster (e.g. a barely trained encoder): the width the target needs searches more
        slowly than brute force (``first``: that measurement, or the probe's estimate). A quantised scan of every
        vector, re-ranked exactly, needs no clusters; where it is no faster either, brute force (recall 1) is what
        remains."""
        (_, truth), exact_s = exact
        if self.pq_fallback and first["kind"] != "pq":
            log.info("%s index: no faster than exact search at that recall, trying a PQ scan", first["kind"])
            self._rebuild(vectors, "pq")
            self.calibrate(queries, vectors, k, _exact=(truth, exact_s))
            self.calibration = {**self.calibration, "fallback": self.calibration.get("fallback", "pq"),
                                "built_as": first["kind"], "before": first}
        else:
            log.info("%s index: no faster than exact search at that recall, building an exact index", first["kind"])
            self._rebuild(vectors, "exact")
            self.calibration = {**first, "fallback": "exact", "built_as": first["kind"]}

    def _rebuild(self, vectors: np.ndarray, kind: str, block: int = 65536) -> None:
        """Replace the built index by a float32 one of ``kind`` over the same ``vectors`` (uncalibrated)."""
        self.kind, self.index, self.on_gpu = kind, None, False
        self.storage = "float32"   # brute force on float32 is a matrix product (what the timing compared with)
        target, self.recall_target = self.recall_target, None
        try:
            self.build(vectors, block=block)
        finally:
            self.recall_target = target

    def _apply_search_params(self) -> None:
        if self.kind == "hnsw":
            self.index.hnsw.efSearch = max(self.ef_search, 1)
        elif self.kind == "pq":
            self.index.k_factor = max(float(self.k_factor), 1.0)
        elif self.kind == "ivf":
            if self.on_gpu:
                faiss.GpuParameterSpace().set_index_parameter(self.index, "nprobe", self.nprobe)
            else:
                self.index.nprobe = self.nprobe

    def vectors(self) -> np.ndarray:
        """The indexed vectors (flat storage of every kind here; IVF gets its direct map made first)."""
        index = faiss.index_gpu_to_cpu(self.index) if self.on_gpu else self.index
        if self.kind == "ivf":
            index.make_direct_map()
        v = index.reconstruct_n(0, index.ntotal)
        extra = (self.norm_max is not None) + self.pad   # the columns _stored added
        return np.ascontiguousarray(v[:, : v.shape[1] - extra]) if extra else v

    def recall_against_exact(self, queries: np.ndarray, ids: np.ndarray, k: int) -> float:
        """Mean |approximate top-k ∩ exact top-k| / k for these queries (``ids``: this index's answers)."""
        truth = exact_top_ids(np.ascontiguousarray(queries, dtype=np.float32), self.vectors(), k)
        return recall_of(ids, truth)

    @property
    def ntotal(self) -> int:
        return 0 if self.index is None else int(self.index.ntotal)

    def search(self, queries: np.ndarray, k: int, batch_size: int = 4096) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids), each (n, k); ids are -1 where fewer than k results exist."""
        if self.index is None:
            raise RuntimeError("index not built")
        q = self._query(queries)
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
        index = faiss.index_gpu_to_cpu(self.index) if self.on_gpu else self.index
        with atomic_dir(path) as tmp:
            faiss.write_index(index, str(tmp / "index.faiss"))
            (tmp / "index.json").write_text(json.dumps(self.config(), indent=2))

    @classmethod
    def load(cls, path: str | Path, use_gpu: str | bool = "auto") -> ANNIndex:
        path = Path(path)
        if not (path / "index.faiss").exists():
            raise ConfigError(f"{path / 'index.faiss'}: index not found")

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
        if obj.kind == "ivf":
            obj._nlist = int(faiss.extract_index_ivf(index).nlist)
        if (use_gpu is True or (use_gpu == "auto" and gpu_available())) and obj.kind in ("exact", "ivf"):
            obj._res = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(obj._res, 0, index)
            obj.on_gpu = True
        obj.index = index
        obj._apply_search_params()
        return obj
