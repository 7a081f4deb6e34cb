"""MACLR training through the shared :class:`xmc.trainer.trainer.Trainer`: Stage I, Stage II, few-shot.

Stage I is a sampler (:class:`ICTClusterSampler`: ICT pairs, cluster ids from the schedule,
M random real labels per step) plus an objective (:class:`MACLRObjective`: Eq. 2 + Eq. 3).
Stage II and few-shot fine-tuning are plain dual-encoder runs (DecoupledSoftmax, in-batch
negatives) on a pseudo-positive or a few-shot ground-truth matrix.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from xmc.config.schema import MaclrStage1, MaclrStage2, filled
from xmc.data.columns import take_texts
from xmc.encoders.base import TextEncoder
from xmc.losses import build_loss
from xmc.maclr.clustering import ClusterSchedule, kmeans_assign
from xmc.maclr.losses import label_regularisation_loss, supcon_loss
from xmc.errors import ConfigError
from xmc.maclr.pseudo import ICTPair, PseudoPairs, agreed_pairs, dense_topk, topk_to_csr, union_pairs
from xmc.models.dual_encoder import DualEncoderModel
from xmc.negatives import build_sampler
from xmc.negatives.base import CandidateBatch, NegativeSampler
from xmc.trainer.trainer import Trainer, TrainConfig
from xmc.trainer.live import TrainingLog
from xmc.trainer.objective import Objective

log = logging.getLogger(__name__)


# ---- Stage I -----------------------------------------------------------------------------------
class ICTClusterSampler(NegativeSampler):
    """Batches of ICT pairs; the positives mask says which pairs share a cluster (identity once the
    schedule is instance level); ``label_ids`` are M labels drawn uniformly from the whole label set
    for the label regulariser (none when it is off).

    Re-clustering runs in :meth:`on_step_start` when the schedule says so. ``cluster_pool`` > 0 embeds
    only the instances of the next ``t_update`` steps (filled up with random others to that size)
    instead of the whole corpus (0 = every instance, the paper; GPUs). K is the schedule's K, not scaled
    down: k-means with K centroids on a random sample partitions the embedding space about as it does on
    the whole corpus, so two batch members share a cluster with about the same probability (~1/K). Only
    the instances that the next steps draw need an assignment.
    """

    def __init__(self, pairs: list[ICTPair], n_labels: int, schedule: ClusterSchedule, label_negatives: int = 32,
                 cluster_pool: int = 0, encode_batch_size: int = 256, seed: int = 0) -> None:
        self.contexts = [p.context for p in pairs]
        self.pseudo_labels = [p.pseudo_label for p in pairs]
        self.Y = sp.csr_matrix((len(pairs), 1), dtype=np.float32)  # the base API's matrix; no labels here
        self._n_labels = n_labels
        self.schedule, self.label_negatives = schedule, label_negatives
        self.cluster_pool, self.encode_batch_size, self.seed = cluster_pool, encode_batch_size, seed
        self.steps_per_epoch = schedule.total_steps
        self.cluster = np.arange(len(pairs), dtype=np.int64)  # instance level until the first clustering
        self.reclustered_at: list[int] = []
        self.k_used: list[int] = []
        self.recluster_seconds: list[float] = []
        self.step = 0

    @property
    def n_labels(self) -> int:
        return self._n_labels

    def query_batches(self, epoch: int, batch_size: int, seed: int) -> list[np.ndarray]:
        self.batch_size = batch_size
        rng = np.random.default_rng([seed, epoch])
        perm = rng.permutation(len(self.contexts))
        return [perm[s : s + batch_size] for s in range(0, len(perm), batch_size)]

    def _upcoming(self, step: int) -> np.ndarray:
        """Instances of steps [step, step + t_update), from the deterministic batch order."""
        idx = []
        for s in range(step, min(step + self.schedule.t_update, self.schedule.total_steps)):
            epoch, i = divmod(s, self.steps_per_epoch)
            batches = self.query_batches(epoch, self.batch_size, self.seed)
            if i < len(batches):
                idx.append(batches[i])
        return np.unique(np.concatenate(idx)) if idx else np.zeros(0, np.int64)

    def pool(self, step: int) -> np.ndarray:
        n = len(self.contexts)
        if not self.cluster_pool or self.cluster_pool >= n:
            return np.arange(n)
        up = self._upcoming(step)
        rest = np.setdiff1d(np.arange(n), up)
        fill = np.random.default_rng([self.seed, step, 7]).choice(rest, max(0, min(len(rest), self.cluster_pool - len(up))),
                                                                    replace=False)
        return np.sort(np.concatenate([up, fill]))

    def on_step_start(self, step: int, model: Any, query_texts: list[str]) -> None:
        self.step = step
        if not self.schedule.recluster_due(step) or step in self.reclustered_at:
            return
        t0 = time.perf_counter()
        pool = self.pool(step)
        vecs = model.query_vectors_np([self.contexts[i] for i in pool], batch_size=self.encode_batch_size, progress=False)
        k = min(self.schedule.k_at(step), len(pool))
        assign = kmeans_assign(vecs, k, seed=self.seed + step)
        n = len(self.contexts)
        cluster = np.arange(n, 2 * n, dtype=np.int64)  # outside the pool: own cluster
        cluster[pool] = assign
        self.cluster = cluster
        self.reclustered_at.append(step)
        self.k_used.append(k)
        self.recluster_seconds.append(time.perf_counter() - t0)
        model.train()
        log.info("step %d: k-means K=%d on %d instances in %.1f s", step, k, len(pool), self.recluster_seconds[-1])

    def same_cluster(self, query_idx: np.ndarray) -> torch.Tensor:
        if not self.schedule.clustered(self.step):
            return torch.eye(len(query_idx), dtype=torch.bool)
        c = self.cluster[query_idx]
        return torch.from_numpy(c[:, None] == c[None, :])

    def make_batch(self, query_idx: np.ndarray, rng: np.random.Generator) -> CandidateBatch:
        labels = (rng.choice(self._n_labels, min(self.label_negatives, self._n_labels), replace=False)
                  if self.label_negatives > 0 else None)
        return CandidateBatch(query_idx, labels, self.same_cluster(query_idx),
                              extras={"pseudo_labels": [self.pseudo_labels[i] for i in query_idx]})

    def state_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "reclustered_at": self.reclustered_at, "k_used": self.k_used,
                "recluster_seconds": self.recluster_seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cluster = state["cluster"]
        self.reclustered_at, self.k_used = list(state["reclustered_at"]), list(state["k_used"])
        self.recluster_seconds = list(state["recluster_seconds"])


class MACLRObjective(Objective):
    """L = L_cluster (Eq. 2; Eq. 1 when the mask is the identity) + label_weight * L_label (Eq. 3); across ranks each
    rank scores its contexts against the batch's pseudo labels (and its twins against the drawn labels)."""

    handles_all_labels = True  # label_ids None = label regulariser off, not "all labels"
    shards_rows = True

    def __init__(self, temperature: float = 0.05, label_weight: float = 1.0) -> None:
        super().__init__()
        self.temperature, self.label_weight = temperature, label_weight

    def forward(self, model: DualEncoderModel, batch: CandidateBatch, query_texts: Sequence[str]) -> torch.Tensor:
        enc = model.encoder
        ctx = take_texts(query_texts, batch.query_idx)
        q = enc(ctx, "query")
        z = enc(batch.extras["pseudo_labels"], "label")
        same = batch.positives.to(q.device)
        n = len(q)
        rows = self.rows(n)   # this rank's contexts (all of them in one process); both losses average over all
        frac = (rows.stop - rows.start) / max(n, 1)
        loss = supcon_loss(q, z, same, self.temperature, rows) * frac if frac else (q.sum() + z.sum()) * 0.0
        parts = {"cluster_loss": float(loss.detach()), "same_cluster_pairs": float((same.sum() - n) / 2)}
        if batch.label_ids is not None and len(batch.label_ids) and self.label_weight > 0:
            q_twin = enc(ctx, "query")  # the same contexts again: another dropout mask (SimCSE)
            lab = model.label_vectors(batch.label_ids)
            l_label = (label_regularisation_loss(q[rows], q_twin[rows], lab, self.temperature) * frac if frac
                       else q_twin.sum() * 0.0 + lab.sum() * 0.0)
            parts["label_loss"] = float(l_label.detach())
            loss = loss + self.label_weight * l_label
        self.last_parts = parts
        return loss


def train_stage1(encoder: TextEncoder, pairs: PseudoPairs, cfg: dict[str, Any], work_dir: Path,
                 encode_batch_size: int = 256, live: TrainingLog | None = None, complete: bool = True) -> dict[str, Any]:
    """Stage I in place on ``encoder``; returns a summary (timings, clustering trace). ``cfg``: a maclr
    ``stage1`` section (partial: the schema's defaults fill the rest). ``complete=False``: its checkpoint stays
    until the caller's model is saved (``summary["trainer"].complete()``)."""
    cfg = filled(MaclrStage1, cfg, "stage1")
    tcfg = TrainConfig.from_params(cfg["train"])
    n_batches = -(-len(pairs.ict) // tcfg.batch_size)
    steps = (min(n_batches, tcfg.max_steps_per_epoch) if tcfg.max_steps_per_epoch else n_batches) * tcfg.epochs
    sched = ClusterSchedule(k0=int(cfg["k0"]), t_k=int(cfg["t_k"]), t_update=int(cfg["t_update"]), total_steps=steps,
                            enabled=cfg["mac"])
    sampler = ICTClusterSampler(pairs.ict, len(pairs.label_texts), sched,
                                label_negatives=cfg["label_negatives"] if cfg["label_reg"] else 0,
                                cluster_pool=cfg["cluster_pool"], encode_batch_size=encode_batch_size,
                                seed=int(tcfg.seed))
    model = DualEncoderModel(encoder, pairs.label_texts)
    objective = MACLRObjective(cfg["temperature"], cfg["label_weight"])
    trainer = Trainer(model, sampler, objective, tcfg, sampler.contexts, work_dir,
                      fingerprint_extra={"maclr_stage1": cfg, "pairs": pairs.meta.get("counts")}, live=live,
                      live_prefix="stage1")
    sampler.steps_per_epoch = trainer.steps_per_epoch
    t0 = time.perf_counter()
    trainer.fit(complete=complete)
    return {"seconds": round(time.perf_counter() - t0, 2), "steps": trainer.global_step,
            "reclustered_at": sampler.reclustered_at, "k_used": sampler.k_used,
            "recluster_seconds": [round(s, 2) for s in sampler.recluster_seconds], "trainer": trainer}


# ---- Stage II and few-shot: plain dual-encoder runs --------------------------------------------
def train_pairs(encoder: TextEncoder, texts: list[str], label_texts: list[str], Y: sp.csr_matrix,
                cfg: dict[str, Any], work_dir: Path, fingerprint: dict[str, Any], live: TrainingLog | None = None,
                live_prefix: str = "", complete: bool = True) -> tuple[Trainer, float]:
    """DecoupledSoftmax dual encoder on the pairs of ``Y`` (in-batch negatives), in place on ``encoder``
    (``complete=False``: the checkpoint stays until the caller's model is saved, :meth:`Trainer.complete`)."""
    model = DualEncoderModel(encoder, label_texts)
    sampler = build_sampler(Y, cfg["negatives"])
    loss = build_loss(cfg["loss"]["name"], **{k: v for k, v in cfg["loss"].items() if k != "name"})
    trainer = Trainer(model, sampler, loss, TrainConfig.from_params(cfg["train"]), texts, work_dir,
                      fingerprint_extra={**fingerprint, "nnz": int(Y.nnz), "negatives": cfg["negatives"], "loss": cfg["loss"]},
                      live=live, live_prefix=live_prefix)
    t0 = time.perf_counter()
    trainer.fit(complete=complete)
    return trainer, time.perf_counter() - t0


def stage2_pseudo_matrix(encoder: TextEncoder | None, pairs: PseudoPairs, cfg: dict[str, Any],
                         encode_batch_size: int = 256) -> tuple[sp.csr_matrix, dict[str, Any]]:
    """Stage-II pseudo positives from the encoder's top-k (``dense_k``; 0 = off) and a sparse view's top-k
    (``sparse``, ``sparse_view``: TF-IDF over the whole label text, or the labels whose names occur in the
    instance) per instance, on ``max_instances`` random training instances (0 = all: the encoder then
    embeds every instance). ``select``: ``union`` (the paper: a pair from either view) or ``agree``
    (only pairs in both views' top-k; needs both views): a precision filter for data where a view's
    top-k is too noisy to self-train on (semcor-wn30: TF-IDF top-3 ~14% precise, the agreed pairs ~40%).
    ``cfg``: a maclr ``stage2`` section (partial: the schema's defaults fill the rest)."""
    cfg = filled(MaclrStage2, cfg, "stage2")
    n, L = len(pairs.texts), len(pairs.label_texts)
    rows = np.arange(n)
    if cfg["max_instances"] and cfg["max_instances"] < n:
        rows = np.sort(np.random.default_rng(cfg["seed"]).choice(n, cfg["max_instances"], replace=False))
    mats, info = [], {"instances": int(len(rows))}
    t0 = time.perf_counter()
    if cfg["dense_k"] > 0:
        assert encoder is not None
        lv = encoder.encode(pairs.label_texts, "label", encode_batch_size, progress=True)
        qv = encoder.encode([pairs.texts[i] for i in rows], "query", encode_batch_size, progress=True)
        ids, _ = dense_topk(qv, lv, cfg["dense_k"])
        mats.append(topk_to_csr(ids, L, rows=rows, n_rows=n))
        info["dense_pairs"] = int(mats[-1].nnz)
    if cfg["sparse"]:
        ids = pairs.sparse_view(cfg["sparse_view"])[rows, : cfg["sparse_k"]]
        mats.append(topk_to_csr(ids, L, rows=rows, n_rows=n))
        info["sparse_view"] = cfg["sparse_view"]
        info["sparse_pairs"] = int(mats[-1].nnz)
    select = cfg["select"]   # "union" or "agree" (the schema refuses any other)
    if select == "agree":
        if len(mats) != 2:
            raise ConfigError("maclr stage2.select 'agree' needs both views (dense_k > 0 and sparse: true)")
        Y = agreed_pairs(*mats)
    else:
        Y = union_pairs(*mats) if mats else sp.csr_matrix((n, L), dtype=np.float32)
    info["select"] = select
    info["union_pairs" if select == "union" else "agreed_pairs"] = int(Y.nnz)
    if Y.nnz == 0:
        # Stage II has nothing to learn from: say which knob gives it pairs, before any training starts
        views = [v for v, on in (("dense", cfg["dense_k"] > 0), (cfg["sparse_view"], cfg["sparse"])) if on]
        raise ConfigError(f"maclr stage2: no pseudo pairs from the view(s) {views or 'none'} with select {select!r} "
                          "(on data whose label names rarely occur in the texts, set stage2.dense_k > 0 or "
                          "sparse_view: tfidf)")
    info["instances_with_pairs"] = int((Y.getnnz(1) > 0).sum())
    info["mining_seconds"] = round(time.perf_counter() - t0, 2)
    return Y, info


def fewshot_labels(Y: sp.csr_matrix, ratio: float, seed: int = 0) -> np.ndarray:
    """A random ``ratio`` of the labels that have training instances (FS-XMC by label, MACLR §4)."""
    freq = np.asarray(Y.sum(0)).ravel()
    have = np.flatnonzero(freq > 0)
    n = max(1, int(round(ratio * len(have))))
    return np.sort(np.random.default_rng(seed).choice(have, n, replace=False))


def restrict_columns(Y: sp.csr_matrix, labels: np.ndarray) -> sp.csr_matrix:
    """Y with every column outside ``labels`` zeroed (ids stay in the full label space)."""
    keep = np.zeros(Y.shape[1], np.float32)
    keep[labels] = 1.0
    out = (Y.tocsr() @ sp.diags(keep)).tocsr()
    out.eliminate_zeros()
    return out
