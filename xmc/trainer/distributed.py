"""Data-parallel training of the one trainer on ``torch.distributed`` (gloo on CPU, NCCL on GPUs).

Every rank draws the same global batch and candidate pool (samplers are seeded by (seed, epoch, step), not by
rank). The encoding is split: a transformer encodes its contiguous share of every text list it sees (queries and
pool labels, in training and in the ANN refresh), and the shares are all-gathered *with their gradients*; a
bag-of-words table is split by its rows instead (``HashedBagOfWordsEncoder.shard_buckets``: each rank sums its own
buckets of every text and the partial bags are all-reduced, so no table gradient crosses ranks). Either way each
rank holds the global query and label vectors — cross-device negatives: the in-batch, hard-negative and
all-label pools are the global ones (DEXML §3). The loss is split too: an objective that shards rows
(``Objective.shards_rows``, every method's) scores only this rank's rows of the batch against the global pool and
returns its share of the batch loss (the shares sum to the loss), which the trainer backpropagates as it is; an
objective that does not computes the whole loss on every rank and the trainer backpropagates ``loss / world``.
Either way the gathers' backward hands each rank the gradient of its own encoded share (summed over ranks), so
after one all-reduce (sum) of every parameter gradient, dense and sparse alike, each rank holds exactly the
single-process gradient and takes the same optimiser step: parameters stay equal without broadcasting them.

Launch: ``torchrun --nproc_per_node N -m stages.train <run>`` (``stages.train`` does it itself when the run's
``train.distributed.nproc_per_node`` > 1). Rank 0 writes checkpoints, logs, the live record and the model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from xmc.encoders.base import TextEncoder
from xmc.parallel import DistContext, context, gather_rows, init_from_env, initialised_context, shard_bounds


class ShardedForward:
    """Replaces an encoder's ``forward`` for the run: this rank encodes its share, the shares are gathered."""

    def __init__(self, encoder: nn.Module, ctx: DistContext) -> None:
        self.encoder, self.ctx = encoder, ctx
        self.inner: Callable[..., torch.Tensor] = encoder.forward

    local = False   # True inside :func:`encode_locally`: this rank encodes what it is given, nothing is gathered

    def __call__(self, texts: list[str], side: str = "query") -> torch.Tensor:
        n = len(texts)
        if n == 0 or self.local:
            return self.inner(texts, side)
        lo, hi = shard_bounds(n, self.ctx.world, self.ctx.rank)
        if hi > lo:
            local = self.inner(list(texts[lo:hi]), side)
        else:   # fewer texts than ranks: an empty share of the right width
            local = self.inner(list(texts[:1]), side)[:0]
        return gather_rows(local, n, self.ctx.world)


def shard_encoders(model: nn.Module, ctx: DistContext) -> list[nn.Module]:
    """Every text encoder inside ``model`` divides its work across the ranks (see the module doc); returns them.
    A bag-of-words table splits by its rows (``shard_buckets``: every rank sees every text, each sums its own
    buckets, no table gradient crosses ranks); any other encoder encodes its rank's share of the texts and
    gathers the vectors."""
    encoders = [m for m in model.modules() if isinstance(m, TextEncoder)]
    for enc in encoders:
        if hasattr(enc, "shard_buckets"):
            if not enc.bucket_sharded:
                enc.shard_buckets(ctx)
        elif not isinstance(enc.forward, ShardedForward):
            enc.forward = ShardedForward(enc, ctx)   # instance attribute: nn.Module.__call__ finds it
    return encoders


def unshard_encoders(model: nn.Module) -> None:
    """The end of a data-parallel training: row-split tables are made whole on every rank (a collective)."""
    for m in model.modules():
        if getattr(m, "bucket_sharded", False):
            m.unshard_buckets()


def bucket_sharded(model: nn.Module) -> bool:
    """Whether an encoder of ``model`` splits its table by rows (its bags are collectives: every rank must encode
    the same texts)."""
    return any(getattr(m, "bucket_sharded", False) for m in model.modules())


class encode_locally:
    """Within it, the model's sharded encoders encode only what this rank passes them (its own label slice in the
    label-sharded all-labels step), with no gather."""

    def __init__(self, model: nn.Module) -> None:
        self.forwards = [m.forward for m in model.modules() if isinstance(getattr(m, "forward", None), ShardedForward)]

    def __enter__(self) -> None:
        for f in self.forwards:
            f.local = True

    def __exit__(self, *exc: object) -> None:
        for f in self.forwards:
            f.local = False


def all_reduce_gradients(params: list[nn.Parameter], ctx: DistContext) -> None:
    """Sum every parameter's gradient over the ranks (sparse gradients as sparse tensors). Rows of a label-sharded
    table (``label_sharded``, :mod:`xmc.trainer.label_table`) already hold their whole gradient and stay local."""
    params = [p for p in params if not getattr(p, "label_sharded", False)]
    dense = [p.grad for p in params if p.grad is not None and not p.grad.is_sparse]
    if dense:
        flat = torch.cat([g.reshape(-1) for g in dense])   # one collective for all dense gradients
        dist.all_reduce(flat)
        offset = 0
        for g in dense:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
    for p in params:
        if p.grad is not None and p.grad.is_sparse:
            p.grad = _sum_sparse(p.grad.coalesce(), ctx)


def _sum_sparse(g: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """The sum over ranks of a sparse COO gradient: every rank's (rows, values) gathered (padded to the largest
    count) and added up; only the rows some rank touched travel, never the whole table."""
    idx, val = g.indices(), g.values()
    counts = [torch.zeros(1, dtype=torch.long, device=idx.device) for _ in range(ctx.world)]
    dist.all_gather(counts, torch.tensor([idx.shape[1]], dtype=torch.long, device=idx.device))
    m = int(max(c.item() for c in counts))
    pad_i = torch.cat([idx, idx.new_zeros((idx.shape[0], m - idx.shape[1]))], 1)
    pad_v = torch.cat([val, val.new_zeros((m - val.shape[0], *val.shape[1:]))])
    all_i = [torch.empty_like(pad_i) for _ in range(ctx.world)]
    all_v = [torch.empty_like(pad_v) for _ in range(ctx.world)]
    dist.all_gather(all_i, pad_i.contiguous())
    dist.all_gather(all_v, pad_v.contiguous())
    n = [int(c.item()) for c in counts]
    return torch.sparse_coo_tensor(torch.cat([a[:, :k] for a, k in zip(all_i, n)], 1),
                                   torch.cat([v[:k] for v, k in zip(all_v, n)]), g.shape).coalesce()


def all_equal(values: list[int], ctx: DistContext) -> bool:
    """Whether every rank holds the same integers."""
    t = torch.tensor(values, dtype=torch.long)
    lo, hi = t.clone(), t.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    return bool(torch.equal(lo, hi))


def barrier(ctx: DistContext) -> None:
    if ctx.active and dist.is_initialized():
        dist.barrier()


__all__ = ["DistContext", "ShardedForward", "all_equal", "all_reduce_gradients", "barrier", "bucket_sharded", "context",
           "encode_locally", "gather_rows", "init_from_env", "initialised_context", "shard_bounds", "shard_encoders",
           "unshard_encoders"]
