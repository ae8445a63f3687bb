/* The portable decode GEMV: the common block types in plain C loops, no intrinsics, for
 * comparison with the vector kernels and for CPUs they do not serve (the compiler may still
 * vectorize the loops for the -march it is given).
 *
 * The same arithmetic as native_qgemv.c: each activation row rounded to int8 blocks of 32
 * (d = max|x| / 127, codes rounded to nearest even), each weight block unpacked to its
 * integer codes q with a scale and an offset per 16 values (w = dg * q + mg), every group
 * one integer dot product scaled in float32, the offsets through the activation sums.
 * The grid types decode through native_iq.h (plain C too).
 * tsr_gemv_quant_portable takes tsr_gemv_quant's arguments; TESSERA_NATIVE_PATH=portable
 * routes the decode matmuls here.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_iq.h"

#define PQK 32           /* values per activation block */
#define PMAX_WEIGHTS 8   /* weights in one call, as tsr_gemv_quant */
#define PMAX_BLOCK 256   /* values per weight block of the largest type */

static float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    uint32_t u;
    if (exp == 0) { /* zero and subnormals: man * 2^-24 */
        const float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    u = sign | (exp == 31 ? 0x7F800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
    float v;
    memcpy(&v, &u, 4);
    return v;
}

/* float32 -> float16, rounded to nearest even as the F16C instruction does. */
static uint16_t float_to_half(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7FFFFFFFu;
    if (u > 0x7F800000u) return sign | 0x7E00u;  /* NaN */
    if (u >= 0x477FF000u) return sign | 0x7C00u; /* 65520 and up round to infinity */
    if (u < 0x38800000u) {                        /* below 2^-14: a subnormal half */
        float a;
        memcpy(&a, &u, 4);
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    u += 0xC8000FFFu + ((u >> 13) & 1u); /* rebias the exponent, round to nearest even */
    return sign | (uint16_t)(u >> 13);
}

/* dtype codes as native_common.h: 0 float32, 1 bfloat16, 2 float16 */
static float load_x(const void *x, int64_t i, int dtype) {
    if (dtype == 1) {
        const uint32_t u = (uint32_t)((const uint16_t *)x)[i] << 16;
        float v;
        memcpy(&v, &u, 4);
        return v;
    }
    if (dtype == 2) return half_to_float((const uint8_t *)((const uint16_t *)x + i));
    return ((const float *)x)[i];
}

static void store_y(void *y, int64_t i, float v, int dtype) {
    if (dtype == 1) {
        uint32_t u;
        memcpy(&u, &v, 4);
        u = (v != v) ? (u | 0x00400000u) : u + 0x7FFFu + ((u >> 16) & 1u);
        ((uint16_t *)y)[i] = (uint16_t)(u >> 16);
    } else if (dtype == 2) {
        ((uint16_t *)y)[i] = float_to_half(v);
    } else {
        ((float *)y)[i] = v;
    }
}

/* One block's integer codes q, scale dg and offset mg per 16 values. */
typedef void (*unpack_fn)(const uint8_t *b, int8_t *q, float *dg, float *mg);

static void fill_groups(float *dg, float *mg, int n, float d, float m) {
    for (int g = 0; g < n; g++) dg[g] = d, mg[g] = m;
}

static void unpack_q8_0(const uint8_t *b, int8_t *q, float *dg, float *mg) {
    memcpy(q, b + 2, 32);
    fill_groups(dg, mg, 2, half_to_float(b), 0.0f);
}

static void unpack_q4_0(const uint8_t *b, int8_t *q, float *dg, float *mg) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((b[2 + j] & 15) - 8);
        q[j + 16] = (int8_t)((b[2 + j] >> 4) - 8);
    }
    fill_groups(dg, mg, 2, half_to_float(b), 0.0f);
}

static void unpack_q4_1(const uint8_t *b, int8_t *q, float *dg, float *mg) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(b[4 + j] & 15);
        q[j + 16] = (int8_t)(b[4 + j] >> 4);
    }
    fill_groups(dg, mg, 2, half_to_float(b), half_to_float(b + 2));
}

/* Q5_0 / Q5_1: bit j of qh is the fifth bit of value j */
static void unpack_5bit(const uint8_t *qh4, const uint8_t *qs, int offset, int8_t *q) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((qs[j] & 15) | (((qh >> j) & 1u) << 4)) - offset);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - offset);
    }
}

static void unpack_q5_0(const uint8_t *b, int8_t *q, float *dg, float *mg) {
    unpack_5bit(b + 2, b + 6, 16, q);
    fill_groups(dg, mg, 2, half_to_float(b), 0.0f);
}

static void unpack_q5_1(const uint8_t *b, int8_t *q, float *dg, float *mg) {
    unpack_5bit(b + 4, b + 8, 0, q);
    fill_groups(dg, mg, 2, half_to_float(b), half_to_float(b + 2));
}

static const int8_t IQ4NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

static void unpack_iq4_nl(const uint8_t *b, int8_t *q, float *dg, float *mg) {
    for (int j = 0; j < 16; j++) {
        q[j] = IQ4NL_VALUES[b[2 + j] & 15];
        q[j + 16] = IQ4NL_VALUES[b[2 + j] >> 4];
    }
    fill_groups(dg, mg, 2, half_to_float(b), 0.0f);
}

/* The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block's 12 scale bytes. */
static void scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void k4_groups(const uint8_t *b, float *dg, float *mg) {
    const float d = half_to_float(b), dmin = half_to_float(b + 2);
    for (int s = 0; s < 8; s++) {
        int sc, m;
        scale_min_k4(s, b + 4, &sc, &m);
        fill_groups(dg + 2 * s, mg + 2 * s, 2, d * (float)sc, -dmin * (float)m);
    }
}

static void unpack_q4_k(const uint8_t *b, int8_t *q, float *dg, float *mg) {
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)(qs[32 * c + l] & 15);
            q[64 * c + 32 + l] = (int8_t)(qs[32 * c + l] >> 4);
        }
    k4_groups(b, dg, mg);
}

static void unpack_q5_k(const uint8_t *b, int8_t *q, float *dg, float *mg) {
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)((qs[32 * c + l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4));
            q[64 * c + 32 + l] = (int8_t)((qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4));
        }
    k4_groups(b, dg, mg);
}

static void unpack_q6_k(const uint8_t *b, int8_t *q, float *dg, float *mg) {
    const float d = half_to_float(b + 208);
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        int8_t *o = q + 128 * n;
        for (int l = 0; l < 32; l++) {
            o[l] = (int8_t)(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
    for (int g = 0; g < 16; g++) dg[g] = d * (float)(int8_t)b[192 + g], mg[g] = 0.0f;
}

/* The grid types (native_iq.h): signed values, a scale per 16 (IQ1: times 1/8), no offsets. */
static void unpack_iq(int type, const uint8_t *b, int8_t *q, float *dg, float *mg) {
    for (int g = 0; g < 8; g++) {
        uint64_t grid[4];
        uint32_t bits;
        iq_group(type, b, g, grid, &bits);
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < 8; j++) q[32 * g + 8 * k + j] = iq_value(type, grid, bits, k, j);
    }
    iq_scales(type, b, dg);
    for (int g = 0; g < 16; g++) dg[g] *= iq_is_iq1(type) ? 0.125f : 1.0f, mg[g] = 0.0f;
}

#define UNPACK_IQ(name, type) \
    static void unpack_##name(const uint8_t *b, int8_t *q, float *dg, float *mg) { unpack_iq(type, b, q, dg, mg); }
UNPACK_IQ(iq2_xxs, IQ2_XXS)
UNPACK_IQ(iq2_xs, IQ2_XS)
UNPACK_IQ(iq2_s, IQ2_S)
UNPACK_IQ(iq3_xxs, IQ3_XXS)
UNPACK_IQ(iq3_s, IQ3_S)
UNPACK_IQ(iq1_s, IQ1_S)
UNPACK_IQ(iq1_m, IQ1_M)

typedef struct {
    int ggml_type, block, type_size;
    unpack_fn unpack;
} portable_kind;

static const portable_kind PKINDS[] = {
    {8, 32, 34, unpack_q8_0},    {2, 32, 18, unpack_q4_0},    {3, 32, 20, unpack_q4_1},
    {6, 32, 22, unpack_q5_0},    {7, 32, 24, unpack_q5_1},    {20, 32, 18, unpack_iq4_nl},
    {12, 256, 144, unpack_q4_k}, {13, 256, 176, unpack_q5_k}, {14, 256, 210, unpack_q6_k},
    {16, 256, 66, unpack_iq2_xxs}, {17, 256, 74, unpack_iq2_xs}, {22, 256, 82, unpack_iq2_s},
    {18, 256, 98, unpack_iq3_xxs}, {21, 256, 110, unpack_iq3_s}, {19, 256, 50, unpack_iq1_s},
    {29, 256, 56, unpack_iq1_m},
};

static const portable_kind *portable_kind_of(int ggml_type) {
    for (size_t i = 0; i < sizeof(PKINDS) / sizeof(PKINDS[0]); i++)
        if (PKINDS[i].ggml_type == ggml_type) return &PKINDS[i];
    return NULL;
}

/* Values per block of the type on the portable path, or 0 when it has no kernel there. */
int tsr_portable_block(int ggml_type) {
    const portable_kind *t = portable_kind_of(ggml_type);
    return t ? t->block : 0;
}

/* Row k of x to int8 codes q (n_in), a scale per block of 32 and the codes' sum per 16. */
static void quantize_row(const void *x, int64_t k, int64_t n_in, int dtype, int8_t *q, float *d,
                         int32_t *sum16) {
    for (int64_t b = 0; b < n_in / PQK; b++) {
        const int64_t i0 = k * n_in + b * PQK;
        float v[PQK], amax = 0.0f;
        for (int j = 0; j < PQK; j++) {
            v[j] = load_x(x, i0 + j, dtype);
            amax = fmaxf(amax, fabsf(v[j]));
        }
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        d[b] = amax / 127.0f;
        sum16[2 * b] = sum16[2 * b + 1] = 0;
        for (int j = 0; j < PQK; j++) {
            const long r = lrintf(v[j] * id);
            q[b * PQK + j] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
            sum16[2 * b + j / 16] += q[b * PQK + j];
        }
    }
}

/* One weight row times the quantized activation row: per block of 32, its two groups. */
static float row_dot(const portable_kind *t, const uint8_t *w, int64_t n_in, const int8_t *qa,
                     const float *da, const int32_t *sum16) {
    int8_t qw[PMAX_BLOCK];
    float dg[PMAX_BLOCK / 16], mg[PMAX_BLOCK / 16], acc = 0.0f;
    for (int64_t k = 0; k < n_in / t->block; k++) {
        t->unpack(w + k * t->type_size, qw, dg, mg);
        for (int g = 0; g < t->block / 16; g++) {
            const int64_t a0 = k * t->block + 16 * g;
            int32_t isum = 0;
            for (int j = 0; j < 16; j++) isum += (int32_t)qw[16 * g + j] * qa[a0 + j];
            acc += da[a0 / PQK] * (dg[g] * (float)isum + mg[g] * (float)sum16[a0 / 16]);
        }
    }
    return acc;
}

int tsr_gemv_quant_portable(int ggml_type, int n_w, const uint8_t *const *ws,
                            const int64_t *n_outs, const void *const *biases, int64_t n_in,
                            const void *x, int64_t m, void *y, int dtype, int n_threads) {
    const portable_kind *t = portable_kind_of(ggml_type);
    if (!t || n_in <= 0 || n_in % t->block || n_w < 1 || n_w > PMAX_WEIGHTS || m < 1) return 0;
    const int64_t row_bytes = n_in / t->block * t->type_size, nb = n_in / PQK;
    int64_t col[PMAX_WEIGHTS + 1];
    col[0] = 0;
    for (int k = 0; k < n_w; k++) col[k + 1] = col[k] + n_outs[k];
    int8_t *qa = malloc((size_t)(m * n_in));
    float *da = malloc(sizeof(float) * (size_t)(m * nb));
    int32_t *sum16 = malloc(sizeof(int32_t) * (size_t)(2 * m * nb));
    if (!qa || !da || !sum16) {
        free(qa), free(da), free(sum16);
        return 0;
    }
    for (int64_t i = 0; i < m; i++)
        quantize_row(x, i, n_in, dtype, qa + i * n_in, da + i * nb, sum16 + 2 * i * nb);
    const int64_t width = col[n_w];
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n_threads > 1)
    for (int64_t c = 0; c < width; c++) {
        int k = 0;
        while (c >= col[k + 1]) k++;
        const int64_t r = c - col[k];
        const void *bias = biases ? biases[k] : NULL;
        for (int64_t i = 0; i < m; i++) {
            const float v = row_dot(t, ws[k] + r * row_bytes, n_in, qa + i * n_in, da + i * nb,
                                    sum16 + 2 * i * nb);
            store_y(y, i * width + c, v + (bias ? load_x(bias, r, dtype) : 0.0f), dtype);
        }
    }
    free(qa), free(da), free(sum16);
    return 1;
}
