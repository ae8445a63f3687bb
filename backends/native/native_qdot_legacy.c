/* One weight row times a few int8 activation rows for the types made of groups of 32 with
 * one scale each: Q4_1, Q5_0, Q5_1 (ggml's legacy blocks), IQ4_NL, IQ4_XS and MXFP4.
 *
 * Per group of 32 the codes meet the activation block in one integer dot product, which is
 * then scaled by weight scale x activation scale in float32:
 *   Q5_0:   sum (q - 16) a = dot(-16 sum a, q, a)    (the offset through the start value,
 *                                                     -2 sum a in each of 8 lanes)
 *   Q4_1, Q5_1: sum (d q + m) a = d dot(q, a) + m sum a   (m times the block's d * sum a)
 *   IQ4_NL, IQ4_XS, MXFP4: sum t[q] a, t[q] signed table values looked up with vpshufb
 *   (dot_s8s8); MXFP4's scale is a power of two (E8M0), its table E2M1 doubled
 * Codes are at most 5 bits or a table value of magnitude <= 127, so the AVX2 path's int16
 * pair sums cannot saturate. Two accumulators per activation row (even and odd groups) keep
 * one decode row from waiting on the FMA latency.
 *
 * With AVX512 four weight rows share each vector (as native_gemv.c's Q4_0): row r's 16 code
 * bytes in 128-bit lane r, low nibbles against the activation block's first 16 bytes
 * repeated in every lane, high nibbles against its last 16; the four rows' scales are one
 * float16 conversion, and the activation's loads, start value and scale are shared by the
 * four rows. There IQ4's table is taken as t[q] + 128 (unsigned; start value -128 sum a).
 */
#include "native_quant.h"

#if TSR_AVX2

enum { LEG_Q4_1, LEG_Q5_0, LEG_Q5_1, LEG_IQ4_NL, LEG_MXFP4 };

/* One block of a legacy type T into the accumulators of MI activation rows. */
ALWAYS_INLINE void legacy_block(const uint8_t *blk, int T, const tsr_acts *a, int64_t i0,
                                int MI, int64_t b, __m256 *acc, float *mins) {
    const float dw = T == LEG_MXFP4 ? e8m0_half(blk[0]) : f16_at(blk);
    __m256i codes;
    float m = 0.0f;
    if (T == LEG_Q4_1) {
        codes = nibbles32(blk + 4);
        m = f16_at(blk + 2);
    } else if (T == LEG_Q5_0) {
        codes = q5_codes(blk + 2);
    } else if (T == LEG_Q5_1) {
        codes = q5_codes(blk + 4);
        m = f16_at(blk + 2);
    } else if (T == LEG_IQ4_NL) {
        codes = _mm256_shuffle_epi8(iq4_table(), nibbles32(blk + 2));
    } else {
        codes = _mm256_shuffle_epi8(mxfp4_table(), nibbles32(blk + 1));
    }
    for (int i = 0; i < MI; i++) {
        const int64_t k = (i0 + i) * a->nb + b;
        const __m256i av = _mm256_loadu_si256((const __m256i *)(a->q + (i0 + i) * a->n_in + b * QK));
        __m256i dot;
        if (T == LEG_Q5_0)
            dot = dot_u8s8(_mm256_set1_epi32(-2 * a->s[k]), codes, av);
        else if (T == LEG_IQ4_NL || T == LEG_MXFP4)
            dot = dot_s8s8(_mm256_setzero_si256(), codes, av);
        else
            dot = dot_u8s8(_mm256_setzero_si256(), codes, av);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * a->d[k]), acc[i]);
        if (T == LEG_Q4_1 || T == LEG_Q5_1) mins[i] += m * a->ds[k];
    }
}

ALWAYS_INLINE void legacy_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI,
                               float *y, int T, int type_size) {
    __m256 even[QUANT_MI], odd[QUANT_MI];
    float mins_even[QUANT_MI], mins_odd[QUANT_MI];
    for (int i = 0; i < MI; i++) {
        even[i] = odd[i] = _mm256_setzero_ps();
        mins_even[i] = mins_odd[i] = 0.0f;
    }
    const int64_t nb = a->nb;
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const uint8_t *blk = w + b * type_size;
        prefetch1(blk + PREFETCH);
        legacy_block(blk, T, a, i0, MI, b, even, mins_even);
        legacy_block(blk + type_size, T, a, i0, MI, b + 1, odd, mins_odd);
    }
    if (b < nb) legacy_block(w + b * type_size, T, a, i0, MI, b, even, mins_even);
    for (int i = 0; i < MI; i++)
        y[i] = hsum(_mm256_add_ps(even[i], odd[i])) + (mins_even[i] + mins_odd[i]);
}

#if TSR_ZMM
/* float16 values at p in four rows, row_bytes apart, as 4 floats. */
ALWAYS_INLINE __m128 f16_of_4rows(const uint8_t *p, int64_t row_bytes) {
    uint16_t h[4];
    for (int r = 0; r < 4; r++) memcpy(h + r, p + r * row_bytes, 2);
    uint64_t packed;
    memcpy(&packed, h, 8);
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)packed));
}

/* The 16 code bytes at p of four rows in the 128-bit lanes of one vector. */
ALWAYS_INLINE __m512i bytes16_of_4rows(const uint8_t *p, int64_t row_bytes) {
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p + row_bytes)), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p + 2 * row_bytes)), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(p + 3 * row_bytes)), 3);
}

/* The fifth bits at p of four rows as byte masks of values 0..15 (lo) and 16..31 (hi): the
 * rows' 16-bit halves gathered by one byte shuffle. */
ALWAYS_INLINE void fifth_bits_4rows(const uint8_t *p, int64_t row_bytes, __mmask64 *lo,
                                    __mmask64 *hi) {
    uint32_t q[4];
    for (int r = 0; r < 4; r++) memcpy(q + r, p + r * row_bytes, 4);
    const __m128i halves = _mm_shuffle_epi8(
        _mm_loadu_si128((const __m128i *)q),
        _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
    *lo = (__mmask64)_mm_cvtsi128_si64(halves);
    *hi = (__mmask64)_mm_extract_epi64(halves, 1);
}

/* A 16-value table plus 128 (IQ4's, MXFP4's), in each 128-bit lane. */
ALWAYS_INLINE __m512i table_u8(__m256i table) {
    return _mm512_broadcast_i32x4(_mm_xor_si128(_mm256_castsi256_si128(table), _mm_set1_epi8((char)0x80)));
}

ALWAYS_INLINE __m512i iq4_table_u8(void) { return table_u8(iq4_table()); }

/* The E8M0 scales at p of four rows as 4 floats. */
ALWAYS_INLINE __m128 e8m0_of_4rows(const uint8_t *p, int64_t row_bytes) {
    return _mm_setr_ps(e8m0_half(p[0]), e8m0_half(p[row_bytes]), e8m0_half(p[2 * row_bytes]),
                       e8m0_half(p[3 * row_bytes]));
}

/* One 32-block of four rows of a legacy type T against MI activation rows. scale: the four
 * rows' (group) scales; min: their offsets (Q4_1, Q5_1). */
ALWAYS_INLINE void legacy_block_4rows(__m512i lo, __m512i hi, __m128 scale, __m128 min, int T,
                                      const tsr_acts *a, int64_t i0, int MI, int64_t b,
                                      __m512 *acc, __m128 *mins) {
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512 sc = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scale));
    for (int i = 0; i < MI; i++) {
        const int64_t k = (i0 + i) * a->nb + b;
        const int8_t *qa = a->q + (i0 + i) * a->n_in + b * QK;
        const __m512i a_lo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qa));
        const __m512i a_hi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(qa + 16)));
        /* the offset of the codes over the 4 lanes of a row's block: Q5_0 16, IQ4 128 */
        const int start = T == LEG_Q5_0 ? -4 * a->s[k] : T >= LEG_IQ4_NL ? -32 * a->s[k] : 0;
        __m512i dot = _mm512_dpbusd_epi32(_mm512_set1_epi32(start), lo, a_lo);
        dot = _mm512_dpbusd_epi32(dot, hi, a_hi);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sc, _mm512_set1_ps(a->d[k])), acc[i]);
        if (T == LEG_Q4_1 || T == LEG_Q5_1) mins[i] = _mm_fmadd_ps(min, _mm_set1_ps(a->ds[k]), mins[i]);
    }
}

ALWAYS_INLINE void legacy_4rows(const uint8_t *w, int64_t rb, const tsr_acts *a, int64_t i0,
                                int MI, float *y, int T, int type_size) {
    const __m512i nib = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    const int qs_at = T == LEG_Q4_1 ? 4 : T == LEG_Q5_0 ? 6 : T == LEG_Q5_1 ? 8 : T == LEG_MXFP4 ? 1 : 2;
    __m512 acc[QUANT_MI];
    __m128 mins[QUANT_MI];
    for (int i = 0; i < MI; i++) acc[i] = _mm512_setzero_ps(), mins[i] = _mm_setzero_ps();
    for (int64_t b = 0; b < a->nb; b++) {
        const uint8_t *blk = w + b * type_size;
        for (int r = 0; r < 4; r++) prefetch1(blk + r * rb + PREFETCH);
        const __m512i z = bytes16_of_4rows(blk + qs_at, rb);
        __m512i lo = _mm512_and_si512(z, nib), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
        if (T == LEG_Q5_0 || T == LEG_Q5_1) {
            __mmask64 k_lo, k_hi;
            fifth_bits_4rows(blk + qs_at - 4, rb, &k_lo, &k_hi);
            lo = _mm512_mask_add_epi8(lo, k_lo, lo, sixteen);
            hi = _mm512_mask_add_epi8(hi, k_hi, hi, sixteen);
        } else if (T == LEG_IQ4_NL || T == LEG_MXFP4) {
            const __m512i table = table_u8(T == LEG_IQ4_NL ? iq4_table() : mxfp4_table());
            lo = _mm512_shuffle_epi8(table, lo);
            hi = _mm512_shuffle_epi8(table, hi);
        }
        const __m128 scale = T == LEG_MXFP4 ? e8m0_of_4rows(blk, rb) : f16_of_4rows(blk, rb);
        const __m128 min = T == LEG_Q4_1 || T == LEG_Q5_1 ? f16_of_4rows(blk + 2, rb) : _mm_setzero_ps();
        legacy_block_4rows(lo, hi, scale, min, T, a, i0, MI, b, acc, mins);
    }
    for (int i = 0; i < MI; i++) {
        float m[4];
        _mm_storeu_ps(m, mins[i]);
        for (int r = 0; r < 4; r++)
            y[i * QUANT_ROWS + r] = _mm512_mask_reduce_add_ps((__mmask16)(0xF << 4 * r), acc[i]) + m[r];
    }
}
#endif

#if TSR_ZMM
#define LEGACY_4ROWS(name, T, size)                                                         \
    if (n_rows == QUANT_ROWS) {                                                             \
        switch (mi) {                                                                       \
        case 1: legacy_4rows(w, row_bytes, a, i0, 1, y, T, size); return;                   \
        case 2: legacy_4rows(w, row_bytes, a, i0, 2, y, T, size); return;                   \
        case 3: legacy_4rows(w, row_bytes, a, i0, 3, y, T, size); return;                   \
        default: legacy_4rows(w, row_bytes, a, i0, 4, y, T, size); return;                  \
        }                                                                                   \
    }
#else
#define LEGACY_4ROWS(name, T, size)
#endif

#define LEGACY(name, T, size)                                                               \
    ALWAYS_INLINE void name##_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI, \
                                   float *y) {                                              \
        legacy_rows(w, a, i0, MI, y, T, size);                                              \
    }                                                                                       \
    TSR_DOT_BY_ROW(name, name##_rows)                                                       \
    void tsr_dot_##name(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a, \
                        int64_t i0, int64_t mi, float *y) {                                 \
        LEGACY_4ROWS(name, T, size)                                                         \
        name##_by_row(w, row_bytes, n_rows, a, i0, mi, y);                                  \
    }

LEGACY(q4_1, LEG_Q4_1, 20)
LEGACY(q5_0, LEG_Q5_0, 22)
LEGACY(q5_1, LEG_Q5_1, 24)
LEGACY(iq4_nl, LEG_IQ4_NL, 18)
LEGACY(mxfp4, LEG_MXFP4, 17)

/* IQ4_XS: super-blocks of 256 (136 bytes: d, scales_h, scales_l, 8 x 16 bytes of nibbles);
 * group g's scale is d * (6-bit scale - 32). */
ALWAYS_INLINE void iq4_xs_rows(const uint8_t *w, const tsr_acts *a, int64_t i0, int MI,
                               float *y) {
    __m256 acc[2][QUANT_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
    const int64_t nsb = a->n_in / 256;
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = w + sb * 136;
        prefetch1(blk + PREFETCH);
        prefetch1(blk + PREFETCH + 64);
        prefetch1(blk + PREFETCH + 128);
        const float d = f16_at(blk);
        for (int g = 0; g < 8; g++) {
            const __m256i t = _mm256_shuffle_epi8(iq4_table(), nibbles32(blk + 8 + 16 * g));
            const float dg = d * (float)iq4_xs_scale(blk, g);
            for (int i = 0; i < MI; i++) {
                const int64_t b = sb * 8 + g, k = (i0 + i) * a->nb + b;
                const __m256i av = _mm256_loadu_si256((const __m256i *)(a->q + (i0 + i) * a->n_in + b * QK));
                const __m256i dot = dot_s8s8(_mm256_setzero_si256(), t, av);
                acc[g & 1][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dg * a->d[k]),
                                                acc[g & 1][i]);
            }
        }
    }
    for (int i = 0; i < MI; i++) y[i] = hsum(_mm256_add_ps(acc[0][i], acc[1][i]));
}

#if TSR_ZMM
/* The 8 group scales d (ls - 32) of an IQ4_XS super-block as floats: the low nibbles of
 * scales_l interleaved, the high 2 bits of scales_h shifted out per group. */
ALWAYS_INLINE __m256 iq4_xs_scales(const uint8_t *blk) {
    uint16_t h;
    uint32_t l;
    memcpy(&h, blk + 2, 2);
    memcpy(&l, blk + 4, 4);
    const __m128i low4 = _mm_set1_epi8(0x0F), lv = _mm_cvtsi32_si128((int)l);
    const __m128i low = _mm_unpacklo_epi8(_mm_and_si128(lv, low4), _mm_and_si128(_mm_srli_epi16(lv, 4), low4));
    __m128i high = _mm_srlv_epi16(_mm_set1_epi16((short)h), _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14));
    high = _mm_slli_epi16(_mm_and_si128(high, _mm_set1_epi16(3)), 4);
    const __m128i ls = _mm_or_si128(low, _mm_packus_epi16(high, high));
    const __m256i scale = _mm256_sub_epi32(_mm256_cvtepu8_epi32(ls), _mm256_set1_epi32(32));
    return _mm256_mul_ps(_mm256_set1_ps(f16_at(blk)), _mm256_cvtepi32_ps(scale));
}

/* Four IQ4_XS rows as four IQ4_NL rows whose group scales change per super-block: the rows'
 * 8 scales each, transposed to 4 rows' scales per group. */
ALWAYS_INLINE void iq4_xs_4rows(const uint8_t *w, int64_t rb, const tsr_acts *a, int64_t i0,
                                int MI, float *y) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512 acc[QUANT_MI];
    __m128 mins[QUANT_MI];
    for (int i = 0; i < MI; i++) acc[i] = _mm512_setzero_ps(), mins[i] = _mm_setzero_ps();
    for (int64_t sb = 0; sb < a->n_in / 256; sb++) {
        const uint8_t *blk = w + sb * 136;
        for (int r = 0; r < 4; r++)
            for (int off = 0; off < 136; off += 64) prefetch1(blk + r * rb + PREFETCH + off);
        const __m256 f0 = iq4_xs_scales(blk), f1 = iq4_xs_scales(blk + rb);
        const __m256 f2 = iq4_xs_scales(blk + 2 * rb), f3 = iq4_xs_scales(blk + 3 * rb);
        const __m256 t0 = _mm256_unpacklo_ps(f0, f1), t1 = _mm256_unpackhi_ps(f0, f1);
        const __m256 t2 = _mm256_unpacklo_ps(f2, f3), t3 = _mm256_unpackhi_ps(f2, f3);
        /* u[k]: the four rows' scales of groups k (low half) and k + 4 (high half) */
        const __m256 u[4] = {_mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xEE),
                             _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xEE)};
        for (int g = 0; g < 8; g++) {
            const __m512i z = bytes16_of_4rows(blk + 8 + 16 * g, rb);
            const __m512i lo = _mm512_shuffle_epi8(iq4_table_u8(), _mm512_and_si512(z, nib));
            const __m512i hi = _mm512_shuffle_epi8(iq4_table_u8(), _mm512_and_si512(_mm512_srli_epi16(z, 4), nib));
            const __m128 scale = g < 4 ? _mm256_castps256_ps128(u[g]) : _mm256_extractf128_ps(u[g - 4], 1);
            legacy_block_4rows(lo, hi, scale, _mm_setzero_ps(), LEG_IQ4_NL, a, i0, MI, sb * 8 + g, acc, mins);
        }
    }
    for (int i = 0; i < MI; i++)
        for (int r = 0; r < 4; r++)
            y[i * QUANT_ROWS + r] = _mm512_mask_reduce_add_ps((__mmask16)(0xF << 4 * r), acc[i]);
}
#endif

TSR_DOT_BY_ROW(iq4_xs, iq4_xs_rows)

void tsr_dot_iq4_xs(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a,
                    int64_t i0, int64_t mi, float *y) {
#if TSR_ZMM
    if (n_rows == QUANT_ROWS) {
        switch (mi) {
        case 1: iq4_xs_4rows(w, row_bytes, a, i0, 1, y); return;
        case 2: iq4_xs_4rows(w, row_bytes, a, i0, 2, y); return;
        case 3: iq4_xs_4rows(w, row_bytes, a, i0, 3, y); return;
        default: iq4_xs_4rows(w, row_bytes, a, i0, 4, y); return;
        }
    }
#endif
    iq4_xs_by_row(w, row_bytes, n_rows, a, i0, mi, y);
}

#endif
