/* The grid types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: one super-block of
 * 256 values decoded to 32 runs of 8 signed bytes and 16 float32 scales (one per 16
 * values), in plain C, for the vector kernels (native_qdot_iq.c) and the portable GEMV
 * alike. The grids and ksigns come from the header generated from gguf.quants at build
 * time (iq_tables.py).
 *
 * Run r holds values 8 r .. 8 r + 7: grid[r] its grid point's bytes, mod[r] for IQ2/IQ3 the
 * sign mask (byte 0xFF: negate), value = (grid ^ mod) - mod; for IQ1 the delta's bytes
 * (0x01 or 0xFF), value = grid + mod, with the grid stored times 8, so the real value is
 * (8 grid +- 1) / 8 and the scale's 1/8 comes after (iq_exact_value). A value times its
 * scale is then what gguf's dequantization gives: d_g * (grid * sign) with d_g computed in
 * its float32 steps (IQ1: dl * (grid + delta)).
 */
#ifndef TSR_NATIVE_IQ_H
#define TSR_NATIVE_IQ_H

#include <stdint.h>
#include <string.h>

#include "native_iq_tables.h"

typedef struct {
    uint64_t grid[32];
    uint64_t mod[32];
    float scale[16];
} iq_superblock;

/* GGML type numbers */
#define IQ2_XXS 16
#define IQ2_XS 17
#define IQ3_XXS 18
#define IQ1_S 19
#define IQ3_S 21
#define IQ2_S 22
#define IQ1_M 29

static inline float iq_half(uint16_t h) {
    /* float16 bits to float32 without F16C (the portable file has no intrinsics) */
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    uint32_t u;
    if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    u = sign | (e == 31 ? 0x7F800000u | m << 13 : (e + 112) << 23 | m << 13);
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static inline uint16_t iq_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t iq_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* IQ3's runs of 8: two grid points of 4. */
static inline uint64_t iq3_pair(const uint32_t *grid, int a, int b) {
    return (uint64_t)grid[a] | (uint64_t)grid[b] << 32;
}

/* IQ2_XXS (66): d; per group of 32 four grid bytes then a uint32 of four 7-bit ksigns
 * indices and the 4-bit scale s on top: d (0.5 + s) / 4. */
static inline void iq_decode_iq2_xxs(const uint8_t *blk, iq_superblock *s) {
    const float d = iq_half(iq_u16(blk));
    for (int g = 0; g < 8; g++) {
        const uint8_t *q = blk + 2 + 8 * g;
        const uint32_t aux = iq_u32(q + 4);
        for (int k = 0; k < 4; k++) {
            s->grid[4 * g + k] = TSR_IQ2XXS_GRID[q[k]];
            s->mod[4 * g + k] = TSR_SIGN_MASK[TSR_KSIGNS[aux >> 7 * k & 127]];
        }
        s->scale[2 * g] = s->scale[2 * g + 1] = d * (0.5f + (float)(aux >> 28)) * 0.25f;
    }
}

/* IQ2_XS / IQ2_S: 4-bit scales per 16 in 8 bytes at sc (low nibble first), d (0.5 + s) / 4. */
static inline void iq_nibble_scales(float d, const uint8_t *sc, iq_superblock *s) {
    for (int j = 0; j < 16; j++) s->scale[j] = d * (0.5f + (float)(sc[j / 2] >> 4 * (j % 2) & 15)) * 0.25f;
}

/* IQ2_XS (74): d; 32 uint16 of a 9-bit grid index and a 7-bit ksigns index; scales. */
static inline void iq_decode_iq2_xs(const uint8_t *blk, iq_superblock *s) {
    for (int r = 0; r < 32; r++) {
        const uint16_t q = iq_u16(blk + 2 + 2 * r);
        s->grid[r] = TSR_IQ2XS_GRID[q & 511];
        s->mod[r] = TSR_SIGN_MASK[TSR_KSIGNS[q >> 9]];
    }
    iq_nibble_scales(iq_half(iq_u16(blk)), blk + 66, s);
}

/* IQ2_S (82): d; 32 low index bytes, 32 sign bytes, 8 bytes of 2 high index bits per run,
 * scales. */
static inline void iq_decode_iq2_s(const uint8_t *blk, iq_superblock *s) {
    for (int r = 0; r < 32; r++) {
        const int high = blk[66 + r / 4] >> 2 * (r % 4) & 3;
        s->grid[r] = TSR_IQ2S_GRID[blk[2 + r] | high << 8];
        s->mod[r] = TSR_SIGN_MASK[blk[34 + r]];
    }
    iq_nibble_scales(iq_half(iq_u16(blk)), blk + 74, s);
}

/* IQ3_XXS (98): d; 64 grid index bytes (points of 4); per group a uint32 as IQ2_XXS's,
 * scale d (0.5 + s) / 2. */
static inline void iq_decode_iq3_xxs(const uint8_t *blk, iq_superblock *s) {
    const float d = iq_half(iq_u16(blk));
    for (int g = 0; g < 8; g++) {
        const uint8_t *q = blk + 2 + 8 * g;
        const uint32_t aux = iq_u32(blk + 66 + 4 * g);
        for (int k = 0; k < 4; k++) {
            s->grid[4 * g + k] = iq3_pair(TSR_IQ3XXS_GRID, q[2 * k], q[2 * k + 1]);
            s->mod[4 * g + k] = TSR_SIGN_MASK[TSR_KSIGNS[aux >> 7 * k & 127]];
        }
        s->scale[2 * g] = s->scale[2 * g + 1] = d * (0.5f + (float)(aux >> 28)) * 0.5f;
    }
}

/* IQ3_S (110): d; 64 low index bytes, 8 bytes of their 9th bits, 32 sign bytes, 4 bytes of
 * 4-bit scales: d (1 + 2 s). */
static inline void iq_decode_iq3_s(const uint8_t *blk, iq_superblock *s) {
    const float d = iq_half(iq_u16(blk));
    for (int r = 0; r < 32; r++) {
        const int i = 2 * r, hi0 = blk[66 + i / 8] >> i % 8 & 1, hi1 = blk[66 + i / 8] >> (i % 8 + 1) & 1;
        s->grid[r] = iq3_pair(TSR_IQ3S_GRID, blk[2 + i] | hi0 << 8, blk[3 + i] | hi1 << 8);
        s->mod[r] = TSR_SIGN_MASK[blk[74 + r]];
    }
    for (int g = 0; g < 8; g++) {
        const int sc = blk[106 + g / 2] >> 4 * (g % 2) & 15;
        s->scale[2 * g] = s->scale[2 * g + 1] = d * (float)(1 + 2 * sc);
    }
}

#define IQ1_PLUS 0x0101010101010101ull /* delta +1/8 on each byte (times 8) */
#define IQ1_MINUS 0xFFFFFFFFFFFFFFFFull

/* IQ1_S (50): d; 32 low index bytes; per group a uint16 of 3 high index bits per run, the
 * 3-bit scale s (bits 12-14) and delta's sign (bit 15): dl = d (2 s + 1). */
static inline void iq_decode_iq1_s(const uint8_t *blk, iq_superblock *s) {
    const float d = iq_half(iq_u16(blk));
    for (int g = 0; g < 8; g++) {
        const uint16_t qh = iq_u16(blk + 34 + 2 * g);
        for (int k = 0; k < 4; k++) {
            s->grid[4 * g + k] = TSR_IQ1_GRID8[blk[2 + 4 * g + k] | (qh >> 3 * k & 7) << 8];
            s->mod[4 * g + k] = qh & 0x8000 ? IQ1_MINUS : IQ1_PLUS;
        }
        s->scale[2 * g] = s->scale[2 * g + 1] = d * (float)(2 * (qh >> 12 & 7) + 1);
    }
}

/* IQ1_M (56): 32 low index bytes; 16 bytes of a nibble per run (3 high index bits, delta's
 * sign on top); four uint16 of four 3-bit scales each (one per 16 values) whose top nibbles
 * make the float16 d: dl = d (2 s + 1). */
static inline void iq_decode_iq1_m(const uint8_t *blk, iq_superblock *s) {
    uint16_t sc[4];
    memcpy(sc, blk + 48, 8);
    const uint16_t dh = (uint16_t)(sc[0] >> 12 | (sc[1] & 0xF000) >> 8 | (sc[2] & 0xF000) >> 4 | (sc[3] & 0xF000));
    const float d = iq_half(dh);
    for (int r = 0; r < 32; r++) {
        const int nib = blk[32 + r / 2] >> 4 * (r % 2) & 15;
        s->grid[r] = TSR_IQ1_GRID8[blk[r] | (nib & 7) << 8];
        s->mod[r] = nib & 8 ? IQ1_MINUS : IQ1_PLUS;
    }
    for (int j = 0; j < 16; j++) s->scale[j] = d * (float)(2 * (sc[j / 4] >> 3 * (j % 4) & 7) + 1);
}

/* Decode a super-block of GGML type `type` (one of the seven; a constant where inlined). */
static inline void iq_decode(int type, const uint8_t *blk, iq_superblock *s) {
    switch (type) {
    case IQ2_XXS: iq_decode_iq2_xxs(blk, s); break;
    case IQ2_XS: iq_decode_iq2_xs(blk, s); break;
    case IQ2_S: iq_decode_iq2_s(blk, s); break;
    case IQ3_XXS: iq_decode_iq3_xxs(blk, s); break;
    case IQ3_S: iq_decode_iq3_s(blk, s); break;
    case IQ1_S: iq_decode_iq1_s(blk, s); break;
    default: iq_decode_iq1_m(blk, s); break;
    }
}

static inline int iq_is_iq1(int type) { return type == IQ1_S || type == IQ1_M; }

/* Block bytes of the type (0: not a grid type). */
static inline int iq_type_size(int type) {
    switch (type) {
    case IQ2_XXS: return 66;
    case IQ2_XS: return 74;
    case IQ2_S: return 82;
    case IQ3_XXS: return 98;
    case IQ3_S: return 110;
    case IQ1_S: return 50;
    case IQ1_M: return 56;
    default: return 0;
    }
}

/* Byte j of run r's integer value (IQ1: 8 grid +- 1). */
static inline int8_t iq_value(int type, const iq_superblock *s, int r, int j) {
    const int8_t g = (int8_t)(s->grid[r] >> 8 * j), m = (int8_t)(s->mod[r] >> 8 * j);
    return iq_is_iq1(type) ? (int8_t)(g + m) : (int8_t)((g ^ m) - m);
}

#endif
