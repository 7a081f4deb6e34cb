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

    def from_positives(self, pos_scores: torch.Tensor, pos_ok: torch.Tensor, neg_lse: torch.Tensor) -> torch.Tensor:
        """The loss from each query's positive scores (B x P, ``pos_ok`` marks real ones) and the log-sum-exp of
        its negatives' logits (B,): the all-labels step streams the normaliser over label chunks and never holds
        the B x L scores (equal to :meth:`forward` on the full block, with every label valid)."""
        logits = pos_scores.to(torch.promote_types(pos_scores.dtype, torch.float32)) / self.temperature
        per_pair = torch.logaddexp(logits, neg_lse[:, None]) - logits
        return mean_over_positives(per_pair, pos_ok.bool(), None)

    def label_sharded(self, scores: torch.Tensor, positives: torch.Tensor, valid: torch.Tensor | None,
                      weights: torch.Tensor | None, world: int) -> torch.Tensor:
        """The same loss when this rank holds only a slice of the label columns (all-labels mode across ranks):
        the negatives' log-sum-exp is combined from every rank's partial one, and the per-query sums over
        positives are summed across ranks, both with autograd collectives; every rank returns the global loss."""
        import torch.distributed as dist
        import torch.distributed.nn.functional as dfn

        logits, pos, valid = prepare(scores, positives, valid, self.temperature)
        neg = valid & ~pos
        local_lse = torch.logsumexp(logits.masked_fill(~neg, NEG_INF), dim=1, keepdim=True)   # (B, 1)
        neg_lse = torch.logsumexp(torch.cat(dfn.all_gather(local_lse), dim=1), dim=1, keepdim=True)
        per_pair = torch.logaddexp(logits, neg_lse) - logits
        if weights is not None:
            per_pair = per_pair * weights
        sums = dfn.all_reduce((per_pair * pos).sum(1))
        n_pos = pos.sum(1)
        dist.all_reduce(n_pos)
        has = n_pos > 0
        if not has.any():
            return sums.sum() * 0.0
        return (sums / n_pos.clamp(min=1))[has].mean()
