"""Scores of each query against its own candidate rows of a large table, with a sparse row gradient.

ASTRA scores every query against its own list of classifier rows (positives, hard and uniform negatives):
``s[b, c] = <q_b, W[ids[b, c]]>``. Gathering ``W[ids]`` as a B x C x d tensor and letting autograd reduce its
gradient back to the table (index backward, the embedding's sparse backward, a coalesce) moved that block several
times through slow scatter kernels: most of an ASTRA step on a CPU (``bench/bow_training_speed.py``). Here the
candidates are the pattern of a sparse B x L matrix ``G`` (row b holds its C candidate ids) and every product is a
sparse-dense kernel that reads the table rows in place:

* forward: ``s = (q Wᵀ) ⊙ pattern(G)``, a sampled matrix product (``torch.sparse.sampled_addmm``);
* backward, with the score gradients as ``G``'s values: ``∂q = G W`` and ``∂W[U] = G[:, U]ᵀ q`` over the step's
  distinct rows U, both as weighted bag sums. The table's gradient is one sparse tensor with a row per distinct
  candidate, in increasing order (coalesced), ready for the row-wise optimisers (:class:`~xmc.trainer.row_adam.RowAdam`,
  SGD).

A candidate listed twice for one query gets both entries' gradients, as through the gather (tested against it).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn.functional as F


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():   # "sparse CSR support is in beta": the kernels used here are tested
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


class _CandidateScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor,  # type: ignore[override]
                ids_np: np.ndarray) -> torch.Tensor:
        B, C = ids.shape
        crow = torch.arange(0, B * C + 1, C, dtype=torch.int64, device=ids.device)
        col = ids.reshape(-1)
        w = weight.detach()
        pattern = _csr(crow, col, w.new_zeros(B * C), (B, w.shape[0]))
        s = torch.sparse.sampled_addmm(pattern, q.detach().to(w.dtype), w.T, beta=0.0).values().view(B, C)
        ctx.save_for_backward(q, weight, crow, col)
        ctx.ids_np = ids_np
        return s.to(q.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        q, weight, crow, col = ctx.saved_tensors
        w = weight.detach()
        ids_np = ctx.ids_np
        B, C = ids_np.shape
        g = grad.reshape(-1).to(w.dtype).contiguous()
        grad_q = grad_w = None
        # both products are weighted bag sums (embedding_bag: the optimised CPU kernel, faster here than CSR @ dense)
        if ctx.needs_input_grad[0]:   # ∂q_b = Σ_c g[b, c] W[ids[b, c]]
            grad_q = F.embedding_bag(col, w, crow[:-1], mode="sum", per_sample_weights=g).to(q.dtype)
        if ctx.needs_input_grad[1]:   # ∂W[u] = Σ_{(b, c): ids[b, c] = u} g[b, c] q_b, the entries of each u together
            uniq, inv = np.unique(ids_np.reshape(-1), return_inverse=True)
            inv = inv.reshape(-1)
            order = np.argsort(inv, kind="stable")
            starts = np.zeros(len(uniq), np.int64)
            np.cumsum(np.bincount(inv, minlength=len(uniq))[:-1], out=starts[1:])
            dev = g.device
            values = F.embedding_bag(torch.from_numpy(order // C).to(dev), q.detach().to(w.dtype),
                                     torch.from_numpy(starts).to(dev), mode="sum",
                                     per_sample_weights=g[torch.from_numpy(order).to(dev)])
            grad_w = torch.sparse_coo_tensor(torch.from_numpy(uniq.astype(np.int64)).to(dev).unsqueeze(0),
                                             values, w.shape, is_coalesced=True, check_invariants=False)
        return grad_q, grad_w, None, None


def candidate_scores(q: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor | np.ndarray) -> torch.Tensor:
    """``s[b, c] = <q[b], weight[ids[b, c]]>`` (``ids``: B x C row ids in ``[0, len(weight))``). Under autograd,
    ``weight`` receives a sparse gradient with one row per distinct id (as ``nn.Embedding(sparse=True)`` gives)."""
    ids_np = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
    if ids_np.ndim != 2:
        raise ValueError(f"candidate ids must be B x C, not shape {ids_np.shape}")
    ids_np = ids_np.astype(np.int64, copy=False)
    if ids_np.size and (ids_np.min() < 0 or ids_np.max() >= weight.shape[0]):
        raise IndexError(f"candidate ids must lie in [0, {weight.shape[0]}), got [{ids_np.min()}, {ids_np.max()}]")
    ids_t = torch.from_numpy(np.ascontiguousarray(ids_np)).to(weight.device)
    if ids_np.size == 0:   # no candidates: the (empty) gather keeps the graph
        return torch.einsum("bd,bcd->bc", q, weight[ids_t])
    return _CandidateScores.apply(q, weight, ids_t, ids_np)
