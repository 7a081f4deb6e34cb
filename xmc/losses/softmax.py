"""Softmax / multi-label InfoNCE (DEXML eq. 4): softmax over all candidates, positives included.

l_i = -(1/|P_i|) sum_{j in P_i} log( e^{s_ij} / sum_{l in candidates} e^{s_il} )

With all labels as candidates this is SoftmaxCE (eq. 3); with one positive per query it
equals DecoupledSoftmax. Kept as the baseline DecoupledSoftmax improves on.
"""

from __future__ import annotations

import torch
from torch import nn

from xmc.losses._common import NEG_INF, mean_over_positives, prepare


class SoftmaxLoss(nn.Module):
    def __init__(self, temperature: float = 0.05) -> None:
        super().__init__()
        self.temperature = temperature

    def forward(self, scores: torch.Tensor, positives: torch.Tensor, valid: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        logits, pos, valid = prepare(scores, positives, valid, self.temperature)
        logp = torch.log_softmax(logits.masked_fill(~valid, NEG_INF), dim=1)
        per_pair = -logp
        return mean_over_positives(per_pair, pos, weights)
