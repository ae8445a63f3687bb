/* Prefill matmuls of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL weights with int8 dot products
 * (vpdpbusd: AVX512-VNNI on 512 bits, AVX-VNNI on 256; AVX2's vpmaddubsw + vpmaddwd), for
 * CPUs without AMX: tessera's native kernels, built with native_gemv.c into one library
 * (tessera/backends/native/library.py).
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
 *
 * The 256-bit paths use the same scheme with 8 lanes: strips of 16 weight rows, an 8 x 8
 * transpose per block. AVX2 without VNNI sums each pair of products in int16 first, which
 * saturates for codes of 8 bits: there Q8_0 and IQ4_NL keep their signed values (offset 0)
 * and multiply |w| by the activation with w's sign (each product within 128 * 127).
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_common.h"
#include "native_quant.h"
#include "native_transpose.h"

#if TSR_ZMM
#define VG_LANES 16 /* weight rows per vector: one int32 lane each */
#else
#define VG_LANES 8
#endif
#define VG_STRIP (2 * VG_LANES)            /* weight rows per strip: two halves */
#define VG_ROWS 4                          /* rows of x per pass of the micro-kernel */
#define VG_BLOCK_BYTES (2 * 8 * 4 * VG_LANES) /* a block of a strip: 2 halves x 8 vectors */

/* Which int8 GEMM was compiled in: 3 AVX512-VNNI, 2 AVX-VNNI (256 bits), 1 AVX2, 0 none. */
int tsr_vnni_gemm_built(void) { return TSR_ZMM ? 3 : TSR_HAVE_VNNI ? 2 : TSR_AVX2 ? 1 : 0; }

#if TSR_AVX2

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

/* Whether the type's codes stay signed (offset 0, the sign trick): 8-bit codes on AVX2
 * without VNNI, where an unsigned code up to 255 would saturate the int16 pair sums. */
static int vg_signed(int type) { return !TSR_HAVE_VNNI && (type == VG_Q8_0 || type == VG_IQ4_NL); }

static int vg_offset(int type) {
    if (vg_signed(type)) return 0;
    switch (type) {
    case VG_Q4_0: return 8;
    case VG_Q5_0: return 16;
    case VG_Q4_1: case VG_Q5_1: return 0;
    default: return 128;
    }
}

/* A block's 32 codes as unsigned bytes in value order, signed ones for the vg_signed types
 * (each block starts with its f16 scale, Q4_1 / Q5_1 then their f16 minimum; 4-bit codes:
 * low nibbles are values 0..15, high nibbles 16..31). */
static inline __m256i vg_codes(const uint8_t *blk, int type) {
    const __m256i flip = _mm256_set1_epi8(vg_signed(type) ? 0 : (char)0x80);
    switch (type) {
    case VG_Q8_0: return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), flip);
    case VG_Q5_0: return q5_codes(blk + 2);
    case VG_Q4_1: return nibbles32(blk + 4);
    case VG_Q5_1: return q5_codes(blk + 4);
    case VG_IQ4_NL:
        return _mm256_xor_si256(_mm256_shuffle_epi8(iq4_table(), nibbles32(blk + 2)), flip);
    default: return nibbles32(blk + 2);
    }
}

/* The vector width's types and operations (a lane is one weight row). */
#if TSR_ZMM
typedef __m512i vg_vi;
typedef __m512 vg_vf;
#define VG_LOADI(p) _mm512_load_si512((const void *)(p))
#define VG_SET1I _mm512_set1_epi32
#define VG_SET1F _mm512_set1_ps
#define VG_LOADF _mm512_load_ps
#define VG_ZEROF _mm512_setzero_ps
#define VG_FMA _mm512_fmadd_ps
#define VG_MUL _mm512_mul_ps
#define VG_CVT _mm512_cvtepi32_ps
#define VG_DOT _mm512_dpbusd_epi32
#else
typedef __m256i vg_vi;
typedef __m256 vg_vf;
#define VG_LOADI(p) _mm256_load_si256((const __m256i *)(p))
#define VG_SET1I _mm256_set1_epi32
#define VG_SET1F _mm256_set1_ps
#define VG_LOADF _mm256_load_ps
#define VG_ZEROF _mm256_setzero_ps
#define VG_FMA _mm256_fmadd_ps
#define VG_MUL _mm256_mul_ps
#define VG_CVT _mm256_cvtepi32_ps
#define VG_DOT dot_u8s8
#endif
#define VG_VEC_BYTES (4 * VG_LANES)     /* one vector: 4 codes of each lane's row */
#define VG_HALF_BYTES (8 * VG_VEC_BYTES) /* one half of a packed block */

/* VG_LANES weight rows (rows[r] their first block) to the packed layout: for each block b,
 * vector p (p = 0..7) at out + b * VG_BLOCK_BYTES holds codes 4p..4p+3 of row r in lane r,
 * scales + b * VG_STRIP the rows' scales and mins + b * VG_STRIP their minimums (types with
 * one). 512 bits: two blocks per 16 x 16 transpose (lanes 0-7, 8-15); 256: one per 8 x 8. */
static void vg_pack_half(const uint8_t *const rows[VG_LANES], int type, int64_t nb,
                         uint8_t *out, float *scales, float *mins) {
    const int type_size = vg_type_size(type);
#if TSR_ZMM
    for (int64_t b = 0; b < nb; b += 2) {
        const int64_t b1 = b + 1 < nb ? b + 1 : b; /* an odd last block: transposed twice */
        __m512i r[16];
        for (int i = 0; i < 16; i++) {
            const uint8_t *p0 = rows[i] + b * type_size, *p1 = rows[i] + b1 * type_size;
            r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(vg_codes(p0, type)),
                                      vg_codes(p1, type), 1);
            scales[b * VG_STRIP + i] = f16_at(p0);
            if (b1 != b) scales[b1 * VG_STRIP + i] = f16_at(p1);
            if (mins) {
                mins[b * VG_STRIP + i] = f16_at(p0 + 2);
                if (b1 != b) mins[b1 * VG_STRIP + i] = f16_at(p1 + 2);
            }
        }
        transpose16_epi32(r);
        for (int p = 0; p < 8; p++) {
            _mm512_store_si512((__m512i *)(out + b * VG_BLOCK_BYTES + p * 64), r[p]);
            if (b1 != b) _mm512_store_si512((__m512i *)(out + b1 * VG_BLOCK_BYTES + p * 64), r[p + 8]);
        }
    }
#else
    for (int64_t b = 0; b < nb; b++) {
        __m256i r[8];
        for (int i = 0; i < 8; i++) {
            const uint8_t *p0 = rows[i] + b * type_size;
            r[i] = vg_codes(p0, type);
            scales[b * VG_STRIP + i] = f16_at(p0);
            if (mins) mins[b * VG_STRIP + i] = f16_at(p0 + 2);
        }
        transpose8_epi32(r);
        for (int p = 0; p < 8; p++)
            _mm256_store_si256((__m256i *)(out + b * VG_BLOCK_BYTES + p * 32), r[p]);
    }
#endif
}

/* silu(g) * u in float32 (g * sigmoid(g), the sigmoid from e^-|g|), 8 lanes. */
static inline __m256 vg_swiglu8(__m256 g, __m256 u) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = exp_nonpos(_mm256_or_ps(g, _mm256_set1_ps(-0.0f)));
    const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e));
    return _mm256_mul_ps(_mm256_mul_ps(g, sig), u);
}

/* One vector of outputs at y[i..]: y = v, or (swiglu) y = silu(v) * u. */
static inline void vg_store(void *y, int64_t i, vg_vf v, vg_vf u, int swiglu, int dtype) {
#if TSR_ZMM
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    if (swiglu) {
        lo = vg_swiglu8(lo, _mm512_castps512_ps256(u));
        hi = vg_swiglu8(hi, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
    }
    store8(y, i, lo, dtype);
    store8(y, i + 8, hi, dtype);
#else
    store8(y, i, swiglu ? vg_swiglu8(v, u) : v, dtype);
#endif
}

/* Rows i0..i0+R-1 of x times a packed strip. Plain: y columns j0..j0+VG_STRIP-1 are the
 * halves; swiglu (half 0 gate rows, half 1 the same up rows): columns j0..j0+VG_LANES-1.
 * sgn: signed codes (vg_signed), |w| times the activation with w's sign. */
static inline __attribute__((always_inline)) void vg_rows(
    const uint8_t *pack, const float *scales, const float *mins, const vg_act *a, int64_t nb,
    int64_t k, int64_t i0, int R, void *y, int64_t n, int64_t j0, int dtype, int swiglu,
    int sgn) {
    vg_vf acc[VG_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = VG_ZEROF();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = pack + b * VG_BLOCK_BYTES;
        vg_vi dot[VG_ROWS][2];
        for (int r = 0; r < R; r++) dot[r][0] = dot[r][1] = VG_SET1I(a->c[(i0 + r) * nb + b]);
        for (int p = 0; p < 8; p++) {
            vg_vi w0 = VG_LOADI(wb + p * VG_VEC_BYTES);
            vg_vi w1 = VG_LOADI(wb + VG_HALF_BYTES + p * VG_VEC_BYTES);
            const vg_vi s0 = w0, s1 = w1;
#if !TSR_HAVE_VNNI
            if (sgn) w0 = _mm256_sign_epi8(w0, w0), w1 = _mm256_sign_epi8(w1, w1);
#endif
            for (int r = 0; r < R; r++) {
                int32_t four;
                memcpy(&four, a->q + (i0 + r) * k + b * QK + 4 * p, 4);
                vg_vi a0 = VG_SET1I(four), a1 = a0;
#if !TSR_HAVE_VNNI
                if (sgn) a0 = _mm256_sign_epi8(a0, s0), a1 = _mm256_sign_epi8(a1, s1);
#endif
                dot[r][0] = VG_DOT(dot[r][0], w0, a0);
                dot[r][1] = VG_DOT(dot[r][1], w1, a1);
            }
            (void)s0, (void)s1, (void)sgn;
        }
        const vg_vf d0 = VG_LOADF(scales + b * VG_STRIP);
        const vg_vf d1 = VG_LOADF(scales + b * VG_STRIP + VG_LANES);
        for (int r = 0; r < R; r++) {
            const vg_vf da = VG_SET1F(a->d[(i0 + r) * nb + b]);
            acc[r][0] = VG_FMA(VG_CVT(dot[r][0]), VG_MUL(d0, da), acc[r][0]);
            acc[r][1] = VG_FMA(VG_CVT(dot[r][1]), VG_MUL(d1, da), acc[r][1]);
        }
        if (mins) {
            const vg_vf m0 = VG_LOADF(mins + b * VG_STRIP);
            const vg_vf m1 = VG_LOADF(mins + b * VG_STRIP + VG_LANES);
            for (int r = 0; r < R; r++) {
                const vg_vf ds = VG_SET1F(a->ds[(i0 + r) * nb + b]);
                acc[r][0] = VG_FMA(m0, ds, acc[r][0]);
                acc[r][1] = VG_FMA(m1, ds, acc[r][1]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const int64_t at = (i0 + r) * n + j0;
        vg_store(y, at, acc[r][0], acc[r][1], swiglu, dtype);
        if (!swiglu) vg_store(y, at + VG_LANES, acc[r][1], acc[r][1], 0, dtype);
    }
}

/* Every row of x against one packed strip, VG_ROWS at a time. */
static inline __attribute__((always_inline)) void vg_strip(
    const uint8_t *pack, const float *scales, const float *mins, const vg_act *a, int64_t nb,
    int64_t k, int64_t m, void *y, int64_t n, int64_t j0, int dtype, int swiglu, int sgn) {
    int64_t i0 = 0;
    for (; i0 + VG_ROWS <= m; i0 += VG_ROWS)
        vg_rows(pack, scales, mins, a, nb, k, i0, VG_ROWS, y, n, j0, dtype, swiglu, sgn);
    switch (m - i0) {
    case 3: vg_rows(pack, scales, mins, a, nb, k, i0, 3, y, n, j0, dtype, swiglu, sgn); break;
    case 2: vg_rows(pack, scales, mins, a, nb, k, i0, 2, y, n, j0, dtype, swiglu, sgn); break;
    case 1: vg_rows(pack, scales, mins, a, nb, k, i0, 1, y, n, j0, dtype, swiglu, sgn); break;
    }
}

/* y (m, n) = x @ W.T (w2 NULL; n a multiple of VG_STRIP) or silu(x @ W.T) * (x @ W2.T) (n
 * a multiple of VG_LANES), x read in x_dtype and y written in y_dtype. Returns 0 for shapes
 * or types it does not take, or out of memory. */
static int vg_gemm(int type, const uint8_t *w, const uint8_t *w2, int64_t n, int64_t k,
                   const void *x, int64_t m, void *y, int x_dtype, int y_dtype, int n_threads) {
    const int64_t step = w2 ? VG_LANES : VG_STRIP;
    if (n % step || k % QK || m < 1 || !vg_type_size(type)) return 0;
    const int64_t nb = k / QK, row_bytes = nb * vg_type_size(type);
    const int swiglu = w2 != NULL, sgn = vg_signed(type);
    vg_act a;
    int ok = vg_quantize(x, x_dtype, m, k, vg_offset(type), &a, n_threads);
#pragma omp parallel num_threads(n_threads) reduction(&& : ok)
    {
        uint8_t *pack = aligned_alloc(64, (size_t)(nb * VG_BLOCK_BYTES));
        float *scales = aligned_alloc(64, sizeof(float) * (size_t)(nb * VG_STRIP));
        const int has_min = vg_has_min(type);
        float *mins = has_min ? aligned_alloc(64, sizeof(float) * (size_t)(nb * VG_STRIP)) : NULL;
        ok = ok && pack && scales && (mins || !has_min);
#pragma omp for schedule(dynamic, 1)
        for (int64_t s = 0; s < n / step; s++) {
            if (!ok) continue;
            const int64_t j0 = s * step;
            const uint8_t *rows[2][VG_LANES];
            for (int i = 0; i < VG_LANES; i++) {
                rows[0][i] = w + (j0 + i) * row_bytes;
                rows[1][i] = w2 ? w2 + (j0 + i) * row_bytes : w + (j0 + VG_LANES + i) * row_bytes;
            }
            vg_pack_half(rows[0], type, nb, pack, scales, mins);
            vg_pack_half(rows[1], type, nb, pack + VG_HALF_BYTES, scales + VG_LANES,
                         mins ? mins + VG_LANES : NULL);
            if (sgn)
                vg_strip(pack, scales, mins, &a, nb, k, m, y, n, j0, y_dtype, swiglu, 1);
            else
                vg_strip(pack, scales, mins, &a, nb, k, m, y, n, j0, y_dtype, swiglu, 0);
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
