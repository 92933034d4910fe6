/* Vector helpers shared by the plugin's C kernels (window_attention.c, gelu.c, layer_norm.c, transpose.c): GCC
 * vector-extension types of MMP_VW fp32 lanes (16 for AVX-512 builds, 8 for AVX2, 4 otherwise, set by the build), a
 * broadcast, bit casts, exp for non-positive arguments, NaN-keeping maxima, horizontal reductions, the bf16 <-> fp32
 * conversions and square transposes in registers; the OpenMP thread number and the per-type name suffix macro. */
#ifndef MMP_VECTOR_MATH_H
#define MMP_VECTOR_MATH_H
#ifdef _OPENMP
#include <omp.h>
#define THREAD_NUM() omp_get_thread_num() /* the calling thread's number in its OpenMP team (0 without OpenMP) */
#else
#define THREAD_NUM() 0
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b) /* a name with a per-type suffix: CAT(mmplugin_gelu_grad_, f32) */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#ifndef MMP_VW
#define MMP_VW 4
#endif
#define VW MMP_VW

typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));

static inline vf splat(float s) {
    vf v = {s};
    vi zero = {0};
    return __builtin_shuffle(v, zero); /* a broadcast */
}

/* the lane permutations of the reductions below: lane i takes lane i ^ half, for half = VW/2, ..., 1 */
#if VW == 16
static const vi FOLDS[] = {{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7},
                           {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
                           {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13},
                           {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}};
#elif VW == 8
static const vi FOLDS[] = {{4, 5, 6, 7, 0, 1, 2, 3}, {2, 3, 0, 1, 6, 7, 4, 5}, {1, 0, 3, 2, 5, 4, 7, 6}};
#elif VW == 4
static const vi FOLDS[] = {{2, 3, 0, 1}, {1, 0, 3, 2}};
#else
#error "MMP_VW must be 4, 8 or 16"
#endif
#define NFOLDS ((int)(sizeof(FOLDS) / sizeof(FOLDS[0])))

static inline vf vbits(vi x) {
    vf y;
    memcpy(&y, &x, sizeof(y));
    return y;
}

static inline vi ibits(vf x) {
    vi y;
    memcpy(&y, &x, sizeof(y));
    return y;
}

/* 2^n for integer-valued n in [-126, 127] */
static inline vf pow2i(vi n) { return vbits((n + 127) << 23); }

/* exp(x) for x <= 0 (scores minus the row's maximum), within 2 ulp of expf: Cody-Waite reduction by ln 2 and a
 * degree-6 polynomial (the constants of Cephes' expf). Results below 2^-126 (x < -87.3, a weight under 1.2e-38
 * against the row's largest weight of 1, far below fp32's resolution of the sum) are flushed to zero rather than
 * computed as subnormals, which cost a microcode assist per lane on some CPUs; -inf gives 0 and NaN stays NaN. */
static inline vf vexp(vf x) {
    vi keep = x >= splat(-87.33f); /* false for NaN and below the range */
    vi nan = x != x;
    vf xc = vbits(keep & ibits(x)); /* 0 where not kept: no special values in the arithmetic below */
    vf t = xc * splat(1.44269504088896341f) + splat(12582912.0f); /* round to nearest integer */
    vf n = t - splat(12582912.0f);
    vf r = xc - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    vf p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * (r * r) + r + splat(1.0f);
    vf y = p * pow2i(__builtin_convertvector(n, vi)); /* n in [-126, 0] */
    y = vbits(ibits(y) & keep);
    return vbits((ibits(y) & ~nan) | (ibits(x) & nan));
}

/* lane-wise maximum that keeps NaN: once a lane holds NaN it stays NaN */
static inline vf vmax(vf m, vf x) {
    vi take = (x > m) | (x != x);
    return vbits((take & ibits(x)) | (~take & ibits(m)));
}

/* horizontal maximum (NaN if a lane is NaN) and sum, as log2(VW) folds */
static inline float hmax(vf v) {
    for (int f = 0; f < NFOLDS; f++) v = vmax(v, __builtin_shuffle(v, FOLDS[f]));
    return v[0];
}

static inline float hsum(vf v) {
    for (int f = 0; f < NFOLDS; f++) v += __builtin_shuffle(v, FOLDS[f]);
    return v[0];
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN stays a quiet NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* VW fp32 values <-> lanes */
static inline vf load_f32(const float *p) {
    vf x;
    memcpy(&x, p, sizeof(vf));
    return x;
}

static inline void store_f32(float *p, vf x) { memcpy(p, &x, sizeof(vf)); }

/* VW bf16 values (bits) <-> fp32 lanes, rounding to nearest even, NaN kept quiet */
typedef uint16_t vh __attribute__((vector_size(VW * 2)));
typedef uint32_t vu __attribute__((vector_size(VW * 4)));

static inline vf load_bf16(const uint16_t *p) {
    vh b;
    memcpy(&b, p, sizeof(vh));
    return vbits((vi)(__builtin_convertvector(b, vu) << 16));
}

static inline void store_bf16_rounded(uint16_t *p, vf x) { /* nearest even; NaN stays a quiet NaN */
    const vu bits = (vu)ibits(x);
    const vu nan = (vu)((bits & 0x7fffffffu) > 0x7f800000u);
    const vu rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const vh b = __builtin_convertvector((nan & ((bits >> 16) | 0x40u)) | (~nan & rounded), vh);
    memcpy(p, &b, sizeof(vh));
}

#if defined(__AVX512BF16__) && VW == 16
/* The same bits from one vcvtneps2bf16 (nearest even, NaN made quiet as above), which treats subnormal fp32 inputs as
 * zero: a vector holding one (exponent bits 0, mantissa not) takes the integer rounding instead. Why: the integer
 * rounding is about ten vector operations per store, and the bf16 kernels round every output and the attention's
 * probabilities that way. 2 threads of an AMD EPYC family 25 model 17 (Zen 4), against the integer rounding: Swin-T's
 * stage-1 LayerNorm at 800x1216 (60,800 rows of 96) alone 0.85 against 1.70 ms; in the prepacked bf16 forwards at
 * 800x1216 (interleaved in one process, per forward, means of 15 / 11 rounds) Swin-T's twelve window-attention calls
 * 61.8 against 70.7 ms and its LayerNorms 21.3 against 26.5 ms, Swin V2-T's 79.6 against 106.1 ms and 31.4 against
 * 42.4 ms. The outputs are the same bits. */
static inline void store_bf16(uint16_t *p, vf x) {
    const __m512i bits = (__m512i)ibits(x);
    const __mmask16 subnormal = _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7f800000)) &
                                _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x007fffff));
    if (__builtin_expect(subnormal != 0, 0)) {
        store_bf16_rounded(p, x);
        return;
    }
    const __m256bh b = _mm512_cvtneps_pbh((__m512)x);
    memcpy(p, &b, sizeof(b));
}
#else
static inline void store_bf16(uint16_t *p, vf x) { store_bf16_rounded(p, x); }
#endif

/* SQUARE_TRANSPOSE(NAME, T, N) defines NAME(src, ss, dst, ds): an N x N block of unsigned integers T (the bits of
 * fp32 or bf16 values, moved, never computed: NaN payloads and signed zeros kept) transposed through N vectors of N
 * lanes, dst[c * ds + r] = src[r * ss + c] (row strides ss, ds in elements). Round b swaps the off-diagonal b x b
 * sub-blocks of rows i and i + b, so log2(N) rounds of two-vector shuffles (one vpermt2d / vpermt2w each in AVX-512
 * builds). */
#define SQUARE_TRANSPOSE(NAME, T, N)                                                                                 \
    static inline void NAME(const T *src, int64_t ss, T *dst, int64_t ds) {                                          \
        typedef T vt __attribute__((vector_size(N * sizeof(T))));                                                    \
        vt r[N];                                                                                                     \
        for (int i = 0; i < N; i++) memcpy(&r[i], src + i * ss, sizeof(vt));                                         \
        for (int b = N / 2; b >= 1; b /= 2) {                                                                        \
            vt lo, hi; /* lane j of row i: its own or row i + b's lane j - b; of row i + b: row i's j + b or its own */ \
            for (int j = 0; j < N; j++) {                                                                            \
                lo[j] = (T)(j & b ? N + j - b : j);                                                                  \
                hi[j] = (T)(j & b ? N + j : j + b);                                                                  \
            }                                                                                                        \
            for (int i = 0; i < N; i++)                                                                              \
                if (!(i & b)) {                                                                                      \
                    const vt x = r[i], y = r[i + b];                                                                 \
                    r[i] = __builtin_shuffle(x, y, lo);                                                              \
                    r[i + b] = __builtin_shuffle(x, y, hi);                                                          \
                }                                                                                                    \
        }                                                                                                            \
        for (int i = 0; i < N; i++) memcpy(dst + i * ds, &r[i], sizeof(vt));                                         \
    }

#endif
