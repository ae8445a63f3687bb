/* One weight row times a few int8 activation rows for the low-bit types Q2_K, Q3_K, TQ1_0
 * and NVFP4:
 *   Q2_K  (84 bytes per 256): value d sc_g q - dmin m_g, q 2 bits, 4-bit sc and m per 16
 *   Q3_K  (110 bytes per 256): value d sc_g (q - 4), q 3 bits, 6-bit signed sc per 16
 *   TQ1_0 (54 bytes per 256): value d (t - 1), t a trit, five (or four) per byte in base 3
 *   NVFP4 (36 bytes per 64): value ue4m3(s_g) / 2 * e2m1(q) doubled, one scale per 16
 *
 * As for Q6_K (native_qdot_k.c), the activations come in int8 blocks of 32 with a float
 * scale per 16 (d16), so one integer dot product of 32 codes gives two groups of 16 in
 * lanes 0-3 and 4-7, each scaled in float32 by its weight scale times its activation
 * scale; the offsets (Q2_K's mins, Q3_K's -4, TQ1_0's -1) meet the activation sums once per
 * super-block. Codes are unsigned and at most 3 bits (NVFP4's signed table values go
 * through the sign trick, dot_s8s8), so the AVX2 int16 pair sums cannot saturate. The
 * kernels are 256-bit; with AVX512-VNNI they run its 256-bit vpdpbusd.
 */
#include "native_quant.h"

#if TSR_AVX2

ALWAYS_INLINE __m256i act32(const tsr_acts *a, int64_t row, int64_t at) {
    return _mm256_loadu_si256((const __m256i *)(a->q + row * a->n_in + at));
}

static inline void prefetch_block(const uint8_t *blk, int bytes) {
    for (int off = 0; off < bytes; off += 64) prefetch1(blk + PREFETCH + off);
}

/* Lanes (2k, 2k + 1) of v to lanes 0-3 and 4-7: the scales of the two groups of 16 in the
 * k-th 32 values of 128. */
ALWAYS_INLINE __m256 pair_lanes(__m256 v, int k) {
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1,
                                                         2 * k + 1, 2 * k + 1, 2 * k + 1));
}

/* Eight signed bytes (scale levels) as eight floats times d. */
ALWAYS_INLINE __m256 levels8(__m128i bytes, float d) {
    return _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)));
}

/* Q2_K (scales 16, qs 64, d, dmin) and Q3_K (hmask 32, qs 64, scales 12, d): the low two
 * bits of value 128 h + 32 n + l are bits 2n of qs[32 h + l]; Q3_K's third bit is bit
 * 4h + n of hmask[l]. Group g = (value) / 16 has weight scale lanes[g] and offset
 * offsets[g] (Q2_K: dmin m_g; Q3_K: 4 d sc_g). */
ALWAYS_INLINE void k23_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y,
                            int three) {
    const int size = three ? 110 : 84, qs_at = three ? 32 : 16;
    const __m256i two = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256 acc[2][QUANT_MI], offs[QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = offs[i] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < a->n_in / 256; sb++) {
        const uint8_t *blk = w + sb * size;
        prefetch_block(blk, size);
        __m256 s[2], o[2];
        if (three) {
            int8_t sc[16];
            q3_k_scales(blk + 96, sc);
            const __m128i levels = _mm_loadu_si128((const __m128i *)sc);
            const float d = f16_at(blk + 108);
            s[0] = levels8(levels, d);
            s[1] = levels8(_mm_srli_si128(levels, 8), d);
            o[0] = _mm256_mul_ps(_mm256_set1_ps(4.0f), s[0]);
            o[1] = _mm256_mul_ps(_mm256_set1_ps(4.0f), s[1]);
        } else {
            const __m128i raw = _mm_loadu_si128((const __m128i *)blk);
            const __m128i sc = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
            const __m128i m = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F));
            const float d = f16_at(blk + 80), dmin = f16_at(blk + 82);
            s[0] = levels8(sc, d);
            s[1] = levels8(_mm_srli_si128(sc, 8), d);
            o[0] = levels8(m, dmin);
            o[1] = levels8(_mm_srli_si128(m, 8), dmin);
        }
        __m256 comb[2][QUANT_MI];
        for (int i = 0; i < MI; i++) {
            const int64_t k = (i0 + i) * 2 * a->nb + sb * 16;
            for (int h = 0; h < 2; h++) {
                comb[h][i] = _mm256_mul_ps(s[h], _mm256_loadu_ps(a->d16 + k + 8 * h));
                offs[i] = _mm256_fmadd_ps(o[h], _mm256_loadu_ps(a->ds16 + k + 8 * h), offs[i]);
            }
        }
        const __m256i hm = three ? _mm256_loadu_si256((const __m256i *)blk) : _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + qs_at + 32 * h));
            for (int n = 0; n < 4; n++) {
                __m256i t = _mm256_and_si256(_mm256_srli_epi16(q, 2 * n), two);
                if (three) { /* bit 4h + n of each hmask byte to bit 2 */
                    const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + n), one);
                    t = _mm256_or_si256(t, _mm256_slli_epi16(bit, 2));
                }
                for (int i = 0; i < MI; i++) {
                    const __m256i dot = dot_u8s8(_mm256_setzero_si256(), t,
                                                 act32(a, i0 + i, sb * 256 + 128 * h + 32 * n));
                    acc[n & 1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), pair_lanes(comb[h][i], n),
                                                    acc[n & 1][i]);
                }
            }
        }
    }
    for (int i = 0; i < MI; i++) y[i] = hsum(_mm256_add_ps(acc[0][i], acc[1][i])) - hsum(offs[i]);
}

ALWAYS_INLINE void q2_k_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y) {
    k23_rows(w, a, i0, MI, y, 0);
}

ALWAYS_INLINE void q3_k_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y) {
    k23_rows(w, a, i0, MI, y, 1);
}

TSR_DOT_BY_ROW(q2_k, q2_k_rows)

void tsr_dot_q2_k(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a, int64_t i0,
                  int64_t mi, float *y) {
    q2_k_by_row(w, row_bytes, n_rows, a, i0, mi, y);
}

TSR_DOT_BY_ROW(q3_k, q3_k_rows)

void tsr_dot_q3_k(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a, int64_t i0,
                  int64_t mi, float *y) {
    q3_k_by_row(w, row_bytes, n_rows, a, i0, mi, y);
}

/* TQ1_0 (qs 48, qh 4, d): trit planes 0..4 of qs[0..32) are values 0..159 (32 each), the
 * planes of qs[32..48) values 160..239 (16 each, two planes per vector), qh's four planes
 * values 240..255 (tq1_trits in native_quant.h). Block b of 32 has scale d, offset d. */
ALWAYS_INLINE void tq1_0_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y) {
    __m256 acc[2][QUANT_MI], offs[QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = offs[i] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < a->n_in / 256; sb++) {
        const uint8_t *blk = w + sb * 54;
        prefetch_block(blk, 54);
        const __m256 d = _mm256_set1_ps(f16_at(blk + 52));
        __m256 comb[QUANT_MI];
        for (int i = 0; i < MI; i++) {
            const int64_t k = (i0 + i) * a->nb + sb * 8;
            comb[i] = _mm256_mul_ps(d, _mm256_loadu_ps(a->d + k));
            offs[i] = _mm256_fmadd_ps(d, _mm256_loadu_ps(a->ds + k), offs[i]);
        }
        __m256i t[8];
        tq1_trits(blk, t);
        for (int b = 0; b < 8; b++) {
            for (int i = 0; i < MI; i++) {
                const __m256i dot = dot_u8s8(_mm256_setzero_si256(), t[b], act32(a, i0 + i, sb * 256 + 32 * b));
                acc[b & 1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), lane(comb[i], b), acc[b & 1][i]);
            }
        }
    }
    for (int i = 0; i < MI; i++) y[i] = hsum(_mm256_add_ps(acc[0][i], acc[1][i])) - hsum(offs[i]);
}

TSR_DOT_BY_ROW(tq1_0, tq1_0_rows)

void tsr_dot_tq1_0(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a, int64_t i0,
                   int64_t mi, float *y) {
    tq1_0_by_row(w, row_bytes, n_rows, a, i0, mi, y);
}

/* NVFP4 (4 UE4M3 scales, then 8 bytes per sub-block of 16): each 32 values are two
 * sub-blocks, lanes 0-3 and 4-7 of one dot product (nvfp4_codes in native_quant.h). */
ALWAYS_INLINE void nvfp4_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, float *y) {
    __m256 acc[2][QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->n_in / 64; b++) {
        const uint8_t *blk = w + b * 36;
        prefetch_block(blk, 36);
        const __m128 s = _mm_setr_ps(ue4m3_half(blk[0]), ue4m3_half(blk[1]), ue4m3_half(blk[2]),
                                     ue4m3_half(blk[3]));
        const __m256i v[2] = {nvfp4_codes(blk + 4), nvfp4_codes(blk + 20)};
        for (int i = 0; i < MI; i++) {
            const __m128 c = _mm_mul_ps(s, _mm_loadu_ps(a->d16 + (i0 + i) * 2 * a->nb + 4 * b));
            const __m256 comb = _mm256_castps128_ps256(c);
            for (int h = 0; h < 2; h++) {
                const __m256i dot = dot_s8s8(_mm256_setzero_si256(), v[h], act32(a, i0 + i, 64 * b + 32 * h));
                acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), pair_lanes(comb, h), acc[h][i]);
            }
        }
    }
    for (int i = 0; i < MI; i++) y[i] = hsum(_mm256_add_ps(acc[0][i], acc[1][i]));
}

TSR_DOT_BY_ROW(nvfp4, nvfp4_rows)

void tsr_dot_nvfp4(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a, int64_t i0,
                   int64_t mi, float *y) {
    nvfp4_by_row(w, row_bytes, n_rows, a, i0, mi, y);
}

#endif
