/* The BLAS/LAPACK library the faiss-gpu-cu12 wheel bundles (libopenblas, 3.9 MB compressed with its gfortran and
 * quadmath), replaced by jumps to a BLAS already on the GPU machine: the device tool carries at most 64 MiB, and
 * faiss-gpu, MiniLM and the data together were over it.
 *
 * faiss calls 13 Fortran BLAS/LAPACK routines (faiss-cpu 1.15, on which this was tested, one more: sgemv_); every argument is a pointer (plus, for character arguments, hidden
 * string lengths passed by value), so each one here is a tail jump to the routine of the same name in
 * XMC_BLAS_LIB, prefixed with XMC_BLAS_PREFIX: scipy's bundled OpenBLAS (LP64, 32-bit integers, as faiss's own)
 * names them scipy_sgemm_ and so on. lab/bench/faiss_gpu/env.sh finds it. Without one, loading still works (the GPU
 * indexes use cuBLAS) and a BLAS call stops the program with a message.
 *
 * Build (lab/bench/gpu_profiles.py pack --faiss-gpu does it, with -o the wheel's library name):
 *   gcc -shared -fPIC -O2 -o libopenblas-r0-f650aae0.3.3.so blas_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FORWARDED(X) X(dgemm_) X(dgesvd_) X(dgetrf_) X(dgetri_) X(dsyev_) X(sgelsd_) X(sgemm_) X(sgemv_) \
                     X(sgeqrf_) X(sgesvd_) X(sgetrf_) X(sgetri_) X(sorgqr_) X(ssyrk_)

static void blas_missing(void) {
    fprintf(stderr, "faiss BLAS shim: no BLAS was found (set XMC_BLAS_LIB, XMC_BLAS_PREFIX)\n");
    abort();
}

#define POINTER(name) __attribute__((visibility("hidden"))) void *target_##name = (void *)blas_missing;
FORWARDED(POINTER)

__attribute__((constructor)) static void resolve_targets(void) {
    const char *lib = getenv("XMC_BLAS_LIB");
    const char *prefix = getenv("XMC_BLAS_PREFIX") ? getenv("XMC_BLAS_PREFIX") : "";
    if (!lib || !*lib)
        return;
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "faiss BLAS shim: cannot load %s: %s\n", lib, dlerror());
        return;
    }
    char sym[128];
#define RESOLVE(name)                                                                          \
    snprintf(sym, sizeof sym, "%s%s", prefix, #name);                                          \
    if (dlsym(h, sym))                                                                         \
        target_##name = dlsym(h, sym);                                                         \
    else                                                                                       \
        fprintf(stderr, "faiss BLAS shim: %s has no %s\n", lib, sym);
    FORWARDED(RESOLVE)
}

#define TRAMPOLINE(name) __asm__(".text\n.globl " #name "\n.type " #name ",@function\n" #name ":\n" \
                                 "  jmp *target_" #name "(%rip)\n.size " #name ", .-" #name "\n");
FORWARDED(TRAMPOLINE)
