/* Prefill matmuls of Q4_0 / Q8_0 / BF16 / F16 weights on the AMX tile units (bf16),
 * dequantizing the weights into tiles on the way: tessera's native kernels, built with
 * native_gemv.c into one library by tessera/backends/native/kernels.py.
 *
 * y (m, n) = x (m, k) @ W.T with x bfloat16 and y bfloat16 or float32 (the accumulators
 * unrounded: float32 activations), W n rows of GGUF block bytes (a BF16 or F16 row's
 * "blocks" are its runs of 32 values, 64 bytes; F16 values are rounded to bf16 as they
 * enter a tile, as converting the weight first would). A
 * TDPBF16PS multiplies a 16 x 32 bf16 tile of x (16 rows, 32 inputs: straight from x with
 * x's row stride) by a 32 x 16 tile of W.T held as 16 rows of input pairs (the "VNNI"
 * layout: row p holds (W[j][2p], W[j][2p + 1]) for 16 output columns j), adding into a
 * 16 x 16 float32 tile. One 32-value block of one weight row is exactly one column of
 * such a W tile: each block is dequantized ((q - 8) * d or q * d in float32, exact, then
 * rounded to bf16 to nearest even: the same values as the dequantize-then-matmul path)
 * into one 512-bit vector of 16 pairs, and 16 rows' vectors are transposed into a tile.
 *
 * Each thread takes strips of 32 output columns: it dequantizes the strip once (two tiles
 * per 32 inputs, into its scratch), then runs every 32-row block of x against it with
 * 2 x 2 float32 accumulator tiles (2 x tiles, 2 W tiles: the 8 tile registers). Rows of x
 * past a multiple of 32 are copied, zero-padded, into the scratch. Products of bf16 values
 * are exact in float32 and summed in float32 as oneDNN's AMX kernels do (in another order).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "native_transpose.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && \
    defined(__AVX512BW__)
#define TSR_AMX 1
#else
#define TSR_AMX 0
#endif

#define AMX_STRIP 32 /* output columns per strip: two W tiles */
#define AMX_ROWS 32  /* rows of x per step: two x tiles */
#define TILE_BYTES 1024

/* The weight formats the tiles read, by GGML type number, and their bytes per 32 values. */
enum { GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q8_0 = 8, GGML_BF16 = 30 };

static int tile_type_size(int ggml_type) {
    switch (ggml_type) {
    case GGML_Q4_0: return 18;
    case GGML_Q8_0: return 34;
    case GGML_F16:
    case GGML_BF16: return 64;
    default: return 0;
    }
}

/* Scratch bytes one thread needs for inputs of length k: a strip's W tiles and the
 * zero-padded last rows of x. The caller passes n_threads times this. */
int64_t tsr_amx_scratch_bytes(int64_t k) {
    return (k / 32) * 2 * TILE_BYTES + AMX_ROWS * k * 2;
}

#if TSR_AMX

/* Linux hands out the tile data state only on request (once per process). */
int tsr_amx_init(void) {
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* tiles 0-3: accumulators (x block i, W tile j) at 2 * i + j; 4-5: x; 6-7: W */
static void configure_tiles(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

/* One block (32 values) as 16 bf16 pairs in input order, from its float32 values. */
static inline __m512i pairs_of(__m512 lo, __m512 hi) {
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); /* values 0-15 low, 16-31 high */
}

static inline __m512i q4_0_pairs(const uint8_t *blk) {
    uint16_t h;
    memcpy(&h, blk, 2);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
    const __m128i packed = _mm_loadu_si128((const __m128i *)(blk + 2));
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m512i eight = _mm512_set1_epi32(8);
    /* low nibbles are values 0..15 of the block, high nibbles 16..31 */
    const __m512i n0 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(packed, low)), eight);
    const __m512i n1 = _mm512_sub_epi32(
        _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(packed, 4), low)), eight);
    return pairs_of(_mm512_mul_ps(_mm512_cvtepi32_ps(n0), d),
                    _mm512_mul_ps(_mm512_cvtepi32_ps(n1), d));
}

static inline __m512i bf16_pairs(const uint8_t *blk) { return _mm512_loadu_si512(blk); }

static inline __m512i f16_pairs(const uint8_t *blk) {
    return pairs_of(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk)),
                    _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32))));
}

static inline __m512i q8_0_pairs(const uint8_t *blk) {
    uint16_t h;
    memcpy(&h, blk, 2);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
    const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
    const __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)));
    return pairs_of(_mm512_mul_ps(_mm512_cvtepi32_ps(q0), d),
                    _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d));
}


/* The W tiles of a strip for every 32 inputs: tiles[2 * kb + h] holds the 16 weight rows
 * (output columns) starting at half[h], input block kb, as rows of input pairs. */
static void dequantize_strip(const uint8_t *const half[2], int64_t row_bytes, int64_t nb,
                             int ggml_type, int type_size, uint8_t *tiles) {
    __m512i r[16];
    for (int64_t kb = 0; kb < nb; kb++)
        for (int h = 0; h < 2; h++) {
            const uint8_t *blk = half[h] + kb * type_size;
            for (int j = 0; j < 16; j++, blk += row_bytes)
                r[j] = ggml_type == GGML_Q4_0   ? q4_0_pairs(blk)
                       : ggml_type == GGML_Q8_0 ? q8_0_pairs(blk)
                       : ggml_type == GGML_F16  ? f16_pairs(blk)
                                                : bf16_pairs(blk);
            transpose16_epi32(r);
            __m512i *tile = (__m512i *)(tiles + (2 * kb + h) * TILE_BYTES);
            for (int p = 0; p < 16; p++) _mm512_store_si512(tile + p, r[p]);
        }
}

/* e^x for x <= 0 (float32; e^x = 2^t, t = x log2 e, 2^frac(t) by a degree-6 polynomial,
 * about 1e-7 relative) -> 0 below -104. */
static inline __m512 exp_nonpos512(__m512 x) {
    const __m512 t = _mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                   _mm512_set1_ps(-150.0f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n); /* [-0.5, 0.5] */
    __m512 p = _mm512_set1_ps(1.535336188e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* silu(g) * u in float32: g * sigmoid(g), the sigmoid from e^-|g| (no overflow). */
static inline __m512 swiglu16(__m512 g, __m512 u) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 e = exp_nonpos512(_mm512_or_ps(g, _mm512_set1_ps(-0.0f)));
    const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sig = _mm512_div_ps(_mm512_mask_blend_ps(neg, one, e), _mm512_add_ps(one, e));
    return _mm512_mul_ps(_mm512_mul_ps(g, sig), u);
}

/* Rows i0..i0+n_rows-1 (n_rows <= 32) of x (at xr, stride x_stride bytes, 32 rows
 * readable) times a strip. Plain: y columns j0..j0+31 are the strip's two halves. SwiGLU
 * (the halves are 16 gate rows and the same 16 up rows): y columns j0..j0+15 are
 * silu(gate) * up. Rounded once to bf16, or stored as float32 when out_f32. */
static void rows_times_strip(const uint8_t *xr, int64_t x_stride, const uint8_t *tiles,
                             int64_t nb, void *y, int64_t n, int64_t i0, int64_t n_rows,
                             int64_t j0, int swiglu, int out_f32) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < nb; kb++) {
        _tile_loadd(4, xr + kb * 64, x_stride);
        _tile_loadd(5, xr + 16 * x_stride + kb * 64, x_stride);
        _tile_loadd(6, tiles + 2 * kb * TILE_BYTES, 64);
        _tile_loadd(7, tiles + (2 * kb + 1) * TILE_BYTES, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float acc[4][16][16] __attribute__((aligned(64)));
    _tile_stored(0, acc[0], 64);
    _tile_stored(1, acc[1], 64);
    _tile_stored(2, acc[2], 64);
    _tile_stored(3, acc[3], 64);
    for (int64_t i = 0; i < n_rows; i++) {
        const int b = (int)(i / 16) * 2, r = (int)(i % 16);
        const __m512 lo = _mm512_load_ps(acc[b][r]), hi = _mm512_load_ps(acc[b + 1][r]);
        const int64_t at = (i0 + i) * n + j0;
        if (out_f32) {
            float *yf = (float *)y + at;
            if (swiglu) {
                _mm512_storeu_ps(yf, swiglu16(lo, hi));
            } else {
                _mm512_storeu_ps(yf, lo);
                _mm512_storeu_ps(yf + 16, hi);
            }
        } else if (swiglu) {
            _mm256_storeu_si256((__m256i *)((uint16_t *)y + at),
                                (__m256i)_mm512_cvtneps_pbh(swiglu16(lo, hi)));
        } else {
            _mm512_storeu_si512((uint16_t *)y + at, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

/* y (m, n) = x @ W.T (w2 NULL; n a multiple of 32) or silu(x @ W.T) * (x @ W2.T) (n a
 * multiple of 16), x (m, k) bfloat16 and y bfloat16 (float32 when out_f32), contiguous;
 * W, W2 n rows of blocks of the GGML type ggml_type (Q4_0, Q8_0, BF16 or F16). scratch:
 * n_threads * tsr_amx_scratch_bytes(k) bytes, 64-byte aligned. Returns 0 (nothing written)
 * where it does not apply. */
static int matmul_tiles(int ggml_type, const uint8_t *w, const uint8_t *w2, int64_t n,
                        int64_t k, const uint16_t *x, int64_t m, void *y, int out_f32,
                        uint8_t *scratch, int n_threads) {
    const int64_t step = w2 ? AMX_STRIP / 2 : AMX_STRIP; /* output columns per strip */
    const int type_size = tile_type_size(ggml_type);
    if (n % step || k % 32 || m < 1 || !type_size) return 0;
    const int64_t nb = k / 32, row_bytes = nb * type_size, x_stride = k * 2;
    const int64_t per_thread = tsr_amx_scratch_bytes(k), full = m / AMX_ROWS * AMX_ROWS;
#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
    {
        uint8_t *tiles = scratch + per_thread * omp_get_thread_num();
        uint8_t *tail = tiles + nb * 2 * TILE_BYTES;
        if (full < m) { /* the last rows, zero-padded to a whole step */
            memset(tail, 0, AMX_ROWS * x_stride);
            memcpy(tail, (const uint8_t *)x + full * x_stride, (m - full) * x_stride);
        }
        configure_tiles();
        /* guided: long runs of strips first, then short ones, so a late thread does less */
#pragma omp for schedule(guided)
        for (int64_t j0 = 0; j0 < n; j0 += step) {
            const uint8_t *half[2] = {w + j0 * row_bytes,
                                      w2 ? w2 + j0 * row_bytes : w + (j0 + 16) * row_bytes};
            dequantize_strip(half, row_bytes, nb, ggml_type, type_size, tiles);
            for (int64_t i0 = 0; i0 < full; i0 += AMX_ROWS)
                rows_times_strip((const uint8_t *)x + i0 * x_stride, x_stride, tiles, nb, y, n,
                                 i0, AMX_ROWS, j0, w2 != NULL, out_f32);
            if (full < m)
                rows_times_strip(tail, x_stride, tiles, nb, y, n, full, m - full, j0, w2 != NULL,
                                 out_f32);
        }
        _tile_release();
    }
    return 1;
}

int tsr_matmul_amx(int ggml_type, const uint8_t *w, int64_t n, int64_t k, const uint16_t *x,
                   int64_t m, uint16_t *y, uint8_t *scratch, int n_threads) {
    return matmul_tiles(ggml_type, w, NULL, n, k, x, m, y, 0, scratch, n_threads);
}

/* An FFN's gate and up projections and silu(gate) * up in one pass (see matmul_tiles). */
int tsr_swiglu_amx(int ggml_type, const uint8_t *w_gate, const uint8_t *w_up, int64_t n,
                   int64_t k, const uint16_t *x, int64_t m, uint16_t *y, uint8_t *scratch,
                   int n_threads) {
    return matmul_tiles(ggml_type, w_gate, w_up, n, k, x, m, y, 0, scratch, n_threads);
}

/* The same two with y float32: the sums unrounded, for float32 activations. */
int tsr_matmul_amx_f32(int ggml_type, const uint8_t *w, int64_t n, int64_t k, const uint16_t *x,
                       int64_t m, float *y, uint8_t *scratch, int n_threads) {
    return matmul_tiles(ggml_type, w, NULL, n, k, x, m, y, 1, scratch, n_threads);
}

int tsr_swiglu_amx_f32(int ggml_type, const uint8_t *w_gate, const uint8_t *w_up, int64_t n,
                       int64_t k, const uint16_t *x, int64_t m, float *y, uint8_t *scratch,
                       int n_threads) {
    return matmul_tiles(ggml_type, w_gate, w_up, n, k, x, m, y, 1, scratch, n_threads);
}

int tsr_native_amx(void) { return 1; }

#else

int tsr_amx_init(void) { return 0; }

int tsr_matmul_amx(int ggml_type, const uint8_t *w, int64_t n, int64_t k, const uint16_t *x,
                   int64_t m, uint16_t *y, uint8_t *scratch, int n_threads) {
    return 0;
}

int tsr_swiglu_amx(int ggml_type, const uint8_t *w_gate, const uint8_t *w_up, int64_t n,
                   int64_t k, const uint16_t *x, int64_t m, uint16_t *y, uint8_t *scratch,
                   int n_threads) {
    return 0;
}

int tsr_matmul_amx_f32(int ggml_type, const uint8_t *w, int64_t n, int64_t k, const uint16_t *x,
                       int64_t m, float *y, uint8_t *scratch, int n_threads) {
    return 0;
}

int tsr_swiglu_amx_f32(int ggml_type, const uint8_t *w_gate, const uint8_t *w_up, int64_t n,
                       int64_t k, const uint16_t *x, int64_t m, float *y, uint8_t *scratch,
                       int n_threads) {
    return 0;
}

int tsr_native_amx(void) { return 0; }

#endif
