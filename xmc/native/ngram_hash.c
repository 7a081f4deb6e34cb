/* Hashed word n-grams of ASCII texts: the bag-of-words encoder's ids (xmc.encoders.bow.hashed_ngrams) in one pass.
 *
 * For an ASCII text, Python's `re.findall(r"\w+", text.lower())` is the maximal runs of [A-Za-z0-9_], lowercased,
 * and each n-gram is its tokens joined by one space. Its id is zlib's CRC-32 (the IEEE polynomial, reflected, as
 * zlib.crc32) of those bytes modulo the bucket count. Per text the ids come in the Python function's order: every
 * unigram, then every bigram, ... up to ngram_max; a text without a token gets the single id 0.
 * Texts are given as one buffer and their byte offsets; non-ASCII texts stay with the Python function (Unicode
 * \w and lower() are not this loop's business), so the caller never passes them here.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint32_t crc_table[256];
static int crc_ready = 0;

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; ++n) {
        uint32_t c = n;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
    crc_ready = 1;
}

static uint32_t crc32_bytes(const unsigned char *s, int64_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (int64_t i = 0; i < n; ++i) c = crc_table[(c ^ s[i]) & 0xFFu] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static int is_word(unsigned char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

/* texts: the ASCII bytes of n_texts texts back to back, text t at [offsets[t], offsets[t + 1]).
 * out_ids (capacity cap) receives the ids of every text in turn, out_counts[t] how many text t has.
 * Returns the number of ids written, or -1 when cap is too small (the caller sizes it as
 * ngram_max * (bytes / 2 + n_texts) + n_texts, an upper bound), -2 when out of memory. */
int64_t xmc_hash_ngrams_ascii(const unsigned char *texts, const int64_t *offsets, int64_t n_texts, int ngram_max,
                              int64_t n_buckets, int64_t *out_ids, int64_t *out_counts, int64_t cap) {
    if (!crc_ready) crc_init();
    int64_t longest = 0;
    for (int64_t t = 0; t < n_texts; ++t)
        if (offsets[t + 1] - offsets[t] > longest) longest = offsets[t + 1] - offsets[t];
    /* the text's tokens lowercased and joined by single spaces, and where each token starts and ends in it */
    unsigned char *joined = malloc((size_t)longest + 1);
    int64_t *start = malloc(sizeof(int64_t) * (size_t)(longest / 2 + 2));
    int64_t *stop = malloc(sizeof(int64_t) * (size_t)(longest / 2 + 2));
    if (!joined || !start || !stop) {
        free(joined); free(start); free(stop);
        return -2;
    }
    int64_t written = 0;
    for (int64_t t = 0; t < n_texts; ++t) {
        const unsigned char *s = texts + offsets[t];
        const int64_t n = offsets[t + 1] - offsets[t];
        int64_t len = 0, ntok = 0;
        for (int64_t i = 0; i < n;) {
            if (!is_word(s[i])) { ++i; continue; }
            if (ntok) joined[len++] = ' ';
            start[ntok] = len;
            while (i < n && is_word(s[i])) {
                unsigned char ch = s[i++];
                joined[len++] = (ch >= 'A' && ch <= 'Z') ? (unsigned char)(ch + 32) : ch;
            }
            stop[ntok++] = len;
        }
        int64_t count = 0;
        if (ntok == 0) {
            if (written + 1 > cap) { written = -1; break; }
            out_ids[written++] = 0;
            count = 1;
        } else {
            for (int g = 1; g <= ngram_max && g <= ntok; ++g) {
                if (written + (ntok - g + 1) > cap) { written = -1; break; }
                for (int64_t k = 0; k + g <= ntok; ++k) {
                    const int64_t a = start[k], b = stop[k + g - 1];
                    out_ids[written++] = (int64_t)(crc32_bytes(joined + a, b - a) % (uint64_t)n_buckets);
                }
                count += ntok - g + 1;
            }
            if (written < 0) break;
        }
        out_counts[t] = count;
    }
    free(joined); free(start); free(stop);
    return written;
}
