/* Lazy Adam on the touched rows of a float32 table, in one pass over each row.
 *
 * The same rule as xmc.train.row_adam's torch path (SparseAdam's lazy Adam), with the same roundings where torch's CPU
 * kernels fuse a multiply and an add (written fmaf here):
 *   m <- fma(1 - b1, g - m, m)                     (torch.lerp_ with a weight below 0.5)
 *   v <- fma((1 - b2) g, g, b2 v)                  (mul_ then addcmul_)
 *   p <- fma(-step_size, m / (sqrt(v) + eps), p)   (index_add_ with alpha)
 * The torch path moves each row through memory about ten times (gathers, element-wise passes, scatters); here each
 * of p, m, v and g is read once and p, m, v written once, which is what the roofline of a step counts.
 * Touched rows are prefetched two ahead (their order is the gradient's, increasing but scattered).
 * Built without implicit contraction (-ffp-contract=off): the fused multiply-adds are the explicit ones. One difference:
 * sqrtf here is IEEE's correctly rounded square root, where torch's vectorised sqrt is off by an ulp for about a fifth
 * of its inputs; m and v come out bit for bit as the torch path's, p within an ulp or so per step.
 *
 * xmc_row_adam_bf16m keeps m and v in bfloat16 (a row's bytes moved per step 28 -> 20 per element, the moments' memory
 * halved): each step computes in float32 as above from the stored moments and rounds the new ones stochastically, so a
 * moment moves in expectation by exactly its float32 update (round-to-nearest would freeze v: (1 - b2) = 0.001 of it
 * is below half a bfloat16 ulp, 2^-9). The random bits of element j of row r are bits[(off_r + j) mod 4096] ^ key_r: a
 * fixed table of 4,096 random words, and a key and an offset per row and step, all made by the caller
 * (xmc.train.row_adam.rounding_keys), so they do not depend on the thread split and the torch path uses the same
 * bits: m and v agree bit for bit. A table read costs a load from L1 where hashing each element cost about a sixth of
 * the kernel's time.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

enum { PREFETCH_AHEAD = 2 };   /* rows ahead: 1 to 4 measured within noise of each other, all ~10% faster than none */

typedef struct {
    float *p, *m, *v;
    uint16_t *mb, *vb;     /* bfloat16 moments (xmc_row_adam_bf16m), else NULL */
    const uint64_t *keys;  /* per gradient row: its rounding key, low word, and table offset, high (bf16m) */
    const uint32_t *bits;  /* BITS_WORDS random words */
    const int64_t *rows;   /* n_rows increasing row ids; NULL: row i of the gradient is row i of the table */
    const float *g;        /* n_rows x dim, row-major */
    int64_t begin, end, dim;
    float w1, b2, w2, eps, step_size;   /* w1 = 1 - b1 and w2 = 1 - b2, rounded from double as torch rounds them */
} span_t;

static void adam_span(const span_t *s) {
    const float w1 = s->w1, w2 = s->w2, alpha = -s->step_size;
    const int64_t dim = s->dim;
    for (int64_t i = s->begin; i < s->end; ++i) {
        const int64_t r = s->rows ? s->rows[i] : i;
        float *restrict p = s->p + r * dim;
        float *restrict m = s->m + r * dim;
        float *restrict v = s->v + r * dim;
        const float *restrict g = s->g + i * dim;
        if (s->rows && i + PREFETCH_AHEAD < s->end) {
            /* the touched rows are scattered over tables far larger than the caches: start loading the three table
               rows of a later gradient row now, so their memory latency overlaps this row's arithmetic (the
               hardware prefetcher follows a row, not the jump to the next one) */
            const int64_t ahead = s->rows[i + PREFETCH_AHEAD] * dim;
            for (int64_t c = 0; c < dim; c += 16) {   /* one 64-byte line = 16 floats */
                __builtin_prefetch(s->p + ahead + c, 1, 0);
                __builtin_prefetch(s->m + ahead + c, 1, 0);
                __builtin_prefetch(s->v + ahead + c, 1, 0);
            }
        }
        for (int64_t j = 0; j < dim; ++j) {
            const float gj = g[j];
            const float mj = fmaf(w1, gj - m[j], m[j]);
            const float vj = fmaf(w2 * gj, gj, v[j] * s->b2);
            m[j] = mj;
            v[j] = vj;
            p[j] = fmaf(alpha, mj / (sqrtf(vj) + s->eps), p[j]);
        }
    }
}

static inline float bf16_to_f32(uint16_t b) {
    union { uint32_t u; float f; } x = {(uint32_t)b << 16};
    return x.f;
}

/* float32 -> bfloat16 rounded up with probability (dropped bits) / 2^16: add 16 random bits below the kept ones and
   truncate. Finite values only (moments are), where a carry into the exponent is the correct rounding. */
static inline uint16_t f32_to_bf16_stochastic(float f, uint32_t random16) {
    union { float f; uint32_t u; } x = {f};
    return (uint16_t)((x.u + random16) >> 16);
}

enum { BITS_WORDS = 4096 };   /* the random table's length (a power of two, 16 KB: stays in L1) */

/* elements [j0, j1) of a row, whose random words are bits[j - j0 ...]: contiguous, so the loop vectorises */
static inline void bf16m_elements(float *restrict p, uint16_t *restrict m, uint16_t *restrict v,
                                  const float *restrict g, const uint32_t *restrict bits, uint32_t key, int64_t j0,
                                  int64_t j1, float w1, float b2, float w2, float eps, float alpha) {
    for (int64_t j = j0; j < j1; ++j) {
        const float gj = g[j];
        const float m0 = bf16_to_f32(m[j]), v0 = bf16_to_f32(v[j]);
        const float mj = fmaf(w1, gj - m0, m0);
        const float vj = fmaf(w2 * gj, gj, v0 * b2);
        const uint32_t h = bits[j - j0] ^ key;
        const uint16_t mq = f32_to_bf16_stochastic(mj, h & 0xFFFFu);
        const uint16_t vq = f32_to_bf16_stochastic(vj, h >> 16);
        m[j] = mq;
        v[j] = vq;
        /* the step takes the stored (rounded) moments, as the torch path, which reads them back, does */
        p[j] = fmaf(alpha, bf16_to_f32(mq) / (sqrtf(bf16_to_f32(vq)) + eps), p[j]);
    }
}

static void adam_span_bf16m(const span_t *s) {
    const float w1 = s->w1, w2 = s->w2, b2 = s->b2, eps = s->eps, alpha = -s->step_size;
    const int64_t dim = s->dim;
    for (int64_t i = s->begin; i < s->end; ++i) {
        const int64_t r = s->rows ? s->rows[i] : i;
        float *restrict p = s->p + r * dim;
        uint16_t *restrict m = s->mb + r * dim;
        uint16_t *restrict v = s->vb + r * dim;
        const float *restrict g = s->g + i * dim;
        if (s->rows && i + PREFETCH_AHEAD < s->end) {
            const int64_t ahead = s->rows[i + PREFETCH_AHEAD] * dim;
            for (int64_t c = 0; c < dim; c += 16) __builtin_prefetch(s->p + ahead + c, 1, 0);
            for (int64_t c = 0; c < dim; c += 32) {   /* one line = 32 bfloat16 */
                __builtin_prefetch(s->mb + ahead + c, 1, 0);
                __builtin_prefetch(s->vb + ahead + c, 1, 0);
            }
        }
        const uint32_t key = (uint32_t)s->keys[i];
        /* word (off + j) mod BITS_WORDS for element j: runs of the table up to its end, then from its start */
        int64_t j = 0, t = (int64_t)(s->keys[i] >> 32 & (BITS_WORDS - 1));
        while (j < dim) {
            const int64_t n = dim - j < BITS_WORDS - t ? dim - j : BITS_WORDS - t;
            bf16m_elements(p, m, v, g, s->bits + t, key, j, j + n, w1, b2, w2, eps, alpha);
            j += n;
            t = 0;
        }
    }
}

static void run_span(const span_t *s) {
    if (s->mb) adam_span_bf16m(s);
    else adam_span(s);
}

static void *adam_thread(void *arg) {
    run_span((const span_t *)arg);
    return NULL;
}

static int run_spans(float *p, float *m, float *v, uint16_t *mb, uint16_t *vb, const uint64_t *keys,
                     const uint32_t *bits, const int64_t *rows,
                     const float *g, int64_t n_rows, int64_t dim, float w1, float b2, float w2, float eps,
                     float step_size, int threads) {
    enum { MAX_THREADS = 64 };
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (n_rows * dim < (int64_t)1 << 16) threads = 1;   /* small updates: a thread costs more than it saves */
    span_t spans[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    int rc = 0;
    for (int t = 0; t < threads; ++t) {
        spans[t] = (span_t){p, m, v, mb, vb, keys, bits, rows, g, n_rows * t / threads, n_rows * (t + 1) / threads, dim,
                            w1, b2, w2, eps, step_size};
    }
    for (int t = 1; t < threads; ++t) {
        started[t] = pthread_create(&ids[t], NULL, adam_thread, &spans[t]) == 0;
        if (!started[t]) rc = -1;
    }
    run_span(&spans[0]);
    for (int t = 1; t < threads; ++t) {
        if (started[t]) pthread_join(ids[t], NULL);
        else run_span(&spans[t]);
    }
    return rc;
}

/* Returns 0, or -1 when a thread could not be started (the rows it held were then done on this thread). */
int xmc_row_adam_f32(float *p, float *m, float *v, const int64_t *rows, const float *g, int64_t n_rows, int64_t dim,
                     float w1, float b2, float w2, float eps, float step_size, int threads) {
    return run_spans(p, m, v, NULL, NULL, NULL, NULL, rows, g, n_rows, dim, w1, b2, w2, eps, step_size, threads);
}

/* The same with bfloat16 moments (raw bits), rounded stochastically: ``keys`` holds per gradient row its key (low 32
   bits) and table offset (high), ``bits`` 4,096 words (xmc.train.row_adam.rounding_keys). */
int xmc_row_adam_bf16m(float *p, uint16_t *m, uint16_t *v, const int64_t *rows, const float *g, int64_t n_rows,
                       int64_t dim, float w1, float b2, float w2, float eps, float step_size, const uint64_t *keys,
                       const uint32_t *bits, int threads) {
    return run_spans(p, NULL, NULL, m, v, keys, bits, rows, g, n_rows, dim, w1, b2, w2, eps, step_size, threads);
}
