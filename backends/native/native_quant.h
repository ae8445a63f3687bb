/* The GGUF block types beyond Q4_0/Q8_0 (Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4, NVFP4,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, TQ1_0, TQ2_0 and the grid types of native_iq.h): what native_qgemv.c (the GEMV driver), native_qdot_*.c (one weight row times a
 * few activation rows) and native_qdequant.c (rows to float32) share: the quantized
 * activations and each type's codes unpacked into 32 bytes in activation order.
 *
 * A block's value is scale * code + offset per group of 16 or 32; the dot products take the
 * codes as unsigned bytes against int8 activation blocks of 32 (dot_u8s8), the offsets
 * through the activation sums, and IQ4's signed table values with the sign trick (dot_s8s8).
 */
#ifndef TSR_NATIVE_QUANT_H
#define TSR_NATIVE_QUANT_H

#include "native_common.h"

#define QUANT_MI 4   /* activation rows sharing one unpacking of the weight rows */
#define QUANT_ROWS 4 /* weight rows per call of a row kernel */

/* m activation rows quantized to int8 blocks of 32 (quantize32). Row i's arrays start at
 * q + i * n_in, d + i * nb, d16 + i * 2 nb ... (nb = n_in / 32). */
typedef struct {
    int8_t *q;    /* codes */
    float *d;     /* scale of each block of 32 */
    float *d16;   /* the same per 16 values (each scale twice), for groups of 16 */
    float *ds;    /* d * (sum of the block's codes): what an offset per block meets */
    float *ds16;  /* the same per 16 values */
    int32_t *s;   /* sum of the block's codes */
    int64_t n_in, nb;
} tsr_acts;

/* y[i * QUANT_ROWS + r] = weight row r (n_in values of its type at w + r * row_bytes) .
 * activation row i0 + i, for r < n_rows <= QUANT_ROWS and i < mi <= QUANT_MI, in float32. */
typedef void (*tsr_row_dot)(const uint8_t *w, int64_t row_bytes, int n_rows, const tsr_acts *a,
                            int64_t i0, int64_t mi, float *y);
/* y (n_in float32) = weight row w, each value computed as the numpy dequantization does
 * (the same float32 operations in the same order). */
typedef void (*tsr_row_dequant)(const uint8_t *w, int64_t n_in, float *y);

#define TSR_DOT_DECL(name) \
    void tsr_dot_##name(const uint8_t *, int64_t, int, const tsr_acts *, int64_t, int64_t, float *);
TSR_DOT_DECL(q4_1)
TSR_DOT_DECL(q5_0)
TSR_DOT_DECL(q5_1)
TSR_DOT_DECL(iq4_nl)
TSR_DOT_DECL(iq4_xs)
TSR_DOT_DECL(mxfp4)
TSR_DOT_DECL(tq2_0)
TSR_DOT_DECL(q4_k)
TSR_DOT_DECL(q5_k)
TSR_DOT_DECL(q6_k)
TSR_DOT_DECL(q2_k)
TSR_DOT_DECL(q3_k)
TSR_DOT_DECL(tq1_0)
TSR_DOT_DECL(nvfp4)
TSR_DOT_DECL(iq2_xxs)
TSR_DOT_DECL(iq2_xs)
TSR_DOT_DECL(iq2_s)
TSR_DOT_DECL(iq3_xxs)
TSR_DOT_DECL(iq3_s)
TSR_DOT_DECL(iq1_s)
TSR_DOT_DECL(iq1_m)
void tsr_deq_q4_1(const uint8_t *, int64_t, float *);
void tsr_deq_q5_0(const uint8_t *, int64_t, float *);
void tsr_deq_q5_1(const uint8_t *, int64_t, float *);
void tsr_deq_iq4_nl(const uint8_t *, int64_t, float *);
void tsr_deq_iq4_xs(const uint8_t *, int64_t, float *);
void tsr_deq_mxfp4(const uint8_t *, int64_t, float *);
void tsr_deq_tq2_0(const uint8_t *, int64_t, float *);
void tsr_deq_q4_k(const uint8_t *, int64_t, float *);
void tsr_deq_q5_k(const uint8_t *, int64_t, float *);
void tsr_deq_q6_k(const uint8_t *, int64_t, float *);
void tsr_deq_q2_k(const uint8_t *, int64_t, float *);
void tsr_deq_q3_k(const uint8_t *, int64_t, float *);
void tsr_deq_tq1_0(const uint8_t *, int64_t, float *);
void tsr_deq_nvfp4(const uint8_t *, int64_t, float *);
void tsr_deq_iq2_xxs(const uint8_t *, int64_t, float *);
void tsr_deq_iq2_xs(const uint8_t *, int64_t, float *);
void tsr_deq_iq2_s(const uint8_t *, int64_t, float *);
void tsr_deq_iq3_xxs(const uint8_t *, int64_t, float *);
void tsr_deq_iq3_s(const uint8_t *, int64_t, float *);
void tsr_deq_iq1_s(const uint8_t *, int64_t, float *);
void tsr_deq_iq1_m(const uint8_t *, int64_t, float *);

/* Expands a switch over mi = 1 .. QUANT_MI into calls of an always-inline kernel whose MI is
 * then a constant (its loops over activation rows unroll, accumulators stay in registers). */
#define TSR_FOR_MI(kernel, w, a, i0, mi, y) \
    switch (mi) {                           \
    case 1: kernel(w, a, i0, 1, y); break;  \
    case 2: kernel(w, a, i0, 2, y); break;  \
    case 3: kernel(w, a, i0, 3, y); break;  \
    default: kernel(w, a, i0, 4, y); break; \
    }

/* tsr_dot_<name> over a one-row kernel one_row(w, a, i0, MI, y): each row in turn. */
#define TSR_DOT_BY_ROW(name, one_row)                                                       \
    static void name##_by_row(const uint8_t *w, int64_t row_bytes, int n_rows,              \
                              const tsr_acts *a, int64_t i0, int64_t mi, float *y) {        \
        for (int r = 0; r < n_rows; r++) {                                                  \
            float yr[QUANT_MI];                                                             \
            TSR_FOR_MI(one_row, w + r * row_bytes, a, i0, mi, yr)                           \
            for (int64_t i = 0; i < mi; i++) y[i * QUANT_ROWS + r] = yr[i];                 \
        }                                                                                   \
    }

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Keeps a product from being fused with the next addition (gcc contracts a * b + c into
 * an FMA, even across intrinsics): the dequantizations round each step as numpy does. */
#define ROUNDED(v) __asm__("" : "+x"(v))

/* 16 bytes of nibbles: value j (low nibble of byte j) then value j + 16 (high nibble). */
ALWAYS_INLINE __m256i nibbles32(const uint8_t *p) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)p);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* Byte j = 16 where bit j of the little-endian 32 bits at p is set, else 0 (the fifth bit
 * of Q5_0 / Q5_1 codes). */
ALWAYS_INLINE __m256i fifth_bits(const uint8_t *p) {
    uint32_t qh;
    memcpy(&qh, p, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_mov_epi8((__mmask32)qh, _mm256_set1_epi8(16));
#else
    /* byte j gets byte j / 8 of qh, then its bit j % 8 is tested */
    const __m256i which = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                           2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), which);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
#endif
}

/* Codes 0..31 of a Q5_0 / Q5_1 block: qh (4 bytes) then qs (16). */
ALWAYS_INLINE __m256i q5_codes(const uint8_t *qh) {
    return _mm256_or_si256(nibbles32(qh + 4), fifth_bits(qh));
}

/* ggml's kvalues_iq4nl in each 128-bit lane (the 16 values of the IQ4 formats' table). */
ALWAYS_INLINE __m256i iq4_table(void) {
    return _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                            113, -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69,
                            89, 113);
}

/* MXFP4's E2M1 values doubled (0, 1, 2, 3, 4, 6, 8, 12 and their negatives), in each lane. */
ALWAYS_INLINE __m256i mxfp4_table(void) {
    return _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3,
                            4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
}

/* An MXFP4 block's E8M0 scale byte as float32, halved for the doubled table: 2^(e - 128),
 * exact, the two smallest as the subnormals 2^-128 and 2^-127 (ggml's table). */
ALWAYS_INLINE float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

/* IQ4_XS group g's 6-bit scale minus 32, from a block's scales_h (bytes 2-3) and scales_l
 * (bytes 4-7). */
ALWAYS_INLINE int iq4_xs_scale(const uint8_t *blk, int g) {
    uint16_t h;
    memcpy(&h, blk + 2, 2);
    const int low = blk[4 + g / 2] >> 4 * (g % 2) & 15;
    return (low | (h >> 2 * g & 3) << 4) - 32;
}

/* The 6-bit scales and mins of groups 0..7 of Q4_K / Q5_K (12 bytes at s) as 8 bytes each:
 * groups 0-3 in the low 6 bits of bytes 0-3 / 4-7, groups 4-7 a nibble of bytes 8-11 and
 * the top two bits of bytes 0-3 / 4-7. */
ALWAYS_INLINE void k4_scales(const uint8_t *s, uint64_t *sc, uint64_t *m) {
    uint32_t a, b, c;
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    const uint32_t sc_hi = (c & 0x0F0F0F0Fu) | (a >> 2 & 0x30303030u);
    const uint32_t m_hi = (c >> 4 & 0x0F0F0F0Fu) | (b >> 2 & 0x30303030u);
    *sc = (a & 0x3F3F3F3Fu) | (uint64_t)sc_hi << 32;
    *m = (b & 0x3F3F3F3Fu) | (uint64_t)m_hi << 32;
}

/* Eight bytes (unsigned) as eight floats. */
ALWAYS_INLINE __m256 u8x8_ps(uint64_t v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v)));
}

/* Lane k of v in every lane. */
ALWAYS_INLINE __m256 lane(__m256 v, int k) {
    return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(k));
}

/* Q6_K's codes 0..63 of quarter k (values 32 k .. 32 k + 31) of a half of 128 values: the
 * low 4 bits from ql (64 bytes: A = bytes 0-31, B = 32-63; quarters 0/1 low nibbles, 2/3
 * high), the high 2 bits from qh (32 bytes H, bits 2 k .. 2 k + 1). Shifts act on 16-bit
 * lanes; the masks keep only bits of the byte's own. */
ALWAYS_INLINE __m256i q6_codes(__m256i A, __m256i B, __m256i H, int k) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), high2 = _mm256_set1_epi8(0x30);
    switch (k) {
    case 0:
        return _mm256_or_si256(_mm256_and_si256(A, low4),
                               _mm256_and_si256(_mm256_slli_epi16(H, 4), high2));
    case 1:
        return _mm256_or_si256(_mm256_and_si256(B, low4),
                               _mm256_and_si256(_mm256_slli_epi16(H, 2), high2));
    case 2:
        return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), low4),
                               _mm256_and_si256(H, high2));
    default:
        return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), low4),
                               _mm256_and_si256(_mm256_srli_epi16(H, 2), high2));
    }
}

/* Q3_K's 16 group scales minus 32 (signed 6 bits) from its 12 scale bytes at s: the low
 * nibble of group j is nibble j / 8 of s[j % 8], its top two bits bits 2 (j / 4) of
 * s[8 + j % 4]. */
ALWAYS_INLINE void q3_k_scales(const uint8_t *s, int8_t *sc) {
    for (int j = 0; j < 16; j++) {
        const int low = s[j % 8] >> 4 * (j / 8) & 15, high = s[8 + j % 4] >> 2 * (j / 4) & 3;
        sc[j] = (int8_t)((low | high << 4) - 32);
    }
}

/* Bytes v times the 16-bit lanes of f, each byte modulo 256 (x86 has no byte multiply). */
ALWAYS_INLINE __m128i mul_u8(__m128i v, __m128i f) {
    const __m128i low = _mm_and_si128(_mm_mullo_epi16(v, f), _mm_set1_epi16(0x00FF));
    const __m128i high = _mm_slli_epi16(_mm_mullo_epi16(_mm_srli_epi16(v, 8), f), 8);
    return _mm_or_si128(low, high);
}

ALWAYS_INLINE __m128i times3_u8(__m128i v) { return _mm_add_epi8(_mm_add_epi8(v, v), v); }

/* The trit (3 b) >> 8 of each byte b: 1 from b = 86, 2 from b = 171. */
ALWAYS_INLINE __m256i trit_of(__m256i b) {
    const __m256i ge1 = _mm256_cmpeq_epi8(_mm256_max_epu8(b, _mm256_set1_epi8(86)), b);
    const __m256i ge2 = _mm256_cmpeq_epi8(_mm256_max_epu8(b, _mm256_set1_epi8((char)171)), b);
    return _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(ge1, ge2));
}

/* A TQ1_0 block's 256 trits (0..2) as 8 vectors of 32 in value order: trit n of a byte is
 * that of (byte 3^n mod 256). qs[0..32): plane n is values 32 n ..; qs[32..48): plane n is
 * values 160 + 16 n ..; qh (4 bytes at 48): trit n of qh[j] is value 240 + 4 n + j. */
ALWAYS_INLINE void tq1_trits(const uint8_t *blk, __m256i *t) {
    __m256i p = _mm256_loadu_si256((const __m256i *)blk);
    for (int n = 0; n < 5; n++) {
        t[n] = trit_of(p);
        p = _mm256_add_epi8(_mm256_add_epi8(p, p), p);
    }
    const __m128i r0 = _mm_loadu_si128((const __m128i *)(blk + 32)), r1 = times3_u8(r0);
    const __m128i r2 = times3_u8(r1), r3 = times3_u8(r2), r4 = times3_u8(r3);
    uint32_t qh;
    memcpy(&qh, blk + 48, 4);
    const __m128i h = mul_u8(_mm_set1_epi32((int)qh), _mm_setr_epi16(1, 1, 3, 3, 9, 9, 27, 27));
    t[5] = trit_of(_mm256_set_m128i(r1, r0));
    t[6] = trit_of(_mm256_set_m128i(r3, r2));
    t[7] = trit_of(_mm256_set_m128i(h, r4));
}

/* An NVFP4 UE4M3 scale byte as float32, halved for the doubled E2M1 table (exact): 0 for
 * bytes 0x00 and 0x7F, the top bit ignored, as ggml's ggml_ue4m3_to_fp32. */
ALWAYS_INLINE float ue4m3_half(uint8_t b) {
    if (b == 0 || b == 0x7F) return 0.0f;
    const int e = b >> 3 & 15, m = b & 7;
    if (e == 0) return (float)m * 0x1p-10f;
    const uint32_t bits = (uint32_t)(e + 119) << 23 | (uint32_t)m << 20; /* (1 + m/8) 2^(e-8) */
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

/* Two NVFP4 sub-blocks (16 bytes at p: 8 each, low nibble value j, high nibble j + 8) as
 * their 32 doubled E2M1 values (signed bytes) in value order. */
ALWAYS_INLINE __m256i nvfp4_codes(const uint8_t *p) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)p), low4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, low4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    const __m256i codes = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
    return _mm256_shuffle_epi8(mxfp4_table(), codes);
}

#endif
