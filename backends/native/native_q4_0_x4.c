/* Q4_0 weights in the 4-row layout, made once at load from the file's block bytes, and the
 * file's rows back from it (prefill's dequantization, get_rows).
 *
 * The file keeps each row's blocks together (18 bytes: float16 scale, 16 code bytes), so
 * the decode GEMV, which takes four rows per pass, reads four streams side by side. The
 * 4-row layout puts what one pass reads in address order, in the same bytes:
 *
 *   codes:  group g = rows 4g..4g+3, block b: 64 bytes at (g * nb + b) * 64, the four
 *           rows' 16 code bytes one after another (one 512-bit load);
 *   scales: after all codes (n_out * nb * 16 bytes), 8 bytes at (g * nb + b) * 8, the four
 *           rows' float16 scales.
 *
 * n_out must be a multiple of 4; the size is the file's (n_out * nb * 18 bytes).
 */
#include <stdint.h>
#include <string.h>

/* out (the 4-row layout) of w (n_out rows of n_in / 32 Q4_0 blocks). */
void tsr_repack_q4_0_x4(const uint8_t *w, int64_t n_out, int64_t n_in, uint8_t *out,
                        int n_threads) {
    const int64_t nb = n_in / 32;
    uint8_t *codes = out, *scales = out + n_out * nb * 16;
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n_threads > 1)
    for (int64_t g = 0; g < n_out / 4; g++)
        for (int64_t b = 0; b < nb; b++)
            for (int r = 0; r < 4; r++) {
                const uint8_t *blk = w + ((g * 4 + r) * nb + b) * 18;
                memcpy(codes + (g * nb + b) * 64 + r * 16, blk + 2, 16);
                memcpy(scales + (g * nb + b) * 8 + r * 2, blk, 2);
            }
}

/* out (n_ids rows of file bytes) = rows ids[0..n_ids) of p (the 4-row layout of an n_out
 * x n_in weight); ids NULL: every row, n_ids = n_out. Ids are not checked here. */
void tsr_unpack_q4_0_x4(const uint8_t *p, int64_t n_out, int64_t n_in, const int64_t *ids,
                        int64_t n_ids, uint8_t *out, int n_threads) {
    const int64_t nb = n_in / 32;
    const uint8_t *codes = p, *scales = p + n_out * nb * 16;
#pragma omp parallel for schedule(static) num_threads(n_threads) if (n_threads > 1 && n_ids > 64)
    for (int64_t i = 0; i < n_ids; i++) {
        const int64_t row = ids ? ids[i] : i, g = row / 4, r = row % 4;
        uint8_t *blk = out + i * nb * 18;
        for (int64_t b = 0; b < nb; b++, blk += 18) {
            memcpy(blk, scales + (g * nb + b) * 8 + r * 2, 2);
            memcpy(blk + 2, codes + (g * nb + b) * 64 + r * 16, 16);
        }
    }
}
