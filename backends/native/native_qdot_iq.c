/* One weight row times a few int8 activation rows, and rows to float32, for the grid types
 * IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (native_iq.h decodes a
 * super-block into 32 runs of 8 signed bytes and a float32 scale per 16 values).
 *
 * Each block of 32 values is one integer dot product of its signed bytes against the int8
 * activations (dot_s8s8: the magnitudes are at most 62, so AVX2's int16 pair sums cannot
 * saturate); its lanes 0-3 and 4-7 are the two groups of 16, scaled in float32 by the weight
 * scale times the activation scale d16 (IQ1: the scale times 1/8, its values being
 * 8 (grid + delta)). No offsets: every value is scale * integer. The kernels are 256-bit;
 * with AVX512-VNNI they run its 256-bit vpdpbusd.
 *
 * The dequantization multiplies each value by its scale as gguf's does (IQ1: the integer
 * times 1/8 first, exactly grid + delta), so the values are bit for bit its float32 ones.
 */
#include "native_iq.h"
#include "native_quant.h"

#if TSR_AVX2

/* The signed bytes of runs 4 b .. 4 b + 3 (values 32 b .. 32 b + 31). */
ALWAYS_INLINE __m256i iq_block(int type, const iq_superblock *s, int b) {
    const __m256i g = _mm256_loadu_si256((const __m256i *)(s->grid + 4 * b));
    const __m256i m = _mm256_loadu_si256((const __m256i *)(s->mod + 4 * b));
    if (iq_is_iq1(type)) return _mm256_add_epi8(g, m);
    return _mm256_sub_epi8(_mm256_xor_si256(g, m), m);
}

/* Lanes (2k, 2k + 1) of v to lanes 0-3 and 4-7: the scales of the two groups of 16 of the
 * k-th 32 values of 128. */
ALWAYS_INLINE __m256 iq_pair_lanes(__m256 v, int k) {
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1,
                                                         2 * k + 1, 2 * k + 1, 2 * k + 1));
}

ALWAYS_INLINE void iq_rows(int type, const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y) {
    const int size = iq_type_size(type);
    const __m256 eighth = _mm256_set1_ps(iq_is_iq1(type) ? 0.125f : 1.0f);
    __m256 acc[2][QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < a->n_in / 256; sb++) {
        const uint8_t *blk = w + sb * size;
        for (int off = 0; off < size; off += 64) prefetch1(blk + PREFETCH + off);
        iq_superblock s;
        iq_decode(type, blk, &s);
        const __m256 sc[2] = {_mm256_mul_ps(_mm256_loadu_ps(s.scale), eighth),
                              _mm256_mul_ps(_mm256_loadu_ps(s.scale + 8), eighth)};
        __m256 comb[2][QUANT_MI];
        for (int i = 0; i < MI; i++) {
            const float *d16 = a->d16 + (i0 + i) * 2 * a->nb + sb * 16;
            comb[0][i] = _mm256_mul_ps(sc[0], _mm256_loadu_ps(d16));
            comb[1][i] = _mm256_mul_ps(sc[1], _mm256_loadu_ps(d16 + 8));
        }
        for (int b = 0; b < 8; b++) {
            const __m256i v = iq_block(type, &s, b);
            for (int i = 0; i < MI; i++) {
                const int8_t *x = a->q + (i0 + i) * a->n_in + sb * 256 + 32 * b;
                const __m256i dot = dot_s8s8(_mm256_setzero_si256(), v, _mm256_loadu_si256((const __m256i *)x));
                acc[b & 1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), iq_pair_lanes(comb[b / 4][i], b % 4),
                                                acc[b & 1][i]);
            }
        }
    }
    for (int i = 0; i < MI; i++) y[i] = hsum(_mm256_add_ps(acc[0][i], acc[1][i]));
}

static void iq_dequant(int type, const uint8_t *w, int64_t n_in, float *y) {
    const int size = iq_type_size(type);
    for (int64_t sb = 0; sb < n_in / 256; sb++, w += size, y += 256) {
        iq_superblock s;
        iq_decode(type, w, &s);
        for (int b = 0; b < 8; b++) {
            const __m256i v = iq_block(type, &s, b);
            const __m128i halves[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};
            for (int j = 0; j < 4; j++) {
                const __m128i bytes = j % 2 ? _mm_srli_si128(halves[j / 2], 8) : halves[j / 2];
                __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
                if (iq_is_iq1(type)) f = _mm256_mul_ps(f, _mm256_set1_ps(0.125f)); /* grid + delta */
                _mm256_storeu_ps(y + 32 * b + 8 * j, _mm256_mul_ps(_mm256_set1_ps(s.scale[2 * b + j / 2]), f));
            }
        }
    }
}

/* The row kernel, the tsr_dot_<name> over it and tsr_deq_<name> of one grid type. */
#define IQ_KERNELS(name, type)                                                                  \
    ALWAYS_INLINE void name##_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI,     \
                                   float *y) {                                                  \
        iq_rows(type, w, a, i0, MI, y);                                                         \
    }                                                                                           \
    TSR_DOT_BY_ROW(name, name##_rows)                                                           \
    void tsr_dot_##name(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a,     \
                        int64_t i0, int64_t mi, float *y) {                                     \
        name##_by_row(w, row_bytes, n_rows, a, i0, mi, y);                                      \
    }                                                                                           \
    void tsr_deq_##name(const uint8_t *w, int64_t n_in, float *y) { iq_dequant(type, w, n_in, y); }

IQ_KERNELS(iq2_xxs, IQ2_XXS)
IQ_KERNELS(iq2_xs, IQ2_XS)
IQ_KERNELS(iq2_s, IQ2_S)
IQ_KERNELS(iq3_xxs, IQ3_XXS)
IQ_KERNELS(iq3_s, IQ3_S)
IQ_KERNELS(iq1_s, IQ1_S)
IQ_KERNELS(iq1_m, IQ1_M)

#endif
