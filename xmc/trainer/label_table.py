"""A per-label parameter table (ASTRA's classifiers, UniDEC's Ψ) that a data-parallel run splits by label.

In one process it is a sparse ``nn.Embedding(L, d)``. With ``shard=True`` under ``torchrun`` rank r holds only the
rows ``[lo, hi)`` of :func:`~xmc.trainer.distributed.shard_bounds` — and so only their optimiser state — as Renée and
ASTRA shard their classifier tables. A step's candidate scores are computed where each row lives: every rank
scores the global batch's queries against the candidates it owns (zeros elsewhere) and the partial score blocks
are summed across ranks with an autograd all-reduce. Every candidate has exactly one owner, so the sum is the
single-process score bit for bit; the all-reduce's backward sums the ranks' ``loss / world`` gradients, so each
owned row receives the whole gradient and the table needs no gradient reduction of its own (its parameter is
marked ``label_sharded``; the trainer skips it). Memory for the table and its optimiser state per rank: ``1/world``.

Whole-table reads (the evaluator's index, saving) gather the shards: :meth:`LabelTable.gathered`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dfn
from torch import nn

from xmc.trainer.candidate_scores import candidate_scores
from xmc.trainer.distributed import DistContext, context, shard_bounds

INIT_BLOCK_ROWS = 4096   # random init is drawn per block of rows, so any split of the table draws the same values


class LabelTable(nn.Module):
    """``L x dim`` rows, one per label, addressed by global label ids; sharded by label when asked and run on >1 rank."""

    def __init__(self, n_labels: int, dim: int, shard: bool = False, init_std: float = 1.0) -> None:
        super().__init__()
        ctx = context()
        self.ctx = ctx if shard and ctx.active else DistContext()
        self.n_labels, self.dim = int(n_labels), int(dim)
        self.lo, self.hi = shard_bounds(self.n_labels, self.ctx.world, self.ctx.rank)
        # sparse: a step touches only its candidates' rows (SGD / lazy Adam update just those). The weight is passed
        # in so that nn.Embedding's own init (which would draw rows x dim from the global RNG) does not run
        self.table = nn.Embedding(self.hi - self.lo, self.dim, sparse=True,
                                  _weight=torch.empty(self.hi - self.lo, self.dim))
        self.init_normal_(init_std)
        if self.sharded:
            self.table.weight.label_sharded = True   # read by xmc.trainer.distributed.all_reduce_gradients

    @property
    def sharded(self) -> bool:
        return self.ctx.active

    @property
    def weight(self) -> nn.Parameter:
        """This rank's rows (the whole table in one process)."""
        return self.table.weight

    # ---- initialisation -------------------------------------------------------------------------
    @torch.no_grad()
    def init_normal_(self, std: float) -> None:
        """N(0, std²) rows from per-block generators seeded by one draw of the global RNG: the same table at any
        world size (rank r draws only the blocks its rows fall in)."""
        base = int(torch.randint(0, 2**62, ()))
        for b in range(self.lo // INIT_BLOCK_ROWS, -(-self.hi // INIT_BLOCK_ROWS)):
            b_lo, b_hi = b * INIT_BLOCK_ROWS, min((b + 1) * INIT_BLOCK_ROWS, self.n_labels)
            g = torch.Generator().manual_seed(base + b)
            block = torch.randn(b_hi - b_lo, self.dim, generator=g) * std
            lo, hi = max(b_lo, self.lo), min(b_hi, self.hi)
            self.weight[lo - self.lo : hi - self.lo] = block[lo - b_lo : hi - b_lo].to(self.weight)

    def owned(self, label_ids: np.ndarray) -> np.ndarray:
        """Which of these global ids this rank holds."""
        ids = np.asarray(label_ids)
        return (ids >= self.lo) & (ids < self.hi)

    @torch.no_grad()
    def set_rows(self, label_ids: np.ndarray, values: np.ndarray | torch.Tensor) -> None:
        """``table[label_ids] = values`` for the ids this rank holds (global ids, values aligned with them)."""
        ids = np.asarray(label_ids, dtype=np.int64)
        keep = self.owned(ids)
        if keep.any():
            vals = torch.as_tensor(np.asarray(values)[keep] if not isinstance(values, torch.Tensor) else values[keep])
            self.weight[torch.from_numpy(ids[keep] - self.lo).to(self.weight.device)] = vals.to(self.weight)

    # ---- training-time lookups and scores ------------------------------------------------------
    def forward(self, label_ids: torch.Tensor) -> torch.Tensor:
        """Rows of global ids (any shape); on a shard, rows this rank does not hold are zeros (no gradient)."""
        if not self.sharded:
            return self.table(label_ids)
        flat = label_ids.reshape(-1)
        mine = ((flat >= self.lo) & (flat < self.hi)).nonzero().squeeze(1)
        out = self.weight.new_zeros((flat.shape[0], self.dim))
        if len(mine):
            uniq, inv = torch.unique(flat[mine] - self.lo, return_inverse=True)   # one sparse-gradient row per label
            out = out.index_copy(0, mine, self.table(uniq)[inv])
        return out.view(*label_ids.shape, self.dim)

    def scores(self, q: torch.Tensor, label_ids: torch.Tensor) -> torch.Tensor:
        """``<q_b, row_l>``: ``label_ids`` 1-D (one list for the batch: B x C) or 2-D (a list per query: B x C).
        On a shard the partial blocks are summed across ranks (autograd all-reduce; see the module doc)."""
        if not self.sharded:
            rows = self(label_ids)
            return q @ rows.T if label_ids.dim() == 1 else torch.einsum("bd,bcd->bc", q, rows)
        if label_ids.dim() == 1:
            s = q @ self(label_ids).T
        else:
            s = self._own_candidate_scores(q, label_ids)

        if torch.is_grad_enabled() and s.requires_grad:
            return dfn.all_reduce(s)
        s = s.contiguous()
        dist.all_reduce(s)
        return s

    def _own_candidate_scores(self, q: torch.Tensor, label_ids: torch.Tensor) -> torch.Tensor:
        """B x C scores of per-query candidate lists against this rank's rows (0 where another rank owns the
        candidate), without a B x C x d block (:func:`~xmc.trainer.candidate_scores.candidate_scores`). A foreign
        entry is pointed at a row this step already touches and its score zeroed: its gradient adds exactly 0 to
        that row, so no row gets a gradient entry it would not get in one process (a lazy optimiser would move it)."""
        own = (label_ids >= self.lo) & (label_ids < self.hi)
        if not bool(own.any()):
            return q.new_zeros(label_ids.shape) + q.sum() * 0.0   # nothing of ours: still part of the graph
        anchor = label_ids[own][0] - self.lo
        local = torch.where(own, label_ids - self.lo, anchor)
        return candidate_scores(q, self.weight, local) * own.to(q.dtype)

    # ---- whole-table reads ------------------------------------------------------------------------
    @torch.no_grad()
    def gathered(self, dst: int | None = None) -> torch.Tensor | None:
        """The whole ``L x dim`` table (CPU): on every rank (``dst`` None) or on rank ``dst`` only (None elsewhere).
        A collective on a shard: every rank calls it. Always a copy: a background reader (ASTRA's pipelined ANN
        refresh) must not see the rows that training keeps updating in place."""
        w = self.weight.detach().float().cpu()
        if not self.sharded:
            return w.clone() if w.data_ptr() == self.weight.data_ptr() else w

        world = self.ctx.world
        rows = -(-self.n_labels // world)
        padded = torch.cat([w, w.new_zeros((rows - w.shape[0], self.dim))]) if w.shape[0] < rows else w
        if dst is None:
            parts = [torch.empty_like(padded) for _ in range(world)]
            dist.all_gather(parts, padded.contiguous())
        else:
            parts = [torch.empty_like(padded) for _ in range(world)] if self.ctx.rank == dst else None
            dist.gather(padded.contiguous(), parts, dst=dst)
            if parts is None:
                return None
        return torch.cat([p[: hi - lo] for p, (lo, hi) in
                          zip(parts, (shard_bounds(self.n_labels, world, r) for r in range(world)))])

    def local_numpy(self) -> tuple[np.ndarray, int]:
        """(a copy of this rank's rows as float32, the global id of its first row)."""
        return np.array(self.weight.detach().float().cpu().numpy(), dtype=np.float32, copy=True), self.lo


def merge_topk(scores: np.ndarray, ids: np.ndarray, k: int, ctx: DistContext) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's top-k (scores, global ids) of the same queries over its label shard -> the global top-k on every
    rank (a sharded index's search: faiss ``IndexShards`` does the same merge within one process)."""
    s, i = torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float32)), torch.from_numpy(ids.astype(np.int64))
    all_s = [torch.empty_like(s) for _ in range(ctx.world)]
    all_i = [torch.empty_like(i) for _ in range(ctx.world)]
    dist.all_gather(all_s, s)
    dist.all_gather(all_i, i)
    S, I = torch.cat(all_s, 1), torch.cat(all_i, 1)
    S = torch.where(I >= 0, S, torch.full_like(S, -np.inf))   # a shard with fewer than k rows pads with -1
    # stable ordering by (score desc, rank order) so every rank and any split picks the same ids on ties
    order = torch.argsort(-S, dim=1, stable=True)[:, :k]
    return torch.gather(S, 1, order).numpy(), torch.gather(I, 1, order).numpy()
