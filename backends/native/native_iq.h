/* The grid types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M in plain C, for the
 * vector kernels (native_qdot_iq.c) and the portable GEMV alike: a super-block of 256 values
 * read one group of 32 at a time (iq_group: four runs of 8 grid bytes and their signs) and
 * its 16 float32 scales (iq_scales: one per 16 values). The grids and ksigns come from the
 * header generated from gguf.quants at build time (iq_tables.py).
 *
 * Run k of group g holds values 32 g + 8 k .. + 7: grid[k] its grid point's bytes; bit
 * 8 k + j of bits negates its value j (IQ2, IQ3). IQ1's grids are stored times 8 and byte k
 * of bits is 0xFF where run k's delta is -1/8 (else +1/8), so its value is the integer
 * 8 grid +- 1 and the scale's 1/8 comes after. A value times its scale is then what gguf's
 * dequantization gives: d_g * (grid * sign) with d_g in its float32 steps (IQ1:
 * dl * (grid + delta)).
 */
#ifndef TSR_NATIVE_IQ_H
#define TSR_NATIVE_IQ_H

#include <stdint.h>
#include <string.h>

#include "native_iq_tables.h"

/* GGML type numbers */
#define IQ2_XXS 16
#define IQ2_XS 17
#define IQ3_XXS 18
#define IQ1_S 19
#define IQ3_S 21
#define IQ2_S 22
#define IQ1_M 29

/* float16 bits to float32 without F16C (the portable file has no intrinsics). */
static inline float iq_half(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        const float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    const uint32_t u = sign | (e == 31 ? 0x7F800000u | m << 13 : (e + 112) << 23 | m << 13);
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

/* Four 7-bit ksigns indices (bits 0, 7, 14, 21 of aux) as the sign bits of four runs. */
static inline uint32_t iq_ksigns4(uint32_t aux) {
    return (uint32_t)TSR_KSIGNS[aux & 127] | (uint32_t)TSR_KSIGNS[aux >> 7 & 127] << 8 |
           (uint32_t)TSR_KSIGNS[aux >> 14 & 127] << 16 | (uint32_t)TSR_KSIGNS[aux >> 21 & 127] << 24;
}

/* Group g of a super-block. Layouts (bytes):
 *   IQ2_XXS (66): d; per group 4 grid bytes, then a uint32 of four 7-bit ksigns indices and
 *                 the 4-bit scale on top
 *   IQ2_XS (74):  d; 32 uint16 of a 9-bit grid index and a 7-bit ksigns index; 8 scale bytes
 *   IQ2_S (82):   d; 32 low index bytes, 32 sign bytes, 8 bytes of 2 high bits per run, scales
 *   IQ3_XXS (98): d; 64 grid index bytes (points of 4); per group a uint32 as IQ2_XXS's
 *   IQ3_S (110):  d; 64 low index bytes, 8 bytes of their 9th bits, 32 sign bytes, 4 scale bytes
 *   IQ1_S (50):   d; 32 low index bytes; per group a uint16: 3 high bits per run, the 3-bit
 *                 scale (bits 12-14), delta's sign (bit 15)
 *   IQ1_M (56):   32 low index bytes; 16 bytes of a nibble per run (3 high bits, delta's sign
 *                 on top); 8 scale bytes (iq_scales) */
static inline void iq_group(int type, const uint8_t *blk, int g, uint64_t *grid, uint32_t *bits) {
    switch (type) {
    case IQ2_XXS: {
        const uint8_t *q = blk + 2 + 8 * g;
        for (int k = 0; k < 4; k++) grid[k] = TSR_IQ2XXS_GRID[q[k]];
        *bits = iq_ksigns4(iq_u32(q + 4));
        break;
    }
    case IQ2_XS: {
        uint32_t b = 0;
        for (int k = 0; k < 4; k++) {
            const uint16_t q = iq_u16(blk + 2 + 8 * g + 2 * k);
            grid[k] = TSR_IQ2XS_GRID[q & 511];
            b |= (uint32_t)TSR_KSIGNS[q >> 9] << 8 * k;
        }
        *bits = b;
        break;
    }
    case IQ2_S: {
        const int high = blk[66 + g];
        for (int k = 0; k < 4; k++) grid[k] = TSR_IQ2S_GRID[blk[2 + 4 * g + k] | (high >> 2 * k & 3) << 8];
        *bits = iq_u32(blk + 34 + 4 * g);
        break;
    }
    case IQ3_XXS: {
        const uint8_t *q = blk + 2 + 8 * g;
        for (int k = 0; k < 4; k++) grid[k] = iq3_pair(TSR_IQ3XXS_GRID, q[2 * k], q[2 * k + 1]);
        *bits = iq_ksigns4(iq_u32(blk + 66 + 4 * g));
        break;
    }
    case IQ3_S: {
        const uint8_t *q = blk + 2 + 8 * g;
        const int high = blk[66 + g];
        for (int k = 0; k < 4; k++)
            grid[k] = iq3_pair(TSR_IQ3S_GRID, q[2 * k] | (high >> 2 * k & 1) << 8,
                               q[2 * k + 1] | (high >> (2 * k + 1) & 1) << 8);
        *bits = iq_u32(blk + 74 + 4 * g);
        break;
    }
    case IQ1_S: {
        const uint16_t qh = iq_u16(blk + 34 + 2 * g);
        for (int k = 0; k < 4; k++) grid[k] = TSR_IQ1_GRID8[blk[2 + 4 * g + k] | (qh >> 3 * k & 7) << 8];
        *bits = qh & 0x8000 ? 0xFFFFFFFFu : 0u;
        break;
    }
    default: { /* IQ1_M */
        const uint16_t qh = iq_u16(blk + 32 + 2 * g); /* runs 4g .. 4g + 3, a nibble each */
        uint32_t b = 0;
        for (int k = 0; k < 4; k++) {
            const int nib = qh >> 4 * k & 15;
            grid[k] = TSR_IQ1_GRID8[blk[4 * g + k] | (nib & 7) << 8];
            b |= nib & 8 ? 0xFFu << 8 * k : 0u;
        }
        *bits = b;
        break;
    }
    }
}

/* IQ2_XS / IQ2_S: a 4-bit scale per 16 values in 8 bytes at sc (low nibble first),
 * d (0.5 + s) / 4. */
static inline void iq_nibble_scales(float d, const uint8_t *sc, float *scale) {
    for (int j = 0; j < 16; j++) scale[j] = d * (0.5f + (float)(sc[j / 2] >> 4 * (j % 2) & 15)) * 0.25f;
}

/* The 16 scales of a super-block (one per 16 values; the types with one per 32 give it
 * twice): IQ2_XXS d (0.5 + s) / 4, IQ3_XXS d (0.5 + s) / 2, IQ3_S d (1 + 2 s), IQ1
 * d (2 s + 1); IQ1_M's float16 d is the top nibbles of its four scale words, which hold
 * four 3-bit scales each. */
static inline void iq_scales(int type, const uint8_t *blk, float *scale) {
    if (type == IQ2_XS || type == IQ2_S) {
        iq_nibble_scales(iq_half(iq_u16(blk)), blk + (type == IQ2_XS ? 66 : 74), scale);
        return;
    }
    if (type == IQ1_M) {
        uint16_t sc[4];
        memcpy(sc, blk + 48, 8);
        const uint16_t dh = (uint16_t)(sc[0] >> 12 | (sc[1] & 0xF000) >> 8 | (sc[2] & 0xF000) >> 4 |
                                       (sc[3] & 0xF000));
        const float d = iq_half(dh);
        for (int j = 0; j < 16; j++) scale[j] = d * (float)(2 * (sc[j / 4] >> 3 * (j % 4) & 7) + 1);
        return;
    }
    const float d = iq_half(iq_u16(blk));
    for (int g = 0; g < 8; g++) {
        float s;
        if (type == IQ2_XXS) {
            s = d * (0.5f + (float)(iq_u32(blk + 6 + 8 * g) >> 28)) * 0.25f;
        } else if (type == IQ3_XXS) {
            s = d * (0.5f + (float)(iq_u32(blk + 66 + 4 * g) >> 28)) * 0.5f;
        } else if (type == IQ3_S) {
            s = d * (float)(1 + 2 * (blk[106 + g / 2] >> 4 * (g % 2) & 15));
        } else { /* IQ1_S */
            s = d * (float)(2 * (iq_u16(blk + 34 + 2 * g) >> 12 & 7) + 1);
        }
        scale[2 * g] = scale[2 * g + 1] = s;
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

/* Value j of run k of a group as an integer (IQ1: 8 grid +- 1). */
static inline int8_t iq_value(int type, const uint64_t *grid, uint32_t bits, int k, int j) {
    const int g = (int8_t)(grid[k] >> 8 * j);
    if (iq_is_iq1(type)) return (int8_t)(g + (bits >> 8 * k & 1 ? -1 : 1));
    return (int8_t)(bits >> (8 * k + j) & 1 ? -g : g);
}

#endif
