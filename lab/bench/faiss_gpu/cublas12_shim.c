/* libcublas.so.12 for the faiss-gpu-cu12 wheel on a machine that has only CUDA 13's cuBLAS.
 *
 * The wheel needs the CUDA 12 runtime (small: carried) and cuBLAS 12 (~600 MB: over the device tool's 64 MiB carry
 * limit). faiss calls eight cuBLAS functions whose C interface is the same in cuBLAS 13, all with integer and
 * pointer arguments, so each one here is a jump to the function of the same name in libcublas.so.13: no argument is
 * touched. The symbols carry the version node `libcublas.so.12` that faiss's references ask for (see the version
 * script). libcublasLt.so.12 is an empty library: faiss lists it as needed but uses none of its symbols.
 *
 * Build (lab/bench/gpu_profiles.py pack --faiss-gpu does it):
 *   gcc -shared -fPIC -O2 -o libcublas.so.12 -Wl,-soname,libcublas.so.12 \
 *       -Wl,--version-script=cublas12.map cublas12_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#define FORWARDED(X) X(cublasCreate_v2) X(cublasDestroy_v2) X(cublasGemmEx) X(cublasGemmStridedBatchedEx) \
                     X(cublasGetMathMode) X(cublasSetMathMode) X(cublasSetStream_v2) X(cublasSgemmEx)

/* the targets; hidden, so that the jumps below address them directly */
#define POINTER(name) __attribute__((visibility("hidden"))) void *target_##name;
FORWARDED(POINTER)

__attribute__((constructor)) static void resolve_targets(void) {
    const char *lib = getenv("XMC_CUBLAS_LIB") ? getenv("XMC_CUBLAS_LIB") : "libcublas.so.13";
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "libcublas.so.12 shim: cannot load %s: %s\n", lib, dlerror());
        abort();
    }
#define RESOLVE(name)                                                                          \
    target_##name = dlsym(h, #name);                                                           \
    if (!target_##name) {                                                                      \
        fprintf(stderr, "libcublas.so.12 shim: %s has no %s\n", lib, #name);                   \
        abort();                                                                               \
    }
    FORWARDED(RESOLVE)
}

/* x86-64: a tail jump keeps every register and the stack as the caller left them */
#define TRAMPOLINE(name) __asm__(".text\n.globl " #name "\n.type " #name ",@function\n" #name ":\n" \
                                 "  jmp *target_" #name "(%rip)\n.size " #name ", .-" #name "\n");
FORWARDED(TRAMPOLINE)
