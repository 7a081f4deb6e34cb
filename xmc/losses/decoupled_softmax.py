"""DecoupledSoftmax (DEXML eq. 5): each positive against the negatives only.

l_i = -(1/|P_i|) sum_{j in P_i} log( e^{s_ij} / (e^{s_ij} + sum_{l not in P_i} e^{s_il}) )

Other positives are left out of each positive's denominator, so confident positives are
not penalised (InfoNCE pushes every positive towards 1/|P_i|). Divided by the number of
positives and averaged over queries, as in the DEXML code.
"""

from __future__ import annotations

import torch
from torch import nn

from xmc.losses._common import NEG_INF, mean_over_positives, prepare


class DecoupledSoftmaxLoss(nn.Module):
    def __init__(self, temperature: float = 0.05) -> None:
        super().__init__()
        self.temperature = temperature

    def forward(self, scores: torch.Tensor, positives: torch.Tensor, valid: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        logits, pos, valid = prepare(scores, positives, valid, self.temperature)
        neg = valid & ~pos
        neg_lse = torch.logsumexp(logits.masked_fill(~neg, NEG_INF), dim=1, keepdim=True)  # (B, 1)
        # -log sigma_ij = logaddexp(s_ij, LSE_neg) - s_ij
        per_pair = torch.logaddexp(logits, neg_lse) - logits
        return mean_over_positives(per_pair, pos, weights)
