"""DecoupledSoftmax (DEXML eq. 5): each positive against the negatives only.

l_i = -(1/|P_i|) sum_{j in P_i} log( e^{s_ij} / (e^{s_ij} + sum_{l not in P_i} e^{s_il}) )

Other positives are left out of each positive's denominator, so confident positives are
not penalised (InfoNCE pushes every positive towards 1/|P_i|). Divided by the number of
positives and averaged over queries, as in the DEXML code.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dfn
from torch import nn

from xmc.losses._common import NEG_INF, mean_over_positives, prepare


def _positions(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of the true entries of a B x C bool matrix, row-major (numpy's flatnonzero is several times
    faster than torch.nonzero on a CPU for the sparse masks of a batch)."""
    if pos.device.type == "cpu":
        flat = torch.from_numpy(np.flatnonzero(pos.contiguous().numpy()))
        return flat // pos.shape[1], flat % pos.shape[1]
    return pos.nonzero(as_tuple=True)


class _DecoupledSoftmaxBlock(torch.autograd.Function):
    """The loss of a B x C score block and its gradient in a few passes over the block.

    Written as a composition of torch operations, autograd makes about a dozen B x C passes (a masked fill, the
    log-sum-exp, a log-add-exp over every entry though only the positives' are used, their backwards); on a CPU
    they took about a fifth of a bag-of-words training step. Here the negatives' normaliser is computed once
    (masked with -inf, so the masked entries' exponentials are exactly 0), its exponentials are kept for the
    backward (the softmax over the negatives, scaled per row), and everything about the positives is computed on
    the few positive entries only. Same value and gradient as the composition (``tests/test_losses.py``)."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor,  # type: ignore[override]
                weights: torch.Tensor | None, temperature: float) -> torch.Tensor:
        s = scores.detach().to(torch.promote_types(scores.dtype, torch.float32))
        pi, pj = _positions(pos)
        pos_logits = s[pi, pj] / temperature
        masked = torch.where(neg, s, float("-inf"))
        mx = masked.amax(1)
        mx = torch.where(torch.isfinite(mx), mx, 0.0)        # a row without negatives: all -inf, exp -> 0
        exps = masked.sub_(mx[:, None]).mul_(1.0 / temperature).exp_()   # e^{(s_il - max) / tau}, 0 off negatives
        total = exps.sum(1)
        neg_lse = mx / temperature + total.log()             # -inf for a row without negatives
        lse_at = neg_lse[pi]
        per_pair = torch.logaddexp(pos_logits, lse_at) - pos_logits   # -log sigma_ij
        pair_w = weights.detach().expand_as(pos)[pi, pj].to(s.dtype) if weights is not None else None
        if pair_w is not None:
            per_pair = per_pair * pair_w
        n_pos = torch.bincount(pi, minlength=s.shape[0]).to(s.dtype)
        n_queries = int((n_pos > 0).sum())
        per_query = torch.zeros_like(total).index_add_(0, pi, per_pair) / n_pos.clamp(min=1)
        ctx.save_for_backward(exps, total, pi, pj, pos_logits, lse_at, n_pos, pair_w)
        ctx.temperature, ctx.n_queries, ctx.dtype = temperature, n_queries, scores.dtype
        return per_query.sum() / max(n_queries, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        exps, total, pi, pj, pos_logits, lse_at, n_pos, pair_w = ctx.saved_tensors
        tau = ctx.temperature
        c = grad.to(exps.dtype) / max(ctx.n_queries, 1) / n_pos[pi]    # d loss / d (-log sigma_ij)
        if pair_w is not None:
            c = c * pair_w
        # d(-log sigma_ij)/d lse_i = sigma(lse_i - l_ij) = -d(-log sigma_ij)/d l_ij
        share = c * torch.sigmoid(lse_at - pos_logits)
        row = torch.zeros_like(total).index_add_(0, pi, share)
        # d lse_i / d s_il = softmax over the negatives / tau; a row without negatives has no such term
        row = torch.where(total > 0, row / (tau * total.clamp(min=torch.finfo(total.dtype).tiny)), 0.0)
        g = exps.mul(row[:, None])
        g.index_put_((pi, pj), -share / tau, accumulate=True)
        return g.to(ctx.dtype), None, None, None, None


class DecoupledSoftmaxLoss(nn.Module):
    def __init__(self, temperature: float = 0.05) -> None:
        super().__init__()
        self.temperature = temperature

    def forward(self, scores: torch.Tensor, positives: torch.Tensor, valid: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        pos = positives.bool()
        if valid is None:
            neg = ~pos
        else:
            valid = valid.bool()
            pos = pos & valid
            neg = valid & ~pos
        return _DecoupledSoftmaxBlock.apply(scores, pos, neg, weights, self.temperature)

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
