"""Small C kernels for the CPU training step, compiled on first use with the machine's C compiler.

A kernel here does in one pass over memory what a chain of torch operations does in several (the roofline of a
bag-of-words or ASTRA step is its bytes moved: ``bench/bow_training_speed.py``). Each is plain C called through
ctypes (no torch headers, so building takes well under a second), cached per source, compiler and CPU under
``$XMC_NATIVE_CACHE`` (default ``~/.cache/xmc/native``) and written atomically. Where no compiler is found or
``XMC_NATIVE=0`` is set, callers get ``None`` and use their torch path, which computes the same rule.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

_SOURCES = Path(__file__).resolve().parent
# no contraction into fused multiply-adds: the kernels round as the torch path does; -fno-math-errno lets sqrtf
# vectorise (it changes no result)
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared", "-pthread"]
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def cache_dir() -> Path:
    root = os.environ.get("XMC_NATIVE_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "xmc" / "native"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(lines))


def _build(name: str) -> Path:
    src = _SOURCES / f"{name}.c"
    cc = _compiler()
    if cc is None:
        raise FileNotFoundError("no C compiler (cc, gcc or clang) on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\n".join([src.read_text(), " ".join(CFLAGS), version, platform.machine(),
                                    _cpu_signature()]).encode()).hexdigest()[:16]
    out = cache_dir() / f"{name}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        res = subprocess.run([cc, *CFLAGS, str(src), "-o", tmp, "-lm"], capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            first = (res.stderr.strip().splitlines() or ["(no message)"])[0]
            raise RuntimeError(f"{cc} could not build {src.name}: {first}")
        os.replace(tmp, out)   # another process building the same key writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def load(name: str) -> ctypes.CDLL | None:
    """The kernel library ``xmc/native/<name>.c``, built if needed; None (logged once) where it cannot be."""
    with _lock:
        if name in _loaded:
            return _loaded[name]
        lib = None
        if os.environ.get("XMC_NATIVE", "1") != "0":
            try:
                lib = ctypes.CDLL(str(_build(name)))
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                log.warning("native kernel %s unavailable, using the torch path: %s", name, e)
        _loaded[name] = lib
        return lib


def row_adam() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """``xmc_row_adam_f32(p, m, v, rows, g, n_rows, dim, 1 - b1, b2, 1 - b2, eps, step_size, threads)``, or None."""
    lib = load("row_adam")
    if lib is None:
        return None
    fn = lib.xmc_row_adam_f32
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 2 + [ctypes.c_float] * 5 + [ctypes.c_int]
    return fn


def row_adam_bf16m() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """``xmc_row_adam_bf16m(p, m, v, rows, g, n_rows, dim, 1 - b1, b2, 1 - b2, eps, step_size, keys, bits, threads)``
    (bfloat16 moments), or None."""
    lib = load("row_adam")
    if lib is None:
        return None
    fn = lib.xmc_row_adam_bf16m
    fn.restype = ctypes.c_int
    fn.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int64] * 2 + [ctypes.c_float] * 5 + [ctypes.c_void_p] * 2
                   + [ctypes.c_int])
    return fn


def trees_score() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """``xmc_trees_score(X, n_rows, n_features, feature, threshold, missing_left, left, right, value, tree_start,
    n_trees, baseline, out)``, or None."""
    lib = load("trees_score")
    if lib is None:
        return None
    fn = lib.xmc_trees_score
    fn.restype = None
    fn.argtypes = ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 7
                   + [ctypes.c_int64, ctypes.c_double, ctypes.c_void_p])
    return fn


def ngram_hash() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """``xmc_hash_ngrams_ascii(texts, offsets, n_texts, ngram_max, n_buckets, out_ids, out_counts, cap)``, or None."""
    lib = load("ngram_hash")
    if lib is None:
        return None
    fn = lib.xmc_hash_ngrams_ascii
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return fn
