/* Decode matmuls and prefill dequantization for the block types of native_quant.h (the grid
 * types' kernels in native_qdot_iq.c), chosen
 * by their GGML type number: the activation rows quantized once, the weight rows (of one or
 * several weights that read the same activations) spread over the threads, each row's dot
 * products from native_qdot_*.c, outputs rounded once to the caller's dtype.
 *
 * The weight rows go in groups of QUANT_ROWS (the 512-bit kernels of the types with
 * groups of 32 put the group's rows side by side in one vector), each group read once for
 * up to QUANT_MI activation rows at a time; consecutive rows are consecutive bytes, so a
 * thread's groups are one stream that the hardware prefetchers follow within a page and
 * PREFETCH carries across pages.
 */
#include <stdlib.h>

#include "native_quant.h"

#if TSR_AVX2

#define QUANT_MAX_WEIGHTS 8 /* weights in one tsr_gemv_quant call */

typedef struct {
    int ggml_type, block, type_size;
    tsr_row_dot dot;
    tsr_row_dequant dequant;
} quant_kind;

static const quant_kind KINDS[] = {
    {3, 32, 20, tsr_dot_q4_1, tsr_deq_q4_1},       {6, 32, 22, tsr_dot_q5_0, tsr_deq_q5_0},
    {7, 32, 24, tsr_dot_q5_1, tsr_deq_q5_1},       {12, 256, 144, tsr_dot_q4_k, tsr_deq_q4_k},
    {13, 256, 176, tsr_dot_q5_k, tsr_deq_q5_k},    {14, 256, 210, tsr_dot_q6_k, tsr_deq_q6_k},
    {20, 32, 18, tsr_dot_iq4_nl, tsr_deq_iq4_nl},  {23, 256, 136, tsr_dot_iq4_xs, tsr_deq_iq4_xs},
    {35, 256, 66, tsr_dot_tq2_0, tsr_deq_tq2_0},    {39, 32, 17, tsr_dot_mxfp4, tsr_deq_mxfp4},
    {10, 256, 84, tsr_dot_q2_k, tsr_deq_q2_k},      {11, 256, 110, tsr_dot_q3_k, tsr_deq_q3_k},
    {34, 256, 54, tsr_dot_tq1_0, tsr_deq_tq1_0},    {40, 64, 36, tsr_dot_nvfp4, tsr_deq_nvfp4},
    {16, 256, 66, tsr_dot_iq2_xxs, tsr_deq_iq2_xxs}, {17, 256, 74, tsr_dot_iq2_xs, tsr_deq_iq2_xs},
    {22, 256, 82, tsr_dot_iq2_s, tsr_deq_iq2_s},     {18, 256, 98, tsr_dot_iq3_xxs, tsr_deq_iq3_xxs},
    {21, 256, 110, tsr_dot_iq3_s, tsr_deq_iq3_s},    {19, 256, 50, tsr_dot_iq1_s, tsr_deq_iq1_s},
    {29, 256, 56, tsr_dot_iq1_m, tsr_deq_iq1_m},
};
#define N_KINDS (int)(sizeof(KINDS) / sizeof(KINDS[0]))

static const quant_kind *kind_of(int ggml_type) {
    for (int i = 0; i < N_KINDS; i++)
        if (KINDS[i].ggml_type == ggml_type) return &KINDS[i];
    return NULL;
}

/* Bytes of one row of n_in values of the type, or 0 when the library has no kernel for it
 * (or n_in is not a whole number of its blocks). */
int64_t tsr_quant_row_bytes(int ggml_type, int64_t n_in) {
    const quant_kind *t = kind_of(ggml_type);
    if (!t || n_in <= 0 || n_in % t->block) return 0;
    return n_in / t->block * t->type_size;
}

static void free_acts(tsr_acts *a) {
    free(a->q);
    free(a->d);
}

static int quantize_acts(const void *x, int dtype, int64_t m, int64_t n_in, tsr_acts *a) {
    const int64_t nb = n_in / QK;
    a->n_in = n_in;
    a->nb = nb;
    a->q = malloc((size_t)(m * n_in + 64));
    a->d = malloc(sizeof(float) * (size_t)(7 * m * nb + 8)); /* d, d16 (2), ds, ds16 (2), s */
    if (!a->q || !a->d) return 0;
    a->d16 = a->d + m * nb;
    a->ds = a->d16 + 2 * m * nb;
    a->ds16 = a->ds + m * nb;
    a->s = (int32_t *)(a->ds16 + 2 * m * nb);
    for (int64_t k = 0; k < m * nb; k++) {
        int half[2];
        const int sum = quantize32(x, k * QK, dtype, a->q + k * QK, a->d + k, half);
        const float d = a->d[k];
        a->s[k] = sum;
        a->ds[k] = d * (float)sum;
        a->d16[2 * k] = a->d16[2 * k + 1] = d;
        a->ds16[2 * k] = d * (float)half[0];
        a->ds16[2 * k + 1] = d * (float)half[1];
    }
    return 1;
}

/* y (m, sum n_outs) = x (m, n_in) @ [W_0; W_1; ...].T (+ biases): n_w <= QUANT_MAX_WEIGHTS
 * weights of one type that read the same activations (Q/K/V, gate/up), their outputs side
 * by side; biases NULL or per weight NULL or n_outs[k] values of dtype, added before the
 * one rounding. Returns 0 for a type without a kernel, a shape it does not take, or when
 * out of memory. */
int tsr_gemv_quant(int ggml_type, int n_w, const uint8_t *const *ws, const int64_t *n_outs,
                   const void *const *biases, int64_t n_in, const void *x, int64_t m, void *y,
                   int dtype, int n_threads) {
    const quant_kind *t = kind_of(ggml_type);
    const int64_t row_bytes = tsr_quant_row_bytes(ggml_type, n_in);
    if (!t || !row_bytes || n_w < 1 || n_w > QUANT_MAX_WEIGHTS || m < 1) return 0;
    int64_t first_group[QUANT_MAX_WEIGHTS + 1], col[QUANT_MAX_WEIGHTS + 1];
    first_group[0] = col[0] = 0;
    for (int k = 0; k < n_w; k++) {
        first_group[k + 1] = first_group[k] + (n_outs[k] + QUANT_ROWS - 1) / QUANT_ROWS;
        col[k + 1] = col[k] + n_outs[k];
    }
    const int64_t groups = first_group[n_w], width = col[n_w];
    tsr_acts a;
    if (!quantize_acts(x, dtype, m, n_in, &a)) {
        free_acts(&a);
        return 0;
    }
    const int64_t group_bytes = QUANT_ROWS * row_bytes;
    const int chunk = group_bytes >= GEMV_CHUNK_BYTES ? 1 : (int)(GEMV_CHUNK_BYTES / group_bytes);
#pragma omp parallel for schedule(guided, chunk) num_threads(n_threads) if (n_threads > 1)
    for (int64_t g = 0; g < groups; g++) {
        int k = 0;
        while (g >= first_group[k + 1]) k++;
        const int64_t r0 = (g - first_group[k]) * QUANT_ROWS;
        const int n = n_outs[k] - r0 < QUANT_ROWS ? (int)(n_outs[k] - r0) : QUANT_ROWS;
        const void *bias = biases ? biases[k] : NULL;
        for (int64_t i0 = 0; i0 < m; i0 += QUANT_MI) {
            const int64_t mi = m - i0 < QUANT_MI ? m - i0 : QUANT_MI;
            float yi[QUANT_MI * QUANT_ROWS];
            t->dot(ws[k] + r0 * row_bytes, row_bytes, n, &a, i0, mi, yi);
            for (int64_t i = 0; i < mi; i++)
                for (int r = 0; r < n; r++)
                    store1(y, (i0 + i) * width + col[k] + r0 + r,
                           yi[i * QUANT_ROWS + r] + (bias ? load1(bias, r0 + r, dtype) : 0.0f), dtype);
        }
    }
    free_acts(&a);
    return 1;
}

/* y (n_out, n_in) = the weight's values in dtype, rounded once from the float32 values of
 * the numpy dequantization (prefill matmuls, embedding rows). Returns 0 as tsr_gemv_quant. */
int tsr_dequant_quant(int ggml_type, const uint8_t *w, int64_t n_out, int64_t n_in, void *y,
                      int dtype, int n_threads) {
    const quant_kind *t = kind_of(ggml_type);
    const int64_t row_bytes = tsr_quant_row_bytes(ggml_type, n_in);
    if (!t || !row_bytes) return 0;
    int ok = 1;
#pragma omp parallel num_threads(n_threads) if (n_threads > 1 && n_out > 1)
    {
        float *buf = dtype == DT_F32 ? NULL : malloc(sizeof(float) * (size_t)n_in);
        if (dtype != DT_F32 && !buf) {
#pragma omp atomic write
            ok = 0;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < n_out; r++) {
            if (dtype == DT_F32) {
                t->dequant(w + r * row_bytes, n_in, (float *)y + r * n_in);
            } else if (buf) {
                t->dequant(w + r * row_bytes, n_in, buf);
                for (int64_t i = 0; i < n_in; i += 8) store8(y, r * n_in + i, _mm256_loadu_ps(buf + i), dtype);
            }
        }
        free(buf);
    }
    return ok;
}

#endif
