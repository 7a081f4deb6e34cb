"""Multi-scale adaptive clustering (MACLR §2.3, Algorithm 1): the schedule and faiss k-means."""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np


@dataclass(frozen=True)
class ClusterSchedule:
    """K0 clusters at step 0, doubled every ``t_k`` steps, assignments recomputed every ``t_update``
    steps, both only while ``step < total_steps / 2``; from the half on every instance is its own
    cluster (the cluster loss reduces to plain ICT). ``enabled=False`` = instance level throughout."""

    k0: int
    t_k: int
    t_update: int
    total_steps: int
    enabled: bool = True

    def clustered(self, step: int) -> bool:
        """True while same-cluster pairs count as positives (the first half of training)."""
        return self.enabled and step < self.total_steps / 2

    def k_at(self, step: int) -> int:
        """Number of clusters over the whole corpus at ``step`` (K doubles at multiples of t_k)."""
        return self.k0 * 2 ** (step // max(1, self.t_k))

    def recluster_due(self, step: int) -> bool:
        return self.clustered(step) and step % max(1, self.t_update) == 0

    def recluster_steps(self) -> list[int]:
        return [s for s in range(self.total_steps) if self.recluster_due(s)]


def kmeans_assign(vecs: np.ndarray, k: int, seed: int = 0, niter: int = 20, nredo: int = 1) -> np.ndarray:
    """Cluster id per row with faiss k-means (L2, as the MACLR code; vectors here are L2-normalised)."""
    x = np.ascontiguousarray(vecs, dtype=np.float32)
    k = int(max(1, min(k, len(x))))
    if k == 1:
        return np.zeros(len(x), np.int64)
    km = faiss.Kmeans(x.shape[1], k, niter=niter, nredo=nredo, seed=seed, verbose=False,
                      min_points_per_centroid=1, max_points_per_centroid=1000)
    km.train(x)
    _, assign = km.index.search(x, 1)
    return assign.ravel().astype(np.int64)
