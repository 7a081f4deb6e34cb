"""Each loss and its gradient against a brute-force version of the paper's formula."""

from __future__ import annotations

import math

import pytest
import torch

from xmc.losses import DecoupledSoftmaxLoss, OneVsAllBCELoss, SoftmaxLoss, SoftTopKLoss, log_soft_topk, soft_topk


def _case(seed=0, B=4, C=9):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, C, generator=g, dtype=torch.float64)
    pos = torch.rand(B, C, generator=g) < 0.3
    pos[:, 0] = True  # every query has a positive
    pos[0] = False
    pos[0, 2] = True
    return scores, pos


def brute_decoupled(scores, pos, tau):
    total, n = 0.0, 0
    for i in range(scores.shape[0]):
        P = [j for j in range(scores.shape[1]) if pos[i, j]]
        if not P:
            continue
        neg = [l for l in range(scores.shape[1]) if not pos[i, l]]
        li = 0.0
        for j in P:
            sj = scores[i, j] / tau
            denom = torch.exp(sj) + sum(torch.exp(scores[i, l] / tau) for l in neg)
            li = li - torch.log(torch.exp(sj) / denom)
        total = total + li / len(P)
        n += 1
    return total / n


def brute_softmax(scores, pos, tau):
    total, n = 0.0, 0
    for i in range(scores.shape[0]):
        P = [j for j in range(scores.shape[1]) if pos[i, j]]
        if not P:
            continue
        denom = sum(torch.exp(scores[i, l] / tau) for l in range(scores.shape[1]))
        total = total + sum(-torch.log(torch.exp(scores[i, j] / tau) / denom) for j in P) / len(P)
        n += 1
    return total / n


def brute_bce(scores, pos, w):
    total = 0.0
    for i in range(scores.shape[0]):
        for j in range(scores.shape[1]):
            p = 1 / (1 + torch.exp(-scores[i, j]))
            y = float(pos[i, j])
            total = total - w[i, j] * (y * torch.log(p) + (1 - y) * torch.log(1 - p))
    return total / scores.shape[0]


@pytest.mark.parametrize("loss_cls,brute,seed", [(DecoupledSoftmaxLoss, brute_decoupled, 0), (SoftmaxLoss, brute_softmax, 1)])
@pytest.mark.parametrize("tau", [1.0, 0.1, 0.05])
def test_softmax_family_value_and_gradient(loss_cls, brute, seed, tau):
    s, pos = _case(seed)
    a = s.clone().requires_grad_(True)
    b = s.clone().requires_grad_(True)
    la = loss_cls(temperature=tau)(a, pos)
    lb = brute(b, pos, tau)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), rel=1e-6)
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_decoupled_softmax_gradient_matches_paper_appendix():
    # App. C.2.1: d l / d s_l = -(1 - sigma_il) for l in P_i, and sum_j e^{s_l}/(e^{s_j} + sum_neg e^{s_k}) otherwise
    s = torch.tensor([[2.0, 1.0, 0.5, -1.0]], dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([[True, True, False, False]])
    DecoupledSoftmaxLoss(temperature=1.0)(s, pos).backward()
    e = s.detach().exp()[0]
    neg = e[2] + e[3]
    sig0, sig1 = e[0] / (e[0] + neg), e[1] / (e[1] + neg)
    expected = torch.tensor([-(1 - sig0), -(1 - sig1), e[2] / (e[0] + neg) + e[2] / (e[1] + neg),
                             e[3] / (e[0] + neg) + e[3] / (e[1] + neg)], dtype=torch.float64) / 2  # / |P_i|
    assert torch.allclose(s.grad[0], expected, atol=1e-9)


def test_decoupled_equals_infonce_with_one_positive_per_query():
    g = torch.Generator().manual_seed(3)
    s = torch.randn(5, 12, generator=g, dtype=torch.float64)
    pos = torch.zeros(5, 12, dtype=torch.bool)
    pos[torch.arange(5), torch.tensor([0, 3, 7, 11, 2])] = True
    a = DecoupledSoftmaxLoss(0.1)(s, pos)
    b = SoftmaxLoss(0.1)(s, pos)
    assert a.item() == pytest.approx(b.item(), rel=1e-9)


def test_decoupled_differs_from_infonce_with_several_positives_and_prefers_confident_positives():
    s = torch.tensor([[5.0, 5.0, -5.0, -5.0]], dtype=torch.float64)
    pos = torch.tensor([[True, True, False, False]])
    assert DecoupledSoftmaxLoss(1.0)(s, pos).item() < 1e-3  # both positives far above negatives: ~0
    assert SoftmaxLoss(1.0)(s, pos).item() == pytest.approx(math.log(2), rel=1e-3)  # capped at sigma = 1/|P|


def test_invalid_candidates_are_ignored():
    s, pos = _case(2)
    valid = torch.ones_like(pos)
    valid[:, -2:] = False
    ref = DecoupledSoftmaxLoss(0.5)(s[:, :-2], pos[:, :-2])
    s2 = s.clone()
    s2[:, -2:] = 1e3  # huge scores on padding must not matter
    assert DecoupledSoftmaxLoss(0.5)(s2, pos, valid).item() == pytest.approx(ref.item(), rel=1e-6)


def _decoupled_composition(scores, positives, valid, weights, tau):
    """The loss written as torch operations under autograd (its form before the fused block): the reference."""
    from xmc.losses._common import NEG_INF, mean_over_positives, prepare

    logits, pos, valid = prepare(scores, positives, valid, tau)
    neg_lse = torch.logsumexp(logits.masked_fill(~(valid & ~pos), NEG_INF), dim=1, keepdim=True)
    return mean_over_positives(torch.logaddexp(logits, neg_lse) - logits, pos, weights)


@pytest.mark.parametrize("with_valid", [False, True])
@pytest.mark.parametrize("weight_shape", [None, "full", "per_query"])
def test_decoupled_fused_block_equals_the_composition(with_valid, weight_shape):
    # rows: one without positives, one whose candidates are all positives (no negatives), one with a single
    # negative, the rest random; weights per pair or per query; some candidates invalid
    g = torch.Generator().manual_seed(11)
    s = torch.randn(7, 30, generator=g, dtype=torch.float64) * 3
    pos = torch.rand(7, 30, generator=g) < 0.2
    pos[0] = False
    pos[1] = True
    pos[2] = True
    pos[2, 5] = False
    pos[3:, 0] = True
    valid = (torch.rand(7, 30, generator=g) > 0.1) if with_valid else None
    if valid is not None:
        valid[2, 5] = True
    w = {None: None, "full": torch.rand(7, 30, generator=g, dtype=torch.float64) + 0.5,
         "per_query": torch.rand(7, 1, generator=g, dtype=torch.float64) + 0.5}[weight_shape]
    a = s.clone().requires_grad_(True)
    b = s.clone().requires_grad_(True)
    la = DecoupledSoftmaxLoss(0.05)(a, pos, valid, w)
    lb = _decoupled_composition(b, pos, valid, w, 0.05)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), rel=1e-9)
    assert torch.allclose(a.grad, b.grad, atol=1e-12)
    assert a.grad[0].abs().max() == 0          # a query without positives moves nothing


def test_decoupled_without_any_positive_is_zero_with_zero_gradient():
    s = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    loss = DecoupledSoftmaxLoss(0.05)(s, torch.zeros(3, 5, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and s.grad.abs().max() == 0


def test_decoupled_low_precision_scores_get_a_gradient_of_their_dtype():
    s, pos = _case(5)
    a = s.to(torch.bfloat16).requires_grad_(True)
    la = DecoupledSoftmaxLoss(0.1)(a, pos)
    la.backward()
    assert la.dtype == torch.float32 and a.grad.dtype == torch.bfloat16
    ref = s.to(torch.bfloat16).double().requires_grad_(True)
    _decoupled_composition(ref, pos, None, None, 0.1).backward()
    assert torch.allclose(a.grad.double(), ref.grad, atol=2e-2)


def test_bce_value_gradient_and_weights():
    s, pos = _case(4)
    w = torch.rand(s.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64) + 0.5
    a = s.clone().requires_grad_(True)
    b = s.clone().requires_grad_(True)
    la = OneVsAllBCELoss()(a, pos, weights=w)
    lb = brute_bce(b, pos, w)
    la.backward()
    lb.backward()
    assert la.item() == pytest.approx(lb.item(), rel=1e-6)
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_softtopk_outputs_sum_to_k():
    x = torch.randn(6, 50, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 3
    for k in (1, 5, 20):
        z = soft_topk(x, k, alpha=2.0, n_iter=64)
        assert torch.allclose(z.sum(1), torch.full((6,), float(k), dtype=torch.float64), atol=1e-6)
        assert ((z > 0) & (z < 1)).all()


def test_softtopk_custom_backward_matches_autograd_through_closed_form_threshold():
    # brute force: t solved to high precision, then z = sigmoid(alpha (x + t(x))) with t's implicit gradient
    # obtained by autograd through a Newton-refined threshold: dt/dx from differentiating sum sigma = k
    torch.manual_seed(0)
    x = torch.randn(3, 15, dtype=torch.float64)
    g = torch.randn(3, 15, dtype=torch.float64)
    k, alpha = 4, 2.0
    a = x.clone().requires_grad_(True)
    (log_soft_topk(a, k, alpha, n_iter=100) * g).sum().backward()

    b = x.clone().requires_grad_(True)
    with torch.no_grad():
        t0 = torch.zeros(3, 1, dtype=torch.float64)
        lo, hi = -x.max(1, keepdim=True).values - 10 / alpha, -x.min(1, keepdim=True).values + 10 / alpha
        for _ in range(200):
            mid = (lo + hi) / 2
            below = torch.sigmoid(alpha * (x + mid)).sum(1, keepdim=True) < k
            lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
        t0 = (lo + hi) / 2
    # one Newton step written with autograd-visible x gives the exact first-order dependence of t on x
    f = torch.sigmoid(alpha * (b + t0)).sum(1, keepdim=True) - k
    fp = (alpha * torch.sigmoid(alpha * (b + t0)) * (1 - torch.sigmoid(alpha * (b + t0)))).sum(1, keepdim=True)
    t = t0 - f / fp.detach()
    (torch.nn.functional.logsigmoid(alpha * (b + t)) * g).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-7)


def test_softtopk_loss_zero_when_positives_in_top_k_and_rejects_bad_k():
    s = torch.tensor([[10.0, 9.0, -10.0, -10.0, -10.0, -10.0]])
    pos = torch.tensor([[True, True, False, False, False, False]])
    assert SoftTopKLoss(k=2, alpha=2.0)(s, pos).item() < 1e-6
    assert SoftTopKLoss(k=2, alpha=2.0)(-s, pos).item() > 5
    with pytest.raises(ValueError):
        log_soft_topk(torch.zeros(1, 3), 3)
