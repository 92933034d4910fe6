/* Window attention: softmax(scale * q k^T + bias) v for every (window, head), with the position bias and the shift
 * mask added in fp32, in one pass per window and head: the scores never leave the thread's cache. Its gradient, for
 * training, is window_attention_grad.h (included beside the forward for each element type).
 *
 * Why: Swin's attention runs over windows of N = ws * ws tokens (49 for 7x7), thousands of them per image. PyTorch's
 * CPU SDPA kernel tiles for long sequences, so on these short ones it reaches a small fraction of the CPU's
 * multiply-add rate; the explicit batched products write and read the (windows, heads, N, N) scores three times.
 * Here the keys of one (window, head) are packed transposed into an fp32 buffer, the scores of a few query rows are
 * held in vector registers, the softmax runs on that row block in the cache, and the values are summed with the
 * unnormalised probabilities, divided by the row's sum at the end.
 *
 * Layouts (strides in elements, the last dimension contiguous): q, k, v are (windows, heads, N, d) with their own
 * window / head / token strides, so the views of a fused qkv projection are read in place; pos is the (heads, N, N)
 * position bias and mask the (nw, N, N) shift mask or NULL, both contiguous fp32, window w using mask[w % nw] (the
 * windows of a batch are image-major); out is (windows, N, heads * d) contiguous, the layout the output projection
 * reads.
 * Gathered from the map (rows != NULL): q, k, v point at the (images * img_rows, ...) rows of a projection computed
 * on the unwindowed map (window and head strides unused, the token stride is the row stride); rows (nw, N) gives each
 * window token's row within its image (the cyclic shift included), -1 for a padding token, whose q, k, v are pad's
 * (the projection of a zero token, laid out as a map row); out is then the (images * img_rows, heads * d) map, each
 * real token written once, in place of the window partition and its reverse.
 * Swin V2's cosine attention: with cosine (heads floats, the per-head logit scale) q and k rows are normalised as
 * F.normalize does, x / max(|x|_2, 1e-12), in fp32, and q is multiplied by its head's scale (times scale).
 * Element types: fp32 (suffix f32) and bf16 (suffix bf16: loaded into fp32, computed in fp32, rounded to nearest
 * even on the store). Built for AVX512-BF16 (-mavx512bf16), the bf16 entry multiplies bf16 operands two per lane
 * (vdpbf16ps: exact products summed in fp32, subnormal inputs and results flushed to zero), q k^T from the operands
 * as they are and the softmax numerators rounded to bf16 for their product with v (each within 2^-8 relative, as a
 * bf16 matmul of the probabilities rounds them). The scale multiplies the summed products there, not q: a score
 * whose unscaled q k^T exceeds fp32's range (entries of q and k about 1e19) is inf or NaN where the fp32 path,
 * scaling q first, stays finite up to 1 / scale (about 5.7 for d = 32) times further. Swin V2's cosine attention
 * normalises q and k in fp32 and rounds F.normalize(q) times its head's logit scale (and the scale) and F.normalize(k)
 * to bf16, once each, for the same products, as autocast's bf16 product of the normalised operands rounds them (each
 * within 2^-8 relative, so a score moves by about 2^-7 times the logit scale at most). Swin V2-T's twelve bf16 calls
 * at 800x1216 (64-token windows), 2 threads of an Intel Xeon family 6 model 167, AMX: 55.9 ms, against 74.7 ms in the
 * fp32 arithmetic.
 *
 * Non-finite values: NaN in a query, key or score makes that query row NaN (its sum is NaN), a NaN or infinite value
 * reaches every query row of its window through the products, +inf scores give NaN rows (inf - inf) and -inf scores
 * a zero probability, as the formulation softmax(s) v in IEEE arithmetic.
 *
 * AMX: where the caller switches it on (mmplugin_window_attention_use_amx: a CPU with AMX tiles that the process may
 * use), the AVX512_BF16 build multiplies the bf16 operands on tiles instead (windows of at least 32 tokens, head dims
 * of 32-value multiples: Swin's 7 x 7 and 12 x 12 windows), same layouts, same rounding of the weights, products exact
 * and summed in fp32 as vdpbf16ps's. Swin-T's stage-1 call at 800x1216 (1276 windows x 3 heads; 1280 in the measurement), 2 threads of an
 * Intel Xeon family 6 model 167: 11.4-12.2 against 14.3 ms; the whole bf16 forward 12-13 ms faster (interleaved).
 *
 * Vector width: MMP_VW floats (16 for AVX-512 builds, 8 for AVX2, 4 otherwise), set by the build; the code is the
 * same for each, written with GCC's vector extensions (__builtin_shuffle: another compiler fails the build, and the
 * callers then run PyTorch's SDPA, warned once).
 *
 * Bias: each thread pads the position bias to its score rows once per call; a window whose mask is all zero (most
 * windows of a shifted map: only those at its last row and column of windows mix regions) attends with it directly,
 * the others with the position bias plus their mask, added per window (Swin-T at 800x1216, fp32: the kernel 2-5%
 * faster than adding the mask to every window).
 *
 * Packing: a window's q, k, v rows are read and its output rows written a vector at a time; the keys go in by row and
 * are transposed in square register blocks (transpose_values), instead of one scalar store per key value (then
 * VW x VW blocks; Swin-T's twelve fp32 calls at 800x1216, each timed alone, 2 threads of an Intel Xeon family 6
 * model 167: 89.4 against 78.5 ms; Swin V2-T's bf16 calls 93.1 against 81.1 ms).
 *
 * Softmax rows: the exponentials of several score rows run interleaved (ROWS of them: 4 in AVX-512 builds, 2 in the
 * others; each row's chain of max, exponentials and sum is a sequence of dependent steps, and one row at a time left
 * the vector units waiting), every row's arithmetic and order unchanged. Swin-T's twelve bf16 calls (the same measurement): 60.0 against 46.5 ms; fp32 75.3 against 73.1 ms.
 *
 * Parallel: a call handles the windows [begin, end), so callers split the windows over threads; each window writes
 * its own output rows. Memory: while a window is computed, the rows of the next are prefetched (the q, k, v of a
 * window are gathered from a projection map larger than the caches: about 30% of a bf16 call waited on those reads).
 */
#define _DEFAULT_SOURCE /* syscall() under -std=c99 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_math.h"

#define ROWS (VW >= 16 ? 4 : 2) /* query rows per register block */
#define KV 4                    /* score vectors per row block: columns are padded to KV * VW */
#define DV 2                    /* output vectors per row block: head dims are padded to DV * VW */
#define AHEAD 1                 /* windows between the one computed and the one whose rows are prefetched */

static inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* *dst = *src for one 32-bit value, as bits (NaN payloads and bf16 pairs pass as they are) */
static inline void move32(float *dst, const float *src) { memcpy(dst, src, sizeof(float)); }

/* The square blocks of transpose_values: 8 x 8 where the vectors are wider (AVX-512 builds: 256-bit rows), VW x VW
 * otherwise. On the Zen 4 of the benchmarks, Swin-T's and Swin V2-T's twelve attention-gradient calls of a training
 * step at 512x768, batch 2, fp32 and bf16 (interleaved, 9 rounds): 8 x 8 blocks 3-5% faster than 16 x 16 in all four,
 * 4 x 4 blocks between (2% slower than 16 x 16 to 7% faster); the inference forwards level within 2%. */
#define TB (VW > 8 ? 8 : VW)
SQUARE_TRANSPOSE(transpose_square, uint32_t, TB)

/* A rows x cols matrix of 32-bit values (row stride ss) transposed into dst (row stride ds): the packed keys' columns
 * from their rows (and the gradient's values'), TB x TB blocks in registers where they fit, single values at the
 * edges. */
static void transpose_values(const float *src, int64_t rows, int64_t cols, int64_t ss, float *dst, int64_t ds) {
    int64_t r0 = 0;
    for (; r0 + TB <= rows; r0 += TB) {
        int64_t c0 = 0;
        for (; c0 + TB <= cols; c0 += TB)
            transpose_square((const uint32_t *)(src + r0 * ss + c0), ss, (uint32_t *)(dst + c0 * ds + r0), ds);
        for (int64_t r = r0; r < r0 + TB; r++)
            for (int64_t c = c0; c < cols; c++) move32(dst + c * ds + r, src + r * ss + c);
    }
    for (int64_t r = r0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) move32(dst + c * ds + r, src + r * ss + c);
}

/* Whether the count values of m are all zero (+0 or -0; NaN is not): such a window's mask adds nothing to its
 * position bias (p + -0 is p; a +0 only turns a -0 bias into +0, which no score or exponential can show). */
static inline int zero_mask(const float *m, int64_t count) {
    vi nonzero = {0};
    int64_t j = 0;
    for (; j + VW <= count; j += VW) nonzero |= load_f32(m + j) != splat(0.0f);
    int any = 0;
    for (int l = 0; l < VW; l++) any |= nonzero[l];
    for (; j < count; j++) any |= !(m[j] == 0.0f);
    return !any;
}

/* Softmax numerators of R score rows in place (row stride np; R at most ROWS and a constant where inlined), exp(s_j -
 * mx[r]) over their np columns, and each row's sum into sums: exp(-inf) = 0 for the padded columns; a NaN or infinite
 * maximum gives a NaN row, as the formulation. The rows' chains of dependent steps run interleaved (one row at a
 * time left the vector units waiting); each row's arithmetic and the order of its sum are the same whatever R. */
static inline __attribute__((always_inline)) void exp_rows(float *s, int64_t np, const float *mx, float *sums,
                                                           const int R) {
    vf m[ROWS], sum[ROWS];
    for (int q = 0; q < R; q++) m[q] = splat(mx[q]), sum[q] = splat(0.0f);
    for (int64_t j = 0; j < np; j += VW)
        for (int q = 0; q < R; q++) {
            const vf x = vexp(load_f32(s + q * np + j) - m[q]);
            sum[q] += x;
            store_f32(s + q * np + j, x);
        }
    for (int q = 0; q < R; q++) sums[q] = hsum(sum[q]);
}

/* The scores of `rows` query rows in one block of KV * VW columns: scale * acc + bias (acc: ROWS x KV vectors of
 * sums, fp32 or the dot-product build's, the same bits), their running row maxima in rmax, stored to scores (rows of
 * np); bias points at the block's first row. */
static inline __attribute__((always_inline)) void biased_scores(const void *acc, float scale, const float *bias,
                                                                int rows, int64_t np, int64_t c0, vf *rmax,
                                                                float *scores) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < KV; j++) {
            vf a, b;
            memcpy(&a, (const char *)acc + (r * KV + j) * sizeof(vf), sizeof(vf));
            memcpy(&b, bias + r * np + c0 + j * VW, sizeof(vf));
            vf sv = a * splat(scale) + b;
            rmax[r] = vmax(rmax[r], sv);
            memcpy(scores + r * np + c0 + j * VW, &sv, sizeof(vf));
        }
}

/* `rows` output rows of DV * VW dims from column c0: acc (ROWS x DV vectors) times the reciprocal of each row's sum
 * (within 1.5 ulp of the quotient), stored to out (rows of dp, pointing at the block's first row). */
static inline __attribute__((always_inline)) void normalised_rows(const void *acc, const float *sums, int rows,
                                                                  int64_t dp, int64_t c0, float *out) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < DV; j++) {
            vf o;
            memcpy(&o, (const char *)acc + (r * DV + j) * sizeof(vf), sizeof(vf));
            o = o * splat(1.0f / sums[r]); /* one division per row: a vector division costs several products */
            memcpy(out + r * dp + c0 + j * VW, &o, sizeof(vf));
        }
}

/* One (window, head) in fp32: qp (n rounded up to ROWS, d) queries already multiplied by the scale, rows beyond n
 * zero; kt (d, np) keys transposed, columns beyond n zero; vp (n, dp) values, columns beyond d zero; bias (n, np)
 * the head's position bias plus the window's shift mask, columns beyond n -inf.
 * Writes the (n, dp) attention output to out. scores: ROWS * np floats of scratch. */
static void attend_unit(const float *qp, const float *kt, const float *vp, const float *bias, int64_t n, int64_t d,
                        int64_t np, int64_t dp, float *scores, float *out) {
    const float inf = __builtin_inff();
    for (int64_t i0 = 0; i0 < n; i0 += ROWS) {
        const int rows = n - i0 < ROWS ? (int)(n - i0) : ROWS;
        vf rmax[ROWS];
        for (int r = 0; r < ROWS; r++) rmax[r] = splat(-inf);
        /* scores + bias of ROWS query rows, KV * VW columns at a time (columns beyond n: -inf), with their maxima */
        for (int64_t c0 = 0; c0 < np; c0 += KV * VW) {
            vf acc[ROWS][KV];
            for (int r = 0; r < ROWS; r++)
                for (int j = 0; j < KV; j++) acc[r][j] = splat(0.0f);
            for (int64_t c = 0; c < d; c++) {
                const float *krow = kt + c * np + c0;
                vf kv[KV];
                for (int j = 0; j < KV; j++) memcpy(&kv[j], krow + j * VW, sizeof(vf));
                for (int r = 0; r < ROWS; r++) {
                    vf qs = splat(qp[(i0 + r) * d + c]);
                    for (int j = 0; j < KV; j++) acc[r][j] += qs * kv[j];
                }
            }
            biased_scores(acc, 1.0f, bias + i0 * np, rows, np, c0, rmax, scores);
        }
        float sums[ROWS]; /* softmax numerators in place */
        if (rows == ROWS) {
            float mx[ROWS];
            for (int r = 0; r < ROWS; r++) mx[r] = hmax(rmax[r]);
            exp_rows(scores, np, mx, sums, ROWS);
        } else
            for (int r = 0; r < ROWS; r++) {
                const float mx = hmax(rmax[r]);
                sums[r] = 1.0f;
                if (r < rows) exp_rows(scores + r * np, np, &mx, sums + r, 1);
            }
        /* numerators x values, DV * VW dims at a time, divided by the row's sum */
        for (int64_t c0 = 0; c0 < dp; c0 += DV * VW) {
            vf acc[ROWS][DV];
            for (int r = 0; r < ROWS; r++)
                for (int j = 0; j < DV; j++) acc[r][j] = splat(0.0f);
            for (int64_t t = 0; t < n; t++) {
                const float *vrow = vp + t * dp + c0;
                vf vv[DV];
                for (int j = 0; j < DV; j++) memcpy(&vv[j], vrow + j * VW, sizeof(vf));
                for (int r = 0; r < ROWS; r++) {
                    vf ps = splat(scores[r * np + t]);
                    for (int j = 0; j < DV; j++) acc[r][j] += ps * vv[j];
                }
            }
            normalised_rows(acc, sums, rows, dp, c0, out + i0 * dp);
        }
    }
}

#if defined(__AVX512BF16__) && VW == 16
#include <immintrin.h>
#define BF16_DOT 1

/* Softmax numerators of R score rows (row stride np, pb likewise; R at most 4 and a constant where inlined), exp(s_j -
 * mx[r]) over their np columns (a multiple of 2 * VW), rounded to bf16 into pb for the product with the values, and
 * the fp32 sums of the unrounded numerators into sums. NaN stays NaN. The rows run interleaved, as exp_rows; each
 * row's arithmetic and the order of its sum are the same whatever R. */
static inline __attribute__((always_inline)) void bf16_numerators(const float *s, int64_t np, const float *mx,
                                                                  uint16_t *pb, float *sums, const int R) {
    vf m[4], sum[4];
    for (int q = 0; q < R; q++) m[q] = splat(mx[q]), sum[q] = splat(0.0f);
    for (int64_t j = 0; j < np; j += 2 * VW)
        for (int q = 0; q < R; q++) {
            const vf x0 = vexp(load_f32(s + q * np + j) - m[q]), x1 = vexp(load_f32(s + q * np + j + VW) - m[q]);
            sum[q] += x0 + x1;
            __m512 a0, a1;
            memcpy(&a0, &x0, sizeof(a0));
            memcpy(&a1, &x1, sizeof(a1));
            _mm512_storeu_si512(pb + q * np + j, (__m512i)_mm512_cvtne2ps_pbh(a1, a0));
        }
    for (int q = 0; q < R; q++) sums[q] = hsum(sum[q]);
}

/* One (window, head) from bf16 operands with AVX512-BF16 dot products (vdpbf16ps: two bf16 products per fp32 lane,
 * exact, summed in fp32): half the multiply instructions of attend_unit. qb (n rounded up to ROWS, d) the queries as
 * they are, rows beyond n zero; kb (d / 2, np, 2) the keys as pairs along d, columns beyond n zero; vb (n rounded up
 * to 2, dp) as pairs along the tokens, (t / 2, c, t % 2), rows beyond n zero; bias as attend_unit's. The scores are
 * scale * (q k^T) + bias; the softmax numerators are rounded to bf16 (relative error at most 2^-8 each) for the
 * product with v, and each row is divided by the fp32 sum of its unrounded numerators. d must be even.
 * scores: ROWS * np floats, pb: ROWS * np bf16 of scratch. Writes the (n, dp) output to out. */
static void attend_unit_bf16dot(const uint16_t *qb, const uint16_t *kb, const uint16_t *vb, const float *bias,
                                int64_t n, int64_t d, int64_t np, int64_t dp, float scale, float *scores,
                                uint16_t *pb, float *out) {
    const float inf = __builtin_inff();
    const int64_t n2 = (n + 1) / 2;
    for (int64_t i0 = 0; i0 < n; i0 += ROWS) {
        const int rows = n - i0 < ROWS ? (int)(n - i0) : ROWS;
        vf rmax[ROWS];
        for (int r = 0; r < ROWS; r++) rmax[r] = splat(-inf);
        for (int64_t c0 = 0; c0 < np; c0 += KV * VW) {
            __m512 acc[ROWS][KV];
            for (int r = 0; r < ROWS; r++)
                for (int j = 0; j < KV; j++) acc[r][j] = _mm512_setzero_ps();
            for (int64_t c2 = 0; c2 < d / 2; c2++) {
                __m512bh kv[KV];
                for (int j = 0; j < KV; j++) kv[j] = (__m512bh)_mm512_loadu_si512(kb + (c2 * np + c0 + j * VW) * 2);
                for (int r = 0; r < ROWS; r++) {
                    uint32_t pair;
                    memcpy(&pair, qb + (i0 + r) * d + 2 * c2, sizeof(pair));
                    const __m512bh qs = (__m512bh)_mm512_set1_epi32((int)pair);
                    for (int j = 0; j < KV; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], qs, kv[j]);
                }
            }
            biased_scores(acc, scale, bias + i0 * np, rows, np, c0, rmax, scores);
        }
        float sums[ROWS];
        if (ROWS == 4 && rows == 4) {
            float mx[4];
            for (int r = 0; r < 4; r++) mx[r] = hmax(rmax[r]);
            bf16_numerators(scores, np, mx, pb, sums, 4);
        } else
            for (int r = 0; r < ROWS; r++) {
                sums[r] = 1.0f;
                if (r >= rows) { /* rows beyond n: zero weights */
                    memset(pb + r * np, 0, (size_t)np * sizeof(uint16_t));
                    continue;
                }
                float *s = scores + r * np;
                const float mx = hmax(rmax[r]);
                bf16_numerators(s, np, &mx, pb + r * np, sums + r, 1);
            }
        for (int64_t c0 = 0; c0 < dp; c0 += DV * VW) {
            __m512 acc[ROWS][DV];
            for (int r = 0; r < ROWS; r++)
                for (int j = 0; j < DV; j++) acc[r][j] = _mm512_setzero_ps();
            for (int64_t t2 = 0; t2 < n2; t2++) {
                __m512bh vv[DV];
                for (int j = 0; j < DV; j++) vv[j] = (__m512bh)_mm512_loadu_si512(vb + (t2 * dp + c0 + j * VW) * 2);
                for (int r = 0; r < ROWS; r++) {
                    uint32_t pair;
                    memcpy(&pair, pb + r * np + 2 * t2, sizeof(pair));
                    const __m512bh ps = (__m512bh)_mm512_set1_epi32((int)pair);
                    for (int j = 0; j < DV; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], ps, vv[j]);
                }
            }
            normalised_rows(acc, sums, rows, dp, c0, out + i0 * dp);
        }
    }
}

/* n bf16 values from src to dst, a vector's bytes at a time */
static inline void copy_bf16(const uint16_t *src, uint16_t *dst, int64_t n) {
    int64_t c = 0;
    for (; c + 2 * VW <= n; c += 2 * VW) memcpy(dst + c, src + c, sizeof(vf));
    for (; c < n; c++) dst[c] = src[c];
}

/* A bf16 row of d values normalised as F.normalize does, x / max(|x|_2, 1e-12) (NaN stays NaN), times s, in fp32
 * with the fp32 path's arithmetic and order, rounded to bf16 (nearest even) into dst: the cosine attention's q (s:
 * the head's logit scale times the scale) and k (s = 1) as the operands of bf16 products, rounded once, as a bf16
 * matmul of F.normalize's fp32 output rounds them. */
static inline void normalised_bf16(const uint16_t *x, int64_t d, float s, uint16_t *dst) {
    vf xx = splat(0.0f);
    int64_t c = 0;
    for (; c + VW <= d; c += VW) {
        const vf a = load_bf16(x + c);
        xx += a * a;
    }
    float ss = hsum(xx);
    for (; c < d; c++) ss += bf16_to_f32(x[c]) * bf16_to_f32(x[c]);
    float norm = sqrtf(ss);
    norm = norm < 1e-12f ? 1e-12f : norm;
    for (c = 0; c + VW <= d; c += VW) store_bf16(dst + c, load_bf16(x + c) / splat(norm) * splat(s));
    for (; c < d; c++) dst[c] = f32_to_bf16(bf16_to_f32(x[c]) / norm * s);
}

/* Token i of a window into attend_unit_bf16dot's layouts, every head (head h's buffers at buf + h * per_head, as
 * the fp32 path's): q as it is; k as it is into row i of the head's result slot, whose rows of d / 2 pairs
 * (32-bit words) are transposed into the (d / 2, np) pair columns once the window is packed; at an odd token, or the
 * last of an odd count (paired with zeros), the two tokens' values interleaved into pairs. vprev: token i - 1's
 * value row (unused at even i). With cosine (Swin V2), q and k are normalised and rounded (normalised_bf16), q times
 * cosine[h] * scale, so that the products are the scores themselves. */
static inline void pack_token_bf16dot(const uint16_t *qr, const uint16_t *kr, const uint16_t *vr,
                                      const uint16_t *vprev, int64_t q_h, int64_t k_h, int64_t v_h, int64_t heads,
                                      int64_t i, int64_t n, int64_t d, int64_t nq, int64_t np, int64_t dp,
                                      int64_t per_head, const float *cosine, float scale, float *buf) {
    const int pair_v = i % 2 == 1 || i == n - 1;
    for (int64_t h = 0; h < heads; h++) {
        float *slot = buf + h * per_head;
        uint16_t *qs = (uint16_t *)slot + i * d, *ks = (uint16_t *)(slot + nq * d + d * np + n * dp) + i * d;
        if (cosine == NULL) {
            copy_bf16(qr + h * q_h, qs, d);
            copy_bf16(kr + h * k_h, ks, d); /* transposed later */
        } else {
            normalised_bf16(qr + h * q_h, d, cosine[h] * scale, qs);
            normalised_bf16(kr + h * k_h, d, 1.0f, ks);
        }
        if (!pair_v) continue;
        uint32_t *vb = (uint32_t *)(slot + nq * d + d * np) + i / 2 * dp;
        const uint16_t *lo = i % 2 ? vprev + h * v_h : vr + h * v_h, *hi = i % 2 ? vr + h * v_h : NULL;
        int64_t c = 0;
        for (; c + VW <= d; c += VW) {
            __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(lo + c)));
            __m512i b = hi == NULL ? _mm512_setzero_si512()
                                   : _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(hi + c))), 16);
            _mm512_storeu_si512(vb + c, _mm512_or_si512(a, b));
        }
        for (; c < d; c++) vb[c] = (uint32_t)lo[c] | (hi == NULL ? 0u : (uint32_t)hi[c] << 16);
    }
}
#if defined(__x86_64__) && defined(__linux__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#include <sys/syscall.h>
#include <unistd.h>
#define AMX 1
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

/* Whether the bf16 path multiplies on AMX tiles: off until mmplugin_window_attention_use_amx(1) (the caller knows
 * whether the CPU has AMX and whether the process may use it: ONEDNN_MAX_CPU_ISA caps), which also asks Linux for the
 * tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA: once per process, as oneDNN does). */
static volatile int amx_on = 0;

int mmplugin_window_attention_use_amx(int on) {
    amx_on = on && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return amx_on;
}

/* the tile configuration (palette 1): tiles 0-7 of 16 rows of 64 bytes each, i.e. 16 x 16 fp32 sums, 16 x 32 bf16
 * operands, 16 pair rows of 16 bf16 pairs; a constant in memory (the load is an asm statement: a local the compiler
 * fills may not be written before it) */
static const struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) AMX_TILES = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

AMX_TARGET static void amx_configure(void) { _tile_loadconfig(&AMX_TILES); }

AMX_TARGET static void amx_release(void) { _tile_release(); }

/* One (window, head) from bf16 operands on AMX tiles, in the layouts of attend_unit_bf16dot: qb (n rounded up to 16,
 * d) the queries, rows beyond n zero; kb (d / 2, np, 2) the keys as pairs along d; vb (np / 2, dp, 2) the values as
 * pairs along the tokens, pairs beyond n zero. Each block of 16 query rows: the scores against 64 keys at a time in
 * four 16 x 16 tiles (TDPBF16PS: exact bf16 products summed in fp32, subnormals flushed to zero, as vdpbf16ps), stored
 * to scores (16 x np fp32); then scale, bias, softmax numerators rounded to bf16 into pb (16 x np bf16) as
 * attend_unit_bf16dot does; then their product with the values, 32 tokens at a time, into two 16 x 16 tiles per 32
 * dims, stored to acc (16 x dp fp32) and multiplied by the reciprocals of the rows' sums into out (n, dp). d and dp multiples of 32, np of 64.
 * The tiles must be configured (amx_configure) on the calling thread. */
AMX_TARGET static void attend_unit_amx(const uint16_t *qb, const uint16_t *kb, const uint16_t *vb, const float *bias,
                                       int64_t n, int64_t d, int64_t np, int64_t dp, float scale, float *scores,
                                       uint16_t *pb, float *acc, float *out) {
    const float inf = __builtin_inff();
    /* the tile loads are asm statements without a memory operand: these barriers keep the stores they read (the
     * packed operands, the bf16 numerators) ahead of them */
    __asm__ volatile("" ::: "memory");
    for (int64_t i0 = 0; i0 < n; i0 += 16) {
        const int rows = n - i0 < 16 ? (int)(n - i0) : 16;
        for (int64_t c0 = 0; c0 < np; c0 += 64) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t k0 = 0; k0 < d; k0 += 32) { /* the key blocks in tiles 5-7 and 5 again: a tile is reloaded
                                                       * only after the product that read it */
                const uint16_t *kp = kb + (k0 / 2 * np + c0) * 2;
                _tile_loadd(4, qb + i0 * d + k0, d * 2);
                _tile_loadd(5, kp, np * 4);
                _tile_loadd(6, kp + 32, np * 4);
                _tile_loadd(7, kp + 64, np * 4);
                _tile_dpbf16ps(0, 4, 5);
                _tile_dpbf16ps(1, 4, 6);
                _tile_dpbf16ps(2, 4, 7);
                _tile_loadd(5, kp + 96, np * 4);
                _tile_dpbf16ps(3, 4, 5);
            }
            _tile_stored(0, scores + c0, np * 4);
            _tile_stored(1, scores + c0 + 16, np * 4);
            _tile_stored(2, scores + c0 + 32, np * 4);
            _tile_stored(3, scores + c0 + 48, np * 4);
        }
        float sums[16];
        int r = 0;
        for (; r + 4 <= rows; r += 4) { /* four rows at a time: scale, bias and maxima, then the numerators */
            float *s = scores + r * np;
            const float *b = bias + (i0 + r) * np;
            vf mv[4];
            float mx[4];
            for (int q = 0; q < 4; q++) mv[q] = splat(-inf);
            for (int64_t j = 0; j < np; j += VW)
                for (int q = 0; q < 4; q++) {
                    const vf x = load_f32(s + q * np + j) * splat(scale) + load_f32(b + q * np + j);
                    mv[q] = vmax(mv[q], x);
                    store_f32(s + q * np + j, x);
                }
            for (int q = 0; q < 4; q++) mx[q] = hmax(mv[q]);
            bf16_numerators(s, np, mx, pb + r * np, sums + r, 4);
        }
        for (; r < 16; r++) {
            sums[r] = 1.0f;
            if (r >= rows) { /* rows beyond n: zero weights */
                memset(pb + r * np, 0, (size_t)np * sizeof(uint16_t));
                continue;
            }
            float *s = scores + r * np;
            const float *b = bias + (i0 + r) * np;
            vf mx = splat(-inf);
            for (int64_t j = 0; j < np; j += VW) {
                const vf x = load_f32(s + j) * splat(scale) + load_f32(b + j);
                mx = vmax(mx, x);
                store_f32(s + j, x);
            }
            const float m1 = hmax(mx);
            bf16_numerators(s, np, &m1, pb + r * np, sums + r, 1);
        }
        __asm__ volatile("" ::: "memory");
        for (int64_t c0 = 0; c0 < dp; c0 += 32) {
            _tile_zero(0);
            _tile_zero(1);
            for (int64_t t0 = 0; t0 < np; t0 += 64) { /* two steps of 32 tokens in their own tiles */
                const uint16_t *vp = vb + (t0 / 2 * dp + c0) * 2, *vq = vp + 32 * dp;
                _tile_loadd(4, pb + t0, np * 2);
                _tile_loadd(5, vp, dp * 4);
                _tile_loadd(6, vp + 32, dp * 4);
                _tile_loadd(3, pb + t0 + 32, np * 2);
                _tile_loadd(7, vq, dp * 4);
                _tile_loadd(2, vq + 32, dp * 4);
                _tile_dpbf16ps(0, 4, 5);
                _tile_dpbf16ps(1, 4, 6);
                _tile_dpbf16ps(0, 3, 7);
                _tile_dpbf16ps(1, 3, 2);
            }
            _tile_stored(0, acc + c0, dp * 4);
            _tile_stored(1, acc + c0 + 16, dp * 4);
        }
        for (int r = 0; r < rows; r++) {
            const vf inv = splat(1.0f / sums[r]);
            for (int64_t c = 0; c < dp; c += VW) store_f32(out + (i0 + r) * dp + c, load_f32(acc + r * dp + c) * inv);
        }
    }
}
#endif
#endif


#define T float
#define SUFFIX f32
#define LOAD(p, i) ((p)[i])
#define STORE(p, i, x) ((p)[i] = (x))
#define LOADV(p) load_f32(p)
#define STOREV(p, x) store_f32(p, x)
#include "window_attention_impl.h"
#include "window_attention_grad.h"
#undef T
#undef SUFFIX
#undef LOAD
#undef STORE
#undef LOADV
#undef STOREV
#undef IS_BF16

#define T uint16_t
#define SUFFIX bf16
#define IS_BF16 1
#define LOAD(p, i) bf16_to_f32((p)[i])
#define STORE(p, i, x) ((p)[i] = f32_to_bf16(x))
#define LOADV(p) load_bf16(p)
#define STOREV(p, x) store_bf16(p, x)
#include "window_attention_impl.h"
#include "window_attention_grad.h"
#undef T
#undef SUFFIX
#undef LOAD
#undef STORE
#undef LOADV
#undef STOREV
#undef IS_BF16
