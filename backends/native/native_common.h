/* What the native kernels' C files share: the integer dot product of the CPU's widest path,
 * reading and writing the caller's dtype, activation blocks rounded to int8, prefetching.
 *
 * The code paths, chosen when the library is compiled (-march=native; tests force the
 * narrower ones with -mno-avx512f and -mno-avxvnni):
 *   TSR_ZMM        AVX512-VNNI with BW/VL: 512-bit kernels where a file has them
 *   TSR_HAVE_VNNI  vpdpbusd on 256 bits (AVX512-VNNI+VL, or AVX-VNNI)
 *   otherwise      AVX2: vpmaddubsw + vpmaddwd, whose int16 pair sums saturate at 32767;
 *                  callers keep |u * s| pairs below that (codes of at most 6 bits, or the
 *                  sign trick for signed weights, see dot_s8s8).
 */
#ifndef TSR_NATIVE_COMMON_H
#define TSR_NATIVE_COMMON_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define QK 32 /* values per activation block */

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define TSR_HAVE_VNNI 1
#elif defined(__AVXVNNI__)
#define TSR_HAVE_VNNI 1
#else
#define TSR_HAVE_VNNI 0
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define TSR_ZMM 1
#else
#define TSR_ZMM 0
#endif

/* Everything here needs AVX2, FMA and F16C (the library's probe checks the CPU for them). */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TSR_AVX2 1
#else
#define TSR_AVX2 0
#endif

#ifndef GEMV_CHUNK_BYTES
/* OpenMP hands out the GEMV rows in guided chunks: each thread first takes a long
 * contiguous run (its hardware and software prefetching stays in its own rows), then ever
 * smaller ones down to about this many weight bytes, so a thread that starts late (woken
 * from sleep, or sharing its core with another process) does less of the work instead of
 * making the other wait at the end. Fixed chunks of 16 groups of 4 rows decoded Q4_0
 * 0.80x and Q8_0 0.88x as fast at two threads (much of each prefetch landed in the other
 * thread's rows). */
#define GEMV_CHUNK_BYTES 131072
#endif
#ifndef PREFETCH
/* Bytes ahead in each weight row: far enough to cross 4 KiB pages, where the hardware
 * prefetchers stop (the file's pages are not huge pages); 16 KiB measured best, 512 B
 * gave 70% of its throughput on the 0.5B model's matrices. */
#define PREFETCH 16384
#endif

/* acc + the sums of four adjacent products u[j] * s[j] (u unsigned, s signed bytes) in each
 * int32 lane. Without VNNI the pairs are summed in int16 first (saturating). */
static inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    const __m256i pairs = _mm256_maddubs_epi16(u, s);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

/* The same for signed weights w (-127..127) and activations a: |w| * (a * sign(w)). Every
 * product stays within 127 * 127, so the AVX2 pair sums cannot saturate. */
static inline __m256i dot_s8s8(__m256i acc, __m256i w, __m256i a) {
    return dot_u8s8(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_i32(__m256i v) {
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

/* Eight float32 values to y[i..i+8) in dtype, rounded as torch rounds (to nearest even). */
static inline void store8(void *y, int64_t i, __m256 v, int dtype) {
    if (dtype == DT_BF16) {
        __m256i u = _mm256_castps_si256(v);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
        u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
        u = _mm256_blendv_epi8(u, quiet, nan); /* NaN stays NaN (the rounding could carry) */
        const __m128i lo = _mm256_castsi256_si128(u), hi = _mm256_extracti128_si256(u, 1);
        _mm_storeu_si128((__m128i *)((uint16_t *)y + i), _mm_packus_epi32(lo, hi));
    } else if (dtype == DT_F16) {
        _mm_storeu_si128((__m128i *)((uint16_t *)y + i),
                         _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
        _mm256_storeu_ps((float *)y + i, v);
    }
}

static inline float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* prefetcht0 as asm: gcc 12 silently dropped _mm_prefetch once these kernels were inlined
 * into the OpenMP region (40% slower decode; check with objdump -d | grep prefetch). */
static inline void prefetch1(const uint8_t *p) {
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
}

/* One block of 32 values x[i..i+32) to 32 int8 codes q: d = max|x| / 127, q = x / d rounded
 * to nearest even (as ggml's q8_0 activations, up to the rounding mode). Returns the sum of
 * the codes; half[0], half[1] get the sums of codes 0..15 and 16..31. */
static inline int quantize32(const void *x, int64_t i, int dtype, int8_t *q, float *d,
                             int half[2]) {
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
    half[0] = hsum_i32(_mm256_add_epi32(i0, i1));
    half[1] = hsum_i32(_mm256_add_epi32(i2, i3));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    /* packs works within 128-bit lanes: put the 4-byte groups back in order */
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    return half[0] + half[1];
}

/* e^x for x <= 0 (softmax of scores minus their max), float32: the exponent split off as
 * 2^round(x log2 e), e^r of the rest by a degree-7 polynomial (Cephes' expf coefficients),
 * relative error ~1e-7; below -87 the result is 0 (float32 would be denormal there). */
static inline __m256 exp_nonpos(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx),
                                                         _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

#endif
