/* The exact (erf) GELU's gradient in one pass over memory, for CPU training:
 *   dh = g * (Phi(h) + h * phi(h)),   and, where act != NULL, act = GELU(h) = h * Phi(h),
 * with Phi(x) = 0.5 * (1 + erf(x / sqrt(2))) and phi(x) = exp(-x^2 / 2) / sqrt(2 pi), the formulas of PyTorch's
 * gelu_backward and gelu.
 *
 * Why: a Swin MLP's hidden map (4C values per token, Swin-T's widest tensor) goes through GELU's gradient once per
 * block in every training step, and the fp32 training path (mmplugin/models/layers/recompute.py) recomputes GELU(h)
 * for fc2's weight gradient instead of keeping it; with PyTorch's two ops that reads h twice and computes erf twice.
 * Here both come from one read of h and g, with erf and exp shared. The bf16 entry serves bf16 hidden maps the same
 * way (the models' bf16 training keeps GELU(h) and does not call it).
 *
 * erf(z), z = x / sqrt(2): for |z| < 1, z * A(z^2) with A of degree 6; otherwise sign(z) * (1 - exp(-z^2) *
 * B(min(|z|, 4) - 2.5)) with B of degree 12, B approximating erfc(z) exp(z^2) (at |z| >= 4 the product is below half
 * an fp32 ulp of 1). The coefficients are weighted least-squares fits in float64 at 4000 Chebyshev nodes (relative
 * error 1.4e-9 for A on [0, 1], 6e-9 for B on [1, 4], 1.6e-7 evaluated in fp32), so erf is within a few fp32 ulps of
 * 1 in absolute terms, as the fp32 result needs. exp(-z^2) serves phi too. Elements: fp32 (suffix f32) or bf16 bits
 * (suffix bf16: widened to fp32, computed in fp32, rounded to nearest even once on the store).
 *
 * Non-finite values where PyTorch's vectorised fp32 and bf16 CPU kernels for the same ISA put them: NaN stays NaN;
 * h = +inf gives dh = NaN (the formula's g * (1 + inf * 0)) and act = NaN in AVX-512 builds, as PyTorch's AVX-512
 * kernels, inf in the others, as its AVX2 and generic kernels, the formula and float64 (and PyTorch's scalar loop,
 * which serves tensors shorter than a vector); h = -inf NaN for both.
 *
 * Layout: h, g, dh, act contiguous, n elements each; dh may be g itself (elementwise, in place). Parallel: OpenMP
 * over blocks of elements, on torch's intra-op threads (see build.py). Returns 0. */
#include <stdint.h>
#include <string.h>

#include "vector_math.h"

#define BLOCK 8192 /* elements per parallel work item */

static inline vf poly(vf x, const float *c, int terms) { /* c[0] x^(terms-1) + ... + c[terms-1] */
    vf p = splat(c[0]);
    for (int k = 1; k < terms; k++) p = p * x + splat(c[k]);
    return p;
}

static const float ERF_A[] = {7.898210206e-05f, -8.024354128e-04f, 5.190053578e-03f, -2.685480854e-02f,
                              1.128361243e-01f, -3.761262884e-01f, 1.128379167e+00f};
static const float ERFC_B[] = {9.592293074e-08f, -4.237685895e-07f, 1.023505673e-06f, -3.763825843e-06f,
                               1.599714556e-05f, -5.948642419e-05f, 2.110511388e-04f, -7.331884928e-04f,
                               2.466997690e-03f, -8.001679940e-03f, 2.493800735e-02f, -7.434733826e-02f,
                               2.108063637e-01f};

/* GELU(x) into *act and its derivative, lane by lane */
static inline vf gelu_and_slope(vf x, vf *act) {
    const vf z = x * splat(0.707106781186547524f), z2 = z * z;
    const vi sign = ibits(z) & (vi)splat(-0.0f);
    const vf az = vbits(ibits(z) & ~sign);
    const vf e = vexp(-z2); /* exp(-z^2) = exp(-x^2 / 2) */
    const vf small = z * poly(z2, ERF_A, 7);
    const vi inside = az < splat(4.0f); /* false for NaN */
    const vf t = vbits((inside & ibits(az)) | (~inside & ibits(splat(4.0f)))) - splat(2.5f);
    const vf large = vbits(ibits(splat(1.0f) - e * poly(t, ERFC_B, 13)) | sign);
    const vi near = az < splat(1.0f);
    const vf erf = vbits((near & ibits(small)) | (~near & ibits(large)));
    const vf cdf = splat(0.5f) * (splat(1.0f) + erf);
#if VW >= 16 /* GELU(+inf): NaN, as PyTorch's AVX-512 kernels give it */
    const vi pinf = x == splat(__builtin_inff());
    *act = vbits((~pinf & ibits(x * cdf)) | (pinf & ibits(splat(__builtin_nanf("")))));
#else /* inf, as the formula and PyTorch's AVX2 and generic kernels give it */
    *act = x * cdf;
#endif
    return cdf + x * (splat(0.398942280401432678f) * e);
}

#define DEFINE_GELU_GRAD(SUFFIX, T, LOAD, STORE)                                                                    \
    int CAT(mmplugin_gelu_grad_, SUFFIX)(const T *h, const T *g, T *dh, T *act, int64_t n, int threads) {           \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                          \
        for (int64_t b = 0; b < n; b += BLOCK) {                                                                  \
            const int64_t end = n - b < BLOCK ? n : b + BLOCK;                                                    \
            for (int64_t i = b; i < end; i += VW) {                                                               \
                T hb[VW], gb[VW], db[VW], ab[VW]; /* the last partial vector, through zero-padded copies */       \
                const int64_t m = end - i < VW ? end - i : VW;                                                    \
                const T *hp = h + i, *gp = g + i;                                                                 \
                T *dp = dh + i, *ap = act == NULL ? NULL : act + i;                                               \
                if (m < VW) {                                                                                     \
                    memset(hb, 0, sizeof(hb));                                                                    \
                    memset(gb, 0, sizeof(gb));                                                                    \
                    memcpy(hb, hp, (size_t)m * sizeof(T));                                                        \
                    memcpy(gb, gp, (size_t)m * sizeof(T));                                                        \
                    hp = hb, gp = gb, dp = db, ap = ap == NULL ? NULL : ab;                                       \
                }                                                                                                 \
                vf a;                                                                                             \
                const vf slope = gelu_and_slope(LOAD(hp), &a);                                                    \
                STORE(dp, LOAD(gp) * slope);                                                                      \
                if (ap != NULL) STORE(ap, a);                                                                     \
                if (m < VW) {                                                                                     \
                    memcpy(dh + i, db, (size_t)m * sizeof(T));                                                    \
                    if (act != NULL) memcpy(act + i, ab, (size_t)m * sizeof(T));                                  \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        return 0;                                                                                                 \
    }

DEFINE_GELU_GRAD(f32, float, load_f32, store_f32)
DEFINE_GELU_GRAD(bf16, uint16_t, load_bf16, store_bf16)
