/* Prefill matmuls of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL weights with int8 dot products
 * (AVX512-VNNI vpdpbusd),
 * for CPUs without AMX: tessera's native kernels, built with native_gemv.c into one
 * library (tessera/backends/native/library.py).
 *
 * y (m, n) = x (m, k) @ W.T, x and y bf16/f16/f32, W n rows of GGUF block bytes. The rows
 * of x are quantized once per call to int8 blocks of 32 with one float scale each (as
 * ggml's Q8_0 activations). A vpdpbusd multiplies 64 unsigned bytes by 64 signed bytes and
 * adds each group of four products into one of 16 int32 lanes; with one lane per weight
 * row (4 consecutive codes of 16 rows in one vector) and the same 4 activation bytes
 * broadcast to every lane, 8 of them give one block's 32-value dot product for 16 weight
 * rows at once, no horizontal sums. So each thread packs a strip of 32 weight rows once:
 * every block as 2 x 8 vectors of that layout (a 16 x 8 transpose of 4-byte groups) and
 * 2 x 16 float scales, then runs all rows of x against it, 4 rows at a time (8 int32 and
 * 8 float32 accumulators).
 *
 * vpdpbusd's weight side is unsigned: Q4_0/Q4_1 and Q5_0/Q5_1 codes are stored as they are
 * (0..15, 0..31), Q8_0's as q + 128 (q ^ 0x80) and IQ4_NL's table values as t + 128; the
 * offset o (8, 16 or 128; 0 for the types with a minimum) comes back out of each dot product
 * by starting its int32 sum at -o * (sum of the activation block's codes). Each block's sum
 * is exact in int32 and is scaled by (weight scale * activation scale) into float32; Q4_1
 * and Q5_1 (value q d + m) add m * (activation scale * sum of its codes).
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_common.h"
#include "native_quant.h"
#include "native_transpose.h"

#define VG_STRIP 32                 /* weight rows per strip: two 16-lane halves */
#define VG_ROWS 4                   /* rows of x per pass of the micro-kernel */
#define VG_BLOCK_BYTES (2 * 8 * 64) /* one block of a packed strip: 2 halves x 8 vectors */

/* Whether the int8 GEMM was compiled in (512-bit VNNI). */
int tsr_vnni_gemm_built(void) { return TSR_ZMM; }

#if TSR_ZMM

typedef struct {
    int8_t *q;   /* (m, k) int8 codes */
    float *d;    /* (m, nb) block scales */
    int32_t *c;  /* (m, nb) -offset * sum of the block's codes: each dot product's start */
    float *ds;   /* (m, nb) scale * sum of the block's codes: what a weight's minimum meets */
} vg_act;

static int vg_quantize(const void *x, int dtype, int64_t m, int64_t k, int offset, vg_act *a,
                       int n_threads) {
    const int64_t nb = k / QK;
    a->q = malloc((size_t)(m * k));
    a->d = malloc(sizeof(float) * (size_t)(m * nb));
    a->c = malloc(sizeof(int32_t) * (size_t)(m * nb));
    a->ds = malloc(sizeof(float) * (size_t)(m * nb));
    if (!a->q || !a->d || !a->c || !a->ds) return 0;
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t i = 0; i < m * nb; i++) {
        int half[2];
        const int sum = quantize32(x, i * QK, dtype, a->q + i * QK, a->d + i, half);
        a->c[i] = -offset * sum;
        a->ds[i] = a->d[i] * (float)sum;
    }
    return 1;
}

/* GGML type numbers */
enum { VG_Q4_0 = 2, VG_Q4_1 = 3, VG_Q5_0 = 6, VG_Q5_1 = 7, VG_Q8_0 = 8, VG_IQ4_NL = 20 };

static int vg_type_size(int type) {
    switch (type) {
    case VG_Q4_0: case VG_IQ4_NL: return 18;
    case VG_Q4_1: return 20;
    case VG_Q5_0: return 22;
    case VG_Q5_1: return 24;
    case VG_Q8_0: return 34;
    default: return 0;
    }
}

/* Whether the type's blocks carry a minimum m after their scale (value q d + m). */
static int vg_has_min(int type) { return type == VG_Q4_1 || type == VG_Q5_1; }

static int vg_offset(int type) {
    switch (type) {
    case VG_Q4_0: return 8;
    case VG_Q5_0: return 16;
    case VG_Q4_1: case VG_Q5_1: return 0;
    default: return 128;
    }
}

/* A block's 32 codes as unsigned bytes in value order (each block starts with its f16 scale,
 * Q4_1 / Q5_1 then their f16 minimum; 4-bit codes: low nibbles are values 0..15, high
 * nibbles 16..31). */
static inline __m256i vg_codes(const uint8_t *blk, int type) {
    switch (type) {
    case VG_Q8_0:
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)),
                                _mm256_set1_epi8((char)0x80));
    case VG_Q5_0: return q5_codes(blk + 2);
    case VG_Q4_1: return nibbles32(blk + 4);
    case VG_Q5_1: return q5_codes(blk + 4);
    case VG_IQ4_NL:
        return _mm256_xor_si256(_mm256_shuffle_epi8(iq4_table(), nibbles32(blk + 2)),
                                _mm256_set1_epi8((char)0x80));
    default: return nibbles32(blk + 2);
    }
}


/* 16 weight rows (rows[r] their first block) to the packed layout: for each block b,
 * vector p (p = 0..7) at out + b * VG_BLOCK_BYTES holds codes 4p..4p+3 of row r in lane r,
 * scales + b * 32 the 16 rows' scales and mins + b * 32 their minimums (types with one).
 * Two blocks per transpose (lanes 0-7, 8-15). */
static void vg_pack16(const uint8_t *const rows[16], int type, int64_t nb, uint8_t *out,
                      float *scales, float *mins) {
    const int type_size = vg_type_size(type);
    for (int64_t b = 0; b < nb; b += 2) {
        const int64_t b1 = b + 1 < nb ? b + 1 : b; /* an odd last block: transposed twice */
        __m512i r[16];
        for (int i = 0; i < 16; i++) {
            const uint8_t *p0 = rows[i] + b * type_size, *p1 = rows[i] + b1 * type_size;
            r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(vg_codes(p0, type)),
                                      vg_codes(p1, type), 1);
            scales[b * 32 + i] = f16_at(p0);
            if (b1 != b) scales[b1 * 32 + i] = f16_at(p1);
            if (mins) {
                mins[b * 32 + i] = f16_at(p0 + 2);
                if (b1 != b) mins[b1 * 32 + i] = f16_at(p1 + 2);
            }
        }
        transpose16_epi32(r);
        for (int p = 0; p < 8; p++) {
            _mm512_store_si512((__m512i *)(out + b * VG_BLOCK_BYTES + p * 64), r[p]);
            if (b1 != b) _mm512_store_si512((__m512i *)(out + b1 * VG_BLOCK_BYTES + p * 64), r[p + 8]);
        }
    }
}

static inline void vg_store16(void *y, int64_t i, __m512 v, int dtype) {
    store8(y, i, _mm512_castps512_ps256(v), dtype);
    store8(y, i + 8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)), dtype);
}

/* silu(g) * u in float32 (g * sigmoid(g), the sigmoid from e^-|g|), 8 lanes. */
static inline __m256 vg_swiglu8(__m256 g, __m256 u) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = exp_nonpos(_mm256_or_ps(g, _mm256_set1_ps(-0.0f)));
    const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e));
    return _mm256_mul_ps(_mm256_mul_ps(g, sig), u);
}

/* Rows i0..i0+R-1 of x times a packed strip. Plain: y columns j0..j0+31 are the halves;
 * swiglu (half 0 gate rows, half 1 the same up rows): columns j0..j0+15. */
static inline __attribute__((always_inline)) void vg_rows(
    const uint8_t *pack, const float *scales, const float *mins, const vg_act *a, int64_t nb,
    int64_t k, int64_t i0, int R, void *y, int64_t n, int64_t j0, int dtype, int swiglu) {
    __m512 acc[VG_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = pack + b * VG_BLOCK_BYTES;
        __m512i dot[VG_ROWS][2];
        for (int r = 0; r < R; r++)
            dot[r][0] = dot[r][1] = _mm512_set1_epi32(a->c[(i0 + r) * nb + b]);
        for (int p = 0; p < 8; p++) {
            const __m512i w0 = _mm512_load_si512((const __m512i *)(wb + p * 64));
            const __m512i w1 = _mm512_load_si512((const __m512i *)(wb + 512 + p * 64));
            for (int r = 0; r < R; r++) {
                int32_t four;
                memcpy(&four, a->q + (i0 + r) * k + b * QK + 4 * p, 4);
                const __m512i av = _mm512_set1_epi32(four);
                dot[r][0] = _mm512_dpbusd_epi32(dot[r][0], w0, av);
                dot[r][1] = _mm512_dpbusd_epi32(dot[r][1], w1, av);
            }
        }
        const __m512 s0 = _mm512_load_ps(scales + b * 32), s1 = _mm512_load_ps(scales + b * 32 + 16);
        for (int r = 0; r < R; r++) {
            const __m512 da = _mm512_set1_ps(a->d[(i0 + r) * nb + b]);
            acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][0]), _mm512_mul_ps(s0, da), acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][1]), _mm512_mul_ps(s1, da), acc[r][1]);
        }
        if (mins) {
            const __m512 m0 = _mm512_load_ps(mins + b * 32), m1 = _mm512_load_ps(mins + b * 32 + 16);
            for (int r = 0; r < R; r++) {
                const __m512 ds = _mm512_set1_ps(a->ds[(i0 + r) * nb + b]);
                acc[r][0] = _mm512_fmadd_ps(m0, ds, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(m1, ds, acc[r][1]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const int64_t at = (i0 + r) * n + j0;
        if (!swiglu) {
            vg_store16(y, at, acc[r][0], dtype);
            vg_store16(y, at + 16, acc[r][1], dtype);
            continue;
        }
        const __m512 g = acc[r][0], u = acc[r][1];
        store8(y, at, vg_swiglu8(_mm512_castps512_ps256(g), _mm512_castps512_ps256(u)), dtype);
        const __m256 g1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(g), 1));
        const __m256 u1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1));
        store8(y, at + 8, vg_swiglu8(g1, u1), dtype);
    }
}

/* y (m, n) = x @ W.T (w2 NULL; n a multiple of 32) or silu(x @ W.T) * (x @ W2.T) (n a
 * multiple of 16), x read in x_dtype and y written in y_dtype. Returns 0 for shapes or
 * types it does not take, or out of memory. */
static int vg_gemm(int type, const uint8_t *w, const uint8_t *w2, int64_t n, int64_t k,
                   const void *x, int64_t m, void *y, int x_dtype, int y_dtype, int n_threads) {
    const int64_t step = w2 ? 16 : VG_STRIP;
    if (n % step || k % QK || m < 1 || !vg_type_size(type)) return 0;
    const int64_t nb = k / QK, row_bytes = nb * vg_type_size(type);
    vg_act a;
    int ok = vg_quantize(x, x_dtype, m, k, vg_offset(type), &a, n_threads);
#pragma omp parallel num_threads(n_threads) reduction(&& : ok)
    {
        uint8_t *pack = aligned_alloc(64, (size_t)(nb * VG_BLOCK_BYTES));
        float *scales = aligned_alloc(64, sizeof(float) * (size_t)(nb * 32));
        const int has_min = vg_has_min(type);
        float *mins = has_min ? aligned_alloc(64, sizeof(float) * (size_t)(nb * 32)) : NULL;
        ok = ok && pack && scales && (mins || !has_min);
#pragma omp for schedule(dynamic, 1)
        for (int64_t s = 0; s < n / step; s++) {
            if (!ok) continue;
            const int64_t j0 = s * step;
            const uint8_t *rows[2][16];
            for (int i = 0; i < 16; i++) {
                rows[0][i] = w + (j0 + i) * row_bytes;
                rows[1][i] = w2 ? w2 + (j0 + i) * row_bytes : w + (j0 + 16 + i) * row_bytes;
            }
            vg_pack16(rows[0], type, nb, pack, scales, mins);
            vg_pack16(rows[1], type, nb, pack + 512, scales + 16, mins ? mins + 16 : NULL);
            int64_t i0 = 0;
            for (; i0 + VG_ROWS <= m; i0 += VG_ROWS)
                vg_rows(pack, scales, mins, &a, nb, k, i0, VG_ROWS, y, n, j0, y_dtype, w2 != NULL);
            const int swiglu = w2 != NULL;
            switch (m - i0) {
            case 3: vg_rows(pack, scales, mins, &a, nb, k, i0, 3, y, n, j0, y_dtype, swiglu); break;
            case 2: vg_rows(pack, scales, mins, &a, nb, k, i0, 2, y, n, j0, y_dtype, swiglu); break;
            case 1: vg_rows(pack, scales, mins, &a, nb, k, i0, 1, y, n, j0, y_dtype, swiglu); break;
            }
        }
        free(pack);
        free(scales);
        free(mins);
    }
    free(a.q);
    free(a.d);
    free(a.c);
    free(a.ds);
    return ok;
}

#else

static int vg_gemm(int type, const uint8_t *w, const uint8_t *w2, int64_t n, int64_t k,
                   const void *x, int64_t m, void *y, int x_dtype, int y_dtype, int n_threads) {
    (void)type, (void)w, (void)w2, (void)n, (void)k, (void)x, (void)m, (void)y;
    (void)x_dtype, (void)y_dtype, (void)n_threads;
    return 0;
}

#endif

/* type: the weight's GGML type number (Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, IQ4_NL 20). */
int tsr_matmul_vnni(int type, const uint8_t *w, int64_t n, int64_t k, const void *x,
                    int64_t m, void *y, int x_dtype, int y_dtype, int n_threads) {
    return vg_gemm(type, w, NULL, n, k, x, m, y, x_dtype, y_dtype, n_threads);
}

int tsr_swiglu_vnni(int type, const uint8_t *w_gate, const uint8_t *w_up, int64_t n,
                    int64_t k, const void *x, int64_t m, void *y, int x_dtype, int y_dtype,
                    int n_threads) {
    return vg_gemm(type, w_gate, w_up, n, k, x, m, y, x_dtype, y_dtype, n_threads);
}
