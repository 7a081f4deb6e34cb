"""What the trainer minimises on one batch.

The trainer calls ``objective(model, batch, query_texts) -> scalar`` and backpropagates; it
knows nothing else. :class:`RetrievalObjective` is the dual-encoder case (query·label scores
into a loss from :mod:`xmc.losses`); a method with two heads, graph regularisers or pseudo
pairs writes its own objective and reuses the same trainer, optimiser, schedule and checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from xmc.data.columns import take_texts
from xmc.negatives.base import CandidateBatch


class Objective(nn.Module):
    """Loss of one candidate batch. ``last_parts`` (name -> float) is logged next to the loss curve."""

    #: True when the objective scores a batch whose ``label_ids`` is None (all labels) itself;
    #: otherwise the trainer uses its gradient-cached all-labels path with ``self.loss``.
    handles_all_labels: bool = False

    def __init__(self) -> None:
        super().__init__()
        self.last_parts: dict[str, float] = {}

    def forward(self, model: nn.Module, batch: CandidateBatch, query_texts: Sequence[str]) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def targets(batch: CandidateBatch, device: torch.device) -> tuple[torch.Tensor, Any, Any]:
        pos = batch.positives.to(device)   # sparse for the all-labels batch (see Trainer._all_labels_step)
        valid = batch.valid.to(device) if batch.valid is not None else None
        weights = batch.weights.to(device) if batch.weights is not None else None
        return pos, valid, weights


class RetrievalObjective(Objective):
    """Dual encoder: scores = query vectors · label vectors of the pool, then ``loss``."""

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
        return self.loss((q @ z.T).float(), pos, valid, weights)
