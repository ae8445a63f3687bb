/* Decode matmuls (a few activation rows) straight from GGUF Q8_0 / Q4_0 block bytes, and
 * Q4_0 dequantization for prefill (tsr_dequant_q4_0, at the end).
 *
 * Built and loaded by tessera/backends/native_gemv.py (cc -O3 -march=native -fopenmp).
 * The activation rows are quantized to int8 blocks of 32 with one float scale each (as
 * ggml's q8_0 activations), then every weight block is an integer dot product on the VNNI
 * unit (vpdpbusd: unsigned bytes x signed bytes, summed by fours into int32 lanes).
 *
 * vpdpbusd wants one unsigned operand, so the weight codes are made unsigned and the
 * offset is taken back through the accumulator's start value:
 *   Q4_0: sum (n - 8) a = dpbusd(-8 sum a, n, a)          n = nibble, 0..15
 *   Q8_0: sum q a       = dpbusd(-128 sum a, q ^ 0x80, a)  q ^ 0x80 = q + 128, 0..255
 * The start value is spread evenly over the lanes that hold one row's block (4 or 8), so
 * it is one broadcast per activation block, shared by all weight rows. Per lane |sum| <=
 * 4 * 255 * 127 + 16 * 32 * 127, far from int32 overflow.
 *
 * Four output rows are done per pass over an activation row, so activation loads and the
 * float work are shared; with AVX512 the four rows' blocks share vectors (Q4_0: the four
 * rows' 16 code bytes in one 512-bit vector; Q8_0: two rows per vector): ~1.5 ns per
 * block and row with the weights in cache here, so the memory read is the limit. OpenMP
 * splits the output rows over the caller's thread count. Weights are read in place
 * (memory-mapped file bytes), never copied.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK 32
#define ROWS 4   /* weight rows per pass over an activation row */
#define MI_MAX 4 /* activation rows sharing one unpacking of the weight blocks */
#ifndef PREFETCH
/* Bytes ahead in each weight row: far enough to cross 4 KiB pages, where the hardware
 * prefetchers stop (the file's pages are not huge pages); 16 KiB measured best, 512 B
 * gave 70% of its throughput on the 0.5B model's matrices. */
#define PREFETCH 16384
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#define TSR_HAVE_VNNI 1
#elif defined(__AVXVNNI__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#define TSR_HAVE_VNNI 1
#else
#define TSR_HAVE_VNNI 0
#endif
/* 512-bit path: two weight rows per vector (AVX512-VNNI with BW/VL, and F16C) */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define TSR_ZMM 1
#else
#define TSR_ZMM 0
#endif

int tsr_native_abi(void) { return 3; }

int tsr_native_vnni(void) { return TSR_HAVE_VNNI; }

int tsr_native_zmm(void) { return TSR_ZMM; }

#if TSR_HAVE_VNNI

typedef struct {
    int8_t *q;   /* (m, n_in) int8 codes */
    float *d;    /* (m, nb) block scales */
    int32_t *s8; /* (m, nb) start value per lane when 8 lanes hold a row's block */
    int32_t *s4; /* (m, nb) the same for 4 lanes (Q4_0's 4-row layout) */
} act_q8;

static float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* Activations and outputs are float32, bfloat16 or float16 (the caller's compute dtype),
 * so the caller converts nothing: each conversion costs a few microseconds in torch. */
enum { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };

static inline __m256 load8(const void *x, int64_t i, int dtype) {
    if (dtype == DT_BF16) {
        const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (dtype == DT_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)x + i)));
    return _mm256_loadu_ps((const float *)x + i);
}

static inline void store1(void *y, int64_t i, float v, int dtype) {
    if (dtype == DT_BF16) {
        uint32_t u;
        memcpy(&u, &v, 4);
        /* round to nearest even, as torch's float -> bfloat16; NaN stays a quiet NaN */
        u = (v != v) ? (u | 0x00400000u) : u + 0x7FFFu + ((u >> 16) & 1u);
        ((uint16_t *)y)[i] = (uint16_t)(u >> 16);
    } else if (dtype == DT_F16) {
        ((uint16_t *)y)[i] = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
    } else {
        ((float *)y)[i] = v;
    }
}

/* One block of 32 values to 32 int8 codes: d = max|x| / 127, q = round-to-nearest(x / d). */
static void quantize_block(const void *x, int64_t i, int dtype, int8_t *q, float *d, int32_t *s8,
                           int32_t *s4, int offset) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v0 = load8(x, i, dtype), v1 = load8(x, i + 8, dtype);
    __m256 v2 = load8(x, i + 16, dtype), v3 = load8(x, i + 24, dtype);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    *d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, id));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, id));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, id));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, id));
    const int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    /* packs works within 128-bit lanes: put the 4-byte groups back in order */
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    *s8 = -(offset / 8) * sum;
    *s4 = -(offset / 4) * sum;
}

static int quantize_act(const void *x, int dtype, int64_t m, int64_t n_in, int offset,
                        act_q8 *a) {
    const int64_t nb = n_in / QK;
    a->q = malloc((size_t)(m * n_in + 64)); /* read with unaligned loads */
    a->d = malloc(sizeof(float) * (size_t)(m * nb + 1));
    a->s8 = malloc(sizeof(int32_t) * (size_t)(m * nb + 1));
    a->s4 = malloc(sizeof(int32_t) * (size_t)(m * nb + 1));
    if (!a->q || !a->d || !a->s8 || !a->s4) return 0;
    for (int64_t i = 0; i < m * nb; i++)
        quantize_block(x, i * QK, dtype, a->q + i * QK, a->d + i, a->s8 + i, a->s4 + i, offset);
    return 1;
}

static void free_act(act_q8 *a) {
    free(a->q);
    free(a->d);
    free(a->s8);
    free(a->s4);
}

/* The weight codes of one block as 32 unsigned bytes in activation order. */
static inline __m256i q4_0_codes(const uint8_t *blk) {
    /* low nibbles are values 0..15 of the block, high nibbles values 16..31 */
    const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 2));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

static inline __m256i q8_0_codes(const uint8_t *blk) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 2));
    return _mm256_xor_si256(raw, _mm256_set1_epi8((char)0x80));
}

static inline float f16_scale(const uint8_t *blk) {
    uint16_t h;
    memcpy(&h, blk, 2);
    return _cvtsh_ss(h);
}

/* prefetcht0 as asm: gcc 12 silently dropped _mm_prefetch once these kernels were inlined
 * into the OpenMP region (40% slower decode; check with objdump -d | grep prefetch). */
static inline void prefetch1(const uint8_t *p) {
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
}

/* y[r] = dot(weight row r, activation row) for r < R, R a compile-time constant after
 * inlining; type_size 18 (Q4_0) or 34 (Q8_0) picks the code unpacking. */
static inline __attribute__((always_inline)) void dot_rows(
    const uint8_t *w, int64_t row_bytes, int R, int64_t nb, int type_size, const int8_t *qa,
    const float *da, const int32_t *s8, float *y) {
    __m256 acc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(qa + b * QK));
        const __m256i s = _mm256_set1_epi32(s8[b]);
        const float d = da[b];
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = w + r * row_bytes + b * type_size;
            prefetch1(blk + PREFETCH);
            const __m256i u = type_size == 18 ? q4_0_codes(blk) : q8_0_codes(blk);
            const __m256 dot = _mm256_cvtepi32_ps(DPBUSD(s, u, a));
            acc[r] = _mm256_fmadd_ps(dot, _mm256_set1_ps(f16_scale(blk) * d), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[r] = hsum(acc[r]);
}

#if TSR_ZMM
/* f16 scales of block b in four rows as 4 floats. */
static inline __m128 scales4(const uint8_t *blk, int64_t row_bytes) {
    uint16_t h0, h1, h2, h3;
    memcpy(&h0, blk, 2);
    memcpy(&h1, blk + row_bytes, 2);
    memcpy(&h2, blk + 2 * row_bytes, 2);
    memcpy(&h3, blk + 3 * row_bytes, 2);
    const uint64_t h = h0 | (uint64_t)h1 << 16 | (uint64_t)h2 << 32 | (uint64_t)h3 << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h));
}


static inline void prefetch4(const uint8_t *p, int64_t row_bytes) {
    prefetch1(p + PREFETCH);
    prefetch1(p + row_bytes + PREFETCH);
    prefetch1(p + 2 * row_bytes + PREFETCH);
    prefetch1(p + 3 * row_bytes + PREFETCH);
}

/* Q4_0, four weight rows x MI activation rows: weight row r's 16 code bytes in 128-bit lane
 * r; low nibbles (values 0..15) meet the activation's first 16 bytes repeated in every
 * lane, high nibbles its last 16. y[i * 4 + r]. */
static inline __attribute__((always_inline)) void q4_0_4rows(
    const uint8_t *w, int64_t row_bytes, int64_t nb, const act_q8 *a, int64_t i0, int64_t n_in,
    int MI, float *y) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[MI_MAX];
    for (int i = 0; i < MI; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * 18;
        prefetch4(blk, row_bytes);
        __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(blk + 2)));
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(blk + row_bytes + 2)), 1);
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(blk + 2 * row_bytes + 2)), 2);
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(blk + 3 * row_bytes + 2)), 3);
        const __m512i lo = _mm512_and_si512(z, nib);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
        const __m512 sc = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scales4(blk, row_bytes)));
        for (int i = 0; i < MI; i++) {
            const int8_t *qa = a->q + (i0 + i) * n_in + b * QK;
            const int64_t k = (i0 + i) * nb + b;
            const __m512i a_lo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qa));
            const __m512i a_hi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(qa + 16)));
            __m512i dot = _mm512_dpbusd_epi32(_mm512_set1_epi32(a->s4[k]), lo, a_lo);
            dot = _mm512_dpbusd_epi32(dot, hi, a_hi);
            const __m512 s = _mm512_mul_ps(sc, _mm512_set1_ps(a->d[k]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc[i]);
        }
    }
    for (int i = 0; i < MI; i++) {
        y[i * ROWS + 0] = _mm512_mask_reduce_add_ps(0x000F, acc[i]);
        y[i * ROWS + 1] = _mm512_mask_reduce_add_ps(0x00F0, acc[i]);
        y[i * ROWS + 2] = _mm512_mask_reduce_add_ps(0x0F00, acc[i]);
        y[i * ROWS + 3] = _mm512_mask_reduce_add_ps((__mmask16)0xF000, acc[i]);
    }
}

/* Q8_0, four weight rows x MI activation rows: two weight rows' 32 code bytes per vector,
 * the activation block repeated. */
static inline __attribute__((always_inline)) void q8_0_4rows(
    const uint8_t *w, int64_t row_bytes, int64_t nb, const act_q8 *a, int64_t i0, int64_t n_in,
    int MI, float *y) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i spread01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i spread23 = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    __m512 acc01[MI_MAX], acc23[MI_MAX];
    for (int i = 0; i < MI; i++) acc01[i] = acc23[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * 34;
        prefetch4(blk, row_bytes);
        __m512i z01 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2)));
        z01 = _mm512_inserti64x4(z01, _mm256_loadu_si256((const __m256i *)(blk + row_bytes + 2)), 1);
        __m512i z23 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2 * row_bytes + 2)));
        z23 = _mm512_inserti64x4(z23, _mm256_loadu_si256((const __m256i *)(blk + 3 * row_bytes + 2)), 1);
        z01 = _mm512_xor_si512(z01, flip);
        z23 = _mm512_xor_si512(z23, flip);
        const __m512 sc = _mm512_castps128_ps512(scales4(blk, row_bytes));
        const __m512 sc01 = _mm512_permutexvar_ps(spread01, sc);
        const __m512 sc23 = _mm512_permutexvar_ps(spread23, sc);
        for (int i = 0; i < MI; i++) {
            const int64_t k = (i0 + i) * nb + b;
            const __m512i av = _mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)(a->q + (i0 + i) * n_in + b * QK)));
            const __m512i s = _mm512_set1_epi32(a->s8[k]);
            const __m512 d = _mm512_set1_ps(a->d[k]);
            const __m512i dot01 = _mm512_dpbusd_epi32(s, z01, av);
            const __m512i dot23 = _mm512_dpbusd_epi32(s, z23, av);
            acc01[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot01), _mm512_mul_ps(sc01, d), acc01[i]);
            acc23[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot23), _mm512_mul_ps(sc23, d), acc23[i]);
        }
    }
    for (int i = 0; i < MI; i++) {
        y[i * ROWS + 0] = _mm512_mask_reduce_add_ps(0x00FF, acc01[i]);
        y[i * ROWS + 1] = _mm512_mask_reduce_add_ps((__mmask16)0xFF00, acc01[i]);
        y[i * ROWS + 2] = _mm512_mask_reduce_add_ps(0x00FF, acc23[i]);
        y[i * ROWS + 3] = _mm512_mask_reduce_add_ps((__mmask16)0xFF00, acc23[i]);
    }
}

/* Four weight rows x activation rows i0 .. i0 + mi - 1 (mi <= MI_MAX) into y[i * 4 + r]. */
static void zmm_4rows(const uint8_t *w, int64_t row_bytes, int64_t nb, const act_q8 *a,
                      int64_t i0, int64_t mi, int64_t n_in, int type_size, float *y) {
#define TSR_CASE(MI)                                                                     \
    case MI:                                                                             \
        if (type_size == 18)                                                             \
            q4_0_4rows(w, row_bytes, nb, a, i0, n_in, MI, y);                            \
        else                                                                             \
            q8_0_4rows(w, row_bytes, nb, a, i0, n_in, MI, y);                            \
        break;
    switch (mi) {
        TSR_CASE(1)
        TSR_CASE(2)
        TSR_CASE(3)
        TSR_CASE(4)
    }
#undef TSR_CASE
}
#endif

static void gemv(const uint8_t *w, int64_t n_out, int64_t n_in, const void *x, int64_t m,
                 void *y, int dtype, int n_threads, int type_size, int offset) {
    const int64_t nb = n_in / QK, row_bytes = nb * type_size;
    const int64_t groups = (n_out + ROWS - 1) / ROWS;
    act_q8 a;
    if (!quantize_act(x, dtype, m, n_in, offset, &a)) {
        free_act(&a);
        for (int64_t i = 0; i < m * n_out; i++) store1(y, i, __builtin_nanf(""), dtype);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n_threads > 1)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t r0 = g * ROWS;
        const int64_t n = n_out - r0 < ROWS ? n_out - r0 : ROWS;
        const uint8_t *wg = w + r0 * row_bytes;
        float yi[MI_MAX * ROWS];
        for (int64_t i0 = 0; i0 < m; i0 += MI_MAX) {
            const int64_t mi = m - i0 < MI_MAX ? m - i0 : MI_MAX;
#if TSR_ZMM
            if (n == ROWS) {
                zmm_4rows(wg, row_bytes, nb, &a, i0, mi, n_in, type_size, yi);
            } else
#endif
            {
                for (int64_t i = 0; i < mi; i++) {
                    const int8_t *qa = a.q + (i0 + i) * n_in;
                    const float *da = a.d + (i0 + i) * nb;
                    const int32_t *s8 = a.s8 + (i0 + i) * nb;
                    if (n == ROWS && type_size == 18)
                        dot_rows(wg, row_bytes, ROWS, nb, 18, qa, da, s8, yi + i * ROWS);
                    else if (n == ROWS)
                        dot_rows(wg, row_bytes, ROWS, nb, 34, qa, da, s8, yi + i * ROWS);
                    else
                        for (int64_t r = 0; r < n; r++) {
                            const uint8_t *wr = wg + r * row_bytes;
                            float *yr = yi + i * ROWS + r;
                            if (type_size == 18)
                                dot_rows(wr, row_bytes, 1, nb, 18, qa, da, s8, yr);
                            else
                                dot_rows(wr, row_bytes, 1, nb, 34, qa, da, s8, yr);
                        }
                }
            }
            for (int64_t i = 0; i < mi; i++)
                for (int64_t r = 0; r < n; r++)
                    store1(y, (i0 + i) * n_out + r0 + r, yi[i * ROWS + r], dtype);
        }
    }
    free_act(&a);
}

/* y (m, n_out) = x (m, n_in) @ W.T, W = n_out rows of GGUF block bytes; x and y contiguous,
 * both of dtype 0 (float32), 1 (bfloat16) or 2 (float16). */
void tsr_gemv_q4_0(const uint8_t *w, int64_t n_out, int64_t n_in, const void *x, int64_t m,
                   void *y, int dtype, int n_threads) {
    gemv(w, n_out, n_in, x, m, y, dtype, n_threads, 18, 8);
}

void tsr_gemv_q8_0(const uint8_t *w, int64_t n_out, int64_t n_in, const void *x, int64_t m,
                   void *y, int dtype, int n_threads) {
    gemv(w, n_out, n_in, x, m, y, dtype, n_threads, 34, 128);
}

/* Eight float32 values to y[i..i+8) in dtype, rounded as torch rounds (to nearest even). */
static inline void store8(void *y, int64_t i, __m256 v, int dtype) {
    if (dtype == DT_BF16) {
        __m256i u = _mm256_castps_si256(v);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
        const __m128i lo = _mm256_castsi256_si128(u), hi = _mm256_extracti128_si256(u, 1);
        _mm_storeu_si128((__m128i *)((uint16_t *)y + i), _mm_packus_epi32(lo, hi));
    } else if (dtype == DT_F16) {
        _mm_storeu_si128((__m128i *)((uint16_t *)y + i),
                         _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
        _mm256_storeu_ps((float *)y + i, v);
    }
}

/* y (n_out, n_in) = the Q4_0 weight in dtype, for prefill matmuls: (n - 8) * d is exact in
 * float32 (a 4-bit integer times a float16), so the only rounding is the final one, the
 * same as torch's dequantization path gives, bit for bit. */
void tsr_dequant_q4_0(const uint8_t *w, int64_t n_out, int64_t n_in, void *y, int dtype,
                      int n_threads) {
    const int64_t nb = n_in / QK, row_bytes = nb * 18;
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n_threads > 1)
    for (int64_t r = 0; r < n_out; r++) {
        const uint8_t *blk = w + r * row_bytes;
        for (int64_t b = 0; b < nb; b++, blk += 18) {
            const __m256 d = _mm256_set1_ps(f16_scale(blk));
            const __m128i packed = _mm_loadu_si128((const __m128i *)(blk + 2));
            const __m128i low = _mm_set1_epi8(0x0F);
            /* low nibbles are values 0..15 of the block, high nibbles 16..31 */
            const __m128i halves[2] = {_mm_and_si128(packed, low),
                                       _mm_and_si128(_mm_srli_epi16(packed, 4), low)};
            for (int h = 0; h < 2; h++)
                for (int k = 0; k < 2; k++) {
                    const __m128i bytes = k ? _mm_srli_si128(halves[h], 8) : halves[h];
                    const __m256i n = _mm256_sub_epi32(_mm256_cvtepu8_epi32(bytes),
                                                       _mm256_set1_epi32(8));
                    store8(y, r * n_in + b * QK + h * 16 + k * 8,
                           _mm256_mul_ps(_mm256_cvtepi32_ps(n), d), dtype);
                }
        }
    }
}

static inline float load1(const void *x, int64_t i, int dtype) {
    if (dtype == DT_BF16) {
        const uint32_t u = (uint32_t)((const uint16_t *)x)[i] << 16;
        float v;
        memcpy(&v, &u, 4);
        return v;
    }
    if (dtype == DT_F16) return _cvtsh_ss(((const uint16_t *)x)[i]);
    return ((const float *)x)[i];
}

/* y (m, n) = x / sqrt(mean(x^2) + eps) * w per row, with float32 statistics as the torch
 * path computes them (w: float32, or NULL for none); x and y of dtype. Decode runs two per
 * layer per token: one C call instead of four torch ops. */
void tsr_rms_norm(const void *x, int64_t m, int64_t n, const float *w, float eps, void *y,
                  int dtype) {
    for (int64_t r = 0; r < m; r++) {
        const int64_t base = r * n;
        __m256 acc = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            const __m256 v = load8(x, base + i, dtype);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = hsum(acc);
        for (; i < n; i++) {
            const float v = load1(x, base + i, dtype);
            ss += v * v;
        }
        const float scale = 1.0f / _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(ss / (float)n + eps)));
        const __m256 s = _mm256_set1_ps(scale);
        for (i = 0; i + 8 <= n; i += 8) {
            __m256 v = _mm256_mul_ps(load8(x, base + i, dtype), s);
            if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
            store8(y, base + i, v, dtype);
        }
        for (; i < n; i++) {
            const float v = load1(x, base + i, dtype) * scale;
            store1(y, base + i, w ? v * w[i] : v, dtype);
        }
    }
}

/* v rounded to dtype and back, as torch rounds the result of every eager op. */
static inline float round_to(float v, int dtype) {
    if (dtype == DT_F32) return v;
    uint16_t h;
    store1(&h, 0, v, dtype);
    return load1(&h, 0, dtype);
}

/* y (t, h, d) = x with its first n_rot values of every head rotated by the angle table
 * (cos, sin: (t, n_rot / 2) of dtype), pairs (j, j + n_rot/2) when neox, else (2j, 2j+1);
 * the rest copied. Each product, difference and sum is rounded to dtype, exactly as the
 * torch path's eager ops round them, so the result is the same bit for bit. */
void tsr_rope(const void *x, int64_t t, int64_t h, int64_t d, int64_t n_rot, const void *cos,
              const void *sin, int neox, void *y, int dtype) {
    const int64_t half = n_rot / 2;
    const size_t width = dtype == DT_F32 ? 4 : 2;
    for (int64_t i = 0; i < t; i++)
        for (int64_t k = 0; k < h; k++) {
            const int64_t base = (i * h + k) * d;
            for (int64_t j = 0; j < half; j++) {
                const int64_t ia = neox ? base + j : base + 2 * j;
                const int64_t ib = neox ? base + j + half : base + 2 * j + 1;
                const float a = load1(x, ia, dtype), b = load1(x, ib, dtype);
                const float c = load1(cos, i * half + j, dtype), s = load1(sin, i * half + j, dtype);
                const float ac = round_to(a * c, dtype), bs = round_to(b * s, dtype);
                const float as = round_to(a * s, dtype), bc = round_to(b * c, dtype);
                store1(y, ia, ac - bs, dtype);
                store1(y, ib, as + bc, dtype);
            }
            if (d > n_rot)
                memcpy((char *)y + (base + n_rot) * width, (const char *)x + (base + n_rot) * width,
                       (size_t)(d - n_rot) * width);
        }
}

#endif
