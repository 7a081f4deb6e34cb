"""In-batch negatives, an ANN-refreshed hard-negative shortlist, and all labels."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from xmc.ann import ANNIndex
from xmc.config.schema import NegativesConfig, filled
from xmc.data.columns import take_texts
from xmc.errors import ConfigError
from xmc.lexical import LabelNameMatcher
from xmc.lexical.matcher import zero_shot_name_topk
from xmc.negatives.base import CandidateBatch, NegativeSampler, draw_from_rows, pool_batch
from xmc.negatives.membership import in_csr_rows
from xmc.parallel import gather_rows, initialised_context, shard_bounds

log = logging.getLogger(__name__)


class InBatchNegatives(NegativeSampler):
    """Pool = the (sampled) positives of the batch's queries; each query's negatives are the others' positives."""

    def make_batch(self, query_idx: np.ndarray, rng: np.random.Generator) -> CandidateBatch:
        sampled = self.sample_positives(query_idx, rng)
        return pool_batch(self.Y, query_idx, sampled, self.name_match_negatives(query_idx, rng),
                          self.unsampled_positives)


def mining_index(kind: str = "exact", **index_kw: Any) -> ANNIndex:
    """The index a hard-negative refresh builds and searches: ``kind`` with storage ``auto`` unless given, i.e.
    float16 vectors for an approximate index over more than ``auto_exact_max`` labels, float32 otherwise (as the
    prediction index). Measured at 10^6 labels (bench/mining_index.py): the same lists and recall@100, 1.31x
    (untrained encoder) and 1.12x (trained) the queries/s of float32, half the memory: the scan is memory-bound."""
    index_kw.setdefault("storage", "auto")
    return ANNIndex(kind=kind, **index_kw)


def mine_shortlist(Y: sp.csr_matrix, query_vecs: np.ndarray, label_vecs: np.ndarray, size: int,
                   index_kind: str = "exact", **index_kw: Any) -> np.ndarray:
    """Top-``size`` labels per query by inner product, positives removed; -1 pads (int32, N x size).

    The search reaches ``size`` plus a typical row's positives (:func:`search_without_positives`), not plus the
    largest row's: one instance with thousands of labels no longer widens every query's search. In a data-parallel
    run every rank searches its contiguous share of the queries and the shares are all-gathered, so the search
    costs ``1/world`` per rank and every rank ends with the whole shortlist (each draws the same global batch)."""
    Y = Y.tocsr()
    index = mining_index(index_kind, **index_kw).build(label_vecs)
    ctx = initialised_context()
    if ctx is None:
        return search_without_positives(index, Y, query_vecs, size)

    lo, hi = shard_bounds(len(query_vecs), ctx.world, ctx.rank)
    mine = torch.from_numpy(search_without_positives(index, Y[lo:hi], query_vecs[lo:hi], size).astype(np.int64))
    return gather_rows(mine, len(query_vecs), ctx.world).numpy().astype(np.int32)


def max_positives(Y: sp.csr_matrix) -> int:
    """The most labels any row has: how far past ``size`` a candidate list must reach to keep ``size`` negatives."""
    return int(np.diff(Y.indptr).max()) if Y.shape[0] else 0


def search_without_positives(index: ANNIndex, Y: sp.csr_matrix, query_vecs: np.ndarray, size: int,
                             quantile: float = 0.99, chunk: int = 65536) -> np.ndarray:
    """``size`` nearest non-positive labels per query (int32, N x size, -1 pads), in two passes: every query
    searches ``size`` + the ``quantile`` of the rows' positive counts; the few rows that come back short because
    they have more positives than that are searched again with ``size`` + their own count. Equal to one search
    widened by the largest row (up to ties), at the cost of the typical row. Queries go ``chunk`` at a time, so
    the search results held are chunk x (size + quantile), whatever N is."""
    Y = Y.tocsr()
    n_pos_all = np.diff(Y.indptr)
    L = index.ntotal
    wide = int(np.quantile(n_pos_all, quantile)) if len(n_pos_all) else 0
    out = np.full((Y.shape[0], size), -1, np.int32)
    for lo in range(0, Y.shape[0], chunk):
        hi = min(lo + chunk, Y.shape[0])
        Yc, n_pos = Y[lo:hi], n_pos_all[lo:hi]
        qc = np.ascontiguousarray(query_vecs[lo:hi], dtype=np.float32)
        _, ids = index.search(qc, min(size + wide, L))
        block = drop_positives(Yc, ids, size)
        short = np.flatnonzero((block[:, -1] < 0) & (n_pos > wide)) if size else np.zeros(0, np.int64)
        for k in np.unique(np.minimum(size + n_pos[short], L)):   # one search per distinct width
            rows = short[np.minimum(size + n_pos[short], L) == k]
            _, again = index.search(qc[rows], int(k))
            block[rows] = drop_positives(Yc[rows], again, size)
        out[lo:hi] = block
    return out


def drop_positives(Y: sp.csr_matrix, ids: np.ndarray, size: int, chunk: int = 65536) -> np.ndarray:
    """Each row's candidate ids without its true labels (and -1 pads), cut to ``size`` (int32, N x size).
    Vectorised: membership by a sorted (row, label) key lookup, kept ids compacted to the front in their order."""
    Y = Y.tocsr()
    N, k = ids.shape
    out = np.full((N, size), -1, np.int32)
    if N == 0 or size == 0 or k == 0:
        return out
    L = max(int(Y.shape[1]), int(ids.max()) + 1, 1)
    for lo in range(0, N, chunk):
        hi = min(lo + chunk, N)
        block = ids[lo:hi]
        keep = (block >= 0) & ~in_csr_rows(Y[lo:hi], block, L)
        order = np.argsort(~keep, axis=1, kind="stable")[:, :size]   # kept ids first, in ranked order
        chosen = np.take_along_axis(block, order, 1)
        n_keep = keep.sum(1)
        width = chosen.shape[1]
        chosen = np.where(np.arange(width)[None, :] < n_keep[:, None], chosen, -1)
        out[lo:hi, :width] = chosen
    return out


class HardNegativeShortlist(InBatchNegatives):
    """In-batch pool plus ``negatives_per_query`` negatives drawn from each query's top-``shortlist_size``
    labels under the current encoder (positives removed), refreshed every ``refresh_every_epochs``
    epochs from ``start_epoch`` on (ANCE-style; DEXML §1.4), and also every ``refresh_every_steps`` steps
    (0 = off) once ``start_epoch`` is reached: a short CPU run of one capped epoch then still mines with the
    encoder being trained, not only the one it started from.

    Given the trainer's :class:`~xmc.negatives.base.StepPlan`, a refresh encodes and mines only the queries that the
    steps before the next refresh draw (a capped epoch reads a fraction of the training set); rows it does not mine
    stay -1 (no hard negative). Without a plan, or when the shortlist must serve a later epoch, every query is mined.
    """

    def __init__(self, Y: sp.csr_matrix, max_positives_per_query: int = 0, shortlist_size: int = 100,
                 negatives_per_query: int = 1, refresh_every_epochs: int = 1, start_epoch: int = 0,
                 index_kind: str = "exact", encode_batch_size: int = 256, unsampled_positives: str = "mask",
                 refresh_every_steps: int = 0, kmeans_iters: int | None = None, **positive_sampling: Any) -> None:
        super().__init__(Y, max_positives_per_query, unsampled_positives, **positive_sampling)
        if refresh_every_epochs < 1:
            raise ConfigError("refresh_every_epochs must be >= 1")
        self.shortlist_size, self.negatives_per_query = shortlist_size, negatives_per_query
        if refresh_every_steps < 0:
            raise ConfigError("refresh_every_steps must be >= 0")
        self.refresh_every_epochs, self.start_epoch = refresh_every_epochs, start_epoch
        self.refresh_every_steps = refresh_every_steps
        self.epoch = 0
        self.refreshed_at_steps: list[int] = []
        self.index_kind, self.encode_batch_size = index_kind, encode_batch_size
        self.index_kw = {} if kmeans_iters is None else {"kmeans_iters": kmeans_iters}
        self.shortlist: np.ndarray | None = None
        self.refreshed_at: list[int] = []
        self.refresh_seconds: list[float] = []
        self.mined_rows: list[int] = []

    def due(self, epoch: int) -> bool:
        return epoch >= self.start_epoch and (epoch - self.start_epoch) % self.refresh_every_epochs == 0

    def on_epoch_start(self, epoch: int, model: Any, query_texts: list[str]) -> None:
        self.epoch = epoch
        if not self.due(epoch) or epoch in self.refreshed_at:
            return
        first = epoch * self.plan.steps_per_epoch if self.plan is not None else 0
        self._refresh(model, query_texts, self.rows_to_mine(epoch, first))
        self.refreshed_at.append(epoch)
        log.info("hard-negative shortlist refreshed at epoch %d in %.1f s (%s queries)", epoch,
                 self.refresh_seconds[-1], f"{self.mined_rows[-1]:,}")

    def on_step_start(self, step: int, model: Any, query_texts: list[str]) -> None:
        every = self.refresh_every_steps
        if not every or step == 0 or step % every or self.epoch < self.start_epoch or step in self.refreshed_at_steps:
            return
        if self.plan is not None and step % self.plan.steps_per_epoch == 0 and self.epoch in self.refreshed_at:
            return   # this epoch's first step: on_epoch_start has just mined with the same encoder
        self._refresh(model, query_texts, self.rows_to_mine(self.epoch, step))
        self.refreshed_at_steps.append(step)
        log.info("hard-negative shortlist refreshed at step %d in %.1f s (%s queries)", step,
                 self.refresh_seconds[-1], f"{self.mined_rows[-1]:,}")

    def rows_to_mine(self, epoch: int, step: int) -> np.ndarray | None:
        """The queries that the steps from global ``step`` (in ``epoch``) until the next refresh draw, as sorted ids;
        None means every query: no plan, or this shortlist is still read after the epoch ends (later epochs'
        batches are not drawn yet)."""
        plan = self.plan
        if plan is None:
            return None
        every = self.refresh_every_steps
        first = epoch * plan.steps_per_epoch
        end = first + plan.steps_per_epoch
        stop = min(end, (step // every + 1) * every) if every else end
        if stop == end:
            nxt = epoch + 1
            renewed = nxt >= plan.epochs or self.due(nxt) or bool(every and nxt >= self.start_epoch and end % every == 0)
            if not renewed:
                return None
        batches = self.query_batches(epoch, plan.batch_size, plan.seed)[: plan.steps_per_epoch]
        window = batches[step - first : stop - first]
        return np.unique(np.concatenate(window)) if window else np.zeros(0, np.int64)

    def _refresh(self, model: Any, query_texts: list[str], rows: np.ndarray | None = None) -> None:
        t0 = time.perf_counter()
        label_vecs = model.all_label_vectors(batch_size=self.encode_batch_size)
        texts = query_texts if rows is None else take_texts(query_texts, rows)
        query_vecs = model.query_vectors_np(texts, batch_size=self.encode_batch_size)
        self.refresh_from_vectors(query_vecs, label_vecs, rows)
        self.refresh_seconds.append(time.perf_counter() - t0)

    def refresh_from_vectors(self, query_vecs: np.ndarray, label_vecs: np.ndarray,
                             rows: np.ndarray | None = None) -> None:
        """Mine the shortlist of every query (``rows`` None) or of the queries ``rows`` (``query_vecs`` in their
        order); the other rows get -1 (no hard negative) and are not read before the next refresh."""
        if rows is None:
            self.shortlist = mine_shortlist(self.Y, query_vecs, label_vecs, self.shortlist_size, self.index_kind,
                                            **self.index_kw)
        else:
            self.shortlist = np.full((self.Y.shape[0], self.shortlist_size), -1, np.int32)
            if len(rows):
                self.shortlist[rows] = mine_shortlist(self.Y[rows], query_vecs, label_vecs, self.shortlist_size,
                                                      self.index_kind, **self.index_kw)
        self.mined_rows.append(int(self.Y.shape[0] if rows is None else len(rows)))

    def make_batch(self, query_idx: np.ndarray, rng: np.random.Generator) -> CandidateBatch:
        sampled = self.sample_positives(query_idx, rng)
        extra = self.name_match_negatives(query_idx, rng)
        if self.shortlist is not None and self.negatives_per_query > 0:
            extra.append(draw_from_rows(self.shortlist[query_idx], self.negatives_per_query, rng))
        return pool_batch(self.Y, query_idx, sampled, extra, self.unsampled_positives)

    def state_dict(self) -> dict[str, Any]:
        return {"shortlist": self.shortlist, "refreshed_at": list(self.refreshed_at),
                "refreshed_at_steps": list(self.refreshed_at_steps), "refresh_seconds": list(self.refresh_seconds),
                "mined_rows": list(self.mined_rows)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shortlist = state.get("shortlist")
        self.refreshed_at = list(state.get("refreshed_at", []))
        self.refreshed_at_steps = list(state.get("refreshed_at_steps", []))
        self.refresh_seconds = list(state.get("refresh_seconds", []))
        self.mined_rows = list(state.get("mined_rows", []))


class AllLabels(NegativeSampler):
    """Every label is a candidate for every query (DEXML's main setting); the trainer chunks the
    label side with gradient caching. The positives are a sparse B x L tensor (its nonzeros are the queries'
    labels): nothing of size B x L is made for a batch unless the loss can only score a dense block."""

    def make_batch(self, query_idx: np.ndarray, rng: np.random.Generator) -> CandidateBatch:
        rows = self.Y[query_idx].tocoo()
        idx = torch.from_numpy(np.vstack([rows.row, rows.col]).astype(np.int64))
        pos = torch.sparse_coo_tensor(idx, torch.ones(rows.nnz, dtype=torch.bool), rows.shape,
                                      check_invariants=True).coalesce()
        return CandidateBatch(query_idx, None, pos)


def name_match_shortlist(Y: sp.csr_matrix, query_texts: list[str], label_texts: list[str],
                         label_names: dict[str, Any], size: int) -> np.ndarray:
    """Each query's best ``size`` label-name matches (zero-shot ranking of :mod:`xmc.lexical`), positives removed;
    -1 pads (int32, N x size). These are the senses a reader of the query's words would confuse."""
    Y = Y.tocsr()
    matcher = LabelNameMatcher.from_settings(label_texts, label_names)
    ids, _ = zero_shot_name_topk(matcher, query_texts, size + max_positives(Y))
    return drop_positives(Y, ids, size)


def build_sampler(Y: sp.csr_matrix, cfg: dict[str, Any] | None, query_texts: list[str] | None = None,
                  label_texts: list[str] | None = None, label_names: dict[str, Any] | None = None) -> NegativeSampler:
    """Sampler from a params ``negatives`` section (partial: the schema's defaults fill the rest).

    ``query_texts``, ``label_texts`` and the ``label_names`` settings are needed only for name-match negatives
    (``name_match_per_query`` > 0)."""
    cfg = filled(NegativesConfig, cfg, "negatives")
    sampler = _build_sampler(Y, cfg)
    if cfg["name_match_per_query"] > 0 and cfg["kind"] != "all":
        if query_texts is None or label_texts is None or label_names is None:
            raise ConfigError("negatives.name_match_per_query needs the query and label texts (this method's "
                              "sampler does not take name-match negatives; set it to 0)")
        t0 = time.perf_counter()
        sampler.name_shortlist = name_match_shortlist(Y, query_texts, label_texts, label_names,
                                                      cfg["name_match_shortlist"])
        sampler.name_per_query = cfg["name_match_per_query"]
        have = int((sampler.name_shortlist[:, 0] >= 0).sum())
        log.info("name-match negatives: %d of %d queries name a label they are not tagged with (%.1f s)",
                 have, len(query_texts), time.perf_counter() - t0)
    return sampler


def _build_sampler(Y: sp.csr_matrix, cfg: dict[str, Any]) -> NegativeSampler:
    kind, maxp, unsampled = cfg["kind"], cfg["max_positives_per_query"], cfg["unsampled_positives"]
    ps = {k: cfg[k] for k in ("positive_sampling", "propensity_a", "propensity_b")}
    if kind == "in_batch":
        return InBatchNegatives(Y, maxp, unsampled, **ps)
    if kind == "hard":
        return HardNegativeShortlist(
            Y, maxp, shortlist_size=cfg["shortlist_size"], negatives_per_query=cfg["negatives_per_query"],
            refresh_every_epochs=cfg["refresh_every_epochs"], start_epoch=cfg["start_epoch"],
            index_kind=cfg["index_kind"], unsampled_positives=unsampled,
            refresh_every_steps=cfg["refresh_every_steps"],
            **({"kmeans_iters": cfg["kmeans_iters"]} if cfg.get("kmeans_iters") is not None else {}), **ps)
    return AllLabels(Y, maxp, unsampled, **ps)   # kind "all" (the schema refuses any other)
