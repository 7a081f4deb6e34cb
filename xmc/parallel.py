"""This process's place in a data-parallel run (``torch.distributed``), without the training code.

Encoders and the ANN refresh ask whether they run under an initialised process group; the trainer
(:mod:`xmc.trainer.distributed`) adds gathers, sharding and gradient reduction on top of this.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def context() -> DistContext:
    """This process's place: from an initialised process group, else torchrun's environment, else one process."""
    if dist.is_available() and dist.is_initialized():
        return DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return DistContext(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                       int(os.environ.get("LOCAL_RANK", 0)))


def initialised_context() -> DistContext | None:
    """This process's place in an initialised process group of more than one rank; None otherwise."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return context()
    return None


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


__all__ = ["DistContext", "context", "init_from_env", "initialised_context"]
