"""The candidate-scores op (xmc.trainer.candidate_scores) against the autograd gather it replaces."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from xmc.trainer.candidate_scores import candidate_scores
from xmc.trainer.row_adam import RowAdam


def _gather_reference(q: torch.Tensor, table: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    return torch.einsum("bd,bcd->bc", q, table(ids))


@pytest.mark.parametrize("repeats", [False, True])
def test_scores_and_gradients_equal_the_gather(repeats):
    g = torch.Generator().manual_seed(0)
    L, d, B, C = 50, 7, 6, 9
    ids = torch.randint(0, L, (B, C), generator=g)
    if repeats:   # a candidate listed twice for one query, and rows shared across queries
        ids[0, 1] = ids[0, 0]
        ids[3] = ids[2]
    weights = torch.randn(B, C, generator=g)
    q0 = torch.randn(B, d, generator=g)
    ref_table, new_table = nn.Embedding(L, d, sparse=True), nn.Embedding(L, d, sparse=True)
    with torch.no_grad():
        new_table.weight.copy_(ref_table.weight)
    q_ref, q_new = q0.clone().requires_grad_(True), q0.clone().requires_grad_(True)
    s_ref = _gather_reference(q_ref, ref_table, ids)
    s_new = candidate_scores(q_new, new_table.weight, ids)
    torch.testing.assert_close(s_new, s_ref)
    (s_ref * weights).sum().backward()
    (s_new * weights).sum().backward()
    torch.testing.assert_close(q_new.grad, q_ref.grad)
    g_new = new_table.weight.grad
    assert g_new.is_sparse
    # one gradient row per distinct candidate, in order (already coalesced), and the same dense gradient
    assert g_new._indices()[0].tolist() == sorted(set(ids.reshape(-1).tolist()))
    torch.testing.assert_close(g_new.to_dense(), ref_table.weight.grad.coalesce().to_dense())


def test_row_adam_steps_equal_after_either_gradient():
    g = torch.Generator().manual_seed(1)
    L, d, B, C = 40, 5, 4, 6
    a, b = nn.Embedding(L, d, sparse=True), nn.Embedding(L, d, sparse=True)
    with torch.no_grad():
        b.weight.copy_(a.weight)
    opt_a, opt_b = RowAdam([a.weight], lr=0.1), RowAdam([b.weight], lr=0.1)
    for _ in range(3):
        ids = torch.randint(0, L, (B, C), generator=g)
        q = torch.randn(B, d, generator=g)
        for table, opt, fn in ((a, opt_a, lambda: _gather_reference(q, a, ids)),
                               (b, opt_b, lambda: candidate_scores(q, b.weight, ids))):
            opt.zero_grad()
            nn.functional.softplus(fn()).sum().backward()
            opt.step()
    torch.testing.assert_close(b.weight, a.weight)
    untouched = np.setdiff1d(np.arange(L), np.unique(ids.numpy()))
    assert len(untouched) > 0


def test_no_grad_scores_and_bad_shape():
    table = torch.randn(10, 3)
    q = torch.randn(2, 3)
    ids = torch.tensor([[0, 9], [4, 4]])
    with torch.no_grad():
        s = candidate_scores(q, table, ids)
    torch.testing.assert_close(s, torch.einsum("bd,bcd->bc", q, table[ids]))
    with pytest.raises(ValueError, match="B x C"):
        candidate_scores(q, table, torch.tensor([1, 2]))


def test_ids_out_of_range_are_refused():
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        candidate_scores(torch.randn(1, 3), torch.randn(10, 3), torch.tensor([[3, 10]]))
