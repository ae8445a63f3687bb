/* Transposes of 32-bit lanes, 16x16 in AVX-512 registers (the AMX tile kernel and the
 * int8 VNNI GEMM) and 8x8 in AVX2 ones (the GEMM's 256-bit paths): both turn rows' 32-bit
 * groups into the column order their dot-product instructions read. */
#ifndef TSR_NATIVE_TRANSPOSE_H
#define TSR_NATIVE_TRANSPOSE_H

#if defined(__AVX512F__)
#include <immintrin.h>

/* r[i] (16 lanes of 32 bits each) -> r[i][j] moved to r[j][i]: 32-bit, then 64-bit
 * unpacks, then two rounds of 128-bit lane shuffles. */
static inline void transpose16_epi32(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 8] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 4], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 4], 0xdd);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 8], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 8], t[i + 12], 0xdd);
    }
}
#endif

#if defined(__AVX2__)
#include <immintrin.h>

/* r[i] (8 lanes of 32 bits) -> r[i][j] moved to r[j][i]: 32-bit, then 64-bit unpacks
 * within 128-bit lanes, then the lanes' halves swapped. */
static inline void transpose8_epi32(__m256i r[8]) {
    __m256i t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2x128_si256(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2x128_si256(r[i], r[i + 4], 0x31);
    }
    for (int i = 0; i < 8; i++) r[i] = t[i];
}
#endif

#endif
