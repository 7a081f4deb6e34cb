"""What machine a time was measured on: the CPU, its vector instructions and a measured matrix-product rate.

Training and prediction times are only comparable on the same hardware: the same 2-core box measured a float32
matrix product at 177 GFLOP/s on one day and 75 GFLOP/s on another (docs/pipeline.md, "Run time"), and every
MiniLM stage took 2.7-2.9x longer. Records that carry a time also carry this description.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def vector_isa() -> str:
    """The widest x86 vector extension the CPU reports (avx512f, avx2, ...), or the architecture elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    for isa in ("amx_tile", "avx512_bf16", "avx512f", "avx2", "avx", "sse4_2"):
        if isa in flags:
            return isa
    return platform.machine()


def matmul_gflops(seconds: float = 0.5, n: int = 2048) -> float:
    """float32 matrix-product rate of torch on this process's threads (best of repeated n x n products)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b   # warm-up: thread pool and kernels
    best, t_end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e9


def describe_machine(measure: bool = True) -> dict[str, Any]:
    """CPU model, cores, vector extension, torch threads and (``measure``) the matrix-product rate."""
    import torch

    out: dict[str, Any] = {"cpu": cpu_model(), "cores": os.cpu_count(), "vector_isa": vector_isa(),
                           "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    if measure:
        out["matmul_GFLOPs"] = round(matmul_gflops(), 1)
    return out
