/* LayerNorm over the last dimension of a bf16 map with fp32 affine parameters (PyTorch's mixed-type LayerNorm, what
 * a bf16 map meets under CPU autocast), forward and backward, computed in fp32 and rounded once to bf16; and, for
 * inference, res + LayerNorm(x) of bf16 or fp32 maps in one pass (mmplugin_layer_norm_add_*, below):
 *   forward:  mean = sum(x) / C,  rstd = 1 / sqrt(sum((x - mean)^2) / C + eps),  y = (x - mean) rstd gamma + beta
 *   backward: xhat = (x - mean) rstd,  gy = dy gamma,
 *             dx = rstd (gy - sum(gy) / C - xhat sum(gy xhat) / C),  dgamma = sum over rows of dy xhat,
 *             dbeta = sum over rows of dy
 *
 * Why: PyTorch's CPU kernels for this mixed-type case run at a fraction of what memory allows (Swin-T's stage-1 map at
 * 512x768, batch 2, 2 x 128 x 192 x 96 bf16, 2 threads of an Intel Xeon family 6 model 167: forward 2.0 ms and
 * backward 4.0-4.1 ms where one elementwise add of two such maps takes 0.7 ms; here 1.6 and 1.4 ms row by row).
 * Each row here is widened into the thread's buffer once and normalised from there (the two-pass variance, the
 * biased estimate, as PyTorch's).
 *
 * Layouts: x, y, dy, dx (rows, C) bf16 bits, contiguous (the add entries: x, res and y bf16 bits or fp32, one type);
 * mean, rstd (rows) fp32 (the forward may take NULL for either: inference keeps no statistics); gamma, beta, dgamma,
 * dbeta (C) fp32.
 * dgamma and dbeta are set (not added to): the threads' partial sums are added in thread order, so a call gives the
 * same bits every time with the same team of threads (OpenMP grants the team asked for unless dynamic teams or nested
 * regions are on).
 *
 * Non-finite values: a NaN or infinite x makes its row's mean or deviation non-finite, so the whole row of y (and of
 * dx) is NaN, and NaN reaches every column of dgamma, as PyTorch's LayerNorm and its gradient give it; a non-finite dy
 * reaches its row of dx and its column of dgamma and dbeta. Returns 0, or 1 where a thread's buffer cannot be
 * allocated. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_math.h"

/* rows normalised together: each row's statistics are a chain of dependent sums, square root and division (about
 * as long as the row's own arithmetic at Swin's 96-384 channels), so RB independent rows keep the vector units busy
 * (Swin-T's stage-1 map at 800x1216, 1 x 200 x 304 x 96 bf16, 2 threads of an Intel Xeon family 6 model 167: 1.1 ms
 * against 1.8 ms row by row, and 2.4 ms in PyTorch); each row's arithmetic and order are those of one row alone */
#define RB 4

/* element j of a row of bf16 bits (bf16 != 0) or fp32 as fp32, and a vector of them from j */
#define LN_LOAD(p, j) (bf16 ? bf16_to_f32(((const uint16_t *)(p))[j]) : ((const float *)(p))[j])
#define LN_LOADV(p, j) (bf16 ? load_bf16((const uint16_t *)(p) + (j)) : load_f32((const float *)(p) + (j)))

/* The forward of rows of bf16 (bf16 != 0) or fp32 x into y of the same type, plus res (the same type and layout as
 * y) where not NULL: y = res + LayerNorm(x), the sum in fp32 and rounded once. bf16 is a constant where inlined. */
static inline __attribute__((always_inline)) int layer_norm_forward(const void *x, const float *gamma,
                                                                    const float *beta, float eps, int64_t rows,
                                                                    int64_t c, const void *res, void *y, float *mean,
                                                                    float *rstd, int threads, const int bf16) {
    int failed = 0;
    const int64_t cv = c / VW * VW, blocks = (rows + RB - 1) / RB, size = bf16 ? 2 : 4;
#pragma omp parallel num_threads(threads)
    {
    float *xf = (float *)malloc((size_t)(RB * c) * sizeof(float)); /* RB rows in fp32 */
    if (xf == NULL) {
#pragma omp atomic write
        failed = 1;
    }
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; blk++) {
        if (xf == NULL) continue;
        const int64_t r0 = blk * RB;
        const int nr = rows - r0 < RB ? (int)(rows - r0) : RB;
        const char *xb = (const char *)x + r0 * c * size, *rb = res == NULL ? NULL : (const char *)res + r0 * c * size;
        char *yb = (char *)y + r0 * c * size;
        float m[RB], s[RB];
        vf acc[RB];
        for (int k = 0; k < RB; k++) acc[k] = splat(0.0f);
        for (int64_t j = 0; j < cv; j += VW) /* the rows loaded and summed, a vector of each in turn */
            for (int k = 0; k < nr; k++) {
                const vf v = LN_LOADV(xb + k * c * size, j);
                store_f32(xf + k * c + j, v);
                acc[k] += v;
            }
        for (int k = 0; k < nr; k++) {
            float t = hsum(acc[k]);
            for (int64_t j = cv; j < c; j++) t += (xf[k * c + j] = LN_LOAD(xb + k * c * size, j));
            m[k] = t / (float)c;
            acc[k] = splat(0.0f);
        }
        for (int64_t j = 0; j < cv; j += VW) /* the squared deviations from each row's mean (two passes) */
            for (int k = 0; k < nr; k++) {
                const vf d = load_f32(xf + k * c + j) - splat(m[k]);
                acc[k] += d * d;
            }
        for (int k = 0; k < nr; k++) {
            float q = hsum(acc[k]);
            for (int64_t j = cv; j < c; j++) q += (xf[k * c + j] - m[k]) * (xf[k * c + j] - m[k]);
            s[k] = 1.0f / sqrtf(q / (float)c + eps);
            if (mean != NULL) mean[r0 + k] = m[k];
            if (rstd != NULL) rstd[r0 + k] = s[k];
        }
        for (int64_t j = 0; j < cv; j += VW) {
            const vf g = load_f32(gamma + j), b = load_f32(beta + j);
            for (int k = 0; k < nr; k++) {
                vf o = (load_f32(xf + k * c + j) - splat(m[k])) * splat(s[k]) * g + b;
                if (rb != NULL) o = LN_LOADV(rb + k * c * size, j) + o;
                if (bf16)
                    store_bf16((uint16_t *)yb + k * c + j, o);
                else
                    store_f32((float *)yb + k * c + j, o);
            }
        }
        for (int k = 0; k < nr; k++)
            for (int64_t j = cv; j < c; j++) {
                float o = (xf[k * c + j] - m[k]) * s[k] * gamma[j] + beta[j];
                if (rb != NULL) o = LN_LOAD(rb + k * c * size, j) + o;
                if (bf16)
                    ((uint16_t *)yb)[k * c + j] = f32_to_bf16(o);
                else
                    ((float *)yb)[k * c + j] = o;
            }
    }
    free(xf);
    }
    return failed;
}

int mmplugin_layer_norm_bf16(const uint16_t *x, const float *gamma, const float *beta, float eps, int64_t rows,
                             int64_t c, uint16_t *y, float *mean, float *rstd, int threads) {
    return layer_norm_forward(x, gamma, beta, eps, rows, c, NULL, y, mean, rstd, threads, 1);
}

/* y = res + LayerNorm(x) for inference (Swin V2's post-norm residual: one pass instead of a LayerNorm and an add),
 * bf16 bits or fp32; res and y of x's type and layout, y not overlapping x or res. Swin V2-T's stage-1 map at
 * 800x1216 (60,800 rows of 96), 2 threads of an Intel Xeon family 6 model 167, against the two ops: bf16 2.02 vs
 * 3.12 ms, fp32 3.08 vs 4.23 ms; the whole prepacked Swin V2-T forward, interleaved, median of 21 / 15: bf16 234.3
 * vs 248.1 ms, fp32 729.6 vs 729.7 ms (level). */
int mmplugin_layer_norm_add_bf16(const uint16_t *x, const float *gamma, const float *beta, float eps, int64_t rows,
                                 int64_t c, const uint16_t *res, uint16_t *y, int threads) {
    return layer_norm_forward(x, gamma, beta, eps, rows, c, res, y, NULL, NULL, threads, 1);
}

int mmplugin_layer_norm_add_f32(const float *x, const float *gamma, const float *beta, float eps, int64_t rows,
                                int64_t c, const float *res, float *y, int threads) {
    return layer_norm_forward(x, gamma, beta, eps, rows, c, res, y, NULL, NULL, threads, 0);
}

int mmplugin_layer_norm_grad_bf16(const uint16_t *dy, const uint16_t *x, const float *mean, const float *rstd,
                                  const float *gamma, int64_t rows, int64_t c, uint16_t *dx, float *dgamma,
                                  float *dbeta, int threads) {
    const int team = rows < threads ? (int)(rows > 0 ? rows : 1) : (threads > 0 ? threads : 1);
    float **parts = (float **)calloc((size_t)team, sizeof(float *));
    if (parts == NULL) return 1;
    int failed = 0;
#pragma omp parallel num_threads(team)
    {
    /* dgamma and dbeta partial sums, then one row of xhat and of dy gamma */
    float *part = (float *)calloc((size_t)(4 * c), sizeof(float));
    if (part == NULL) {
#pragma omp atomic write
        failed = 1;
    }
    parts[THREAD_NUM()] = part;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        if (part == NULL) continue;
        const uint16_t *xr = x + r * c, *dr = dy + r * c;
        uint16_t *dxr = dx + r * c;
        float *dg = part, *db = part + c, *xh = part + 2 * c, *gy = part + 3 * c;
        const float m = mean[r], s = rstd[r];
        const vf mv = splat(m), sv = splat(s);
        vf a1 = splat(0.0f), a2 = splat(0.0f); /* sums of gy and gy * xhat */
        int64_t j = 0;
        for (; j + VW <= c; j += VW) {
            const vf d = load_bf16(dr + j), h = (load_bf16(xr + j) - mv) * sv, g = d * load_f32(gamma + j);
            store_f32(xh + j, h);
            store_f32(gy + j, g);
            a1 += g;
            a2 += g * h;
            store_f32(dg + j, load_f32(dg + j) + d * h);
            store_f32(db + j, load_f32(db + j) + d);
        }
        float s1 = hsum(a1), s2 = hsum(a2);
        for (; j < c; j++) {
            const float d = bf16_to_f32(dr[j]), h = (bf16_to_f32(xr[j]) - m) * s, g = d * gamma[j];
            xh[j] = h, gy[j] = g;
            s1 += g;
            s2 += g * h;
            dg[j] += d * h;
            db[j] += d;
        }
        const float k1 = s1 / (float)c, k2 = s2 / (float)c;
        const vf k1v = splat(k1), k2v = splat(k2);
        for (j = 0; j + VW <= c; j += VW)
            store_bf16(dxr + j, sv * (load_f32(gy + j) - k1v - load_f32(xh + j) * k2v));
        for (; j < c; j++) dxr[j] = f32_to_bf16(s * (gy[j] - k1 - xh[j] * k2));
    }
    }
    memset(dgamma, 0, (size_t)c * sizeof(float));
    memset(dbeta, 0, (size_t)c * sizeof(float));
    for (int t = 0; t < team; t++) {
        if (parts[t] == NULL) continue;
        for (int64_t j = 0; j < c; j++) dgamma[j] += parts[t][j], dbeta[j] += parts[t][c + j];
        free(parts[t]);
    }
    free(parts);
    return failed;
}
