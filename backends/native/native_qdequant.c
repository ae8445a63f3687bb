/* Rows of the block types of native_quant.h to float32, each value computed with the float32
 * operations of the numpy dequantization (plugins/quant) in the same order, so that the
 * compute dtype's rounding of the result (native_qgemv.c) is bit for bit the torch path's:
 *   Q4_1, Q5_1: d q + m           Q5_0: d (q - 16)           IQ4_NL: d t[q]
 *   IQ4_XS: (d (ls - 32)) t[q]    Q4_K, Q5_K: (d sc) q - (dmin m)    Q6_K: (d sc) (q - 32)
 *   MXFP4: 2^(e - 128) t[q]       TQ2_0, TQ1_0: d (t - 1)    NVFP4: (ue4m3(s) / 2) t[q]
 *   Q2_K: (d sc) q - (dmin m)     Q3_K: (d sc) (q - 4)
 * ROUNDED keeps gcc from fusing a product and a sum into one FMA (one rounding, not two).
 */
#include "native_quant.h"

#if TSR_AVX2

/* Values y[0..32) = codes * scale (+ offset): codes 32 bytes, signed when sign, minus bias;
 * scale_hi (offset_hi) is the scale (offset) of values 16..31 (groups of 16), else scale. */
ALWAYS_INLINE void group32x2(__m256i codes, int sign, int bias, float scale, float scale_hi,
                             int has_offset, float offset, float offset_hi, int subtract, float *y) {
    const __m128i halves[2] = {_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1)};
    for (int j = 0; j < 4; j++) {
        const __m128i bytes = j % 2 ? _mm_srli_si128(halves[j / 2], 8) : halves[j / 2];
        __m256i n = sign ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
        n = _mm256_sub_epi32(n, _mm256_set1_epi32(bias));
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(n), _mm256_set1_ps(j < 2 ? scale : scale_hi));
        if (has_offset) {
            ROUNDED(v);
            const __m256 o = _mm256_set1_ps(j < 2 ? offset : offset_hi);
            v = subtract ? _mm256_sub_ps(v, o) : _mm256_add_ps(v, o);
        }
        _mm256_storeu_ps(y + 8 * j, v);
    }
}

ALWAYS_INLINE void group32(__m256i codes, int sign, int bias, float scale, float scale_hi,
                           int has_offset, float offset, int subtract, float *y) {
    group32x2(codes, sign, bias, scale, scale_hi, has_offset, offset, offset, subtract, y);
}

void tsr_deq_q4_1(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t b = 0; b < n_in / QK; b++, w += 20) {
        const float d = f16_at(w);
        group32(nibbles32(w + 4), 0, 0, d, d, 1, f16_at(w + 2), 0, y + b * QK);
    }
}

void tsr_deq_q5_0(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t b = 0; b < n_in / QK; b++, w += 22) {
        const float d = f16_at(w);
        group32(q5_codes(w + 2), 0, 16, d, d, 0, 0.0f, 0, y + b * QK);
    }
}

void tsr_deq_q5_1(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t b = 0; b < n_in / QK; b++, w += 24) {
        const float d = f16_at(w);
        group32(q5_codes(w + 4), 0, 0, d, d, 1, f16_at(w + 2), 0, y + b * QK);
    }
}

void tsr_deq_iq4_nl(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t b = 0; b < n_in / QK; b++, w += 18) {
        const float d = f16_at(w);
        group32(_mm256_shuffle_epi8(iq4_table(), nibbles32(w + 2)), 1, 0, d, d, 0, 0.0f, 0,
                y + b * QK);
    }
}

void tsr_deq_iq4_xs(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t sb = 0; sb < n_in / 256; sb++, w += 136) {
        const float d = f16_at(w);
        for (int g = 0; g < 8; g++) {
            const float dg = d * (float)iq4_xs_scale(w, g);
            const __m256i t = _mm256_shuffle_epi8(iq4_table(), nibbles32(w + 8 + 16 * g));
            group32(t, 1, 0, dg, dg, 0, 0.0f, 0, y + sb * 256 + 32 * g);
        }
    }
}

void tsr_deq_mxfp4(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t b = 0; b < n_in / QK; b++, w += 17) {
        const float d = e8m0_half(w[0]);
        group32(_mm256_shuffle_epi8(mxfp4_table(), nibbles32(w + 1)), 1, 0, d, d, 0, 0.0f, 0,
                y + b * QK);
    }
}

void tsr_deq_tq2_0(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t sb = 0; sb < n_in / 256; sb++, w += 66) {
        const float d = f16_at(w + 64);
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w + 32 * h));
            for (int n = 0; n < 4; n++) { /* byte m: values 128 h + 32 n + m in bits 2n */
                const __m256i t = _mm256_and_si256(_mm256_srli_epi16(q, 2 * n), _mm256_set1_epi8(3));
                group32(t, 0, 1, d, d, 0, 0.0f, 0, y + sb * 256 + 128 * h + 32 * n);
            }
        }
    }
}

static void k4_dequant(const uint8_t *w, int64_t n_in, float *y, int five) {
    const int size = five ? 176 : 144, qs_at = five ? 48 : 16;
    for (int64_t sb = 0; sb < n_in / 256; sb++, w += size) {
        const float d = f16_at(w), dmin = f16_at(w + 2);
        uint64_t sc, m;
        k4_scales(w + 4, &sc, &m);
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w + qs_at + 32 * (g / 2)));
            __m256i codes = _mm256_and_si256(g % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0F));
            if (five) {
                const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, g), _mm256_set1_epi8(1));
                codes = _mm256_or_si256(codes, _mm256_slli_epi16(bit, 4));
            }
            const float scale = d * (float)(sc >> 8 * g & 0xFF);
            const float offset = dmin * (float)(m >> 8 * g & 0xFF);
            group32(codes, 0, 0, scale, scale, 1, offset, 1, y + sb * 256 + 32 * g);
        }
    }
}

void tsr_deq_q4_k(const uint8_t *w, int64_t n_in, float *y) { k4_dequant(w, n_in, y, 0); }

void tsr_deq_q5_k(const uint8_t *w, int64_t n_in, float *y) { k4_dequant(w, n_in, y, 1); }

void tsr_deq_q6_k(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t sb = 0; sb < n_in / 256; sb++, w += 210) {
        const float d = f16_at(w + 208);
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int h = 0; h < 2; h++) {
            const __m256i A = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
            const __m256i B = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
            const __m256i H = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            for (int k = 0; k < 4; k++) {
                const int g = 8 * h + 2 * k;
                group32(q6_codes(A, B, H, k), 0, 32, d * (float)sc[g], d * (float)sc[g + 1], 0,
                        0.0f, 0, y + sb * 256 + 128 * h + 32 * k);
            }
        }
    }
}

/* Q2_K (scales 16, qs 64, d, dmin) and Q3_K (hmask 32, qs 64, scales 12, d): value
 * 128 h + 32 n + l has its low bits at bits 2n of qs[32 h + l] (Q3_K: its third bit is bit
 * 4h + n of hmask[l]); groups of 16. */
void tsr_deq_q2_k(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t sb = 0; sb < n_in / 256; sb++, w += 84) {
        const float d = f16_at(w + 80), dmin = f16_at(w + 82);
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * h));
            for (int n = 0; n < 4; n++) {
                const int g = 8 * h + 2 * n;
                const __m256i codes = _mm256_and_si256(_mm256_srli_epi16(q, 2 * n), _mm256_set1_epi8(3));
                group32x2(codes, 0, 0, d * (float)(w[g] & 15), d * (float)(w[g + 1] & 15), 1,
                          dmin * (float)(w[g] >> 4), dmin * (float)(w[g + 1] >> 4), 1,
                          y + sb * 256 + 128 * h + 32 * n);
            }
        }
    }
}

void tsr_deq_q3_k(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t sb = 0; sb < n_in / 256; sb++, w += 110) {
        const float d = f16_at(w + 108);
        int8_t sc[16];
        q3_k_scales(w + 96, sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)w);
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w + 32 + 32 * h));
            for (int n = 0; n < 4; n++) {
                const int g = 8 * h + 2 * n;
                const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q, 2 * n), _mm256_set1_epi8(3));
                const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + n), _mm256_set1_epi8(1));
                group32(_mm256_or_si256(low, _mm256_slli_epi16(bit, 2)), 0, 4, d * (float)sc[g],
                        d * (float)sc[g + 1], 0, 0.0f, 0, y + sb * 256 + 128 * h + 32 * n);
            }
        }
    }
}

void tsr_deq_tq1_0(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t sb = 0; sb < n_in / 256; sb++, w += 54) {
        const float d = f16_at(w + 52);
        __m256i t[8];
        tq1_trits(w, t);
        for (int b = 0; b < 8; b++) group32(t[b], 0, 1, d, d, 0, 0.0f, 0, y + sb * 256 + 32 * b);
    }
}

void tsr_deq_nvfp4(const uint8_t *w, int64_t n_in, float *y) {
    for (int64_t b = 0; b < n_in / 64; b++, w += 36) {
        for (int h = 0; h < 2; h++)
            group32(nvfp4_codes(w + 4 + 16 * h), 1, 0, ue4m3_half(w[2 * h]), ue4m3_half(w[2 * h + 1]),
                    0, 0.0f, 0, y + 64 * b + 32 * h);
    }
}

#endif
