/* One weight row times a few int8 activation rows, and rows to float32, for the grid types
 * IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (native_iq.h reads a group of
 * 32 values as four grid points and their sign bits, and a float32 scale per 16 values).
 *
 * Each group's grid points make one vector, its sign bits a byte mask (AVX512BW: one
 * vpmovm2b), and the group is one integer dot product of its signed bytes against the int8
 * activations (dot_s8s8: the magnitudes are at most 62, so AVX2's int16 pair sums cannot
 * saturate); its lanes 0-3 and 4-7 are the two groups of 16, scaled in float32 by the weight
 * scale times the activation scale d16 (IQ1: the scale times 1/8, its values being
 * 8 (grid + delta), taken unsigned plus 9 and the 9 paid back through the activation sums
 * ds16, as Q2_K's mins). The kernels are 256-bit;
 * with AVX512-VNNI they run its 256-bit vpdpbusd.
 *
 * The dequantization multiplies each value by its scale as gguf's does (IQ1: the integer
 * times 1/8 first, exactly grid + delta), so the values are bit for bit its float32 ones.
 */
#include "native_iq.h"
#include "native_quant.h"

#if TSR_AVX2

/* Byte j = 0xFF where bit j of bits is set, else 0. */
ALWAYS_INLINE __m256i iq_bit_mask(uint32_t bits) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_movm_epi8((__mmask32)bits);
#else
    const __m256i which = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                           2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), which);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
#endif
}

/* The parity of each byte's low 7 bits set as its top bit: the sign byte ksigns maps each
 * 7-bit index to (an even number of negative values). */
ALWAYS_INLINE __m256i iq_ksigns_bytes(__m256i idx) {
    const __m256i par = _mm256_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128,
                                         -128, 0, 0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128,
                                         0, -128, -128, 0);
    const __m256i low = _mm256_and_si256(idx, _mm256_set1_epi8(15));
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(idx, 4), _mm256_set1_epi8(15));
    const __m256i p = _mm256_xor_si256(_mm256_shuffle_epi8(par, low), _mm256_shuffle_epi8(par, high));
    return _mm256_or_si256(idx, p);
}

/* The sign bits of a super-block's eight groups, word g for group g, where they come
 * through ksigns (IQ2_XXS, IQ3_XXS, IQ2_XS): its 32 7-bit indices made sign bytes in one
 * vector rather than by 32 table reads. Returns 0 for the other types (iq_group's bits). */
ALWAYS_INLINE int iq_sign_words(int type, const uint8_t *blk, uint32_t *bits) {
    __m256i idx;
    if (type == IQ2_XXS || type == IQ3_XXS) {
        __m256i aux; /* group g's uint32 in lane g */
        if (type == IQ3_XXS) {
            aux = _mm256_loadu_si256((const __m256i *)(blk + 66));
        } else { /* the odd words of 64 bytes at blk + 2 */
            const __m256i odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
            const __m256i lo = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(blk + 2)), odd);
            const __m256i hi = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(blk + 34)), odd);
            aux = _mm256_blend_epi32(lo, hi, 0xF0);
        }
        const __m256i seven = _mm256_set1_epi32(0x7F);
        idx = _mm256_or_si256(_mm256_and_si256(aux, seven),
                              _mm256_and_si256(_mm256_slli_epi32(aux, 1), _mm256_slli_epi32(seven, 8)));
        idx = _mm256_or_si256(idx, _mm256_and_si256(_mm256_slli_epi32(aux, 2), _mm256_slli_epi32(seven, 16)));
        idx = _mm256_or_si256(idx, _mm256_and_si256(_mm256_slli_epi32(aux, 3), _mm256_slli_epi32(seven, 24)));
    } else if (type == IQ2_XS) { /* the top 7 bits of 32 uint16 */
        const __m256i a = _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(blk + 2)), 9);
        const __m256i b = _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(blk + 34)), 9);
        idx = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
    } else {
        return 0;
    }
    _mm256_storeu_si256((__m256i *)bits, iq_ksigns_bytes(idx));
    return 1;
}

/* The scales of values 16 j .. 16 j + 15 for j in 0..7 (sc[0]) and 8..15 (sc[1]) from
 * eight integer levels per 32 (lane g) or sixteen per 16, as iq_scales computes them. */
ALWAYS_INLINE void iq_scales_per32(__m256 per32, __m256 *sc) {
    sc[0] = _mm256_permutevar8x32_ps(per32, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    sc[1] = _mm256_permutevar8x32_ps(per32, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
}

/* A super-block's 16 scales in two vectors, in vector steps (iq_scales' scalar ones cost
 * as much as a third of the IQ2 dot products). */
ALWAYS_INLINE void iq_scales_vec(int type, const uint8_t *blk, __m256 *sc) {
    const __m256 half = _mm256_set1_ps(0.5f);
    if (type == IQ2_XS || type == IQ2_S) { /* nibble j of 8 bytes: (0.5 + s) d / 4 */
        uint64_t raw;
        memcpy(&raw, blk + (type == IQ2_XS ? 66 : 74), 8);
        const __m128i b = _mm_cvtsi64_si128((long long)raw), f = _mm_set1_epi8(15);
        const __m128i s = _mm_unpacklo_epi8(_mm_and_si128(b, f), _mm_and_si128(_mm_srli_epi16(b, 4), f));
        const __m256 d = _mm256_set1_ps(f16_at(blk)), quarter = _mm256_set1_ps(0.25f);
        for (int h = 0; h < 2; h++) {
            const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h ? _mm_srli_si128(s, 8) : s));
            sc[h] = _mm256_mul_ps(_mm256_mul_ps(d, _mm256_add_ps(half, v)), quarter);
        }
        return;
    }
    if (type == IQ1_M) { /* word j / 4 >> 3 (j % 4) & 7: d (2 s + 1) */
        uint64_t raw;
        memcpy(&raw, blk + 48, 8);
        const __m256i words = _mm256_cvtepu16_epi32(_mm_cvtsi64_si128((long long)raw));
        const __m256i shifts = _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9);
        const __m256 d = _mm256_set1_ps(iq_half((uint16_t)(raw >> 12 & 0xF | (raw >> 24 & 0xF0) |
                                                          (raw >> 36 & 0xF00) | (raw >> 48 & 0xF000))));
        for (int h = 0; h < 2; h++) {
            const __m256i w = _mm256_permutevar8x32_epi32(
                words, _mm256_setr_epi32(2 * h, 2 * h, 2 * h, 2 * h, 2 * h + 1, 2 * h + 1, 2 * h + 1, 2 * h + 1));
            const __m256i s = _mm256_and_si256(_mm256_srlv_epi32(w, shifts), _mm256_set1_epi32(7));
            const __m256i odd = _mm256_add_epi32(_mm256_add_epi32(s, s), _mm256_set1_epi32(1));
            sc[h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(odd));
        }
        return;
    }
    const __m256 d = _mm256_set1_ps(f16_at(blk));
    __m256 per32;
    if (type == IQ2_XXS || type == IQ3_XXS) { /* the top 4 bits of each group's word */
        __m256i aux;
        if (type == IQ3_XXS) {
            aux = _mm256_loadu_si256((const __m256i *)(blk + 66));
        } else {
            const __m256i odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
            const __m256i lo = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(blk + 2)), odd);
            const __m256i hi = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(blk + 34)), odd);
            aux = _mm256_blend_epi32(lo, hi, 0xF0);
        }
        const __m256 v = _mm256_cvtepi32_ps(_mm256_srli_epi32(aux, 28));
        per32 = _mm256_mul_ps(_mm256_mul_ps(d, _mm256_add_ps(half, v)),
                              _mm256_set1_ps(type == IQ2_XXS ? 0.25f : 0.5f));
    } else if (type == IQ3_S) { /* nibble g of 4 bytes: d (1 + 2 s) */
        const __m256i b = _mm256_set1_epi32((int)iq_u32(blk + 106));
        const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        const __m256i s = _mm256_and_si256(_mm256_srlv_epi32(b, shifts), _mm256_set1_epi32(15));
        per32 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_add_epi32(s, s), _mm256_set1_epi32(1))));
    } else { /* IQ1_S: bits 12-14 of each group's uint16: d (2 s + 1) */
        const __m256i qh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(blk + 34)));
        const __m256i s = _mm256_and_si256(_mm256_srli_epi32(qh, 12), _mm256_set1_epi32(7));
        per32 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_add_epi32(s, s), _mm256_set1_epi32(1))));
    }
    iq_scales_per32(per32, sc);
}

/* Group g (values 32 g .. 32 g + 31) of a super-block: its grid bytes and sign bits (the
 * IQ3 types' eight points by a gather: 1.3x their eight reads and inserts here). */
ALWAYS_INLINE __m256i iq_grid_bits(int type, const uint8_t *blk, int g, uint32_t *bits) {
    uint64_t grid[4];
    iq_group(type, blk, g, grid, bits);
    if (type == IQ3_XXS || type == IQ3_S) { /* eight points of 4: one gather of 8 words */
        uint64_t raw;
        memcpy(&raw, blk + 2 + 8 * g, 8);
        __m256i idx = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)raw));
        if (type == IQ3_S) { /* bit k of byte 66 + g is point k's 9th bit */
            const __m256i high = _mm256_srlv_epi32(_mm256_set1_epi32(blk[66 + g]),
                                                   _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            idx = _mm256_or_si256(idx, _mm256_slli_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)), 8));
        }
        const uint32_t *table = type == IQ3_XXS ? TSR_IQ3XXS_GRID : TSR_IQ3S_GRID;
        return _mm256_i32gather_epi32((const int *)table, idx, 4);
    }
    return _mm256_setr_epi64x((long long)grid[0], (long long)grid[1], (long long)grid[2],
                              (long long)grid[3]);
}

/* Its signed bytes (IQ1: 8 grid +- 1). */
ALWAYS_INLINE __m256i iq_block(int type, const uint8_t *blk, int g) {
    uint32_t bits;
    const __m256i v = iq_grid_bits(type, blk, g, &bits);
    const __m256i m = iq_bit_mask(bits);
    if (iq_is_iq1(type)) return _mm256_add_epi8(v, _mm256_or_si256(m, _mm256_set1_epi8(1)));
    return _mm256_sub_epi8(_mm256_xor_si256(v, m), m);
}

/* The activations x with the group's signs: byte j negated where bit j of bits is set (the
 * IQ2/IQ3 grids are magnitudes, so the dot product takes them unsigned). */
ALWAYS_INLINE __m256i iq_signed_acts(__m256i x, uint32_t bits) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_mask_sub_epi8(x, (__mmask32)bits, _mm256_setzero_si256(), x);
#else
    return _mm256_sign_epi8(x, _mm256_or_si256(iq_bit_mask(bits), _mm256_set1_epi8(1)));
#endif
}

/* IQ1 group g's values plus 9 as unsigned bytes, 8 grid + 9 + delta (0 .. 18): the runs'
 * delta signs as 64-bit lane masks (IQ1_S: bit 15 of the group's word, IQ1_M: bit 4 k + 3
 * of its two nibble bytes), no scalar bit work. */
ALWAYS_INLINE __m256i iq1_plus8(int type, const uint8_t *blk, int g, __m256i grid) {
    __m256i minus;
    if (type == IQ1_S) {
        minus = _mm256_set1_epi64x(iq_u16(blk + 34 + 2 * g) & 0x8000 ? -1 : 0);
    } else {
        const __m256i qh = _mm256_set1_epi64x(iq_u16(blk + 32 + 2 * g));
        const __m256i bit = _mm256_and_si256(_mm256_srlv_epi64(qh, _mm256_setr_epi64x(3, 7, 11, 15)),
                                             _mm256_set1_epi64x(1));
        minus = _mm256_sub_epi64(_mm256_setzero_si256(), bit);
    }
    return _mm256_add_epi8(grid, _mm256_blendv_epi8(_mm256_set1_epi8(10), _mm256_set1_epi8(8), minus));
}

/* The integer dot product of group g (grid bytes, sign bits; IQ1: its values plus 9) with
 * the activations at x (32 int8). */
ALWAYS_INLINE __m256i iq_dot(int type, __m256i grid, uint32_t bits, const int8_t *x) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)x);
    if (iq_is_iq1(type)) return dot_u8s8(_mm256_setzero_si256(), grid, a);
    return dot_u8s8(_mm256_setzero_si256(), grid, iq_signed_acts(a, bits));
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
    __m256 acc[2][QUANT_MI], offs[QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = offs[i] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < a->n_in / 256; sb++) {
        const uint8_t *blk = w + sb * size;
        for (int off = 0; off < size; off += 64) prefetch1(blk + PREFETCH + off);
        __m256 sc[2];
        iq_scales_vec(type, blk, sc);
        sc[0] = _mm256_mul_ps(sc[0], eighth);
        sc[1] = _mm256_mul_ps(sc[1], eighth);
        const __m256 nine[2] = {_mm256_mul_ps(sc[0], _mm256_set1_ps(9.0f)),
                                _mm256_mul_ps(sc[1], _mm256_set1_ps(9.0f))};
        __m256 comb[2][QUANT_MI];
        for (int i = 0; i < MI; i++) {
            const int64_t k = (i0 + i) * 2 * a->nb + sb * 16;
            comb[0][i] = _mm256_mul_ps(sc[0], _mm256_loadu_ps(a->d16 + k));
            comb[1][i] = _mm256_mul_ps(sc[1], _mm256_loadu_ps(a->d16 + k + 8));
            if (iq_is_iq1(type)) { /* the 9 added to each value: 9 dl / 8 * (d16 * sum16) */
                offs[i] = _mm256_fmadd_ps(nine[0], _mm256_loadu_ps(a->ds16 + k), offs[i]);
                offs[i] = _mm256_fmadd_ps(nine[1], _mm256_loadu_ps(a->ds16 + k + 8), offs[i]);
            }
        }
        uint32_t words[8];
        const int vector_signs = iq_sign_words(type, blk, words);
#pragma GCC unroll 8 /* constant lanes and accumulators in registers, not indexed spills */
        for (int b = 0; b < 8; b++) {
            uint32_t bits;
            __m256i grid = iq_grid_bits(type, blk, b, &bits);
            if (vector_signs) bits = words[b];
            if (iq_is_iq1(type)) grid = iq1_plus8(type, blk, b, grid);
            for (int i = 0; i < MI; i++) {
                const __m256i dot = iq_dot(type, grid, bits, a->q + (i0 + i) * a->n_in + sb * 256 + 32 * b);
                acc[b & 1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), iq_pair_lanes(comb[b / 4][i], b % 4),
                                                acc[b & 1][i]);
            }
        }
    }
    for (int i = 0; i < MI; i++) y[i] = hsum(_mm256_add_ps(acc[0][i], acc[1][i])) - hsum(offs[i]);
}

static void iq_dequant(int type, const uint8_t *w, int64_t n_in, float *y) {
    const int size = iq_type_size(type);
    for (int64_t sb = 0; sb < n_in / 256; sb++, w += size, y += 256) {
        float scale[16];
        iq_scales(type, w, scale);
        for (int b = 0; b < 8; b++) {
            const __m256i v = iq_block(type, w, b);
            const __m128i halves[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};
            for (int j = 0; j < 4; j++) {
                const __m128i bytes = j % 2 ? _mm_srli_si128(halves[j / 2], 8) : halves[j / 2];
                __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
                if (iq_is_iq1(type)) f = _mm256_mul_ps(f, _mm256_set1_ps(0.125f)); /* grid + delta */
                _mm256_storeu_ps(y + 32 * b + 8 * j, _mm256_mul_ps(_mm256_set1_ps(scale[2 * b + j / 2]), f));
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
