"""ASTRA (Mehta et al., "Accurate and Scalable ANNS-based Training of Extreme Classifiers").

An encoder Φ and one linear one-vs-all classifier per label, trained end to end with a sampled
BCE whose per-step cost does not grow with L:

* :class:`ASTRAModel` - encoder + classifier table W (L x (d+1): weight row and bias), score
  f_l(x) = <w_l, Φ(x)> + b_l. The table is a sparse embedding trained with plain SGD (only the
  rows of a step's positives and negatives are touched); the encoder with (Sparse)Adam.
  Inference: exact/ANN inner product of [Φ(x), 1] against [w_l, b_l].
* :class:`ASTRANegatives` - per query: its positives (≤ k_p), k_h *stale* hard negatives from a
  shortlist mined with an ANN index over the classifier vectors (refreshed every τ_r epochs from
  τ_s on, written to a memory-mapped N x k_h file, index discarded), and k_r fresh uniform
  negatives from [L] minus the shortlist, each weighted (L - k_h)/k_r (paper eq. 2), so the
  sampled loss is an unbiased estimate of the full one-vs-all loss. Before τ_s: k_h + k_r uniform.
  The query embeddings for a refresh are the ones the training steps of the previous epoch
  computed (stale, as in the paper), so a refresh costs an index build and a search, no
  encoding pass; with ``async_refresh`` it runs in a background thread during the epoch before.
* :class:`ASTRAObjective` - that weighted BCE over each query's own candidate list.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from xmc.config.schema import AstraModel, AstraNegatives, filled
from xmc.data.columns import take_texts
from xmc.encoders.base import TextEncoder
from xmc.encoders.build import build_encoder
from xmc.errors import ConfigError
from xmc.negatives.base import CandidateBatch, NegativeSampler
from xmc.negatives.membership import in_csr_rows, in_padded_rows
from xmc.negatives.samplers import drop_positives, mining_index, search_without_positives
from xmc.methods.trainer_method import TrainerMethod, TrainingParts
from xmc.models import astra as astra_files
from xmc.trainer.candidate_scores import candidate_scores
from xmc.trainer.distributed import context
from xmc.trainer.label_table import LabelTable, merge_topk
from xmc.trainer.objective import Objective, row_slice

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------
# model
# ------------------------------------------------------------------------------------------------
class ASTRAModel(nn.Module):
    """Encoder Φ + per-label linear classifiers W (weight and bias in one sparse table)."""

    def __init__(self, encoder: TextEncoder, label_texts: Sequence[str], bias_init: float = 0.0,
                 shard_labels: bool = False) -> None:
        super().__init__()
        self.encoder = encoder
        self.label_texts = list(label_texts)
        self.dim = int(encoder.dim)
        # column d is the bias: it lets the model push every negative logit down at once, which the
        # full one-vs-all loss (L - |P| negatives per query) asks for from the first step.
        # shard_labels: under torchrun each rank holds its slice of the rows (xmc.trainer.label_table)
        self.W = LabelTable(self.n_labels, self.dim + 1, shard=shard_labels, init_std=self.dim**-0.5)
        with torch.no_grad():
            self.W.weight[:, -1] = bias_init

    @property
    def n_labels(self) -> int:
        return len(self.label_texts)

    def query_vectors(self, texts: Sequence[str]) -> torch.Tensor:
        """Φ(x) with a constant 1 appended, so <[Φ(x), 1], [w_l, b_l]> is the classifier score."""
        phi = self.encoder(list(texts), "query")
        return torch.cat([phi, phi.new_ones(len(phi), 1)], dim=1)

    def classifiers(self, label_ids: torch.Tensor | np.ndarray) -> torch.Tensor:
        idx = torch.as_tensor(np.asarray(label_ids), dtype=torch.long, device=self.W.weight.device)
        if not torch.is_grad_enabled() or self.W.sharded:
            return self.W(idx)
        # each distinct row gathered once: W's sparse gradient gets one row per distinct label of the step
        uniq, inv = torch.unique(idx, return_inverse=True)
        return self.W(uniq)[inv]

    def classifier_scores(self, q: torch.Tensor, label_ids: torch.Tensor) -> torch.Tensor:
        """<[Φ(x), 1], [w_l, b_l]> for 1-D ids (one list for the batch) or 2-D ids (a list per query); on a
        label-sharded table each rank scores the rows it holds and the blocks are summed across ranks."""
        if self.W.sharded:
            return self.W.scores(q, label_ids.to(self.W.weight.device))
        if label_ids.dim() == 2:   # a list per query: no B x C x d gradient block (xmc.trainer.candidate_scores)
            return candidate_scores(q, self.W.weight, label_ids)
        return q @ self.classifiers(label_ids).T

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """ASTRA: the encoder with Adam, the classifiers with SGD (``group_optimizer``)."""
        return {"encoder": [p for p in self.encoder.parameters() if p.requires_grad], "classifier": [self.W.weight]}

    # ---- numpy views for the index, the evaluator and the miner --------------------------------
    @torch.no_grad()
    def all_label_vectors(self, batch_size: int = 256, progress: bool = True) -> np.ndarray:
        """[w_l, b_l] for every label (a label-sharded table is gathered: every rank must call this)."""
        return np.ascontiguousarray(self.W.gathered().numpy())

    @torch.no_grad()
    def query_vectors_np(self, texts: Sequence[str], batch_size: int = 256, progress: bool = True) -> np.ndarray:
        phi = self.encoder.encode(list(texts), "query", batch_size, progress)
        return np.ascontiguousarray(np.hstack([phi, np.ones((len(phi), 1), np.float32)]), dtype=np.float32)

    @torch.no_grad()
    def label_text_vectors(self, batch_size: int = 256) -> np.ndarray:
        """Φ(z_l) with a 0 appended (no bias): the label-embedding index of the ablation."""
        z = self.encoder.encode(self.label_texts, "label", batch_size, False)
        return np.ascontiguousarray(np.hstack([z, np.zeros((len(z), 1), np.float32)]), dtype=np.float32)

    @torch.no_grad()
    def init_classifiers(self, how: str, scale: float = 1.0, batch_size: int = 256) -> None:
        """``label_text``: w_l := scale·Φ(z_l), so step 0 already ranks like the zero-shot dual encoder
        and labels without training points keep a meaningful vector; ``random``: N(0, 1/d)."""
        if how == "label_text":
            # this rank's rows only (all rows in one process); the encoder is not yet sharded, so no collective
            z = self.encoder.encode(self.label_texts[self.W.lo : self.W.hi], "label", batch_size, False)
            self.W.weight[:, :-1] = torch.from_numpy(z * scale).to(self.W.weight.device)
        elif how != "random":
            raise ConfigError(f"astra.model.init_classifiers must be 'label_text' or 'random', not {how!r}")

    @torch.no_grad()
    def adjust_logits(self, label_counts: np.ndarray, tau: float) -> None:
        """Post-hoc logit adjustment (Menon et al., 2021, "Long-tail learning via logit adjustment"), folded into
        the bias column: b_l -= tau * log(1 + n_l), n_l the label's training positives. The model was fit on a
        sampled objective (positives and mined negatives, not every label), which leaves frequent labels scored
        above their share; the saved model carries the adjustment, so every predictor serves it as trained.
        The +1 keeps labels never seen in training finite (a constant shift changes no ranking)."""
        counts = np.asarray(label_counts, dtype=np.float64).ravel()
        if counts.shape[0] != self.n_labels:
            raise ValueError(f"label_counts has {counts.shape[0]} entries for {self.n_labels} labels")
        if tau < 0:
            raise ValueError(f"logit adjustment tau must be >= 0, not {tau}")
        if tau == 0:
            return
        shift = torch.from_numpy((tau * np.log1p(counts[self.W.lo : self.W.hi])).astype(np.float32))
        self.W.weight[:, -1] -= shift.to(self.W.weight.device)   # this rank's rows only (all in one process)

    # ---- persistence -----------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        W = self.W.gathered(dst=0)   # a label-sharded table comes together on rank 0, which alone writes it
        if W is None:
            return
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.encoder.save(path / astra_files.ENCODER)
        torch.save({"W": W}, path / astra_files.CLASSIFIERS)
        (path / astra_files.DESCRIPTION).write_text(json.dumps({"dim": self.dim, "n_labels": self.n_labels}, indent=2))

    @classmethod
    def load(cls, path: str | Path, label_texts: Sequence[str]) -> ASTRAModel:
        """The layout :func:`xmc.models.astra.load_astra` reads, as a trainable model."""
        encoder, W = astra_files.load_astra(path, len(label_texts))
        model = cls(encoder, label_texts)
        model.W.weight.data.copy_(torch.from_numpy(W))
        return model.eval()


# ------------------------------------------------------------------------------------------------
# negatives
# ------------------------------------------------------------------------------------------------
def search_label_vectors(Y: sp.csr_matrix, query_vecs: np.ndarray, label_vecs: np.ndarray, k_h: int,
                         index_kind: str = "exact", label_offset: int = 0,
                         **index_kw: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, scores, global ids): the top-(k_h + most positives of a row) labels of ``label_vecs`` (rows
    ``label_offset ...`` of the table: a rank's shard) for every query with a vector. The index is discarded."""
    Y = Y.tocsr()
    max_pos = int(np.diff(Y.indptr).max()) if Y.shape[0] else 0
    index = mining_index(index_kind, **index_kw).build(np.ascontiguousarray(label_vecs, dtype=np.float32))
    rows = np.flatnonzero(np.isfinite(query_vecs[:, 0]))
    D, ids = index.search(np.ascontiguousarray(query_vecs[rows], dtype=np.float32), min(k_h + max_pos, Y.shape[1]))
    del index
    return rows, D, np.where(ids >= 0, ids + label_offset, -1)


def fill_shortlist(Y: sp.csr_matrix, rows: np.ndarray, ids: np.ndarray, k_h: int, out: np.ndarray) -> None:
    """``out[r]`` := row r's candidate ids without its positives, cut to k_h (-1 padded; other rows -1)."""
    out[:] = -1
    if len(rows):
        out[rows] = drop_positives(Y.tocsr()[rows], ids, k_h)


def in_rows(sets: np.ndarray, items: np.ndarray, n_labels: int) -> np.ndarray:
    """``out[b, j]``: is ``items[b, j]`` among ``sets[b]`` (a row of label ids, -1 = none)? O(B·(|items| + |sets|)) memory."""
    return in_padded_rows(sets, items, n_labels)


def mine_classifier_shortlist(Y: sp.csr_matrix, query_vecs: np.ndarray, label_vecs: np.ndarray, k_h: int,
                              out: np.ndarray, index_kind: str = "exact", **index_kw: Any) -> None:
    """Top-k_h labels per query by inner product with ``label_vecs``, positives dropped, into ``out``
    (N x k_h int32, -1 padded; rows of queries without a vector stay -1)."""
    rows, _, ids = search_label_vectors(Y, query_vecs, label_vecs, k_h, index_kind, **index_kw)
    fill_shortlist(Y, rows, ids, k_h, out)


class ASTRANegatives(NegativeSampler):
    """Stale classifier-ANN hard negatives (weight 1) + fresh uniform negatives (weight (L-k_h)/k_r).

    * ``max_positives_per_query`` = k_p (0 = all; more are sampled uniformly, as the paper's k_p
      is "all available positives" and it does not say what happens beyond);
    * ``hard_negatives`` = k_h, ``uniform_negatives`` = k_r;
    * ``refresh_every_epochs`` = τ_r, ``start_epoch`` = τ_s: epochs [0, τ_s) use k_h + k_r uniform
      negatives; from τ_s on the shortlist is rebuilt at τ_s, τ_s + τ_r, ...;
    * ``mine_with``: ``classifiers`` (ASTRA: index over [w_l, b_l]) or ``label_embeddings`` (ANCE
      style: index over Φ(z_l), the paper's Observation-1 ablation);
    * ``uniform_shared``: one draw of k_r uniform labels (without replacement) per batch, shared by its
      queries, each weighted L/k_r and masked where it is the query's positive or hard negative: still an
      unbiased estimate of the loss over [L] \\ (P ∪ H) for every query, scored as one matrix product
      (B x d by d x k_r) that touches k_r classifier rows per step instead of B·k_r;
    * ``async_refresh``: mine in a background thread during the epoch before the refresh epoch,
      from that moment's classifiers and the previous epoch's query embeddings (the paper's
      pipelining); off = mine at the start of the refresh epoch (same staleness of the queries).
    """

    def __init__(self, Y: sp.csr_matrix, dim: int, max_positives_per_query: int = 0, hard_negatives: int = 50,
                 uniform_negatives: int = 400, refresh_every_epochs: int = 5, start_epoch: int = 5,
                 mine_with: str = "classifiers", index_kind: str = "exact", async_refresh: bool = False,
                 uniform_shared: bool = False, work_dir: str | Path | None = None, encode_batch_size: int = 256,
                 total_epochs: int | None = None, **index_kw: Any) -> None:
        super().__init__(Y, max_positives_per_query, unsampled_positives="positive")
        if refresh_every_epochs < 1:
            raise ConfigError("astra.negatives.refresh_every_epochs must be >= 1")
        if hard_negatives < 0 or uniform_negatives < 0 or hard_negatives + uniform_negatives == 0:
            raise ConfigError("astra.negatives: hard_negatives and uniform_negatives must be >= 0, not both 0")
        if mine_with not in ("classifiers", "label_embeddings"):
            raise ConfigError(f"astra.negatives.mine_with must be 'classifiers' or 'label_embeddings', not {mine_with!r}")
        self.k_h, self.k_r = int(hard_negatives), int(uniform_negatives)
        # a small label space holds fewer negatives than asked for: mine every label a query does not have
        n_labels = int(self.Y.shape[1])
        most_positives = int(np.diff(self.Y.indptr).max()) if self.Y.shape[0] else 0
        room = max(0, n_labels - most_positives - 1)
        if self.k_h > room:
            log.warning("astra: %d hard negatives per query asked for, but %d labels leave room for %d: using %d",
                        self.k_h, n_labels, room, room)
            self.k_h = room
        if self.k_h + self.k_r == 0:
            raise ConfigError(f"astra.negatives: {n_labels} labels leave no room for negatives (some query has "
                              f"{most_positives} positives)")
        self.refresh_every, self.start_epoch = int(refresh_every_epochs), int(start_epoch)
        self.mine_with, self.index_kind, self.index_kw = mine_with, index_kind, index_kw
        self.async_refresh, self.encode_batch_size = bool(async_refresh), encode_batch_size
        self.uniform_shared = bool(uniform_shared)
        self.total_epochs = total_epochs   # the run's length: no pipelined refresh for an epoch that never comes
        self.work_dir = Path(work_dir) if work_dir is not None else None
        # a label-sharded classifier table (set by _snapshot): each rank searches its shard, the top-k are merged
        self._shard_ctx: Any = None
        # the previous epoch's query embeddings [Φ(x), 1], filled by the objective (NaN = not seen); a memory-mapped
        # file under work_dir (N x (d+1) float32 is 1 GB at 10^6 queries: paged by the OS, and a checkpoint
        # refers to it instead of pickling it)
        self._dim = dim
        self._query_buffer: np.ndarray | None = None   # opened on first use, or reopened by load_state_dict
        self.shortlist: np.ndarray | None = None
        self.refreshed_at: list[int] = []
        self.refresh_seconds: list[float] = []
        self._pending: tuple[int, threading.Thread, dict[str, Any]] | None = None

    # ---- refresh -----------------------------------------------------------------------------------
    def due(self, epoch: int) -> bool:
        return self.k_h > 0 and epoch >= self.start_epoch and (epoch - self.start_epoch) % self.refresh_every == 0

    def record_query_vectors(self, query_idx: np.ndarray, vecs: torch.Tensor) -> None:
        self.query_buffer[query_idx] = vecs.detach().float().cpu().numpy()

    @property
    def query_buffer(self) -> np.ndarray:
        if self._query_buffer is None:   # a new run: a fresh (all-NaN) buffer, never an older run's file
            self._query_buffer = self._open_query_buffer(create=True)
        return self._query_buffer

    def _query_buffer_path(self) -> Path | None:
        if self.work_dir is None:
            return None

        ctx = context()
        return self.work_dir / f"query_buffer{f'.rank{ctx.rank}' if ctx.active else ''}.npy"

    def _open_query_buffer(self, create: bool) -> np.ndarray:
        shape = (self.Y.shape[0], self._dim + 1)
        path = self._query_buffer_path()
        if path is None:
            return np.full(shape, np.nan, np.float32)
        if not create and path.is_file():
            buf = np.load(path, mmap_mode="r+")
            if buf.shape == shape and buf.dtype == np.float32:
                return buf
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
        buf[:] = np.nan
        return buf

    def _shortlist_file(self, epoch: int) -> np.ndarray:
        """N x k_h int32; memory-mapped under ``work_dir`` (as the paper's memmap files) when set."""
        shape = (self.Y.shape[0], self.k_h)
        if self.work_dir is None:
            return np.full(shape, -1, np.int32)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        return np.lib.format.open_memmap(self._shortlist_path(epoch), mode="w+", dtype=np.int32, shape=shape)

    def _shortlist_path(self, epoch: int) -> Path:
        ctx = context()   # the ranks of a data-parallel run share work_dir: one file each
        return self.work_dir / f"shortlist_epoch{epoch}{f'.rank{ctx.rank}' if ctx.active else ''}.npy"

    def _snapshot(self, model: Any, query_texts: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
        """(query vectors, label-side vectors, global id of their first row) for mining; queries never seen yet are
        encoded now. A label-sharded classifier table gives this rank's rows (its shard of the index)."""
        has = np.diff(self.Y.indptr) > 0
        missing = np.flatnonzero(has & ~np.isfinite(self.query_buffer[:, 0]))
        # a copy only where needed: the background miner's snapshot (training keeps writing the buffer), or to add
        # the unseen queries' current encodings without marking them seen; otherwise the buffer is read as is
        qv = self.query_buffer.copy() if self.async_refresh or len(missing) else self.query_buffer
        if len(missing):
            qv[missing] = model.query_vectors_np(take_texts(query_texts, missing), self.encode_batch_size, False)
        qv[~has] = np.nan  # queries without positives are never trained on
        if self.mine_with != "classifiers":
            return qv, model.label_text_vectors(self.encode_batch_size), 0
        table = getattr(model, "W", None)
        if isinstance(table, LabelTable) and table.sharded:
            self._shard_ctx = table.ctx
            lv, offset = table.local_numpy()
            return qv, lv, offset
        return qv, model.all_label_vectors(), 0

    def _mine(self, epoch: int, qv: np.ndarray, lv: np.ndarray, offset: int, out: dict[str, Any]) -> None:
        """Search (in the background thread with ``async_refresh``). On one label shard it stops at this rank's
        top-k: the merge across ranks is a collective, made by every rank at :meth:`_install`."""
        t0 = time.perf_counter()
        if self._shard_ctx is not None:   # the merge needs each shard's scores: top-(k_h + most positives of a row)
            rows, D, ids = search_label_vectors(self.Y, qv, lv, self.k_h, self.index_kind, offset, **self.index_kw)
            out["partial"], out["seconds"] = (rows, D, ids), time.perf_counter() - t0
            return
        out["shortlist"] = self._stream_fill(epoch, qv, lv)
        out["seconds"] = time.perf_counter() - t0

    def _stream_fill(self, epoch: int, qv: np.ndarray, lv: np.ndarray, chunk: int = 65536) -> np.ndarray:
        """One index, the queries with a vector searched ``chunk`` at a time (not widened by the largest row:
        :func:`~xmc.negatives.samplers.search_without_positives`), written into the shortlist file."""
        index = mining_index(self.index_kind, **self.index_kw).build(lv)
        sl = self._shortlist_file(epoch)
        sl[:] = -1
        rows = np.flatnonzero(np.isfinite(qv[:, 0]))
        for lo in range(0, len(rows), chunk):
            r = rows[lo : lo + chunk]
            sl[r] = search_without_positives(index, self.Y[r], qv[r], self.k_h, chunk=chunk)
        if isinstance(sl, np.memmap):
            sl.flush()
        return sl

    def _fill(self, epoch: int, rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
        sl = self._shortlist_file(epoch)
        fill_shortlist(self.Y, rows, ids, self.k_h, sl)
        if isinstance(sl, np.memmap):
            sl.flush()
        return sl

    def _install(self, epoch: int, result: dict[str, Any], extra_seconds: float = 0.0) -> None:
        if "partial" in result:   # the sharded index's merge: every rank gets the global top-k
            t0 = time.perf_counter()
            rows, D, ids = result.pop("partial")

            _, ids = merge_topk(D, ids, ids.shape[1], self._shard_ctx or context())   # (or resumed from a checkpoint)
            result["shortlist"] = self._fill(epoch, rows, ids)
            result["seconds"] += time.perf_counter() - t0
        old = self.shortlist
        self.shortlist = result["shortlist"]
        self.refreshed_at.append(epoch)
        self.refresh_seconds.append(result["seconds"] + extra_seconds)
        if isinstance(old, np.memmap) and self.work_dir is not None:
            # only the current shortlist is kept on disk
            path = Path(old.filename)
            del old
            if path.exists() and path != self._shortlist_path(epoch):
                path.unlink()
        log.info("ASTRA shortlist (%s) refreshed for epoch %d in %.1f s", self.mine_with, epoch, self.refresh_seconds[-1])

    def on_epoch_start(self, epoch: int, model: Any, query_texts: list[str]) -> None:
        if self._pending is not None and self._pending[0] == epoch:
            _, thread, result = self._pending
            t0 = time.perf_counter()
            thread.join()
            self._pending = None
            log.info("ASTRA async refresh: waited %.1f s for the miner", time.perf_counter() - t0)
            self._install(epoch, result, result.get("snapshot_seconds", 0.0))
        elif self.due(epoch) and epoch not in self.refreshed_at:
            t0 = time.perf_counter()
            qv, lv, offset = self._snapshot(model, query_texts)
            result: dict[str, Any] = {}
            self._mine(epoch, qv, lv, offset, result)
            self._install(epoch, result, time.perf_counter() - t0 - result["seconds"])
        # pipelining: mine next epoch's shortlist while this epoch trains (needs embeddings from at least one epoch)
        if self.async_refresh and self.due(epoch + 1) and epoch + 1 > self.start_epoch and self._pending is None \
                and (epoch + 1) not in self.refreshed_at \
                and (self.total_epochs is None or epoch + 1 < self.total_epochs):
            t0 = time.perf_counter()
            qv, lv, offset = self._snapshot(model, query_texts)
            result = {"snapshot_seconds": time.perf_counter() - t0}
            thread = threading.Thread(target=self._mine, args=(epoch + 1, qv, lv, offset, result), daemon=True)
            thread.start()
            self._pending = (epoch + 1, thread, result)

    # ---- batches -------------------------------------------------------------------------------------
    def _uniform(self, rng: np.random.Generator, shape: tuple[int, int], exclude: np.ndarray) -> np.ndarray:
        """Draws (with replacement) uniform over [L] minus each row's ``exclude`` entries (-1 = none),
        by rejection: |exclude| << L, so a few rounds suffice. Vectorised over the batch; membership by a sorted
        key lookup, so memory is O(B·(k_r + k_h)), not the B x k_r x k_h comparison block."""
        draws = rng.integers(0, self.n_labels, size=shape)
        if exclude.size:
            for _ in range(64):
                bad = in_rows(exclude, draws, self.n_labels)
                if not bad.any():
                    break
                draws[bad] = rng.integers(0, self.n_labels, size=int(bad.sum()))
        return draws

    def _is_positive(self, query_idx: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Elementwise: is ``labels[b, j]`` a true label of ``query_idx[b]``?"""
        return in_csr_rows(self.Y[query_idx], labels, self.n_labels)

    def make_batch(self, query_idx: np.ndarray, rng: np.random.Generator) -> CandidateBatch:
        L, B = self.n_labels, len(query_idx)
        sampled = self.sample_positives(query_idx, rng)
        hard_on = self.shortlist is not None
        k_uni = self.k_r if hard_on else self.k_h + self.k_r
        kp = max((len(p) for p in sampled), default=0)
        # positives block (B x kp, padded)
        p_ids = np.zeros((B, kp), np.int64)
        p_ok = np.zeros((B, kp), bool)
        for b, p in enumerate(sampled):
            p_ids[b, : len(p)], p_ok[b, : len(p)] = p, True
        # stale hard negatives (weight 1): the stored shortlist rows, -1 = padding
        hard = np.asarray(self.shortlist[query_idx], dtype=np.int64) if hard_on else np.zeros((B, 0), np.int64)
        h_ok = hard >= 0
        n_hard = h_ok.sum(1)
        # fresh uniform negatives from [L] \ H: each stands for (L - |H|)/k_uni labels, so the sum is an
        # unbiased estimate of the negative loss over [L] \ H; a draw that hits a positive adds nothing (y = 1)
        shared = None
        if self.uniform_shared and k_uni:
            # one uniform draw for the batch: P(l drawn) = k_uni / L for every l, so weight L / k_uni makes the
            # masked sum an unbiased estimate over [L] \ (P ∪ H) of each query
            shared = np.sort(rng.choice(L, size=min(k_uni, L), replace=False)).astype(np.int64)
            s_ids = np.broadcast_to(shared, (B, len(shared)))
            s_ok = ~self._is_positive(query_idx, s_ids)
            if hard.shape[1]:
                s_ok &= ~in_rows(hard, s_ids, L)
            k_uni = 0
        uni = self._uniform(rng, (B, k_uni), hard) if k_uni else np.zeros((B, 0), np.int64)
        u_ok = ~self._is_positive(query_idx, uni) if k_uni else np.zeros((B, 0), bool)
        cand = np.concatenate([p_ids, np.where(h_ok, hard, -1), uni], 1)
        valid = np.concatenate([p_ok, h_ok, u_ok], 1)
        pos = np.concatenate([p_ok, np.zeros_like(h_ok), np.zeros_like(u_ok)], 1)
        u_w = ((L - n_hard) / max(1, k_uni)).astype(np.float32)[:, None].repeat(k_uni, 1)
        weight = np.concatenate([np.ones((B, kp), np.float32), np.ones(hard.shape, np.float32), u_w], 1)
        kind = np.concatenate([np.full((B, kp), 1, np.int8), np.full(hard.shape, 2, np.int8),
                               np.full((B, k_uni), 3, np.int8)], 1)  # for the logged loss parts
        label_ids = np.unique(cand[valid]) if shared is None else np.union1d(cand[valid], shared)
        batch = CandidateBatch(query_idx, label_ids, torch.from_numpy(pos), valid=torch.from_numpy(valid),
                               weights=torch.from_numpy(weight))
        batch.extras.update({"candidates": torch.from_numpy(np.where(valid, cand, 0)), "drawn": cand,
                             "kind": torch.from_numpy(kind), "record": self.record_query_vectors})
        if shared is not None:
            batch.extras.update({"shared_uniform": torch.from_numpy(shared), "shared_valid": torch.from_numpy(s_ok),
                                 "shared_weight": float(L) / len(shared)})
        return batch

    # ---- checkpoint ----------------------------------------------------------------------------------
    def finish_pending(self) -> None:
        if self._pending is not None:
            self._pending[1].join()

    def state_dict(self) -> dict[str, Any]:
        self.finish_pending()
        pending = None
        if self._pending is not None:  # a finished background refresh for the next epoch (or this rank's part of it)
            pending = (self._pending[0], {k: np.asarray(v) if k == "shortlist" else v
                                          for k, v in self._pending[2].items()})
        state = {"shortlist": None if self.shortlist is None else np.asarray(self.shortlist),
                 "refreshed_at": list(self.refreshed_at), "refresh_seconds": list(self.refresh_seconds),
                 "pending": pending}
        if isinstance(self.query_buffer, np.memmap):
            # by reference: entries written after this step by a run that then died are the embeddings a resumed
            # (deterministic) run writes again in the same steps, before the next refresh reads them
            self.query_buffer.flush()
            state["query_buffer_file"] = str(self._query_buffer_path())
        else:
            state["query_buffer"] = self.query_buffer
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shortlist = state.get("shortlist")
        self.refreshed_at = list(state.get("refreshed_at", []))
        self.refresh_seconds = list(state.get("refresh_seconds", []))
        if state.get("query_buffer") is not None:
            self.query_buffer[:] = state["query_buffer"]
        elif state.get("query_buffer_file"):
            self._query_buffer = self._open_query_buffer(create=False)
        pending = state.get("pending")
        if pending is not None:
            done = threading.Thread(target=lambda: None)
            done.start()
            self._pending = (pending[0], done, dict(pending[1]))


# ------------------------------------------------------------------------------------------------
# objective
# ------------------------------------------------------------------------------------------------
class ASTRAObjective(Objective):
    """Paper eq. (2): Σ_{P} softplus(-s) + Σ_{H} softplus(s) + (L-k_h)/k_r · Σ_{R} softplus(s),
    summed over a query's candidates and averaged over the batch's queries."""

    shards_rows = True

    def forward(self, model: nn.Module, batch: CandidateBatch, query_texts: Sequence[str]) -> torch.Tensor:
        q = model.query_vectors(take_texts(query_texts, batch.query_idx))  # B x (d+1)
        record = batch.extras.get("record")
        if record is not None:
            record(batch.query_idx, q)
        n = len(q)
        rows = self.rows(n)   # this rank's rows of the batch (all of them in one process)
        mean = (lambda t: t.mean()) if rows == slice(0, n) else (lambda t: t.sum() / n)   # this rank's share of it

        def scores(ids: torch.Tensor) -> torch.Tensor:
            # a label-sharded table scores the global batch where its rows live (a collective); a replicated one
            # only this rank's rows
            if model.W.sharded:
                return model.classifier_scores(q, ids)[rows]
            return model.classifier_scores(q[rows], row_slice(ids, rows, n) if ids.dim() == 2 else ids)

        cand = batch.extras["candidates"].to(q.device)
        s = scores(cand).float()  # B x C: only these rows get gradients
        pos, valid, weights = (row_slice(t, rows, n) for t in self.targets(batch, q.device))
        per = F.binary_cross_entropy_with_logits(s, pos.float(), reduction="none") * weights * valid
        loss = mean(per.sum(1))
        shared = batch.extras.get("shared_uniform")
        shared_part = 0.0
        if shared is not None:
            # the batch's shared uniform negatives: one (B x d) @ (d x R) product, label y = 0 for every entry
            s_sh = scores(shared.to(q.device)).float()
            ok = row_slice(batch.extras["shared_valid"].to(q.device), rows, n)
            per_sh = F.softplus(s_sh) * ok * batch.extras["shared_weight"]   # a scalar: L / R
            shared_loss = mean(per_sh.sum(1))
            loss = loss + shared_loss
            shared_part = float(shared_loss.detach())
        kind = batch.extras.get("kind")
        if kind is not None:
            # the loss by candidate kind in one pass (per-kind boolean masks took 5 % of a step)
            kind = row_slice(kind.to(q.device), rows, n)
            sums = per.new_zeros(4).index_add_(0, kind.reshape(-1).long(), per.detach().reshape(-1))
            self.last_parts = {name: float(sums[code]) / max(1, len(q))
                               for name, code in (("positive", 1), ("hard", 2), ("uniform", 3))}
            self.last_parts["uniform"] += shared_part
        return loss


def full_ova_loss(model: ASTRAModel, Y: sp.csr_matrix, query_idx: np.ndarray, texts: Sequence[str]) -> torch.Tensor:
    """The full one-vs-all BCE (paper eq. 1) of the given queries: every label scored. For tests and
    the scale benchmark's all-labels peer."""
    q = model.query_vectors(take_texts(texts, query_idx))
    s = (q @ model.W.weight.T).float()
    y = torch.from_numpy(Y.tocsr()[query_idx].toarray() > 0).to(s.device).float()
    return F.binary_cross_entropy_with_logits(s, y, reduction="none").sum(1).mean()


class FullOvAObjective(Objective):
    """Every label scored for every query (the all-labels peer of the scale benchmark and the
    ``uniform_negatives: all`` reference): O(B·L·d) per step."""

    def __init__(self, Y: sp.csr_matrix) -> None:
        super().__init__()
        self.Y = Y.tocsr()

    def forward(self, model: nn.Module, batch: CandidateBatch, query_texts: Sequence[str]) -> torch.Tensor:
        return full_ova_loss(model, self.Y, batch.query_idx, query_texts)


# ------------------------------------------------------------------------------------------------
# one run
# ------------------------------------------------------------------------------------------------
def build_astra_sampler(Y: sp.csr_matrix, dim: int, cfg: dict[str, Any] | None, work_dir: str | Path | None,
                        total_epochs: int | None = None) -> ASTRANegatives:
    """The sampler of ``astra.negatives`` (schema defaults filled; unset index knobs keep the index's defaults) for
    a run of ``total_epochs`` epochs."""
    return ASTRANegatives(Y, dim, work_dir=work_dir, total_epochs=total_epochs,
                          **filled(AstraNegatives, cfg, "astra.negatives"))


def build_astra_model(encoder_cfg: dict[str, Any], model_cfg: dict[str, Any] | None, label_texts: Sequence[str],
                      Y_train: sp.csr_matrix | None = None, shard_labels: bool = False) -> ASTRAModel:
    model_cfg = filled(AstraModel, model_cfg, "astra.model")
    bias = model_cfg["bias_init"]
    if bias == "prior":
        # σ(b) = mean positives per query / L: a label's logit from the base rate alone, so the
        # L - |P| negatives do not dominate the first steps
        if Y_train is None or Y_train.shape[0] == 0:
            raise ConfigError("astra.model.bias_init 'prior' needs the training label matrix")
        rate = min(max(Y_train.nnz / Y_train.shape[0] / len(label_texts), 1e-9), 0.5)
        bias = math.log(rate / (1 - rate))
    model = ASTRAModel(build_encoder(encoder_cfg), label_texts, bias_init=float(bias), shard_labels=shard_labels)
    model.init_classifiers(model_cfg["init_classifiers"], float(model_cfg["init_scale"]))
    return model


class ASTRAMethod(TrainerMethod):
    """ASTRA on the one trainer; predicts with its classifier vectors (``dense`` predictor, bias column)."""

    name = "astra"

    def build(self, ctx: Any, ds: Any) -> TrainingParts:
        cfg = ctx.config
        model = build_astra_model(cfg["encoder"], cfg["model"], ds.label_texts, ds.trn.Y,
                                  shard_labels=bool(cfg["train"].get("shard_label_tables", True)))
        sampler = build_astra_sampler(ds.trn.Y, model.dim, dict(cfg["negatives"]), Path(ctx.work_dir) / "shortlists",
                                      total_epochs=int(cfg["train"]["epochs"]))

        tau = float(cfg["model"].get("logit_adjustment", 0.0))

        def after_fit(history: dict[str, Any]) -> dict[str, Any]:
            sampler.finish_pending()  # a background refresh still mining must not outlive the run
            model.adjust_logits(np.asarray(ds.trn.Y.sum(axis=0)).ravel(), tau)
            return {"logit_adjustment": tau}

        return TrainingParts(model, sampler, ASTRAObjective(),
                             fingerprint={"method": "astra", **{k: cfg[k] for k in ("encoder", "model", "negatives")},
                                          "data": ds.meta.get("content_sha256")},
                             save=model.save, after_fit=after_fit)
