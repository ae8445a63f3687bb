/* Decode matmuls (a few activation rows) of F16 and BF16 weights, the file's bytes in place.
 *
 * torch's one-row matmul of a dense bf16 weight reads it at a fraction of the memory
 * bandwidth, and an F16 file was first rounded to the bf16 compute dtype at load. Here each
 * weight row is read once from the memory-mapped file for up to DENSE_MI activation rows:
 * every value is widened to float32 (F16: vcvtph2ps; BF16: a 16-bit shift) and multiplied
 * with float32 activations by FMA, so the products are exact and only the float32 sums
 * round; with AVX512-BF16, BF16 weights meet bf16 activations in vdpbf16ps (32 values per
 * instruction, the same exact products). The outputs are rounded once to the caller's dtype.
 *
 * The paths, chosen when the library is compiled (tests force the narrower ones with
 * -mno-avx512bf16 and -mno-avx512f): AVX512 with vdpbf16ps (tsr_dense_path 2), AVX512F
 * (1), AVX2 + F16C (0). The weight rows are read one after the other, so a thread's rows
 * are one sequential stream (four rows read side by side, as the block types do, gave 0.6x
 * the bandwidth: the activations are small and stay in L1 anyway), prefetched PREFETCH
 * bytes ahead across the file's 4 KiB pages; OpenMP hands out the rows of all the weights
 * of one call in guided chunks (as gemv_n in native_gemv.c).
 */
#include <stdlib.h>

#include "native_common.h"

#define GGML_F16 1
#define GGML_BF16 30
#define DENSE_MAX_WEIGHTS 8 /* weights in one tsr_gemv_dense call */

#if defined(__AVX512F__)
#define DENSE_ZMM 1
#define DENSE_MI 4 /* activation rows per pass over a weight row */
#define DENSE_W 16 /* values per vector */
#else
#define DENSE_ZMM 0
#define DENSE_MI 2 /* 4 accumulators of 16 registers */
#define DENSE_W 8
#endif
#if DENSE_ZMM && defined(__AVX512BF16__)
#define DENSE_DPBF16 1
#else
#define DENSE_DPBF16 0
#endif

/* Which path this build runs: 2 vdpbf16ps, 1 AVX512F, 0 AVX2 + F16C. */
int tsr_dense_path(void) { return DENSE_DPBF16 ? 2 : DENSE_ZMM; }

#if TSR_AVX2

static inline float widen1(uint16_t h, int bf16) {
    if (!bf16) return _cvtsh_ss(h);
    const uint32_t u = (uint32_t)h << 16;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

#if DENSE_ZMM
typedef __m512 vec;
#define VZERO _mm512_setzero_ps
#define VFMA _mm512_fmadd_ps
#define VLOAD _mm512_loadu_ps
#define VSUM _mm512_reduce_add_ps
static inline vec widen(const uint16_t *p, int bf16) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (bf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}
#else
typedef __m256 vec;
#define VZERO _mm256_setzero_ps
#define VFMA _mm256_fmadd_ps
#define VLOAD _mm256_loadu_ps
#define VSUM hsum
static inline vec widen(const uint16_t *p, int bf16) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}
#endif

/* y[i] = dot(weight row w, xf row i) for i < MI (a compile-time constant after inlining):
 * n_in 16-bit values against float32 rows xs apart, two accumulators per activation row
 * (two FMA chains in flight). */
static inline __attribute__((always_inline)) void row_fma(const uint16_t *w, int64_t n_in, int MI,
                                                         int bf16, const float *xf, int64_t xs,
                                                         float *y) {
    vec acc[2][DENSE_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = VZERO();
    int64_t k = 0;
    for (; k + 2 * DENSE_W <= n_in; k += 2 * DENSE_W) {
        prefetch1((const uint8_t *)(w + k) + PREFETCH);
        const vec w0 = widen(w + k, bf16), w1 = widen(w + k + DENSE_W, bf16);
        for (int i = 0; i < MI; i++) {
            acc[0][i] = VFMA(w0, VLOAD(xf + i * xs + k), acc[0][i]);
            acc[1][i] = VFMA(w1, VLOAD(xf + i * xs + k + DENSE_W), acc[1][i]);
        }
    }
    for (; k + DENSE_W <= n_in; k += DENSE_W) {
        const vec w0 = widen(w + k, bf16);
        for (int i = 0; i < MI; i++) acc[0][i] = VFMA(w0, VLOAD(xf + i * xs + k), acc[0][i]);
    }
    for (int i = 0; i < MI; i++) {
        float s = VSUM(acc[0][i]) + VSUM(acc[1][i]);
        for (int64_t j = k; j < n_in; j++) s += widen1(w[j], bf16) * xf[i * xs + j];
        y[i] = s;
    }
}

#if DENSE_DPBF16
/* The same for a BF16 weight row and bf16 activations xb (rows xs apart): vdpbf16ps on
 * pairs, 32 values per instruction. */
static inline __attribute__((always_inline)) void row_dpbf16(const uint16_t *w, int64_t n_in,
                                                            int MI, const uint16_t *xb,
                                                            int64_t xs, float *y) {
    __m512 acc[2][DENSE_MI];
    for (int i = 0; i < MI; i++) acc[0][i] = acc[1][i] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= n_in; k += 64) {
        prefetch1((const uint8_t *)(w + k) + PREFETCH);
        prefetch1((const uint8_t *)(w + k + 32) + PREFETCH);
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
        for (int i = 0; i < MI; i++) {
            acc[0][i] = _mm512_dpbf16_ps(acc[0][i], w0, (__m512bh)_mm512_loadu_si512(xb + i * xs + k));
            acc[1][i] = _mm512_dpbf16_ps(acc[1][i], w1,
                                         (__m512bh)_mm512_loadu_si512(xb + i * xs + k + 32));
        }
    }
    for (; k + 32 <= n_in; k += 32) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k);
        for (int i = 0; i < MI; i++)
            acc[0][i] = _mm512_dpbf16_ps(acc[0][i], w0, (__m512bh)_mm512_loadu_si512(xb + i * xs + k));
    }
    for (int i = 0; i < MI; i++) {
        float s = _mm512_reduce_add_ps(acc[0][i]) + _mm512_reduce_add_ps(acc[1][i]);
        for (int64_t j = k; j < n_in; j++) s += widen1(w[j], 1) * widen1(xb[i * xs + j], 1);
        y[i] = s;
    }
}
#endif

/* One weight row x mi activation rows starting at row i0 into y[0 .. mi). */
static void dense_row(const uint16_t *w, int64_t n_in, int64_t mi, int bf16, int dp,
                      const void *xa, int64_t i0, float *y) {
#if DENSE_DPBF16
#define DENSE_DP(MM) \
    if (dp) { row_dpbf16(w, n_in, MM, (const uint16_t *)xa + i0 * n_in, n_in, y); return; }
#else
#define DENSE_DP(MM) (void)dp;
#endif
#define DENSE_CASE(MM)                                                       \
    if (mi == MM) {                                                          \
        DENSE_DP(MM)                                                         \
        row_fma(w, n_in, MM, bf16, (const float *)xa + i0 * n_in, n_in, y);  \
        return;                                                              \
    }
    DENSE_CASE(1)
    DENSE_CASE(2)
#if DENSE_MI == 4
    DENSE_CASE(3)
    DENSE_CASE(4)
#endif
#undef DENSE_CASE
#undef DENSE_DP
}

/* y (m, sum n_outs) = x (m, n_in) @ [W_0; W_1; ...].T (+ biases): n_w <= DENSE_MAX_WEIGHTS
 * weights of GGML type F16 (1) or BF16 (30), rows of n_in values, that read the same
 * activations (Q/K/V, gate/up), their outputs side by side; biases NULL or per weight NULL
 * or n_outs[k] values of dtype, added before the one rounding. x and y contiguous, of dtype.
 * Returns 0 for another type, a shape it does not take, or when out of memory. */
int tsr_gemv_dense(int ggml_type, int n_w, const uint8_t *const *ws, const int64_t *n_outs,
                   const void *const *biases, int64_t n_in, const void *x, int64_t m, void *y,
                   int dtype, int n_threads) {
    if ((ggml_type != GGML_F16 && ggml_type != GGML_BF16) || n_w < 1 || n_w > DENSE_MAX_WEIGHTS)
        return 0;
    if (m < 1 || n_in < 1) return 0;
    const int bf16 = ggml_type == GGML_BF16;
    /* bf16 activations meet BF16 weights as they are; else they are widened once */
    const int dp = DENSE_DPBF16 && bf16 && dtype == DT_BF16;
    float *xf = NULL;
    const void *xa = x;
    if (!dp && dtype != DT_F32) {
        xf = malloc(sizeof(float) * (size_t)(m * n_in));
        if (!xf) return 0;
        for (int64_t i = 0; i < m * n_in; i++) xf[i] = load1(x, i, dtype);
        xa = xf;
    }
    int64_t first_row[DENSE_MAX_WEIGHTS + 1], col[DENSE_MAX_WEIGHTS + 1];
    first_row[0] = col[0] = 0;
    for (int k = 0; k < n_w; k++) {
        first_row[k + 1] = first_row[k] + n_outs[k];
        col[k + 1] = col[k] + n_outs[k];
    }
    const int64_t n_rows = first_row[n_w], width = col[n_w], row_bytes = 2 * n_in;
    const int chunk = row_bytes >= GEMV_CHUNK_BYTES ? 1 : (int)(GEMV_CHUNK_BYTES / row_bytes);
#pragma omp parallel for schedule(guided, chunk) num_threads(n_threads) if (n_threads > 1)
    for (int64_t g = 0; g < n_rows; g++) {
        int k = 0;
        while (g >= first_row[k + 1]) k++;
        const int64_t r = g - first_row[k];
        const uint16_t *wr = (const uint16_t *)ws[k] + r * n_in;
        const float b = biases && biases[k] ? load1(biases[k], r, dtype) : 0.0f;
        for (int64_t i0 = 0; i0 < m; i0 += DENSE_MI) {
            const int64_t mi = m - i0 < DENSE_MI ? m - i0 : DENSE_MI;
            float yi[DENSE_MI];
            dense_row(wr, n_in, mi, bf16, dp, xa, i0, yi);
            for (int64_t i = 0; i < mi; i++) store1(y, (i0 + i) * width + col[k] + r, yi[i] + b, dtype);
        }
    }
    free(xf);
    return 1;
}

/* bf16 bits of a float32, rounded to nearest even; a NaN stays a NaN (quiet), as ggml's
 * ggml_compute_fp32_to_bf16 and vcvtne2ps2bf16 give. */
static inline uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* F16 values to bf16, each widened to float32 (exact) and rounded once to nearest even:
 * what torch's cast gives for every value but NaN (kept quiet NaN with its sign, where
 * torch writes 0x7fc0). The threads take 64 Ki-value runs, so each streams its own part
 * of the source and the destination. Load-time conversion of F16 files for bf16 compute:
 * torch's cast ran at ~4 ns per value and thread, this at memory speed. */
void tsr_f16_to_bf16(const uint16_t *src, uint16_t *dst, int64_t n, int n_threads) {
    const int64_t run = 65536, n_runs = (n + run - 1) / run;
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n_threads > 1 && n_runs > 1)
    for (int64_t c = 0; c < n_runs; c++) {
        int64_t i = c * run;
        const int64_t end = i + run < n ? i + run : n;
#if DENSE_DPBF16
        for (; i + 32 <= end; i += 32) {
            const __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i)));
            const __m512 hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i + 16)));
            _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
#else
        const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
        const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
        for (; i + 8 <= end; i += 8) {
            const __m256i u = _mm256_castps_si256(
                _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
            const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
            __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), lsb), 16);
            const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
            const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
            r = _mm256_blendv_epi8(r, quiet, nan);
            /* eight 32-bit lanes to eight 16-bit values (each fits: no saturation) */
            const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r),
                                                    _mm256_extracti128_si256(r, 1));
            _mm_storeu_si128((__m128i *)(dst + i), packed);
        }
#endif
        for (; i < end; i++) dst[i] = bf16_bits(_cvtsh_ss(src[i]));
    }
}

#endif
