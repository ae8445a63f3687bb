/* Decode matmuls (a few activation rows) straight from GGUF Q8_0 / Q4_0 block bytes, and
 * Q4_0 dequantization for prefill (tsr_dequant_q4_0, at the end).
 *
 * Built and loaded by tessera/backends/native/kernels.py (cc -O3 -march=native -fopenmp).
 * The activation rows are quantized to int8 blocks of 32 with one float scale each (as
 * ggml's q8_0 activations), then every weight block is an integer dot product on the VNNI
 * unit (vpdpbusd: unsigned bytes x signed bytes, summed by fours into int32 lanes).
 *
 * vpdpbusd wants one unsigned operand, so the weight codes are made unsigned and the
 * offset is taken back through the accumulator's start value:
 *   Q4_0: sum (n - 8) a = dpbusd(-8 sum a, n, a)          n = nibble, 0..15
 *   Q8_0: sum q a       = dpbusd(-128 sum a, q ^ 0x80, a)  q ^ 0x80 = q + 128, 0..255
 * (without VNNI, Q8_0 takes the sign trick of dot_s8s8 in native_common.h, start 0).
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
#include <math.h>
#include <stdlib.h>

#include "native_common.h"

#define ROWS 4   /* weight rows per pass over an activation row */
#define MI_MAX 4 /* activation rows sharing one unpacking of the weight blocks */
#define GEMV_MAX_WEIGHTS 8 /* weights in one tsr_gemv_n call */
/* Q8_0 codes meet vpdpbusd as q + 128 (start value -128 sum a); the AVX2 path multiplies
 * the signed codes with the sign trick instead (q + 128 would saturate vpmaddubsw). */
#define Q8_0_OFFSET (TSR_HAVE_VNNI ? 128 : 0)

static int offset_of(int type_size) { return type_size == 18 ? 8 : Q8_0_OFFSET; }
/* How gemv_n finds the blocks: the file's Q4_0 (18-byte blocks) or Q8_0 (34-byte blocks)
 * rows, or Q4_0 in the 4-row layout of native_q4_0_x4.c. */
enum { FILE_18, FILE_34, X4 };
/* The decoder block's code for Q4_0 in the 4-row layout (no GGML type has it). */
#define TSR_TYPE_Q4_0_X4 1002
#ifndef PREFETCH_X4
/* Bytes ahead in the 4-row layout's one stream of codes (its scales: an eighth of it). */
#define PREFETCH_X4 4096
#endif

int tsr_native_abi(void) { return 7; }

int tsr_native_vnni(void) { return TSR_HAVE_VNNI; }

int tsr_native_zmm(void) { return TSR_ZMM; }

#if TSR_AVX2

typedef struct {
    int8_t *q;   /* (m, n_in) int8 codes */
    float *d;    /* (m, nb) block scales */
    int32_t *s8; /* (m, nb) start value per lane when 8 lanes hold a row's block */
    int32_t *s4; /* (m, nb) the same for 4 lanes (Q4_0's 4-row layout) */
} act_q8;

/* One block of 32 values to int8 codes (quantize32) with its start values: the weight codes'
 * offset times the block's sum, spread over the 8 or 4 lanes that hold a row's block. */
static void quantize_block(const void *x, int64_t i, int dtype, int8_t *q, float *d, int32_t *s8,
                           int32_t *s4, int offset) {
    int half[2];
    const int sum = quantize32(x, i, dtype, q, d, half);
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

/* Where a group of weight rows keeps its blocks: row r's block b has its codes at q + r *
 * q_row + b * q_blk and its float16 scale at d + r * d_row + b * d_blk. The file's layout
 * is {w + 2, row bytes, type size, w, row bytes, type size}; the 4-row layout of
 * native_q4_0_x4.c is {codes + 64 g nb, 16, 64, scales + 8 g nb, 2, 8} for group g. */
typedef struct {
    const uint8_t *q;
    int64_t q_row, q_blk;
    const uint8_t *d;
    int64_t d_row, d_blk;
} rows_view;

static inline rows_view file_rows(const uint8_t *w, int64_t row_bytes, int type_size) {
    return (rows_view){w + 2, row_bytes, type_size, w, row_bytes, type_size};
}

static inline rows_view x4_rows(const uint8_t *w, int64_t n_out, int64_t nb, int64_t group) {
    const uint8_t *scales = w + n_out * nb * 16;
    return (rows_view){w + group * nb * 64, 16, 64, scales + group * nb * 8, 2, 8};
}

/* The weight codes of one Q4_0 block (its 16 code bytes at q) as 32 unsigned bytes in
 * activation order. */
static inline __m256i q4_0_codes(const uint8_t *q) {
    /* low nibbles are values 0..15 of the block, high nibbles values 16..31 */
    const __m128i raw = _mm_loadu_si128((const __m128i *)q);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

static inline __m256i q8_0_codes(const uint8_t *q) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)q);
    return _mm256_xor_si256(raw, _mm256_set1_epi8((char)0x80));
}

/* y[r] = dot(weight row r of v, activation row) for r < R, R a compile-time constant after
 * inlining; q4 picks Q4_0's code unpacking (else Q8_0's). */
static inline __attribute__((always_inline)) void dot_rows(rows_view v, int R, int64_t nb,
                                                           int q4, const int8_t *qa,
                                                           const float *da, const int32_t *s8,
                                                           float *y) {
    __m256 acc[ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(qa + b * QK));
        const __m256i s = _mm256_set1_epi32(s8[b]);
        const float d = da[b];
        for (int r = 0; r < R; r++) {
            const uint8_t *q = v.q + r * v.q_row + b * v.q_blk;
            if (r == 0 || v.q_row >= 64) prefetch1(q + PREFETCH); /* 4-row layout: one line */
#if TSR_HAVE_VNNI
            const __m256i u = q4 ? q4_0_codes(q) : q8_0_codes(q);
            const __m256 dot = _mm256_cvtepi32_ps(dot_u8s8(s, u, a));
#else
            const __m256i raw = _mm256_loadu_si256((const __m256i *)q);
            const __m256 dot = _mm256_cvtepi32_ps(
                q4 ? dot_u8s8(s, q4_0_codes(q), a) : dot_s8s8(s, raw, a));
#endif
            const float scale = f16_at(v.d + r * v.d_row + b * v.d_blk);
            acc[r] = _mm256_fmadd_ps(dot, _mm256_set1_ps(scale * d), acc[r]);
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
 * lane, high nibbles its last 16. y[i * 4 + r]. x4 (a compile-time constant): v is a group
 * of the 4-row layout, whose block of four rows is one 64-byte load and one 8-byte load of
 * scales, read in address order; else the file's layout, four rows' blocks side by side. */
static inline __attribute__((always_inline)) void q4_0_4rows(rows_view v, int x4, int64_t nb,
                                                             const act_q8 *a, int64_t i0,
                                                             int64_t n_in, int MI, float *y) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const int64_t rb = v.q_row;
    __m512 acc[MI_MAX];
    for (int i = 0; i < MI; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i z;
        __m128 scales;
        if (x4) {
            const uint8_t *q = v.q + b * 64, *d = v.d + b * 8;
            prefetch1(q + PREFETCH_X4);
            if ((b & 7) == 0) prefetch1(d + PREFETCH_X4 / 8);
            z = _mm512_loadu_si512(q);
            scales = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)d));
        } else {
            const uint8_t *blk = v.d + b * 18;
            prefetch4(blk, rb);
            z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(blk + 2)));
            z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(blk + rb + 2)), 1);
            z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(blk + 2 * rb + 2)), 2);
            z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(blk + 3 * rb + 2)), 3);
            scales = scales4(blk, rb);
        }
        const __m512i lo = _mm512_and_si512(z, nib);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
        const __m512 sc = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scales));
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

/* Four weight rows x activation rows i0 .. i0 + mi - 1 (mi <= MI_MAX) into y[i * 4 + r];
 * layout FILE_18, FILE_34 or X4. */
static void zmm_4rows(rows_view v, int layout, int64_t nb, const act_q8 *a, int64_t i0,
                      int64_t mi, int64_t n_in, float *y) {
#define TSR_CASE(MI)                                                                     \
    case MI:                                                                             \
        if (layout == X4)                                                                \
            q4_0_4rows(v, 1, nb, a, i0, n_in, MI, y);                                    \
        else if (layout == FILE_18)                                                      \
            q4_0_4rows(v, 0, nb, a, i0, n_in, MI, y);                                    \
        else                                                                             \
            q8_0_4rows(v.d, v.d_row, nb, a, i0, n_in, MI, y);                            \
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

/* y (m, sum n_outs) = x (m, n_in) @ [W_0; W_1; ...].T (+ the biases): n_w weights of the
 * same type that read the same activations (Q/K/V, gate/up), quantized once, in one
 * parallel region over the row groups of all of them. biases[k] is NULL or n_outs[k]
 * values of dtype, added before the one rounding of each output. */
static void gemv_n(int n_w, const uint8_t *const *ws, const int64_t *n_outs,
                   const void *const *biases, int64_t n_in, const void *x, int64_t m, void *y,
                   int dtype, int n_threads, int layout) {
    const int type_size = layout == FILE_34 ? 34 : 18, q4 = type_size == 18;
    const int64_t nb = n_in / QK, row_bytes = nb * type_size;
    int64_t first_group[GEMV_MAX_WEIGHTS + 1], col[GEMV_MAX_WEIGHTS + 1];
    first_group[0] = col[0] = 0;
    for (int k = 0; k < n_w; k++) {
        first_group[k + 1] = first_group[k] + (n_outs[k] + ROWS - 1) / ROWS;
        col[k + 1] = col[k] + n_outs[k];
    }
    const int64_t groups = first_group[n_w], width = col[n_w];
    act_q8 a;
    if (!quantize_act(x, dtype, m, n_in, offset_of(type_size), &a)) {
        free_act(&a);
        for (int64_t i = 0; i < m * width; i++) store1(y, i, __builtin_nanf(""), dtype);
        return;
    }
    const int64_t group_bytes = ROWS * row_bytes;
    const int chunk = group_bytes >= GEMV_CHUNK_BYTES ? 1 : (int)(GEMV_CHUNK_BYTES / group_bytes);
#pragma omp parallel for schedule(guided, chunk) num_threads(n_threads) if (n_threads > 1)
    for (int64_t g = 0; g < groups; g++) {
        int k = 0;
        while (g >= first_group[k + 1]) k++;
        const int64_t r0 = (g - first_group[k]) * ROWS, n_out = n_outs[k];
        const int64_t n = n_out - r0 < ROWS ? n_out - r0 : ROWS;
        const rows_view v = layout == X4 ? x4_rows(ws[k], n_out, nb, r0 / ROWS)
                                         : file_rows(ws[k] + r0 * row_bytes, row_bytes, type_size);
        const void *bias = biases ? biases[k] : NULL;
        float yi[MI_MAX * ROWS];
        for (int64_t i0 = 0; i0 < m; i0 += MI_MAX) {
            const int64_t mi = m - i0 < MI_MAX ? m - i0 : MI_MAX;
#if TSR_ZMM
            if (n == ROWS) {
                zmm_4rows(v, layout, nb, &a, i0, mi, n_in, yi);
            } else
#endif
            {
                for (int64_t i = 0; i < mi; i++) {
                    const int8_t *qa = a.q + (i0 + i) * n_in;
                    const float *da = a.d + (i0 + i) * nb;
                    const int32_t *s8 = a.s8 + (i0 + i) * nb;
                    if (n == ROWS && q4)
                        dot_rows(v, ROWS, nb, 1, qa, da, s8, yi + i * ROWS);
                    else if (n == ROWS)
                        dot_rows(v, ROWS, nb, 0, qa, da, s8, yi + i * ROWS);
                    else
                        for (int64_t r = 0; r < n; r++) {
                            rows_view vr = v; /* row r on its own */
                            vr.q += r * v.q_row;
                            vr.d += r * v.d_row;
                            dot_rows(vr, 1, nb, q4, qa, da, s8, yi + i * ROWS + r);
                        }
                }
            }
            for (int64_t i = 0; i < mi; i++)
                for (int64_t r = 0; r < n; r++)
                    store1(y, (i0 + i) * width + col[k] + r0 + r,
                           yi[i * ROWS + r] + (bias ? load1(bias, r0 + r, dtype) : 0.0f), dtype);
        }
    }
    free_act(&a);
}

/* y (m, n_out) = x (m, n_in) @ W.T, W = n_out rows of GGUF block bytes; x and y contiguous,
 * both of dtype 0 (float32), 1 (bfloat16) or 2 (float16). */
void tsr_gemv_q4_0(const uint8_t *w, int64_t n_out, int64_t n_in, const void *x, int64_t m,
                   void *y, int dtype, int n_threads) {
    gemv_n(1, &w, &n_out, NULL, n_in, x, m, y, dtype, n_threads, FILE_18);
}

void tsr_gemv_q8_0(const uint8_t *w, int64_t n_out, int64_t n_in, const void *x, int64_t m,
                   void *y, int dtype, int n_threads) {
    gemv_n(1, &w, &n_out, NULL, n_in, x, m, y, dtype, n_threads, FILE_34);
}

/* Several weights of one type (type_size 18: Q4_0, 34: Q8_0) on the same activations, their
 * outputs side by side in y (m, sum n_outs), each plus its bias (NULL entries: none; or
 * biases NULL). At most GEMV_MAX_WEIGHTS weights; returns 0 when asked for more. */
int tsr_gemv_n(int type_size, int n_w, const uint8_t *const *ws, const int64_t *n_outs,
               const void *const *biases, int64_t n_in, const void *x, int64_t m, void *y,
               int dtype, int n_threads) {
    if (n_w < 1 || n_w > GEMV_MAX_WEIGHTS || (type_size != 18 && type_size != 34)) return 0;
    gemv_n(n_w, ws, n_outs, biases, n_in, x, m, y, dtype, n_threads,
           type_size == 18 ? FILE_18 : FILE_34);
    return 1;
}

/* tsr_gemv_n for Q4_0 weights in the 4-row layout (tsr_repack_q4_0_x4); every n_out a
 * multiple of 4, else (or for more than GEMV_MAX_WEIGHTS weights) returns 0. */
int tsr_gemv_q4_0_x4(int n_w, const uint8_t *const *ws, const int64_t *n_outs,
                     const void *const *biases, int64_t n_in, const void *x, int64_t m, void *y,
                     int dtype, int n_threads) {
    if (n_w < 1 || n_w > GEMV_MAX_WEIGHTS) return 0;
    for (int k = 0; k < n_w; k++)
        if (n_outs[k] % ROWS) return 0;
    gemv_n(n_w, ws, n_outs, biases, n_in, x, m, y, dtype, n_threads, X4);
    return 1;
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
            const __m256 d = _mm256_set1_ps(f16_at(blk));
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

/* y (m, n) = x / sqrt(mean(x^2) + eps) * w per row, with float32 statistics as the torch
 * path computes them (w: float32, or NULL for none); x and y of dtype. One C call instead
 * of torch's composite: two per layer per decode token, and prefill's rows in parallel. */
void tsr_rms_norm(const void *x, int64_t m, int64_t n, const float *w, float eps, void *y,
                  int dtype, int n_threads) {
    /* rows over the threads for prefill-sized inputs; decode's few rows stay on one */
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n_threads > 1 && m > 1 && m * n >= 65536)
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


/* Attention of each query over its own cache rows (the attention_rows op, for few queries).
 *
 * q (t, h, d); k_cache (cells, h_kv, d) and v_cache (cells, h_kv, dv), all of dtype; query
 * head j reads KV head j / (h / h_kv). The queries come in s slices of tq: q_rows (s, tq) is
 * the query's row of q and out (-1: none), rows (s, r) the cache cells the slice reads (-1:
 * none), allowed (s, tq, r) bytes, nonzero where the query may read the row (NULL: every
 * row). Scores and the softmax are float32; each output value is rounded once; a query
 * with no row gives zeros. out is (t, h * dv).
 *
 * The work is done by tsr_attention_kv (native_attention.c: flash-decoding over tiles of
 * rows, the caches in their storage types); here both caches are of dtype. */
int tsr_attention_kv(const void *q, int64_t t, int64_t h, int64_t d, const void *k_cache,
                     int k_type, const void *v_cache, int v_type, int64_t h_kv, int64_t dv,
                     const int64_t *rows, int64_t s, int64_t r, const int64_t *q_rows,
                     int64_t tq, const uint8_t *allowed, float scale, void *out, int dtype,
                     int n_threads);
int64_t tsr_kv_bytes(int type, int64_t n);
void tsr_kv_store(const void *x, int dtype, int64_t n, void *dst, int type);

void tsr_attention_rows(const void *q, int64_t t, int64_t h, int64_t d, const void *k_cache,
                        const void *v_cache, int64_t h_kv, int64_t dv, const int64_t *rows,
                        int64_t s, int64_t r, const int64_t *q_rows, int64_t tq,
                        const uint8_t *allowed, float scale, void *out, int dtype, int n_threads) {
    if (!tsr_attention_kv(q, t, h, d, k_cache, dtype, v_cache, dtype, h_kv, dv, rows, s, r,
                          q_rows, tq, allowed, scale, out, dtype, n_threads))
        for (int64_t i = 0; i < t * h * dv; i++) store1(out, i, NAN, dtype); /* out of memory */
}
/* v rounded to dtype (to nearest even) and widened back to float32, 8 at a time. */
static inline __m256 round8(__m256 v, int dtype) {
    if (dtype == DT_BF16) {
        __m256i u = _mm256_castps_si256(v);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd));
        return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xFFFF0000u)));
    }
    if (dtype == DT_F16)
        return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return v;
}

/* y = a + b (n values of dtype, y may be a), or silu(a) * b when swiglu (silu rounded to
 * dtype before the product, as the eager torch ops round it; sigmoid from e^-|a|). Whole
 * vectors of 8 where they fit (a scalar loop here cost 6% of a decode block). */
static inline __m256 elementwise8(__m256 va, __m256 vb, int dtype, int swiglu) {
    if (!swiglu) return _mm256_add_ps(va, vb);
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = exp_nonpos(_mm256_or_ps(va, _mm256_set1_ps(-0.0f)));
    const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, e, va), _mm256_add_ps(one, e));
    return _mm256_mul_ps(round8(_mm256_mul_ps(va, sig), dtype), vb);
}

static void elementwise(const void *a, const void *b, int64_t n, void *y, int dtype, int swiglu) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        store8(y, i, elementwise8(load8(a, i, dtype), load8(b, i, dtype), dtype, swiglu), dtype);
    if (i < n) {
        float a8[8] = {0}, b8[8] = {0}, y8[8];
        for (int64_t k = 0; i + k < n; k++) a8[k] = load1(a, i + k, dtype), b8[k] = load1(b, i + k, dtype);
        _mm256_storeu_ps(y8, elementwise8(_mm256_loadu_ps(a8), _mm256_loadu_ps(b8), dtype, swiglu));
        for (int64_t k = 0; i + k < n; k++) store1(y, i + k, y8[k], dtype);
    }
}

/* One pre-norm decoder block of the llama family (RMSNorm, GQA attention with RoPE, SwiGLU
 * FFN; optional Q/K/V biases and per-head Q/K RMSNorm) for one token, in one call: the
 * same kernels, in the same order and with the same roundings, as the op-by-op decode path
 * of the torch backend, without a Python call between them. Weights are GGUF block bytes
 * of the GGML type in type_* (Q4_0 2 and Q8_0 8 here, F16 1 and BF16 30 through
 * tsr_gemv_dense, the others of native_qgemv.c through tsr_gemv_quant), norms float32, the
 * rest of dtype. */
typedef struct {
    int64_t n_embd, n_head, n_head_kv, head_dim, n_ff, n_rot;
    float eps, scale;
    int neox, type_q, type_k, type_v, type_o, type_gate, type_up, type_down;
    const uint8_t *wq, *wk, *wv, *wo, *w_gate, *w_up, *w_down;
    const void *bq, *bk, *bv;          /* dtype, or NULL */
    const float *attn_norm, *ffn_norm; /* n_embd */
    const float *q_norm, *k_norm;      /* head_dim, or NULL */
    void *k_cache, *v_cache;           /* (cells, n_head_kv, head_dim) of k_type / v_type */
    int k_type, v_type;                /* the caches' storage types (tsr_attention_kv's) */
} tsr_block;

/* The token: its RoPE angles (n_rot / 2 values of dtype each), the cache cell its K/V go
 * to, and the cells it attends to (in position order, its own included). */
typedef struct {
    const void *cos, *sin;
    int64_t cell;
    const int64_t *rows;
    int64_t n_rows;
} tsr_step;

int tsr_gemv_quant(int ggml_type, int n_w, const uint8_t *const *ws, const int64_t *n_outs,
                   const void *const *biases, int64_t n_in, const void *x, int64_t m, void *y,
                   int dtype, int n_threads);
int tsr_gemv_dense(int ggml_type, int n_w, const uint8_t *const *ws, const int64_t *n_outs,
                   const void *const *biases, int64_t n_in, const void *x, int64_t m, void *y,
                   int dtype, int n_threads);

/* gemv_n of one activation row for weights of GGML type ggml_type (Q4_0, Q8_0 here, F16
 * and BF16 in native_dense_gemv.c, the others in native_qgemv.c); 0 when that fails. */
static int block_gemv(int ggml_type, int n_w, const uint8_t *const *ws, const int64_t *n_outs,
                      const void *const *biases, int64_t n_in, const void *x, void *y, int dtype,
                      int n_threads) {
    if (ggml_type == 2 || ggml_type == 8) {
        gemv_n(n_w, ws, n_outs, biases, n_in, x, 1, y, dtype, n_threads,
               ggml_type == 2 ? FILE_18 : FILE_34);
        return 1;
    }
    if (ggml_type == TSR_TYPE_Q4_0_X4)
        return tsr_gemv_q4_0_x4(n_w, ws, n_outs, biases, n_in, x, 1, y, dtype, n_threads);
    if (ggml_type == 1 || ggml_type == 30)
        return tsr_gemv_dense(ggml_type, n_w, ws, n_outs, biases, n_in, x, 1, y, dtype, n_threads);
    return tsr_gemv_quant(ggml_type, n_w, ws, n_outs, biases, n_in, x, 1, y, dtype, n_threads);
}

/* Weights reading the same activations, outputs side by side in y: one call when they
 * are of one type, else one each with its bias added after the output's rounding, as the
 * op-by-op path (one matmul, then an add) rounds it. */
static int block_gemvs(const int *types, int n_w, const uint8_t *const *ws, const int64_t *n_outs,
                       const void *const *biases, int64_t n_in, const void *x, char *y, int dtype,
                       int n_threads) {
    int same = 1;
    for (int k = 1; k < n_w; k++) same &= types[k] == types[0];
    if (same) return block_gemv(types[0], n_w, ws, n_outs, biases, n_in, x, y, dtype, n_threads);
    const int64_t es = dtype == DT_F32 ? 4 : 2;
    int ok = 1;
    for (int k = 0; k < n_w; y += es * n_outs[k], k++) {
        ok &= block_gemv(types[k], 1, ws + k, n_outs + k, NULL, n_in, x, y, dtype, n_threads);
        if (biases[k]) elementwise(y, biases[k], n_outs[k], y, dtype, 0);
    }
    return ok;
}

/* y (n_embd) = the block applied to x (n_embd); y may be x (x is last read before y is
 * written). Returns 0 when out of memory (or a weight's type has no kernel). */
int tsr_block_decode(const tsr_block *b, const tsr_step *s, const void *x, void *y, int dtype,
                     int n_threads) {
    const int64_t es = dtype == DT_F32 ? 4 : 2, n = b->n_embd;
    const int64_t qd = b->n_head * b->head_dim, kd = b->n_head_kv * b->head_dim;
    char *buf = malloc((size_t)(es * (4 * n + 3 * qd + 3 * kd + 3 * b->n_ff) + 64));
    if (!buf) return 0;
    char *h = buf, *q = h + es * n, *k = q + es * qd, *v = k + es * kd, *qr = v + es * kd;
    char *att = qr + es * qd, *mid = att + es * qd, *gu = mid + es * n;
    char *act = gu + es * 2 * b->n_ff, *tmp = act + es * b->n_ff, *kr = tmp + es * n;
    tsr_rms_norm(x, 1, n, b->attn_norm, b->eps, h, dtype, 1);
    const uint8_t *qkv_w[3] = {b->wq, b->wk, b->wv};
    const int64_t qkv_n[3] = {qd, kd, kd};
    const void *qkv_b[3] = {b->bq, b->bk, b->bv};
    const int qkv_t[3] = {b->type_q, b->type_k, b->type_v};
    int ok = block_gemvs(qkv_t, 3, qkv_w, qkv_n, qkv_b, n, h, q, dtype, n_threads);
    if (b->q_norm) tsr_rms_norm(q, b->n_head, b->head_dim, b->q_norm, b->eps, q, dtype, 1);
    if (b->k_norm) tsr_rms_norm(k, b->n_head_kv, b->head_dim, b->k_norm, b->eps, k, dtype, 1);
    /* the token's K and V into its cell, rounded as the caches store them */
    char *k_cell = (char *)b->k_cache + tsr_kv_bytes(b->k_type, kd) * s->cell;
    char *v_cell = (char *)b->v_cache + tsr_kv_bytes(b->v_type, kd) * s->cell;
    tsr_rope(q, 1, b->n_head, b->head_dim, b->n_rot, s->cos, s->sin, b->neox, qr, dtype);
    const int k_in_place = b->k_type == dtype;
    tsr_rope(k, 1, b->n_head_kv, b->head_dim, b->n_rot, s->cos, s->sin, b->neox,
             k_in_place ? k_cell : kr, dtype);
    if (!k_in_place) tsr_kv_store(kr, dtype, kd, k_cell, b->k_type);
    if (b->v_type == dtype) memcpy(v_cell, v, (size_t)(es * kd));
    else tsr_kv_store(v, dtype, kd, v_cell, b->v_type);
    const int64_t q_row = 0;
    ok &= tsr_attention_kv(qr, 1, b->n_head, b->head_dim, b->k_cache, b->k_type, b->v_cache,
                           b->v_type, b->n_head_kv, b->head_dim, s->rows, 1, s->n_rows, &q_row, 1,
                           NULL, b->scale, att, dtype, n_threads);
    ok &= block_gemv(b->type_o, 1, &b->wo, &n, NULL, qd, att, tmp, dtype, n_threads);
    elementwise(x, tmp, n, mid, dtype, 0);
    tsr_rms_norm(mid, 1, n, b->ffn_norm, b->eps, h, dtype, 1);
    const uint8_t *up_w[2] = {b->w_gate, b->w_up};
    const int64_t up_n[2] = {b->n_ff, b->n_ff};
    const int up_t[2] = {b->type_gate, b->type_up};
    const void *up_b[2] = {NULL, NULL};
    ok &= block_gemvs(up_t, 2, up_w, up_n, up_b, n, h, gu, dtype, n_threads);
    elementwise(gu, gu + es * b->n_ff, b->n_ff, act, dtype, 1);
    ok &= block_gemv(b->type_down, 1, &b->w_down, &n, NULL, b->n_ff, act, tmp, dtype, n_threads);
    elementwise(mid, tmp, n, y, dtype, 0);
    free(buf);
    return ok;
}
#endif
