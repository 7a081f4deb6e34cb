"""What the trainer minimises on one batch.

The trainer calls ``objective(model, batch, query_texts) -> scalar`` and backpropagates; it
knows nothing else. :class:`RetrievalObjective` is the dual-encoder case (query·label scores
into a loss from :mod:`xmc.losses`); a method with two heads, graph regularisers or pseudo
pairs writes its own objective and reuses the same trainer, optimiser, schedule and checkpoints.

Under data parallelism every rank holds the global batch's query and label vectors (a transformer's shares gathered
with their gradients, a row-split bag-of-words table's partial bags all-reduced: :mod:`xmc.trainer.distributed`).
An objective whose ``shards_rows`` is True then scores only this rank's rows of the batch (:meth:`Objective.rows`)
and returns its **share** of the batch loss: the shares of the ranks sum to the single-process loss, so the trainer
backpropagates each share as it is and the collectives' backward plus one gradient all-reduce give every rank the
single-process gradient, while the scores and the loss are computed once in all, not once per rank. An objective without it computes the whole loss on every
rank (the trainer then backpropagates ``loss / world``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from xmc.data.columns import take_texts
from xmc.negatives.base import CandidateBatch
from xmc.parallel import DistContext, shard_bounds


def row_slice(t: torch.Tensor | None, rows: slice, n: int) -> torch.Tensor | None:
    """``t[rows]`` for a block with one row per batch row (``n`` x ...); a broadcast one (1 x C), a scalar or a 1-D
    tensor (one entry per candidate, not per row) as it is."""
    if t is None or t.dim() < 2 or t.shape[0] != n:
        return t
    return t[rows]


def counted_rows(loss: nn.Module, positives: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Which rows of a B x C block ``loss`` averages over (bool, B): the loss's own ``counted_rows`` where it has
    one (BCE: every row), else the queries with a valid positive (the softmax losses of :mod:`xmc.losses`)."""
    own = getattr(loss, "counted_rows", None)
    if own is not None:
        return own(positives, valid)
    pos = positives.bool()
    if valid is not None:
        pos = pos & valid.bool()
    return pos.any(1)


class Objective(nn.Module):
    """Loss of one candidate batch. ``last_parts`` (name -> float) is logged next to the loss curve."""

    #: True when the objective scores a batch whose ``label_ids`` is None (all labels) itself;
    #: otherwise the trainer uses its gradient-cached all-labels path with ``self.loss``.
    handles_all_labels: bool = False
    #: True when, across ranks, ``forward`` returns this rank's share of the batch loss (module doc).
    shards_rows: bool = False

    def __init__(self) -> None:
        super().__init__()
        self.last_parts: dict[str, float] = {}
        self.dist = DistContext()   # set by the trainer: this process's place in a data-parallel run

    def rows(self, n: int) -> slice:
        """This rank's rows of an ``n``-row batch (all of them in one process or without ``shards_rows``)."""
        if not (self.shards_rows and self.dist.active):
            return slice(0, n)
        return slice(*shard_bounds(n, self.dist.world, self.dist.rank))

    def replicated(self, value: torch.Tensor) -> torch.Tensor:
        """The share of a term every rank computes whole (a small regulariser): ``value / world``."""
        return value / self.dist.world if self.shards_rows and self.dist.active else value

    @staticmethod
    def share(loss: nn.Module, counted: torch.Tensor, rows: slice, scores: torch.Tensor, positives: torch.Tensor,
              valid: torch.Tensor | None = None, weights: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's share of a loss that averages over the ``counted`` rows of the batch (bool, B): ``loss`` of
        its rows (``scores``: already only those rows; ``positives``/``valid``/``weights``: the whole batch's) times
        the fraction of the counted rows they are. The shares of a partition of the rows sum to the loss."""
        n = counted.shape[0]
        total = int(counted.sum())
        mine = int(counted[rows].sum())
        if mine == 0 or total == 0:
            return scores.sum() * 0.0   # no term, but the graph still reaches the gathers (their backward is a collective)
        part = loss(scores, row_slice(positives, rows, n), row_slice(valid, rows, n), row_slice(weights, rows, n))
        return part * (mine / total)

    def forward(self, model: nn.Module, batch: CandidateBatch, query_texts: Sequence[str]) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def targets(batch: CandidateBatch, device: torch.device) -> tuple[torch.Tensor, Any, Any]:
        pos = batch.positives.to(device)   # sparse for the all-labels batch (see Trainer._all_labels_step)
        valid = batch.valid.to(device) if batch.valid is not None else None
        weights = batch.weights.to(device) if batch.weights is not None else None
        return pos, valid, weights


class RetrievalObjective(Objective):
    """Dual encoder: scores = query vectors · label vectors of the pool, then ``loss``; across ranks each scores
    its rows of the batch against the whole pool (the global in-batch and hard negatives)."""

    shards_rows = True

    def __init__(self, loss: nn.Module) -> None:
        super().__init__()
        self.loss = loss

    def forward(self, model: nn.Module, batch: CandidateBatch, query_texts: Sequence[str]) -> torch.Tensor:
        texts = take_texts(query_texts, batch.query_idx)
        if hasattr(model, "pair_vectors"):
            q, z = model.pair_vectors(texts, batch.label_ids)
        else:
            q, z = model.query_vectors(texts), model.label_vectors(batch.label_ids)
        pos, valid, weights = self.targets(batch, q.device)
        rows = self.rows(len(q))
        return self.share(self.loss, counted_rows(self.loss, pos, valid), rows, (q[rows] @ z.T).float(), pos, valid,
                          weights)
