/* Batched matrix transpose, dst[b][j][i] = src[b][i][j], for src (batch, rows, cols) and dst (batch, cols, rows),
 * both contiguous; elements of 4 bytes (fp32) or 2 bytes (bf16, fp16), copied as bits (NaN payloads and signed zeros
 * kept). The returned maps' layout (mmplugin/models/layers/layout.py) uses it both ways: a channels_last map's
 * (H*W, C) rows into NCHW (C, H*W) planes, and an NCHW gradient back into rows.
 *
 * Why: ATen copies a transposed matrix in cache blocks on one thread. Swin-T's stage-1 map at 800x1216 (96 x 200 x
 * 304), 2 threads of an Intel Xeon family 6 model 167, fp32: ATen's blocked copy 6.3-7.4 ms, this kernel's
 * element-by-element tiles 2.7-2.9 ms (bf16: 3.7-4.1 against 1.7 ms); the four Swin-T stages together 11.3 against
 * 4.8 ms in fp32.
 *
 * Tiles of TILE x TILE elements (4 KiB of fp32: a tile's source and destination lines stay in L1), in source-row-major
 * order so that consecutive tiles read on along the same source rows. In AVX-512 builds, square blocks within a tile
 * (4 x 4 fp32, 32 x 32 bf16: a 128-bit and a 512-bit vector per row) are transposed in registers: each row loaded as
 * one vector, log2(lanes) rounds of two-vector shuffles, each row stored as one vector. The elements beyond the last
 * whole block of a tile (all of them in the other builds) are copied one by one: 4-byte elements destination row by
 * destination row (contiguous writes), 2-byte elements source row by source row (contiguous reads), each measured the
 * faster for its size, both directions of Swin-T's maps. The register blocks replaced one-by-one copies inside the
 * tiles: the four Swin-T stage outputs at 800x1216 ((H*W, C) 60800 x 96 down to 950 x 768), 2 threads of an AMD EPYC
 * family 25 model 17, against the element copies (four runs, interleaved): fp32 5.4-6.4 against 6.7-8.4 ms, bf16
 * 1.7-2.1 against 5.9-9.2 ms (ATen 11.4-13.3 / 7.3-8.5 ms; a plain copy of the same bytes 1.1-1.3 / 0.3-0.4 ms).
 * The tiles are split over `threads` OpenMP threads (each writes its own tiles). Returns 0. */
#include <stdint.h>
#include <string.h>

#include "vector_math.h"

#define TILE 32

#if VW >= 16 /* AVX-512 builds: a two-vector shuffle of 16-bit lanes is one instruction (vpermt2w) */
#define B32 4        /* fp32 blocks of 4 x 4 (on the Zen 4 above: 5.95 ms, 8 x 8 8.03 ms, 16 x 16 7.96 ms, elements 8.16) */
#define B16 (2 * VW) /* bf16 blocks of 32 x 32 */
SQUARE_TRANSPOSE(square_b32, uint32_t, B32)
SQUARE_TRANSPOSE(square_b16, uint16_t, B16)
#else /* AVX2 and generic builds: register blocks measured slower than the element copies (AVX2 on the same Zen 4: fp32
       * 8.8-9.5 against 8.4 ms, bf16 7.3 against 5.2 ms), so no blocks */
#define B32 1
#define B16 1
#endif

/* the [ia, ib) x [ja, jb) elements of a tile one by one, destination rows outer (WRITE_ROWS) or source rows outer */
#define COPY(WRITE_ROWS, ia, ib, ja, jb)                                                                            \
    if (WRITE_ROWS)                                                                                                 \
        for (int64_t j = (ja); j < (jb); j++)                                                                       \
            for (int64_t i = (ia); i < (ib); i++) d[j * rows + i] = s[i * cols + j];                                \
    else                                                                                                            \
        for (int64_t i = (ia); i < (ib); i++)                                                                       \
            for (int64_t j = (ja); j < (jb); j++) d[j * rows + i] = s[i * cols + j];

#define TRANSPOSE(SUFFIX, T, N, WRITE_ROWS)                                                                         \
    int mmplugin_transpose_##SUFFIX(const T *src, T *dst, int64_t batch, int64_t rows, int64_t cols, int threads) { \
        const int64_t tr = (rows + TILE - 1) / TILE, tc = (cols + TILE - 1) / TILE, tiles = batch * tr * tc;        \
        _Pragma("omp parallel for schedule(static) num_threads(threads)") for (int64_t t = 0; t < tiles; t++) {     \
            const int64_t b = t / (tr * tc), i0 = t / tc % tr * TILE, j0 = t % tc * TILE;                           \
            const int64_t i1 = i0 + TILE < rows ? i0 + TILE : rows, j1 = j0 + TILE < cols ? j0 + TILE : cols;       \
            const int64_t iv = WHOLE(i0, i1, N), jv = WHOLE(j0, j1, N); /* where the whole blocks end */          \
            const T *s = src + b * rows * cols;                                                                     \
            T *d = dst + b * rows * cols;                                                                           \
            BLOCKS_##SUFFIX                                                                                         \
            COPY(WRITE_ROWS, i0, iv, jv, j1) /* the rest of the tile: the last columns of the blocks' rows */        \
            COPY(WRITE_ROWS, iv, i1, j0, j1) /* and its last rows */                                                \
        }                                                                                                           \
        return 0;                                                                                                   \
    }

#if VW >= 16 /* the whole N x N blocks of a tile, in registers */
#define WHOLE(lo, hi, N) ((lo) + ((hi) - (lo)) / (N) * (N))
#define BLOCKS(SUFFIX, N)                                                                                           \
    for (int64_t i = i0; i < iv; i += (N))                                                                          \
        for (int64_t j = j0; j < jv; j += (N)) square_##SUFFIX(s + i * cols + j, cols, d + j * rows + i, rows);
#else
#define WHOLE(lo, hi, N) (lo)
#define BLOCKS(SUFFIX, N)
#endif
#define BLOCKS_b32 BLOCKS(b32, B32)
#define BLOCKS_b16 BLOCKS(b16, B16)

TRANSPOSE(b32, uint32_t, B32, 1)
TRANSPOSE(b16, uint16_t, B16, 0)
