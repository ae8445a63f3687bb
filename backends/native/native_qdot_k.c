/* One weight row times a few int8 activation rows for the K-quants Q4_K, Q5_K and Q6_K:
 * super-blocks of 256 values in 8 groups of 32 (Q4_K, Q5_K: value d sc q - dmin m) or 16
 * groups of 16 (Q6_K: value d sc (q - 32), sc a signed byte); and the ternary TQ2_0 (256
 * values of d (t - 1), t a 2-bit trit), which has the same shape with one scale.
 *
 * The activations come in blocks of 32 with one float scale each (finer than ggml's q8_K
 * blocks of 256), so each group's integer dot product is scaled in float32 by the group's
 * weight scale times its activation block's scale; a super-block's 8 (16) group scales
 * times the matching activation scales are one vector product, and every group takes its
 * lane with one permute. The offsets (the mins, Q6_K's -32) meet the activation sums once
 * per super-block, as one vector product each:
 *   sum_g (d sc_g dot(q_g, a_g) - dmin m_g sum a_g)
 * Codes are at most 6 bits, so the AVX2 path's int16 pair sums cannot saturate. With
 * AVX512 one vector holds 64 values (two groups of 32, or four of 16), so one dot product,
 * one permute of the combined scales and one FMA serve 64 weights.
 */
#include "native_quant.h"

#if TSR_AVX2

static inline void prefetch_superblock(const uint8_t *blk, int bytes) {
    for (int off = 0; off < bytes; off += 64) prefetch1(blk + PREFETCH + off);
}

ALWAYS_INLINE __m256i act32(const tsr_acts *a, int64_t row, int64_t at) {
    return _mm256_loadu_si256((const __m256i *)(a->q + row * a->n_in + at));
}

/* Q4_K (144 bytes: d, dmin, 12 bytes of scales, 128 of nibbles) and Q5_K (176 bytes: the
 * same with 32 bytes of fifth bits before the nibbles): for each 64 values, 32 bytes whose
 * low nibbles are group 2c and high nibbles group 2c + 1; Q5_K's fifth bit of value v is
 * bit v / 32 of qh[v % 32]. */
ALWAYS_INLINE void k4_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y,
                           int five) {
    const int size = five ? 176 : 144, qs_at = five ? 48 : 16;
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    __m256 acc[2][QUANT_MI], mins[QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = mins[i] = _mm256_setzero_ps();
    const int64_t nsb = a->n_in / 256;
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = w + sb * size;
        prefetch_superblock(blk, size);
        uint64_t sc, m;
        k4_scales(blk + 4, &sc, &m);
        const __m256 scales = _mm256_mul_ps(_mm256_set1_ps(f16_at(blk)), u8x8_ps(sc));
        const __m256 offsets = _mm256_mul_ps(_mm256_set1_ps(f16_at(blk + 2)), u8x8_ps(m));
        __m256 comb[QUANT_MI];
        for (int i = 0; i < MI; i++) {
            const int64_t k = (i0 + i) * a->nb + sb * 8;
            comb[i] = _mm256_mul_ps(scales, _mm256_loadu_ps(a->d + k));
            mins[i] = _mm256_fmadd_ps(offsets, _mm256_loadu_ps(a->ds + k), mins[i]);
        }
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + qs_at + 32 * c));
            __m256i lo = _mm256_and_si256(q, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            if (five) { /* bits 2c and 2c + 1 of each qh byte to bit 4 */
                const __m256i h = _mm256_srli_epi16(qh, 2 * c);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(h, 3), bit4));
            }
            for (int i = 0; i < MI; i++) {
                const int64_t at = sb * 256 + 64 * c;
                const __m256i d0 = dot_u8s8(_mm256_setzero_si256(), lo, act32(a, i0 + i, at));
                const __m256i d1 = dot_u8s8(_mm256_setzero_si256(), hi, act32(a, i0 + i, at + 32));
                acc[0][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), lane(comb[i], 2 * c), acc[0][i]);
                acc[1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), lane(comb[i], 2 * c + 1), acc[1][i]);
            }
        }
    }
    for (int i = 0; i < MI; i++) y[i] = hsum(_mm256_add_ps(acc[0][i], acc[1][i])) - hsum(mins[i]);
}

#if TSR_ZMM
ALWAYS_INLINE __m512i act64(const tsr_acts *a, int64_t row, int64_t at) {
    return _mm512_loadu_si512((const void *)(a->q + row * a->n_in + at));
}

/* Lanes 0-7 of v to lanes 8 k .. 8 k + 7 of the result's 16 (k 0, 1) by the index pair i. */
ALWAYS_INLINE __m512 two_lanes(__m256 v, int i) {
    const __m512i idx = _mm512_setr_epi32(i, i, i, i, i, i, i, i, i + 1, i + 1, i + 1, i + 1,
                                          i + 1, i + 1, i + 1, i + 1);
    return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(v));
}

/* k4_rows with 64 values per vector: chunk c's low nibbles (group 2c) in the low half, its
 * high nibbles (group 2c + 1) in the high half, against 64 contiguous activation bytes. */
ALWAYS_INLINE void k4_rows_zmm(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y,
                               int five) {
    const int size = five ? 176 : 144, qs_at = five ? 48 : 16;
    const __m512i low4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    __m512 acc[2][QUANT_MI];
    __m256 mins[QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = _mm512_setzero_ps(), mins[i] = _mm256_setzero_ps();
    const int64_t nsb = a->n_in / 256;
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = w + sb * size;
        prefetch_superblock(blk, size);
        uint64_t sc, m;
        k4_scales(blk + 4, &sc, &m);
        const __m256 scales = _mm256_mul_ps(_mm256_set1_ps(f16_at(blk)), u8x8_ps(sc));
        const __m256 offsets = _mm256_mul_ps(_mm256_set1_ps(f16_at(blk + 2)), u8x8_ps(m));
        __m256 comb[QUANT_MI];
        for (int i = 0; i < MI; i++) {
            const int64_t k = (i0 + i) * a->nb + sb * 8;
            comb[i] = _mm256_mul_ps(scales, _mm256_loadu_ps(a->d + k));
            mins[i] = _mm256_fmadd_ps(offsets, _mm256_loadu_ps(a->ds + k), mins[i]);
        }
        /* Q5_K: qh in both halves; chunk c tests bit 2c (low half) and 2c + 1 (high half) */
        const __m512i qh = five ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)))
                                : _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + qs_at + 32 * c));
            __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
            z = _mm512_and_si512(z, low4);
            if (five) {
                const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << 2 * c)),
                                                        _mm256_set1_epi8((char)(2 << 2 * c)), 1);
                z = _mm512_mask_add_epi8(z, _mm512_test_epi8_mask(qh, bits), z, sixteen);
            }
            for (int i = 0; i < MI; i++) {
                const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z,
                                                        act64(a, i0 + i, sb * 256 + 64 * c));
                acc[c & 1][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), two_lanes(comb[i], 2 * c), acc[c & 1][i]);
            }
        }
    }
    for (int i = 0; i < MI; i++)
        y[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][i], acc[1][i])) - hsum(mins[i]);
}
#endif

ALWAYS_INLINE void q4_k_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y) {
#if TSR_ZMM
    k4_rows_zmm(w, a, i0, MI, y, 0);
#else
    k4_rows(w, a, i0, MI, y, 0);
#endif
}

ALWAYS_INLINE void q5_k_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y) {
#if TSR_ZMM
    k4_rows_zmm(w, a, i0, MI, y, 1);
#else
    k4_rows(w, a, i0, MI, y, 1);
#endif
}

TSR_DOT_BY_ROW(q4_k, q4_k_rows)

void tsr_dot_q4_k(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a, int64_t i0,
                  int64_t mi, float *y) {
    q4_k_by_row(w, row_bytes, n_rows, a, i0, mi, y);
}

TSR_DOT_BY_ROW(q5_k, q5_k_rows)

void tsr_dot_q5_k(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a, int64_t i0,
                  int64_t mi, float *y) {
    q5_k_by_row(w, row_bytes, n_rows, a, i0, mi, y);
}

/* Q6_K (210 bytes: ql 128, qh 64, 16 signed scales, d): each quarter of 32 values holds two
 * groups of 16, lanes 0-3 and 4-7 of its dot product. */
ALWAYS_INLINE void q6_k_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y) {
    __m256 acc[2][QUANT_MI], offs[QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = offs[i] = _mm256_setzero_ps();
    const __m256i pick[4] = {_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
                             _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                             _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5),
                             _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7)};
    const int64_t nsb = a->n_in / 256;
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = w + sb * 210;
        prefetch_superblock(blk, 210);
        const __m256 d = _mm256_set1_ps(f16_at(blk + 208));
        const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192));
        const __m256 s_lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        const __m256 s_hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
        __m256 comb[2][QUANT_MI];
        for (int i = 0; i < MI; i++) {
            const int64_t k = (i0 + i) * 2 * a->nb + sb * 16;
            comb[0][i] = _mm256_mul_ps(s_lo, _mm256_loadu_ps(a->d16 + k));
            comb[1][i] = _mm256_mul_ps(s_hi, _mm256_loadu_ps(a->d16 + k + 8));
            offs[i] = _mm256_fmadd_ps(s_lo, _mm256_loadu_ps(a->ds16 + k), offs[i]);
            offs[i] = _mm256_fmadd_ps(s_hi, _mm256_loadu_ps(a->ds16 + k + 8), offs[i]);
        }
        for (int h = 0; h < 2; h++) {
            const __m256i A = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
            const __m256i B = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
            const __m256i H = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
            for (int k = 0; k < 4; k++) {
                const __m256i q = q6_codes(A, B, H, k);
                for (int i = 0; i < MI; i++) {
                    const __m256i dot = dot_u8s8(_mm256_setzero_si256(), q,
                                                 act32(a, i0 + i, sb * 256 + 128 * h + 32 * k));
                    const __m256 s = _mm256_permutevar8x32_ps(comb[h][i], pick[k]);
                    acc[k & 1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[k & 1][i]);
                }
            }
        }
    }
    for (int i = 0; i < MI; i++)
        y[i] = hsum(_mm256_add_ps(acc[0][i], acc[1][i])) - 32.0f * hsum(offs[i]);
}

#if TSR_ZMM
/* q6_k_rows with 64 values per vector: a half's ql (64 bytes) in one vector, its qh (32
 * bytes) in both halves; quarters 0/1 from the low nibbles and qh << 4 / << 2, quarters
 * 2/3 from the high nibbles and qh >> 0 / >> 2 (16-bit shifts per vector half). */
ALWAYS_INLINE void q6_k_rows_zmm(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), high2 = _mm512_set1_epi8(0x30);
    const __m512i shift01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shift23 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    __m512 acc[2][QUANT_MI], offs[QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = offs[i] = _mm512_setzero_ps();
    const int64_t nsb = a->n_in / 256;
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = w + sb * 210;
        prefetch_superblock(blk, 210);
        const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192));
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(f16_at(blk + 208)),
                                       _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
        __m512 comb[QUANT_MI];
        for (int i = 0; i < MI; i++) {
            const int64_t k = (i0 + i) * 2 * a->nb + sb * 16;
            comb[i] = _mm512_mul_ps(s, _mm512_loadu_ps(a->d16 + k));
            offs[i] = _mm512_fmadd_ps(s, _mm512_loadu_ps(a->ds16 + k), offs[i]);
        }
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * h));
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
            const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                                _mm512_and_si512(_mm512_sllv_epi16(qh, shift01), high2));
            const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                                _mm512_and_si512(_mm512_srlv_epi16(qh, shift23), high2));
            for (int p = 0; p < 2; p++) {
                /* four groups of 16: 8 h + 4 p .. 8 h + 4 p + 3, four lanes each */
                const int g = 8 * h + 4 * p;
                const __m512i idx = _mm512_setr_epi32(g, g, g, g, g + 1, g + 1, g + 1, g + 1, g + 2, g + 2,
                                                      g + 2, g + 2, g + 3, g + 3, g + 3, g + 3);
                for (int i = 0; i < MI; i++) {
                    const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), p ? q23 : q01,
                                                            act64(a, i0 + i, sb * 256 + 128 * h + 64 * p));
                    acc[p][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(idx, comb[i]),
                                                acc[p][i]);
                }
            }
        }
    }
    for (int i = 0; i < MI; i++)
        y[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][i], acc[1][i])) - 32.0f * _mm512_reduce_add_ps(offs[i]);
}
#define Q6_K_ROWS q6_k_rows_zmm
#else
#define Q6_K_ROWS q6_k_rows
#endif

TSR_DOT_BY_ROW(q6_k, Q6_K_ROWS)

void tsr_dot_q6_k(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a, int64_t i0,
                  int64_t mi, float *y) {
    q6_k_by_row(w, row_bytes, n_rows, a, i0, mi, y);
}

/* TQ2_0 (66 bytes: 64 of trits, d): for each 128 values, byte m holds values m + 32 n in
 * bits 2n; the -1 meets the activation sums as an offset d per group. */
ALWAYS_INLINE void tq2_0_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y) {
    const __m256i two = _mm256_set1_epi8(3);
#if TSR_ZMM
    __m512 acc[2][QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = _mm512_setzero_ps();
#else
    __m256 acc[2][QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
#endif
    __m256 offs[QUANT_MI];
    for (int i = 0; i < MI; i++) offs[i] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < a->n_in / 256; sb++) {
        const uint8_t *blk = w + sb * 66;
        prefetch_superblock(blk, 66);
        const __m256 d = _mm256_set1_ps(f16_at(blk + 64));
        __m256 comb[QUANT_MI];
        for (int i = 0; i < MI; i++) {
            const int64_t k = (i0 + i) * a->nb + sb * 8;
            comb[i] = _mm256_mul_ps(d, _mm256_loadu_ps(a->d + k));
            offs[i] = _mm256_fmadd_ps(d, _mm256_loadu_ps(a->ds + k), offs[i]);
        }
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 32 * h));
#if TSR_ZMM
            for (int p = 0; p < 2; p++) { /* trits 2p and 2p + 1: 64 contiguous values */
                const __m256i t0 = _mm256_and_si256(_mm256_srli_epi16(q, 4 * p), two);
                const __m256i t1 = _mm256_and_si256(_mm256_srli_epi16(q, 4 * p + 2), two);
                const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(t0), t1, 1);
                for (int i = 0; i < MI; i++) {
                    const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z,
                                                            act64(a, i0 + i, sb * 256 + 128 * h + 64 * p));
                    acc[p][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), two_lanes(comb[i], 4 * h + 2 * p), acc[p][i]);
                }
            }
#else
            for (int n = 0; n < 4; n++) {
                const __m256i t = _mm256_and_si256(_mm256_srli_epi16(q, 2 * n), two);
                for (int i = 0; i < MI; i++) {
                    const __m256i dot = dot_u8s8(_mm256_setzero_si256(), t, act32(a, i0 + i, sb * 256 + 128 * h + 32 * n));
                    acc[n & 1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), lane(comb[i], 4 * h + n), acc[n & 1][i]);
                }
            }
#endif
        }
    }
    for (int i = 0; i < MI; i++) {
#if TSR_ZMM
        y[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][i], acc[1][i])) - hsum(offs[i]);
#else
        y[i] = hsum(_mm256_add_ps(acc[0][i], acc[1][i])) - hsum(offs[i]);
#endif
    }
}

TSR_DOT_BY_ROW(tq2_0, tq2_0_rows)

void tsr_dot_tq2_0(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a, int64_t i0,
                   int64_t mi, float *y) {
    tq2_0_by_row(w, row_bytes, n_rows, a, i0, mi, y);
}

#endif
