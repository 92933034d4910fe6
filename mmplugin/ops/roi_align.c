/* RoIAlign with average pooling on NCHW maps (float32 and float64): the function of mmcv's RoIAlign CPU kernel
 * (aligned and legacy modes, fixed or adaptive sampling grid, zero weight outside [-1, size], edge clamping), computed
 * in separable form and parallel over channels.
 *
 * A bin's value is the mean over its gh x gw sample points of a bilinear interpolation, and a bilinear weight is the
 * product of a row weight and a column weight. So for one RoI, one channel and one output row ph:
 *   A[x]        = sum over the row samples iy of bin row ph:  wy_lo * F[y_lo, x] + wy_hi * F[y_hi, x]
 *   out[ph, pw] = (sum over the column samples ix of bin pw:  wx_lo * A[x_lo] + wx_hi * A[x_hi]) / (gh * gw)
 * The first pass runs along contiguous rows of the map, and each map row is read once per output row instead of once
 * per sample. The backward is the transpose: a column pass into G[x], then G added along the sampled rows.
 *
 * Non-finite values reach exactly the outputs the reference reaches: an in-range sample touches the same four map
 * entries (zero weights included, so 0 * inf = NaN as there), and every out-of-range sample adds 0 * F[0, 0] as the
 * reference does. In the backward, out-of-range samples add nothing, as there. A RoI of NaN size, where the
 * reference's grid size is undefined behaviour, gives NaN outputs and no gradient; an infinite one gets no samples
 * (zero outputs, as the reference on x86).
 *
 * Parallel: a call handles the channels [c_begin, c_end) of every RoI, so callers split the channels over threads;
 * in the backward each thread then owns its channels of the input gradient, without atomics.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#define T float
#define SUFFIX f32
#include "roi_align_impl.h"
#undef T
#undef SUFFIX

#define T double
#define SUFFIX f64
#include "roi_align_impl.h"
#undef T
#undef SUFFIX
