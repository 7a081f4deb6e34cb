from __future__ import annotations

import torch

NEG_INF = -1e4  # finite "minus infinity": keeps logsumexp and bisection bounds finite


def prepare(scores: torch.Tensor, positives: torch.Tensor, valid: torch.Tensor | None,
            temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # bf16/fp16 scores are promoted to fp32 for a stable logsumexp; fp64 stays fp64
    logits = scores.to(torch.promote_types(scores.dtype, torch.float32)) / temperature
    pos = positives.bool()
    if valid is None:
        valid = torch.ones_like(pos)
    valid = valid.bool()
    pos = pos & valid
    return logits, pos, valid


def mean_over_queries_with_positives(per_query: torch.Tensor, n_pos: torch.Tensor) -> torch.Tensor:
    has = n_pos > 0
    if not has.any():
        return per_query.sum() * 0.0
    return per_query[has].mean()


def mean_over_positives(per_pair: torch.Tensor, pos: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """(1/|P_i|) sum_{j in P_i} per_pair_ij (optionally weighted), averaged over queries with positives."""
    if weights is not None:
        per_pair = per_pair * weights
    n_pos = pos.sum(1)
    per_query = (per_pair * pos).sum(1) / n_pos.clamp(min=1)
    return mean_over_queries_with_positives(per_query, n_pos)
