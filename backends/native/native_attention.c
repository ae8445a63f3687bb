/* Attention of a few queries over their own KV-cache rows (the attention_rows op), the
 * cache read in place in its storage type: float32, bfloat16, float16, or q8_0 blocks
 * (GGML type 8: per 32 values along a head's row, a float16 scale and 32 int8 codes).
 *
 * Flash-decoding: the cache rows are read in tiles of KV_TILE, each K and V tile converted
 * to float32 once for a block of up to HB query heads that share a KV head, with a running
 * maximum, sum and weighted V sum per head (the online softmax), so the work is linear in
 * the rows and the memory a task holds does not grow with them. When the queries and KV
 * heads give the threads too few tasks (one decode token, few KV heads), each one's rows
 * are split into ranges whose partial results are combined at the end, weighted by the
 * exponent of their maxima. Scores, softmax and sums are float32; each output value is
 * rounded once.
 */
#include <math.h>
#include <stdlib.h>

#include "native_common.h"

#if TSR_AVX2

#define KV_Q8_0 8     /* the cache type of q8_0 blocks (its GGML type number) */
#define KV_TILE 32    /* cache rows converted to float32 at a time */
#define HB 8          /* query heads sharing a KV head, per task */
#define MIN_SPLIT 256 /* fewest rows per range when the rows are split over threads */
#define MAX_SPLITS 64 /* most ranges per (query, KV head, head block) */

/* Bytes that n values (a multiple of 32 for q8_0) take in a cache of type `type`. */
int64_t tsr_kv_bytes(int type, int64_t n) {
    return type == KV_Q8_0 ? n / QK * 34 : n * (type == DT_F32 ? 4 : 2);
}

/* n values of x (dtype) written to dst as a cache of type `type` stores them: rounded to
 * bfloat16 / float16 (to nearest even), or as q8_0 blocks (d = max|x| / 127 as float16, codes
 * round(x * (1 / d)) half away from zero, all in float32: ggml's quantize_row_q8_0_ref, and
 * tessera.engine.kv_types.quantize_q8_0 bit for bit). */
void tsr_kv_store(const void *x, int dtype, int64_t n, void *dst, int type) {
    if (type != KV_Q8_0) {
        for (int64_t i = 0; i < n; i++) store1(dst, i, load1(x, i, dtype), type);
        return;
    }
    uint8_t *blk = dst;
    for (int64_t i0 = 0; i0 < n; i0 += QK, blk += 34) {
        float v[QK], amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            v[j] = load1(x, i0 + j, dtype);
            amax = fabsf(v[j]) > amax ? fabsf(v[j]) : amax;
        }
        const float d = amax / 127.0f, inv = d == 0.0f ? 0.0f : 1.0f / d;
        const uint16_t h = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(blk, &h, 2);
        for (int j = 0; j < QK; j++) blk[2 + j] = (uint8_t)(int8_t)roundf(v[j] * inv);
    }
}

/* Row `row` (cell * h_kv + head) of a cache of type `type` with d values per row, as float32
 * into dst[0 .. dp), zeros past d. */
static void load_row(const void *cache, int type, int64_t row, int64_t d, int64_t dp, float *dst) {
    int64_t i = 0;
    if (type == KV_Q8_0) {
        const uint8_t *blk = (const uint8_t *)cache + row * (d / QK * 34);
        for (; i < d; i += QK, blk += 34) {
            const __m256 s = _mm256_set1_ps(f16_at(blk));
            for (int k = 0; k < QK; k += 8) {
                const __m128i c = _mm_loadl_epi64((const __m128i *)(blk + 2 + k));
                _mm256_storeu_ps(dst + i + k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), s));
            }
        }
    } else {
        const int64_t base = row * d;
        for (; i + 8 <= d; i += 8) _mm256_storeu_ps(dst + i, load8(cache, base + i, type));
        for (; i < d; i++) dst[i] = load1(cache, base + i, type);
    }
    for (; i < dp; i++) dst[i] = 0.0f;
}

/* The sums of a[0] .. a[7] as one vector. */
static inline __m256 hsum8x8(const __m256 a[8]) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Scores of one tile: p[hh * KV_TILE + jj] = dot(q row hh, K tile row jj) for hh < nh, every
 * row of the tile (rows of dp floats, dp a multiple of VW). */
#if defined(__AVX512F__)
#define VW 16 /* floats per vector of the tile kernels */
/* The 8 sums of a[0] .. a[7] (512-bit) as one 256-bit vector. */
static inline __m256 hsum8x8_512(const __m512 a[8]) {
    __m256 h[8];
    for (int k = 0; k < 8; k++)
        h[k] = _mm256_add_ps(_mm512_castps512_ps256(a[k]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[k]), 1)));
    return hsum8x8(h);
}

/* Four heads x two rows at a time: each K and q vector loaded once for 4 or 2 FMAs. */
static void tile_scores(const float *qf, int64_t nh, const float *kt, int64_t dp, float *p) {
    for (int64_t h0 = 0; h0 < nh; h0 += 4) {
        const int64_t nb = nh - h0 < 4 ? nh - h0 : 4;
        const float *q0 = qf + h0 * dp, *q1 = q0 + (nb > 1) * dp, *q2 = q0 + (nb > 2) * 2 * dp;
        const float *q3 = q0 + (nb > 3) * 3 * dp; /* missing heads repeat head h0 */
        for (int64_t jb = 0; jb < KV_TILE; jb += 2) {
            __m512 a[8];
            for (int k = 0; k < 8; k++) a[k] = _mm512_setzero_ps();
            const float *k0 = kt + jb * dp, *k1 = k0 + dp;
            for (int64_t i = 0; i < dp; i += 16) {
                const __m512 r0 = _mm512_loadu_ps(k0 + i), r1 = _mm512_loadu_ps(k1 + i);
                const __m512 v0 = _mm512_loadu_ps(q0 + i), v1 = _mm512_loadu_ps(q1 + i);
                const __m512 v2 = _mm512_loadu_ps(q2 + i), v3 = _mm512_loadu_ps(q3 + i);
                a[0] = _mm512_fmadd_ps(v0, r0, a[0]), a[1] = _mm512_fmadd_ps(v0, r1, a[1]);
                a[2] = _mm512_fmadd_ps(v1, r0, a[2]), a[3] = _mm512_fmadd_ps(v1, r1, a[3]);
                a[4] = _mm512_fmadd_ps(v2, r0, a[4]), a[5] = _mm512_fmadd_ps(v2, r1, a[5]);
                a[6] = _mm512_fmadd_ps(v3, r0, a[6]), a[7] = _mm512_fmadd_ps(v3, r1, a[7]);
            }
            float sums[8];
            _mm256_storeu_ps(sums, hsum8x8_512(a));
            for (int64_t hh = 0; hh < nb; hh++) {
                p[(h0 + hh) * KV_TILE + jb] = sums[2 * hh];
                p[(h0 + hh) * KV_TILE + jb + 1] = sums[2 * hh + 1];
            }
        }
    }
}

/* acc[hh] += sum_jj p[hh][jj] V tile row jj: four heads x one vector of values at a time,
 * each V vector loaded once for four FMAs. */
static void tile_pv(const float *p, int64_t nh, const float *vt, int64_t dvp, float *acc) {
    for (int64_t h0 = 0; h0 < nh; h0 += 4) {
        const int64_t nb = nh - h0 < 4 ? nh - h0 : 4;
        const float *p0 = p + h0 * KV_TILE;
        for (int64_t i = 0; i < dvp; i += 16) {
            __m512 s[4];
            for (int64_t hh = 0; hh < 4; hh++)
                s[hh] = hh < nb ? _mm512_loadu_ps(acc + (h0 + hh) * dvp + i) : _mm512_setzero_ps();
            for (int64_t jj = 0; jj < KV_TILE; jj++) {
                const __m512 v = _mm512_loadu_ps(vt + jj * dvp + i);
                for (int64_t hh = 0; hh < 4; hh++)
                    s[hh] = _mm512_fmadd_ps(_mm512_set1_ps(p0[(hh < nb ? hh : 0) * KV_TILE + jj]), v, s[hh]);
            }
            for (int64_t hh = 0; hh < nb; hh++) _mm512_storeu_ps(acc + (h0 + hh) * dvp + i, s[hh]);
        }
    }
}
#else
#define VW 8
static void tile_scores(const float *qf, int64_t nh, const float *kt, int64_t dp, float *p) {
    for (int64_t hh = 0; hh < nh; hh++)
        for (int64_t jb = 0; jb < KV_TILE; jb += 8) {
            __m256 a[8];
            for (int jj = 0; jj < 8; jj++) a[jj] = _mm256_setzero_ps();
            for (int64_t i = 0; i < dp; i += 8) {
                const __m256 qv = _mm256_loadu_ps(qf + hh * dp + i);
                for (int jj = 0; jj < 8; jj++)
                    a[jj] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kt + (jb + jj) * dp + i), a[jj]);
            }
            _mm256_storeu_ps(p + hh * KV_TILE + jb, hsum8x8(a));
        }
}

static void tile_pv(const float *p, int64_t nh, const float *vt, int64_t dvp, float *acc) {
    for (int64_t hh = 0; hh < nh; hh++) {
        const float *ph = p + hh * KV_TILE;
        for (int64_t i = 0; i < dvp; i += 8) {
            __m256 s0 = _mm256_loadu_ps(acc + hh * dvp + i), s1 = _mm256_setzero_ps();
            for (int64_t jj = 0; jj < KV_TILE; jj += 2) {
                s0 = _mm256_fmadd_ps(_mm256_set1_ps(ph[jj]), _mm256_loadu_ps(vt + jj * dvp + i), s0);
                s1 = _mm256_fmadd_ps(_mm256_set1_ps(ph[jj + 1]), _mm256_loadu_ps(vt + (jj + 1) * dvp + i), s1);
            }
            _mm256_storeu_ps(acc + hh * dvp + i, _mm256_add_ps(s0, s1));
        }
    }
}
#endif

typedef struct {
    const void *k, *v;
    int k_type, v_type;
    int64_t h_kv, d, dv, dp, dvp;
} kv_cache;

/* One task: query heads h0 .. h0 + nh of one query (qf: nh rows of dp scaled values) over
 * cache rows cells[lo .. hi) of KV head g (ok: per row nonzero when it may be read, or
 * NULL), into the running maxima m, sums l and weighted sums acc (nh x dvp), which start
 * at -inf, 0, 0. buf: KV_TILE * (dp + dvp) + HB * KV_TILE floats. */
static void attend_range(const kv_cache *c, const float *qf, int64_t nh, const int64_t *cells,
                         const uint8_t *ok, int64_t lo, int64_t hi, int64_t g, float *m,
                         float *l, float *acc, float *buf) {
    const int64_t dp = c->dp, dvp = c->dvp;
    float *kt = buf, *vt = kt + KV_TILE * dp, *p = vt + KV_TILE * dvp;
    for (int64_t j0 = lo; j0 < hi; j0 += KV_TILE) {
        const int64_t nj = hi - j0 < KV_TILE ? hi - j0 : KV_TILE;
        int live[KV_TILE], any = 0;
        for (int64_t jj = 0; jj < KV_TILE; jj++) {
            const int64_t j = j0 + jj;
            live[jj] = jj < nj && cells[j] >= 0 && !(ok && !ok[j]);
            any |= live[jj];
            if (live[jj]) load_row(c->k, c->k_type, cells[j] * c->h_kv + g, c->d, dp, kt + jj * dp);
            else memset(kt + jj * dp, 0, sizeof(float) * (size_t)dp);
        }
        if (!any) continue;
        int used = 0; /* whether some head gives a row of this tile a nonzero weight */
        tile_scores(qf, nh, kt, dp, p);
        for (int64_t hh = 0; hh < nh; hh++) {
            float *ph = p + hh * KV_TILE, tile_max = -INFINITY;
            for (int64_t jj = 0; jj < KV_TILE; jj++) {
                if (!live[jj]) ph[jj] = -INFINITY;
                if (ph[jj] > tile_max) tile_max = ph[jj];
            }
            if (tile_max == -INFINITY) {
                for (int64_t jj = 0; jj < KV_TILE; jj++) ph[jj] = 0.0f;
                continue;
            }
            const float m_new = tile_max > m[hh] ? tile_max : m[hh];
            if (m_new > m[hh]) { /* rescale what came before to the new maximum */
                const float f = m[hh] == -INFINITY ? 0.0f : expf(m[hh] - m_new);
                const __m256 fv = _mm256_set1_ps(f);
                for (int64_t i = 0; i < dvp; i += 8)
                    _mm256_storeu_ps(acc + hh * dvp + i, _mm256_mul_ps(fv, _mm256_loadu_ps(acc + hh * dvp + i)));
                l[hh] *= f;
                m[hh] = m_new;
            }
            const __m256 mv = _mm256_set1_ps(m_new);
            __m256 sum = _mm256_setzero_ps();
            for (int64_t jb = 0; jb < KV_TILE; jb += 8) { /* -inf rows: exp gives 0 */
                const __m256 e = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(ph + jb), mv));
                _mm256_storeu_ps(ph + jb, e);
                sum = _mm256_add_ps(sum, e);
            }
            l[hh] += hsum(sum);
            used = 1;
        }
        if (!used) continue;
        for (int64_t jj = 0; jj < KV_TILE; jj++) {
            if (live[jj]) load_row(c->v, c->v_type, cells[j0 + jj] * c->h_kv + g, c->dv, dvp, vt + jj * dvp);
            else memset(vt + jj * dvp, 0, sizeof(float) * (size_t)dvp);
        }
        tile_pv(p, nh, vt, dvp, acc);
    }
}

/* Attention of each query over its own cache rows, as tsr_attention_rows (native_gemv.c)
 * describes it, with each cache in its own storage type k_type / v_type (DT_F32, DT_BF16,
 * DT_F16 or KV_Q8_0; q8_0 rows need d, dv multiples of 32). Returns 0 when out of memory. */
int tsr_attention_kv(const void *q, int64_t t, int64_t h, int64_t d, const void *k_cache,
                     int k_type, const void *v_cache, int v_type, int64_t h_kv, int64_t dv,
                     const int64_t *rows, int64_t s, int64_t r, const int64_t *q_rows,
                     int64_t tq, const uint8_t *allowed, float scale, void *out, int dtype,
                     int n_threads) {
    (void)t;
    const int64_t group = h / h_kv, blocks = (group + HB - 1) / HB;
    const int64_t base = s * tq * h_kv * blocks;
    int64_t splits = 1; /* row ranges per (query, KV head, head block) */
    if (n_threads > 1 && base < 2 * n_threads) {
        splits = (2 * n_threads + base - 1) / base;
        if (splits > r / MIN_SPLIT) splits = r / MIN_SPLIT > 1 ? r / MIN_SPLIT : 1;
        if (splits > MAX_SPLITS) splits = MAX_SPLITS;
    }
    const int64_t span = (r + splits - 1) / splits, tasks = base * splits;
    kv_cache c = {k_cache, v_cache, k_type, v_type, h_kv, d, dv, (d + VW - 1) / VW * VW,
                  (dv + VW - 1) / VW * VW};
    const int64_t part = HB * (c.dvp + 2); /* per task: m, l, acc of its heads */
    float *parts = malloc(sizeof(float) * (size_t)(tasks * part));
    if (!parts) return 0;
    int ok_all = 1;
#pragma omp parallel num_threads(n_threads) if (n_threads > 1 && tasks > 1 && tasks * r * d >= 65536)
    {
        float *buf = malloc(sizeof(float) * (size_t)(HB * c.dp + KV_TILE * (c.dp + c.dvp) + HB * KV_TILE));
        if (!buf) {
#pragma omp atomic write
            ok_all = 0;
        }
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t unit = task / splits, split = task % splits;
            const int64_t sj = unit / (h_kv * blocks), g = unit / blocks % h_kv;
            const int64_t h0 = g * group + unit % blocks * HB;
            const int64_t nh = g * group + group - h0 < HB ? g * group + group - h0 : HB;
            float *m = parts + task * part, *l = m + HB, *acc = l + HB;
            for (int64_t hh = 0; hh < HB; hh++) m[hh] = -INFINITY, l[hh] = 0.0f;
            memset(acc, 0, sizeof(float) * (size_t)(HB * c.dvp));
            const int64_t qr = q_rows[sj], lo = split * span, hi = lo + span < r ? lo + span : r;
            if (qr < 0 || !buf || lo >= hi) continue;
            float *qf = buf;
            for (int64_t hh = 0; hh < nh; hh++)
                for (int64_t i = 0; i < c.dp; i++)
                    qf[hh * c.dp + i] = i < d ? load1(q, (qr * h + h0 + hh) * d + i, dtype) * scale : 0.0f;
            attend_range(&c, qf, nh, rows + sj / tq * r, allowed ? allowed + sj * r : NULL, lo,
                         hi, g, m, l, acc, buf + HB * c.dp);
        }
        free(buf);
    }
    /* combine each unit's ranges: sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c */
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n_threads > 1 && base > 1 && base * dv >= 4096)
    for (int64_t unit = 0; unit < base; unit++) {
        const int64_t sj = unit / (h_kv * blocks), g = unit / blocks % h_kv;
        const int64_t h0 = g * group + unit % blocks * HB;
        const int64_t nh = g * group + group - h0 < HB ? g * group + group - h0 : HB;
        const int64_t qr = q_rows[sj];
        if (qr < 0) continue;
        for (int64_t hh = 0; hh < nh; hh++) {
            float top = -INFINITY, total = 0.0f;
            for (int64_t sp = 0; sp < splits; sp++) {
                const float mc = parts[(unit * splits + sp) * part + hh];
                if (mc > top) top = mc;
            }
            float w[MAX_SPLITS];
            for (int64_t sp = 0; sp < splits; sp++) {
                const float *mc = parts + (unit * splits + sp) * part;
                w[sp] = mc[hh] == -INFINITY ? 0.0f : expf(mc[hh] - top);
                total += w[sp] * mc[HB + hh];
            }
            const float inv = total > 0.0f ? 1.0f / total : 0.0f;
            for (int64_t i = 0; i < dv; i++) {
                float v = 0.0f;
                for (int64_t sp = 0; sp < splits; sp++)
                    v += w[sp] * parts[(unit * splits + sp) * part + 2 * HB + hh * c.dvp + i];
                store1(out, (qr * h + h0 + hh) * dv + i, v * inv, dtype);
            }
        }
    }
    free(parts);
    return ok_all;
}

#endif
