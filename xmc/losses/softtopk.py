"""SoftTop-k loss (DEXML eq. 6) with the bisection forward and implicit-gradient backward (App. B.7).

SoftTop-k(x)_i = sigmoid(alpha (x_i + t)), with t such that sum_i SoftTop-k(x)_i = k, found by
bisection. The backward uses implicit differentiation of that constraint:
d log z_l / d x_i = alpha (1 - z_l) (1[i=l] - v_i / sum_j v_j),  v = alpha z (1 - z).
"""

from __future__ import annotations

import torch
from torch import nn

from xmc.losses._common import NEG_INF, mean_over_positives, prepare


class _LogSoftTopK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, k: float, alpha: float, n_iter: int) -> torch.Tensor:
        lo = -x.max(dim=1, keepdim=True).values - 10.0 / alpha
        hi = -x.min(dim=1, keepdim=True).values + 10.0 / alpha
        for _ in range(n_iter):
            mid = (lo + hi) / 2
            s = torch.sigmoid(alpha * (x + mid)).sum(dim=1, keepdim=True)
            below = s < k
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        t = (lo + hi) / 2
        logits = alpha * (x + t)
        ctx.save_for_backward(logits)
        ctx.alpha = alpha
        return logits - torch.logaddexp(logits, torch.zeros_like(logits))  # log sigmoid

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (logits,) = ctx.saved_tensors
        alpha = ctx.alpha
        sig = torch.sigmoid(logits)
        v = alpha * sig * (1 - sig)
        s = v.sum(dim=1, keepdim=True)
        uv = grad_out * alpha * (1 - sig)
        uv_sum = uv.sum(dim=1, keepdim=True)
        return uv - uv_sum * v / s, None, None, None


def log_soft_topk(x: torch.Tensor, k: float, alpha: float = 2.0, n_iter: int = 32) -> torch.Tensor:
    """log SoftTop-k(x) row-wise; requires 0 < k < x.shape[1]."""
    if not 0 < k < x.shape[1]:
        raise ValueError(f"SoftTop-k needs 0 < k < number of candidates ({x.shape[1]}), got k={k}")
    return _LogSoftTopK.apply(x, float(k), float(alpha), int(n_iter))


def soft_topk(x: torch.Tensor, k: float, alpha: float = 2.0, n_iter: int = 32) -> torch.Tensor:
    return log_soft_topk(x, k, alpha, n_iter).exp()


class SoftTopKLoss(nn.Module):
    """-(1/|P_i|) sum_{j in P_i} log SoftTop-k(s_i / tau)_j; zero once every positive is in the top-k."""

    def __init__(self, k: int = 5, alpha: float = 2.0, temperature: float = 1.0, n_iter: int = 32) -> None:
        super().__init__()
        self.k, self.alpha, self.temperature, self.n_iter = k, alpha, temperature, n_iter

    def forward(self, scores: torch.Tensor, positives: torch.Tensor, valid: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        logits, pos, valid = prepare(scores, positives, valid, self.temperature)
        k = min(self.k, int(valid.sum(1).min().item()) - 1)
        logz = log_soft_topk(logits.masked_fill(~valid, NEG_INF / self.alpha), k, self.alpha, self.n_iter)
        per_pair = -logz
        return mean_over_positives(per_pair, pos, weights)
