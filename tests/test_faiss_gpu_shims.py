"""The pieces that put faiss-gpu on the lent GPU machine (lab/bench/faiss_gpu/): the fat-binary pruner keeps one
architecture's code in a real shared library, and the cuBLAS 12 / BLAS shims forward each call to the library they
are pointed at. Built with the system C compiler; no GPU needed."""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from lab.bench.faiss_gpu.fatbin import FATBIN_MAGIC, entries, keep_only
from lab.bench.gpu_profiles import SHIM, epoch_seconds

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs a C compiler")


def _gcc(out: Path, source: Path, *flags: str) -> Path:
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(out), str(source), *flags], check=True)
    return out


def _fatbin(parts: list[tuple[int, int, bytes]]) -> bytes:
    """A fat binary: its header, then per part (kind 1 PTX / 2 ELF, sm arch, payload) a 64-byte entry header."""
    body = b""
    for kind, arch, payload in parts:
        head = struct.pack("<HHIQ", kind, 0, 64, len(payload)) + bytes(12) + struct.pack("<I", arch)
        body += head + bytes(64 - len(head)) + payload
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def _library_with_fatbin(tmp_path: Path, parts: list[tuple[int, int, bytes]]) -> Path:
    blob = _fatbin(parts)
    src = tmp_path / "kernels.c"
    src.write_text("__attribute__((section(\".nv_fatbin\"), used, aligned(8))) const unsigned char fatbin[] = {"
                   + ",".join(str(b) for b in blob) + "};\nint answer(void) { return 42; }\n")
    return _gcc(tmp_path / "libkernels.so", src)


def test_keep_only_blanks_the_other_architectures_and_the_library_still_loads(tmp_path):
    sm80, sm90, ptx = b"\x80" * 96, b"\x90" * 128, b"// ptx\n" * 9
    lib = _library_with_fatbin(tmp_path, [(2, 80, sm80), (2, 90, sm90), (1, 90, ptx)])
    size = lib.stat().st_size
    assert [(k, a, n) for k, a, _, n in entries(lib.read_bytes())] == [("elf", 80, 96), ("elf", 90, 128),
                                                                        ("ptx", 90, len(ptx))]
    seen = keep_only(lib, 90)
    assert seen == {("blanked", "elf", 80): 1, ("kept", "elf", 90): 1, ("blanked", "ptx", 90): 1}
    data = lib.read_bytes()
    payload = {(k, a): data[s : s + n] for k, a, s, n in entries(data)}
    assert payload[("elf", 90)] == sm90
    assert payload[("elf", 80)] == bytes(96) and payload[("ptx", 90)] == bytes(len(ptx))
    assert lib.stat().st_size == size
    assert ctypes.CDLL(str(lib)).answer() == 42   # the headers and the ELF layout are untouched

    (tmp_path / "b").mkdir()
    only80 = _library_with_fatbin(tmp_path / "b", [(2, 80, sm80)])
    with pytest.raises(ValueError, match="no sm_90 code"):
        keep_only(only80, 90)
    assert entries(only80.read_bytes())[0][3] == 96 and b"\x80" * 96 in only80.read_bytes()   # left as it was


def test_the_cublas_shim_exports_cublas12_symbols_and_forwards_to_the_library_named(tmp_path, monkeypatch):
    shim = _gcc(tmp_path / "libcublas.so.12", SHIM / "cublas12_shim.c", "-Wl,-soname,libcublas.so.12",
                f"-Wl,--version-script={SHIM / 'cublas12.map'}", "-ldl")
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(shim)], capture_output=True, text=True,
                          check=True).stdout
    for name in ("cublasCreate_v2", "cublasGemmEx", "cublasSgemmEx", "cublasSetStream_v2"):
        assert f"{name}@@libcublas.so.12" in syms
    # a stand-in cuBLAS 13: the shim passes every argument through untouched (ints, pointers, on the stack too)
    fake = tmp_path / "fake13.c"
    names = ["cublasCreate_v2", "cublasDestroy_v2", "cublasGetMathMode", "cublasSetStream_v2", "cublasSgemmEx",
             "cublasGemmStridedBatchedEx"]
    fake.write_text("".join(f"int {n}(void) {{ return 0; }}\n" for n in names)
                    + "int cublasSetMathMode(void *h, int mode) { return 1000 + mode; }\n"
                    + "long cublasGemmEx(long a,long b,long c,long d,long e,long f,long g,long h,long i,long j,"
                      "long k,long l,long m,long n,long o,long p,long q,long r,long s) { return a + 10 * s; }\n")
    target = _gcc(tmp_path / "libfake13.so", fake)
    monkeypatch.setenv("XMC_CUBLAS_LIB", str(target))
    lib = ctypes.CDLL(str(shim))
    assert lib.cublasSetMathMode(None, 3) == 1003
    lib.cublasGemmEx.restype = ctypes.c_long
    assert lib.cublasGemmEx(*[ctypes.c_long(x) for x in range(7, 26)]) == 7 + 10 * 25   # the 19th, on the stack


def test_the_blas_shim_forwards_to_the_prefixed_routines_and_stops_clearly_without_them(tmp_path, monkeypatch):
    blas = _gcc(tmp_path / "libopenblas-shim.so", SHIM / "blas_shim.c", "-ldl")
    fake = tmp_path / "fakeblas.c"
    fake.write_text("void scipy_ssyrk_(int *x, const float *y) { *x = 42 + (int)*y; }\n")
    monkeypatch.setenv("XMC_BLAS_LIB", str(_gcc(tmp_path / "libfakeblas.so", fake)))
    monkeypatch.setenv("XMC_BLAS_PREFIX", "scipy_")
    x, y = ctypes.c_int(0), ctypes.c_float(8.0)
    ctypes.CDLL(str(blas)).ssyrk_(ctypes.byref(x), ctypes.byref(y))
    assert x.value == 50
    # no BLAS given: loading works, a call stops the process with the message (in a child process)
    code = f"import ctypes; ctypes.CDLL({str(blas)!r}).sgemm_()"
    env = {"PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "no BLAS was found" in r.stderr


def test_epoch_seconds_reads_the_finished_epochs_from_a_runs_progress_bars():
    log = ("epoch 1/75:  96%|#| 27/28 [00:31<00:01, 1.1s/step]\repoch 1/75: 100%|##| 28/28 [00:32<00:00, 1.17s/step]\r"
           "epoch 2/75: 100%|##| 28/28 [00:21<00:00, 1.30step/s]\nepoch 2/75: 100%|##| 28/28 [00:21<00:00, 1.28step/s]\n"
           "epoch 3/75: 100%|##| 28/28 [1:02:05<00:00, 9.3s/step]\repoch 4/75:  50%|#| 14/28 [00:05<00:05]")
    assert epoch_seconds(log) == [32, 21, 3600 + 125]
