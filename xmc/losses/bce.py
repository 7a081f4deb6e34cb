"""One-vs-all binary cross-entropy (DEXML eq. 2) over the candidate labels.

l_i = -sum_j w_ij [ y_ij log sigmoid(s_ij) + (1 - y_ij) log(1 - sigmoid(s_ij)) ], averaged over queries.

``weights`` make it an importance-weighted estimate of the full one-vs-all loss when the
candidates are a sample of the labels (ASTRA's uniform negatives).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xmc.losses._common import prepare


class OneVsAllBCELoss(nn.Module):
    def __init__(self, temperature: float = 1.0, bias: float = 0.0) -> None:
        super().__init__()
        self.temperature = temperature
        self.bias = bias

    def forward(self, scores: torch.Tensor, positives: torch.Tensor, valid: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        logits, pos, valid = prepare(scores, positives, valid, self.temperature)
        per = F.binary_cross_entropy_with_logits(logits + self.bias, pos.float(), reduction="none")
        if weights is not None:
            per = per * weights
        return (per * valid).sum(1).mean()

    @staticmethod
    def counted_rows(positives: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """The rows the loss averages over (a data-parallel rank's share, :mod:`xmc.trainer.objective`): all."""
        return torch.ones(positives.shape[0], dtype=torch.bool, device=positives.device)
