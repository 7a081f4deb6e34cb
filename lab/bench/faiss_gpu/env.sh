# On the GPU machine: `source lab/bench/faiss_gpu/env.sh [CARRY]` puts faiss-gpu (packed by
# `python -m lab.bench.gpu_profiles pack --faiss-gpu`) on the Python path, with the CUDA 12 runtime and the cuBLAS 12
# shim (cublas12_shim.c) on the loader's path, pointed at the image's cuBLAS 13. The loader reads LD_LIBRARY_PATH
# when a process starts, so source this before python starts.
_carry=${1:-.gpu}
mkdir -p /tmp/site && tar -xJf "$_carry/faiss_gpu.tar.xz" -C /tmp
XMC_CUBLAS_LIB=$(python3 - <<'PY'
import glob
try:
    import nvidia
    roots = list(nvidia.__path__)
except ImportError:
    roots = []
for root in roots + glob.glob("/usr/local/cuda*/lib64"):
    hits = sorted(glob.glob(root + "/**/libcublas.so.13*", recursive=True))
    if hits:
        print(hits[0])
        break
PY
)
export XMC_CUBLAS_LIB
# faiss's CPU-side BLAS / LAPACK (blas_shim.c): the OpenBLAS inside scipy (LP64; its routines are named scipy_*)
XMC_BLAS_LIB=$(python3 - <<'PY'
import ctypes, glob, os
try:
    import scipy
    libs = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs",
                                         "libscipy_openblas-*.so")))
    if libs and hasattr(ctypes.CDLL(libs[0]), "scipy_sgemm_"):
        print(libs[0])
except Exception:
    pass
PY
)
export XMC_BLAS_LIB XMC_BLAS_PREFIX=scipy_
export LD_LIBRARY_PATH=/tmp/cuda12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export _FAISS_WHEEL_DISABLE_CUDA_PRELOAD=1   # the wheel would look for the nvidia-*-cu12 packages
echo "faiss-gpu: cuBLAS 13 at ${XMC_CUBLAS_LIB:-(not found)}; BLAS at ${XMC_BLAS_LIB:-(not found)}"
