/* Batched matrix transpose, dst[b][j][i] = src[b][i][j], for src (batch, rows, cols) and dst (batch, cols, rows),
 * both contiguous; elements of 4 bytes (fp32) or 2 bytes (bf16, fp16), copied as bits (NaN payloads and signed zeros
 * kept). The returned maps' layout (mmplugin/models/layers/layout.py) uses it both ways: a channels_last map's
 * (H*W, C) rows into NCHW (C, H*W) planes, and an NCHW gradient back into rows.
 *
 * Why: ATen copies a transposed matrix in cache blocks on one thread. Swin-T's stage-1 map at 800x1216 (96 x 200 x
 * 304), 2 threads of an Intel Xeon family 6 model 167, fp32: ATen's blocked copy 6.3-7.4 ms, this kernel 2.7-2.9 ms
 * (bf16: 3.7-4.1 against 1.7 ms); the four Swin-T stages together 11.3 against 4.8 ms in fp32.
 *
 * Tiles of TILE x TILE elements (4 KiB of fp32: a tile's source and destination lines stay in L1), in
 * source-row-major order so that consecutive tiles read on along the same source rows. Within a tile, 4-byte elements
 * are copied destination row by destination row (contiguous writes) and 2-byte elements source row by source row
 * (contiguous reads): each measured the faster for its size, both directions of Swin-T's maps. The tiles are split over `threads` OpenMP threads (each writes its own tiles).
 * Returns 0. */
#include <stdint.h>

#define TILE 32

#define TRANSPOSE(SUFFIX, T, WRITE_ROWS)                                                                            \
    int mmplugin_transpose_##SUFFIX(const T *src, T *dst, int64_t batch, int64_t rows, int64_t cols, int threads) { \
        const int64_t tr = (rows + TILE - 1) / TILE, tc = (cols + TILE - 1) / TILE, tiles = batch * tr * tc;        \
        _Pragma("omp parallel for schedule(static) num_threads(threads)") for (int64_t t = 0; t < tiles; t++) {     \
            const int64_t b = t / (tr * tc), i0 = t / tc % tr * TILE, j0 = t % tc * TILE;                           \
            const int64_t i1 = i0 + TILE < rows ? i0 + TILE : rows, j1 = j0 + TILE < cols ? j0 + TILE : cols;       \
            const T *s = src + b * rows * cols;                                                                     \
            T *d = dst + b * rows * cols;                                                                           \
            if (WRITE_ROWS)                                                                                         \
                for (int64_t j = j0; j < j1; j++)                                                                   \
                    for (int64_t i = i0; i < i1; i++) d[j * rows + i] = s[i * cols + j];                            \
            else                                                                                                    \
                for (int64_t i = i0; i < i1; i++)                                                                   \
                    for (int64_t j = j0; j < j1; j++) d[j * rows + i] = s[i * cols + j];                            \
        }                                                                                                           \
        return 0;                                                                                                   \
    }

TRANSPOSE(b32, uint32_t, 1)
TRANSPOSE(b16, uint16_t, 0)
