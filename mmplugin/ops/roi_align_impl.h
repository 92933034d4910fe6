/* The RoIAlign kernels for one element type T (float or double), named with SUFFIX; included by roi_align.c. */
#define NAME(x) CAT(x, SUFFIX)

/* Sample taps of one axis of one RoI: for each of the pooled * grid samples, the two neighbouring map indices and
 * their weights, and whether the sample is inside [-1, size]. Arithmetic as in the reference, operation by
 * operation, so the taps are bit-identical to it. */
typedef struct {
    int64_t *lo, *hi;
    T *wlo, *whi;
    unsigned char *in;
    int64_t first, last; /* range of indices touched by in-range samples; last < first when none */
} NAME(Axis);

static void NAME(axis_taps)(NAME(Axis) * a, T start, T bin, int pooled, int grid, int64_t size) {
    a->first = size;
    a->last = -1;
    for (int p = 0; p < pooled; p++) {
        for (int i = 0; i < grid; i++) {
            const int k = p * grid + i;
            T v = start + p * bin + (T)(i + .5f) * bin / (T)grid;
            if (v < -1.0 || v > size) {
                a->lo[k] = a->hi[k] = 0;
                a->wlo[k] = a->whi[k] = 0;
                a->in[k] = 0;
                continue;
            }
            if (v <= 0) v = 0;
            int64_t lo = (int64_t)v, hi;
            if (lo >= size - 1) {
                hi = lo = size - 1;
                v = (T)lo;
            } else {
                hi = lo + 1;
            }
            const T l = v - lo;
            a->lo[k] = lo;
            a->hi[k] = hi;
            a->wlo[k] = (T)(1. - l);
            a->whi[k] = l;
            a->in[k] = 1;
            if (lo < a->first) a->first = lo;
            if (hi > a->last) a->last = hi;
        }
    }
}

/* Samples per bin side: sampling_ratio, or ceil(extent / bins). An extent whose grid is not a positive int (inf,
 * or beyond INT_MAX samples) gets no samples: the reference's int conversion is undefined there and on x86 yields
 * INT_MIN, whose loops never run (zero outputs). */
static int NAME(grid)(int sampling_ratio, T extent, int bins) {
    if (sampling_ratio > 0) return sampling_ratio;
    const float g = ceilf(extent / bins);
    return g > 0 && g < 2147483647.0f ? (int)g : 0;
}

/* The RoI's geometry as the reference computes it. Returns 1, or 0 for a RoI of NaN size (the reference's grid
 * is undefined behaviour there; here its outputs are NaN), or -1 for an aligned RoI whose size is negative or NaN
 * (the reference refuses it). */
static int NAME(roi_geometry)(const T *roi, T scale, int ph_n, int pw_n, int sampling_ratio, int aligned, T *sh,
                              T *sw, T *bh, T *bw, int *gh, int *gw) {
    const T offset = aligned ? (T)0.5 : (T)0.0;
    const T start_w = roi[1] * scale - offset, start_h = roi[2] * scale - offset;
    const T end_w = roi[3] * scale - offset, end_h = roi[4] * scale - offset;
    T width = end_w - start_w, height = end_h - start_h;
    if (aligned && !(width >= 0 && height >= 0)) return -1;
    if (!aligned) { /* std::max(size, 1): a NaN size stays NaN, -inf becomes 1 */
        if (width < (T)1.) width = (T)1.;
        if (height < (T)1.) height = (T)1.;
    }
    if (isnan(width) || isnan(height)) return 0;
    *sh = start_h;
    *sw = start_w;
    *bh = height / (T)ph_n;
    *bw = width / (T)pw_n;
    *gh = NAME(grid)(sampling_ratio, height, ph_n);
    *gw = NAME(grid)(sampling_ratio, width, pw_n);
    return 1;
}

typedef struct {
    NAME(Axis) y, x;
    int gh, gw;
    T *buf; /* A (forward) or G (backward): one value per column of the touched range */
    int *ny, *nx; /* in-range samples per bin row / bin column */
} NAME(Roi);

/* Fills r for one RoI and sets *finite (0: a RoI of NaN size, r not filled). Returns 0, or the kernels' error
 * codes: 1 on allocation failure or a grid of more than INT_MAX taps, 2 for a refused RoI. Buffers grow as needed
 * and are freed by roi_free. */
static int NAME(roi_prepare)(NAME(Roi) * r, size_t *cap, const T *roi, T scale, int ph_n, int pw_n, int sr,
                             int aligned, int64_t height, int64_t width, int *finite) {
    T sh, sw, bh, bw;
    int gh, gw;
    *finite = NAME(roi_geometry)(roi, scale, ph_n, pw_n, sr, aligned, &sh, &sw, &bh, &bw, &gh, &gw);
    if (*finite < 0) return 2;
    if (*finite == 0) return 0;
    /* every array holds n entries: the taps of either axis, a column buffer, and a count per bin row / column */
    const size_t taps_y = (size_t)ph_n * (size_t)gh, taps_x = (size_t)pw_n * (size_t)gw;
    if (taps_y > 2147483647u || taps_x > 2147483647u) return 1; /* tap indices are int */
    size_t need = (size_t)width;
    if (taps_y > need) need = taps_y;
    if (taps_x > need) need = taps_x;
    if ((size_t)ph_n > need) need = (size_t)ph_n;
    if ((size_t)pw_n > need) need = (size_t)pw_n;
    need += 1;
    if (need > *cap) {
        const size_t n = need * 2, per = 4 * sizeof(int64_t) + 5 * sizeof(T) + 2 * sizeof(int) + 2;
        free(r->y.lo);
        r->y.lo = NULL; /* nothing to free again if the allocation below fails */
        *cap = 0;
        if (n > SIZE_MAX / per) return 1;
        /* one block of n entries for each array: four of int64 (taps), five of T (weights, buffer), two of int
         * (counts) and two of bytes (in-range flags), in that order, so each array is aligned for its type */
        char *m = malloc(n * per);
        if (!m) return 1;
        r->y.lo = (int64_t *)m;
        r->y.hi = r->y.lo + n;
        r->x.lo = r->y.hi + n;
        r->x.hi = r->x.lo + n;
        r->y.wlo = (T *)(r->x.hi + n);
        r->y.whi = r->y.wlo + n;
        r->x.wlo = r->y.whi + n;
        r->x.whi = r->x.wlo + n;
        r->buf = r->x.whi + n;
        r->ny = (int *)(r->buf + n);
        r->nx = r->ny + n;
        r->y.in = (unsigned char *)(r->nx + n);
        r->x.in = r->y.in + n;
        *cap = n;
    }
    NAME(axis_taps)(&r->y, sh, bh, ph_n, gh, height);
    NAME(axis_taps)(&r->x, sw, bw, pw_n, gw, width);
    for (int p = 0; p < ph_n; p++) {
        int c = 0;
        for (int i = 0; i < gh; i++) c += r->y.in[p * gh + i];
        r->ny[p] = c;
    }
    for (int p = 0; p < pw_n; p++) {
        int c = 0;
        for (int i = 0; i < gw; i++) c += r->x.in[p * gw + i];
        r->nx[p] = c;
    }
    r->gh = gh;
    r->gw = gw;
    return 0;
}

static void NAME(roi_free)(NAME(Roi) * r) { free(r->y.lo); }

/* out[n, c, ph, pw] for n in [0, n_rois), c in [c_begin, c_end). Returns 0 on success, 1 on allocation failure,
 * 2 for a refused RoI (aligned, negative or NaN size). */
int NAME(mmplugin_roi_align_forward)(const T *input, const T *rois, T *out, int64_t n_rois, int64_t channels,
                                     int64_t height, int64_t width, int ph_n, int pw_n, float spatial_scale,
                                     int sampling_ratio, int aligned, int64_t c_begin, int64_t c_end) {
    NAME(Roi) r;
    memset(&r, 0, sizeof(r));
    size_t cap = 0;
    const T scale = (T)spatial_scale;
    const int64_t plane = height * width, bins = (int64_t)ph_n * pw_n;
    for (int64_t n = 0; n < n_rois; n++) {
        const T *roi = rois + n * 5;
        int finite;
        const int status = NAME(roi_prepare)(&r, &cap, roi, scale, ph_n, pw_n, sampling_ratio, aligned, height,
                                             width, &finite);
        if (status) {
            NAME(roi_free)(&r);
            return status;
        }
        const int64_t b = (int64_t)roi[0];
        const int gh = r.gh, gw = r.gw, samples = gh * gw;
        const T count = (T)(samples > 1 ? samples : 1);
        const int64_t x0 = r.x.first, xn = r.x.last - r.x.first + 1;
        for (int64_t c = c_begin; c < c_end; c++) {
            T *o = out + (n * channels + c) * bins;
            if (!finite) {
                for (int64_t k = 0; k < bins; k++) o[k] = (T)NAN;
                continue;
            }
            const T *f = input + (b * channels + c) * plane;
            const T outside = (T)0 * f[0];
            T *restrict a = r.buf;
            for (int ph = 0; ph < ph_n; ph++) {
                if (xn > 0) {
                    memset(a, 0, (size_t)xn * sizeof(T));
                    for (int iy = 0; iy < gh; iy++) {
                        const int k = ph * gh + iy;
                        if (!r.y.in[k]) continue;
                        const T *restrict rl = f + r.y.lo[k] * width + x0, *restrict rh = f + r.y.hi[k] * width + x0;
                        const T wl = r.y.wlo[k], wh = r.y.whi[k];
                        for (int64_t x = 0; x < xn; x++) a[x] += wl * rl[x] + wh * rh[x];
                    }
                }
                for (int pw = 0; pw < pw_n; pw++) {
                    T s = 0;
                    for (int ix = 0; ix < gw; ix++) {
                        const int k = pw * gw + ix;
                        if (!r.x.in[k]) continue;
                        s += r.x.wlo[k] * a[r.x.lo[k] - x0] + r.x.whi[k] * a[r.x.hi[k] - x0];
                    }
                    if (r.ny[ph] * r.nx[pw] < samples) s += outside;
                    o[ph * pw_n + pw] = s / count;
                }
            }
        }
    }
    NAME(roi_free)(&r);
    return 0;
}

/* grad_input[b, c] += the transpose of the forward, for c in [c_begin, c_end); grad_input must hold zeros or a
 * sum to add to. grad_out is contiguous (n_rois, channels, ph_n, pw_n). Returns 0 on success, 1 on allocation
 * failure, 2 for a refused RoI. */
int NAME(mmplugin_roi_align_backward)(const T *grad_out, const T *rois, T *grad_input, int64_t n_rois,
                                      int64_t channels, int64_t height, int64_t width, int ph_n, int pw_n,
                                      float spatial_scale, int sampling_ratio, int aligned, int64_t c_begin,
                                      int64_t c_end) {
    NAME(Roi) r;
    memset(&r, 0, sizeof(r));
    size_t cap = 0;
    const T scale = (T)spatial_scale;
    const int64_t plane = height * width, bins = (int64_t)ph_n * pw_n;
    for (int64_t n = 0; n < n_rois; n++) {
        const T *roi = rois + n * 5;
        int finite;
        const int status = NAME(roi_prepare)(&r, &cap, roi, scale, ph_n, pw_n, sampling_ratio, aligned, height,
                                             width, &finite);
        if (status) {
            NAME(roi_free)(&r);
            return status;
        }
        const int gh = r.gh, gw = r.gw;
        if (!finite || gh * gw == 0 || r.x.last < r.x.first || r.y.last < r.y.first) continue;
        const int64_t b = (int64_t)roi[0];
        const T count = (T)(gh * gw);
        const int64_t x0 = r.x.first, xn = r.x.last - r.x.first + 1;
        for (int64_t c = c_begin; c < c_end; c++) {
            const T *go = grad_out + (n * channels + c) * bins;
            T *gi = grad_input + (b * channels + c) * plane;
            T *restrict g = r.buf;
            for (int ph = 0; ph < ph_n; ph++) {
                if (r.ny[ph] == 0) continue;
                memset(g, 0, (size_t)xn * sizeof(T));
                for (int pw = 0; pw < pw_n; pw++) {
                    const T v = go[ph * pw_n + pw] / count;
                    for (int ix = 0; ix < gw; ix++) {
                        const int k = pw * gw + ix;
                        if (!r.x.in[k]) continue;
                        g[r.x.lo[k] - x0] += v * r.x.wlo[k];
                        g[r.x.hi[k] - x0] += v * r.x.whi[k];
                    }
                }
                for (int iy = 0; iy < gh; iy++) {
                    const int k = ph * gh + iy;
                    if (!r.y.in[k]) continue;
                    T *restrict rl = gi + r.y.lo[k] * width + x0;
                    const T wl = r.y.wlo[k];
                    for (int64_t x = 0; x < xn; x++) rl[x] += wl * g[x];
                    T *restrict rh = gi + r.y.hi[k] * width + x0;
                    const T wh = r.y.whi[k];
                    for (int64_t x = 0; x < xn; x++) rh[x] += wh * g[x];
                }
            }
        }
    }
    NAME(roi_free)(&r);
    return 0;
}

#undef NAME
