"""Adam for large embedding tables with sparse (row) gradients, one fused pass per touched row.

The update is torch's :class:`~torch.optim.SparseAdam` (lazy Adam: only the rows a step touched move, with
the moments and bias correction of that rule), computed on the unique rows directly: gather the rows' two
moments, update them, write them back and add the step to the parameter rows. torch's implementation builds
three sparse tensors per table per step and masks the dense moments with them (``sparse_mask``), which took
most of a bag-of-words or ASTRA step on a CPU (``bench/bow_training_speed.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


class RowAdam(torch.optim.Optimizer):
    """Lazy Adam for parameters whose gradients are sparse COO row gradients (``nn.Embedding(sparse=True)``,
    ``nn.EmbeddingBag(sparse=True)``); a dense gradient updates every row (then it is plain Adam)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid RowAdam settings: lr={lr}, betas={betas}, eps={eps}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if g.is_sparse:
                    g = g.coalesce()  # duplicate rows summed: the update is non-linear in the gradient
                    rows, vals = g.indices()[0], g.values()
                    if vals.numel() == 0:
                        continue
                else:
                    rows, vals = None, g
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                m_all, v_all = state["exp_avg"], state["exp_avg_sq"]
                m = m_all.index_select(0, rows) if rows is not None else m_all
                v = v_all.index_select(0, rows) if rows is not None else v_all
                m.lerp_(vals, 1 - b1)                            # m <- b1 m + (1 - b1) g
                v.mul_(b2).addcmul_(vals, vals, value=1 - b2)    # v <- b2 v + (1 - b2) g^2
                if rows is not None:
                    m_all.index_copy_(0, rows, m)
                    v_all.index_copy_(0, rows, v)
                step = state["step"]
                step_size = lr * math.sqrt(1 - b2**step) / (1 - b1**step)
                update = m.div(v.sqrt().add_(eps))
                if rows is not None:
                    p.index_add_(0, rows, update, alpha=-step_size)
                else:
                    p.add_(update, alpha=-step_size)
        return loss
