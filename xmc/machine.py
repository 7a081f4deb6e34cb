"""What machine a time was measured on: the CPU, its vector instructions and a measured matrix-product rate.

Training and prediction times are only comparable on the same hardware: the same 2-core box measured a float32
matrix product at 177 GFLOP/s on one day and 75 GFLOP/s on another (docs/pipeline.md, "Run time"), and every
MiniLM stage took 2.7-2.9x longer. Records that carry a time also carry this description.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
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
    import torch   # imported here: set_threads must be able to run before torch loads (and without it)

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
    import torch   # imported here: set_threads must be able to run before torch loads (and without it)

    out: dict[str, Any] = {"cpu": cpu_model(), "cores": os.cpu_count(), "vector_isa": vector_isa(),
                           "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    if measure:
        out["matmul_GFLOPs"] = round(matmul_gflops(), 1)
    return out


# ------------------------------------------------------------------------------------------------
# threads of this process
# ------------------------------------------------------------------------------------------------
def set_threads() -> None:
    """Use every core the machine (or ``XMC_THREADS``) gives this process: its share, under data parallelism.

    Sets torch's threads now if torch is loaded, else when it loads: a stage that never needs torch (the
    baselines, name matching) does not pay the ~2 s of importing it just to set a thread count. Idle OpenMP
    workers spin briefly before they sleep (:func:`short_openmp_spin`), so they leave the cores to the work; MKL
    computes the same bits in every run (:func:`reproducible_mkl`)."""
    short_openmp_spin()
    reproducible_mkl()
    world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    n = max(1, int(os.environ.get("XMC_THREADS", os.cpu_count() or 1)) // world)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
        return
    for finder in sys.meta_path:
        if isinstance(finder, _ThreadsWhenTorchLoads):
            finder.threads = n
            return
    sys.meta_path.insert(0, _ThreadsWhenTorchLoads(n))


def reproducible_mkl() -> bool:
    """Set ``MKL_CBWR=AUTO`` (MKL's conditional numerical reproducibility) for this process and its children: without
    it MKL picks its kernels by the arrays' memory alignment, which differs from run to run, so a bag-of-words training
    on 2 threads came out different in its last bits each time (a different final loss after 10 epochs) whenever the
    process's heap was laid out differently (measured: three runs, three results; with it, the same weights each
    time). MKL reads it when it first computes, so this goes before any training step. A user's setting is kept.
    True when it was set here."""
    if "MKL_CBWR" in os.environ:
        return False
    os.environ["MKL_CBWR"] = "AUTO"
    return True


# Busy-wait iterations of an idle OpenMP worker before it sleeps. libgomp's default, 300,000 (several ms), keeps
# torch's idle workers (and faiss's: it ships its own libgomp) spinning between a step's operations, on the cores
# that the C kernels' threads (xmc/native) and the other library's pool then need: on 2 cores a bag-of-words step's
# RowAdam update took twice as long (bench/openmp_spin.py times the training loops with either setting).
OPENMP_SPIN_COUNT = 20000


def short_openmp_spin() -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`OPENMP_SPIN_COUNT` for the OpenMP runtimes this process loads from now on
    (libgomp reads it when it loads: torch's, faiss's, scikit-learn's), and for its child processes. A setting of
    the user's (``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` in the environment) is kept. True when it was set here."""
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return False
    os.environ["GOMP_SPINCOUNT"] = str(OPENMP_SPIN_COUNT)
    return True


class _ThreadsWhenTorchLoads:
    """An import hook (``sys.meta_path``) that calls ``torch.set_num_threads`` right after torch is imported,
    then removes itself. It finds torch with the other finders and only wraps the loader's ``exec_module``."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)   # one shot, and no recursion in the lookup below
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenSetThreads(spec.loader, self.threads)
        return spec


class _ThenSetThreads:
    def __init__(self, loader: Any, threads: int) -> None:
        self.loader, self.threads = loader, threads

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        module.set_num_threads(self.threads)

    def __getattr__(self, name: str) -> Any:   # anything else a loader offers (get_resource_reader, is_package...)
        return getattr(self.loader, name)
