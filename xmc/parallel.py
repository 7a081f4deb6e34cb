"""This process's place in a data-parallel run (``torch.distributed``), without the training code.

Encoders and the ANN refresh ask whether they run under an initialised process group, and the samplers split and
gather their work (:func:`shard_bounds`, :func:`gather_rows`); the trainer (:mod:`xmc.trainer.distributed`) adds
sharded encoders and gradient reduction on top of this. What needs no torch (the launched ranks, shard bounds,
the rank's exit) is :mod:`xmc.ranks`, re-exported here.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dfn

from xmc.ranks import DistContext, exit_rank, launched_context, shard_bounds


def context() -> DistContext:
    """This process's place: from an initialised process group, else torchrun's environment, else one process."""
    if dist.is_available() and dist.is_initialized():
        return DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return launched_context()


def initialised_context() -> DistContext | None:
    """This process's place in an initialised process group of more than one rank; None otherwise."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return context()
    return None


def gather_rows(local: torch.Tensor, n: int, world: int) -> torch.Tensor:
    """All ranks' shares of an ``n``-row tensor, in rank order, with gradients flowing back to each share."""
    rows = -(-n // world)   # all_gather needs equal shapes: pad each share to ceil(n / world) rows
    pad = rows - local.shape[0]
    padded = torch.cat([local, local.new_zeros((pad, *local.shape[1:]))]) if pad else local
    if torch.is_grad_enabled() and padded.requires_grad:
        parts = dfn.all_gather(padded)
    else:
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded.contiguous())
    out = []
    for r, part in enumerate(parts):
        lo, hi = shard_bounds(n, world, r)
        out.append(part[: hi - lo])
    return torch.cat(out)


def init_from_env(backend: str = "auto") -> DistContext:
    """Join the process group torchrun describes (no-op for one process); gloo on CPU, NCCL with CUDA."""
    ctx = context()
    if ctx.world > 1 and not dist.is_initialized():
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(ctx.local_rank)
        dist.init_process_group(backend=backend)
    return context()


__all__ = ["DistContext", "context", "exit_rank", "gather_rows", "init_from_env", "initialised_context",
           "shard_bounds"]
