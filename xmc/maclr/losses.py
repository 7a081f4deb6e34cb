"""MACLR Stage-I losses on L2-normalised vectors (scores divided by a temperature; the paper's
unnormalised tanh embeddings need none, ours are unit vectors so cosine/τ plays that role)."""

from __future__ import annotations

import torch


def supcon_loss(q: torch.Tensor, z: torch.Tensor, same: torch.Tensor, temperature: float,
                rows: slice | None = None) -> torch.Tensor:
    """Eq. 2: each context q_i against the batch's pseudo labels z_j; every p with the same cluster
    (``same[i, p]``, the diagonal always included) is a positive, averaged over P(i) and the batch.
    With ``same`` = identity this is Eq. 1 (ICT with in-batch negatives). ``rows``: only these contexts (a
    data-parallel rank's), averaged over them."""
    pos = same.bool() | torch.eye(len(q), dtype=torch.bool, device=q.device)
    if rows is not None:
        q, pos = q[rows], pos[rows]
    logits = (q @ z.T).float() / temperature
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    return (-(log_prob * pos).sum(1) / pos.sum(1)).mean()


def label_regularisation_loss(h: torch.Tensor, h_twin: torch.Tensor, labels: torch.Tensor,
                              temperature: float) -> torch.Tensor:
    """Eq. 3: an instance's dropout twin is its positive, M randomly drawn real labels its negatives:
    -log( e^{h·h+} / (e^{h·h+} + sum_j e^{h·y_j}) ), averaged over the batch."""
    pos = (h * h_twin).sum(1, keepdim=True).float() / temperature  # (N, 1)
    neg = (h @ labels.T).float() / temperature                     # (N, M)
    logits = torch.cat([pos, neg], dim=1)
    return (torch.logsumexp(logits, dim=1) - pos.squeeze(1)).mean()
