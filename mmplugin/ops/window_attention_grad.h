/* The gradient of window attention for CPU training, for one element type T (fp32, or bf16 bits loaded into fp32 and
 * the gradient rounded once on the store; included once per type, as window_attention_impl.h): for every (window, head), with S = scale * q k^T + pos +
 * mask and P = softmax(S) recomputed from q, k, v (nothing but the inputs is kept from the forward),
 *   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),  dQ = scale * dS K,  dK = scale * dS^T Q,
 *   dpos += dS (summed over the windows and images; the mask takes no gradient).
 * Swin V2's cosine attention (cosine != NULL, heads floats: the per-head logit scale c_h): S = s_h qn kn^T + pos +
 * mask with qn = q / max(|q|_2, 1e-12), kn likewise (F.normalize) and s_h = scale * c_h; then
 *   dqn = s_h dS kn,  dkn = s_h dS^T qn,  dc_h += scale * sum(dS * qn kn^T) (into dcos, summed as dpos),
 * and through the normalisation, x = q or k with n = |x|_2: dx = (dxn - xn (xn . dxn)) / n where n >= 1e-12, else
 * dxn / 1e-12 (F.normalize's clamp passes no gradient to the norm below its minimum).
 * bf16: the operands are widened and nothing is rounded before the gradient's store, also where the forward's bf16
 * products rounded the probabilities (and V2's normalised q and k) to bf16: the gradient of the attention without
 * those roundings (recompute.map_attention_dtype says why).
 * Included by window_attention.c (its vector helpers and block sizes).
 *
 * Why: the batched products of the reference backward write and read the (windows, heads, N, N) probabilities and
 * their gradient through memory five times, the q, k, v operands are copied head-major for them and the three
 * gradients copied back into the projection's layout; here one window's heads are packed once into the thread's
 * scratch (about 28 KB per head of 32 dims in 7 x 7 windows: Swin-T's 24-head stage 4 about 0.9 MB, within a core's
 * L2 on the CPUs measured) and their five products, the softmax and its gradient run there, and the gradients are
 * written straight into the qkv projection's layout. The heads are packed in one pass over the window's token rows,
 * every head into a slot of its own (a row's heads lie side by side), then attended one after the other: packing a
 * head at a time re-read a few lines of every token row per head. On an AMD EPYC family 25 model 17 (Zen 4), 2
 * threads, the twelve gradient calls of a training step at 512x768, batch 2, against a pass per head (interleaved,
 * 9-15 rounds): Swin-T fp32 181-191 against 192-204 ms, bf16 level (138-148 against 138-154 ms); Swin V2-T fp32
 * 217-247 against 277-326 ms (its q and k now normalised a vector at a time), bf16 level (178-184 against 171-192
 * ms).
 *
 * Layouts (contiguous; qkv, g, pad and dqkv of type T, the rest fp32): qkv and dqkv are (windows, N, 3, heads, d), the fused projection's output and its
 * gradient (q, k, v of token i, head h at columns h * d, C + h * d, 2C + h * d of row i, C = heads * d); g, the
 * output's gradient, is (windows, N, heads * d); pos (heads, N, N); mask (nw, N, N) or NULL, window w using
 * mask[w % nw]; dpos (heads, N, N) receives the sum over all windows (added to what it holds; the threads' partial
 * sums in thread order, so the bits repeat from call to call at a given thread count).
 * Gathered from the map (rows != NULL, as the forward's map layout): qkv, dqkv are (images * img_rows, 3C) and g
 * (images * img_rows, C), the rows of the unwindowed map; rows (nw, N) gives each window token's row within its image
 * (-1 for a padding token, whose q, k, v are pad's, 3C floats, and whose output takes no gradient: the padding is
 * cropped); every map row appears once, so each dqkv row is written once; dpad (3C, fp32) receives the padding tokens'
 * gradient summed (added to what it holds).
 * Non-finite values: as the formulation's backward in IEEE arithmetic (a NaN or infinite score makes its row's
 * probabilities NaN, and the NaN reaches that row's and the window's gradients through the products).
 * Returns 0, or 1 when a thread's scratch buffer cannot be allocated. */
#ifndef MMP_TOKEN_ROW
#define MMP_TOKEN_ROW
/* Rows [0, R) of one (window, head)'s softmax backward, R at most ROWS and a constant where inlined (the rows'
 * dependent chains interleaved): p (rows of np) holds scale * q k^T on entry and P = softmax(S) on exit, S = that +
 * pos + m (m NULL without a mask; rows of n), the padding columns -inf; ds holds dP on entry and dS = P * (dP -
 * rowsum(P * dP)) on exit; acc (rows of n) += dS. Each row's arithmetic in the same order whatever R. */
static inline __attribute__((always_inline)) void softmax_grad_rows(const int R, float *p, float *ds, const float *pos,
                                                                    const float *m, float *acc, int64_t n,
                                                                    int64_t np) {
    float mx[ROWS], sums[ROWS];
    for (int r = 0; r < R; r++) {
        float *restrict pi = p + r * np;
        const float *restrict pr = pos + r * n, *restrict mr = m == NULL ? NULL : m + r * n;
        for (int64_t j = 0; j < n; j++) pi[j] += mr == NULL ? pr[j] : pr[j] + mr[j];
        for (int64_t j = n; j < np; j++) pi[j] = -__builtin_inff();
    }
    {
        vf mv[ROWS];
        for (int r = 0; r < R; r++) mv[r] = splat(-__builtin_inff());
        for (int64_t j = 0; j < np; j += VW)
            for (int r = 0; r < R; r++) mv[r] = vmax(mv[r], load_f32(p + r * np + j));
        for (int r = 0; r < R; r++) mx[r] = hmax(mv[r]);
    }
    exp_rows(p, np, mx, sums, R);
    vf inv[ROWS], dot[ROWS];
    for (int r = 0; r < R; r++) inv[r] = splat(1.0f / sums[r]), dot[r] = splat(0.0f);
    for (int64_t j = 0; j < np; j += VW)
        for (int r = 0; r < R; r++) {
            const vf x = load_f32(p + r * np + j) * inv[r];
            dot[r] += x * load_f32(ds + r * np + j);
            store_f32(p + r * np + j, x);
        }
    for (int r = 0; r < R; r++) dot[r] = splat(hsum(dot[r]));
    for (int64_t j = 0; j < np; j += VW)
        for (int r = 0; r < R; r++)
            store_f32(ds + r * np + j, load_f32(p + r * np + j) * (load_f32(ds + r * np + j) - dot[r]));
    for (int r = 0; r < R; r++)
        for (int64_t j = 0; j < n; j++) acc[r * n + j] += ds[r * np + j];
}
/* One head's slot of the gradient's scratch (see the layout there): the packed q (times its scale), the output's
 * gradient, k and v by row, and for the cosine attention (cosine != 0) the normalised q and the norms, else NULL. */
typedef struct {
    float *qs, *go, *kr, *vr, *qh, *qnrm, *knrm;
} head_slot;

static inline head_slot slot_of(float *base, int64_t nq, int64_t np, int64_t n, int64_t d, int64_t dp, int cosine) {
    head_slot s;
    s.qs = base, s.go = s.qs + nq * dp, s.kr = s.go + nq * dp, s.vr = s.kr + np * dp;
    s.qh = cosine ? s.vr + n * d : NULL, s.qnrm = cosine ? s.qh + nq * dp : NULL, s.knrm = cosine ? s.qnrm + nq : NULL;
    return s;
}
/* Token i of window w: its row in qkv / g / dqkv (the window layout's own row, or the map row through rows), or -1
 * for a padding token of the map layout. */
static inline int64_t token_row(const int64_t *rows, int64_t w, int64_t i, int64_t nw, int64_t n, int64_t img_rows) {
    if (rows == NULL) return w * n + i;
    const int64_t r = rows[(w % nw) * n + i];
    return r < 0 ? -1 : (w / nw) * img_rows + r;
}
#endif

int CAT(mmplugin_window_attention_grad_, SUFFIX)(const T *qkv, const T *g, const float *pos, const float *mask,
                                       int64_t windows, int64_t nw, int64_t heads, int64_t n, int64_t d, float scale,
                                       T *dqkv, float *dpos, const int64_t *rows, const T *pad,
                                       int64_t img_rows, float *dpad, int threads, const float *cosine, float *dcos) {
    const int64_t np = round_up(n, KV * VW), dp = round_up(d, DV * VW), nq = round_up(n, ROWS);
    const int64_t c = heads * d, row = 3 * c;
    /* per thread: kt, vt (dp, np) keys and values transposed; p, ds (nq, np) probabilities and score gradients; acc
     * (heads, n, n) the thread's position-bias gradient; tmp (dp) a row; accpad (3C) the padding tokens' gradient;
     * for the cosine attention accc (heads) the logit scales' gradient and dqs, dks (nq, dp) the normalised q and k
     * gradients; then one slot per head of the window's packed operands: qs, go (nq, dp); kr (np, dp) keys by row;
     * vr (n, d) values by row, before their transposition; for the cosine attention qh (nq, dp) the normalised
     * queries and qnrm, knrm (nq) norms */
    const int64_t slot = 2 * nq * dp + np * dp + n * d + (cosine == NULL ? 0 : nq * dp + 2 * nq);
    const int64_t acc_at = 2 * dp * np + 2 * nq * np; /* acc's offset in a buffer */
    const int64_t slots_at = acc_at + heads * n * n + dp + row + (cosine == NULL ? 0 : heads + 2 * nq * dp);
    const int64_t floats = slots_at + heads * slot;
    const int team = windows < threads ? (int)(windows > 0 ? windows : 1) : (threads > 0 ? threads : 1);
    /* each thread's buffer, kept past the parallel region: the bias and padding gradients are summed over the
     * threads in thread order, so a call gives the same bits every time at a given thread count */
    float **bufs = (float **)calloc((size_t)team, sizeof(float *));
    if (bufs == NULL) return 1;
    int failed = 0;
#pragma omp parallel num_threads(team)
    {
    float *buf = (float *)calloc((size_t)floats, sizeof(float)); /* padding rows and columns stay zero */
    if (buf == NULL) {
#pragma omp atomic write
        failed = 1;
    }
    bufs[THREAD_NUM()] = buf;
    float *kt = buf, *vt = kt + dp * np, *p = vt + dp * np, *ds = p + nq * np, *acc = ds + nq * np;
    float *tmp = acc + heads * n * n, *accpad = tmp + dp, *accc = accpad + row, *dqs = accc + heads,
          *dks = dqs + nq * dp;
#pragma omp for schedule(static)
    for (int64_t w = 0; w < windows; w++) {
        if (buf == NULL) continue;
        const float *mw = mask == NULL ? NULL : mask + (w % nw) * n * n;
        /* every head's operands into its slot, in one pass over the window's token rows (each row's heads lie side
         * by side: contiguous reads, where a pass per head read a few lines of every row) */
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = token_row(rows, w, i, nw, n, img_rows);
            for (int64_t h = 0; h < heads; h++) {
                const float sh = cosine == NULL ? scale : scale * cosine[h];
                const head_slot hs = slot_of(buf + slots_at + h * slot, nq, np, n, d, dp, cosine != NULL);
                float *qs = hs.qs, *go = hs.go, *kr = hs.kr, *vr = hs.vr, *qh = hs.qh, *qnrm = hs.qnrm, *knrm = hs.knrm;
                const T *src = (t < 0 ? pad : qkv + t * row) + h * d, *gi = t < 0 ? NULL : g + t * c + h * d;
                float qi = 1.0f, ki = 1.0f; /* divisors: F.normalize's max(|x|, 1e-12) for the cosine attention */
                if (cosine != NULL) { /* sums of squares in the forward kernel's order: vectors, then the rest */
                    vf qv = splat(0.0f), kv = splat(0.0f);
                    int64_t e = 0;
                    for (; e + VW <= d; e += VW) {
                        const vf a = LOADV(src + e), b = LOADV(src + c + e);
                        qv += a * a;
                        kv += b * b;
                    }
                    float qq = hsum(qv), kk = hsum(kv);
                    for (; e < d; e++) {
                        const float a = LOAD(src, e), b = LOAD(src, c + e);
                        qq += a * a;
                        kk += b * b;
                    }
                    qnrm[i] = sqrtf(qq), knrm[i] = sqrtf(kk);
                    qi = qnrm[i] < 1e-12f ? 1e-12f : qnrm[i]; /* NaN stays NaN */
                    ki = knrm[i] < 1e-12f ? 1e-12f : knrm[i];
                }
                int64_t e = 0;
                for (; e + VW <= d; e += VW) { /* the scalar loop's arithmetic, a vector at a time */
                    vf qe = LOADV(src + e), ke = LOADV(src + c + e);
                    if (cosine != NULL) {
                        qe = qe / splat(qi);
                        ke = ke / splat(ki);
                        store_f32(qh + i * dp + e, qe);
                    }
                    store_f32(qs + i * dp + e, qe * splat(sh));
                    store_f32(kr + i * dp + e, ke);
                    store_f32(vr + i * d + e, LOADV(src + 2 * c + e));
                    store_f32(go + i * dp + e, gi == NULL ? splat(0.0f) : LOADV(gi + e));
                }
                for (; e < d; e++) {
                    const float qe = cosine == NULL ? LOAD(src, e) : LOAD(src, e) / qi;
                    if (cosine != NULL) qh[i * dp + e] = qe;
                    qs[i * dp + e] = qe * sh;
                    kr[i * dp + e] = cosine == NULL ? LOAD(src, c + e) : LOAD(src, c + e) / ki;
                    vr[i * d + e] = LOAD(src, 2 * c + e);
                    go[i * dp + e] = gi == NULL ? 0.0f : LOAD(gi, e);
                }
            }
        }
        for (int64_t h = 0; h < heads; h++) {
            const float sh = cosine == NULL ? scale : scale * cosine[h];
            const head_slot hs = slot_of(buf + slots_at + h * slot, nq, np, n, d, dp, cosine != NULL);
            float *qs = hs.qs, *go = hs.go, *kr = hs.kr, *vr = hs.vr, *qh = hs.qh, *qnrm = hs.qnrm, *knrm = hs.knrm;
            transpose_values(kr, n, d, dp, kt, np); /* keys and values transposed, columns beyond n staying zero */
            transpose_values(vr, n, d, d, vt, np);
            const float *ph = pos + h * n * n;
            /* S = qs k^T + pos + mask into p (ROWS rows at a time), then the rows' softmax in place */
            for (int64_t i0 = 0; i0 < n; i0 += ROWS) {
                const int nr = n - i0 < ROWS ? (int)(n - i0) : ROWS;
                for (int64_t c0 = 0; c0 < np; c0 += KV * VW)
                    for (int pass = 0; pass < 2; pass++) { /* S = qs k^T into p, then dP = dO V^T into ds: 16
                                                           * accumulators each (both at once would spill) */
                        const float *lhs = pass == 0 ? qs : go, *rhs = pass == 0 ? kt : vt;
                        float *res = pass == 0 ? p : ds;
                        vf s[ROWS][KV];
                        for (int r = 0; r < ROWS; r++)
                            for (int j = 0; j < KV; j++) s[r][j] = splat(0.0f);
                        for (int64_t e = 0; e < d; e++) {
                            vf kv[KV];
                            for (int j = 0; j < KV; j++) memcpy(&kv[j], rhs + e * np + c0 + j * VW, sizeof(vf));
                            for (int r = 0; r < ROWS; r++) {
                                const vf qv = splat(lhs[(i0 + r) * dp + e]);
                                for (int j = 0; j < KV; j++) s[r][j] += qv * kv[j];
                            }
                        }
                        for (int r = 0; r < nr; r++)
                            for (int j = 0; j < KV; j++) memcpy(res + (i0 + r) * np + c0 + j * VW, &s[r][j], sizeof(vf));
                    }
            }
            for (int64_t i0 = 0; i0 < n; i0 += ROWS) { /* ROWS rows at a time, their chains interleaved */
                const float *mr = mw == NULL ? NULL : mw + i0 * n;
                if (n - i0 >= ROWS)
                    softmax_grad_rows(ROWS, p + i0 * np, ds + i0 * np, ph + i0 * n, mr, acc + (h * n + i0) * n, n, np);
                else
                    for (int64_t i = i0; i < n; i++)
                        softmax_grad_rows(1, p + i * np, ds + i * np, ph + i * n, mw == NULL ? NULL : mw + i * n,
                                          acc + (h * n + i) * n, n, np);
            }
            /* dV = P^T dO, dK = scale * dS^T Q (qs carries the scale), dQ = scale * dS K: ROWS output rows and DV * VW
             * dims at a time, written to the projection's layout; for the cosine attention dK and dS K (unscaled) go
             * to dks and dqs, for the normalisation's gradient below */
            for (int part = 0; part < 3; part++) {
                const float *coef = part == 2 ? ds : (part == 0 ? p : ds); /* indexed [t][j] (transposed) or [j][t] */
                const float *opnd = part == 0 ? go : (part == 1 ? qs : kr);
                const int transposed = part < 2;
                const float mult = part == 2 && cosine == NULL ? scale : 1.0f;
                float *stage = cosine == NULL || part == 0 ? NULL : (part == 1 ? dks : dqs);
                T *dst = dqkv + (part == 0 ? 2 * c : (part == 1 ? c : 0)) + h * d;
                for (int64_t j0 = 0; j0 < n; j0 += ROWS) {
                    const int nr = n - j0 < ROWS ? (int)(n - j0) : ROWS;
                    for (int64_t c0 = 0; c0 < dp; c0 += DV * VW) {
                        vf a[ROWS][DV];
                        for (int r = 0; r < ROWS; r++)
                            for (int j = 0; j < DV; j++) a[r][j] = splat(0.0f);
                        for (int64_t t = 0; t < n; t++) {
                            vf ov[DV];
                            for (int j = 0; j < DV; j++) memcpy(&ov[j], opnd + t * dp + c0 + j * VW, sizeof(vf));
                            for (int r = 0; r < ROWS; r++) {
                                const vf cv = splat(transposed ? coef[t * np + j0 + r] : coef[(j0 + r) * np + t]);
                                for (int j = 0; j < DV; j++) a[r][j] += cv * ov[j];
                            }
                        }
                        for (int r = 0; r < nr; r++) {
                            for (int j = 0; j < DV; j++) {
                                const vf o = a[r][j] * splat(mult);
                                memcpy(tmp + j * VW, &o, sizeof(vf));
                            }
                            const int64_t width = d - c0 < DV * VW ? d - c0 : DV * VW;
                            const int64_t t = token_row(rows, w, j0 + r, nw, n, img_rows);
                            if (stage != NULL)
                                memcpy(stage + (j0 + r) * dp + c0, tmp, (size_t)width * sizeof(float));
                            else if (t >= 0) { /* a vector at a time, for either type */
                                int64_t e = 0;
                                for (; e + VW <= width; e += VW) STOREV(dst + t * row + c0 + e, load_f32(tmp + e));
                                for (; e < width; e++) STORE(dst + t * row + c0, e, tmp[e]);
                            }
                            else /* a padding token: its gradient adds to pad's */
                                for (int64_t e = 0; e < width; e++) accpad[(dst - dqkv) + c0 + e] += tmp[e];
                        }
                    }
                }
            }
            for (int64_t i = 0; cosine != NULL && i < n; i++) { /* through the normalisations, and the logit scale */
                const int64_t t = token_row(rows, w, i, nw, n, img_rows);
                float *restrict a = dqs + i * dp, *restrict b = dks + i * dp;
                const float *restrict qe = qh + i * dp, *restrict ke = kr + i * dp;
                float dc = 0.0f, qd = 0.0f, kd = 0.0f;
                for (int64_t e = 0; e < d; e++) {
                    dc += a[e] * qe[e];
                    a[e] *= sh; /* dqn */
                    qd += qe[e] * a[e];
                    kd += ke[e] * b[e];
                }
                accc[h] += scale * dc;
                const int qn = qnrm[i] >= 1e-12f, kn = knrm[i] >= 1e-12f; /* NaN: the clamp's branch, as PyTorch */
                const float qdiv = qnrm[i] < 1e-12f ? 1e-12f : qnrm[i], kdiv = knrm[i] < 1e-12f ? 1e-12f : knrm[i];
                for (int64_t e = 0; e < d; e++) {
                    a[e] = (qn ? a[e] - qe[e] * qd : a[e]) / qdiv;
                    b[e] = (kn ? b[e] - ke[e] * kd : b[e]) / kdiv;
                }
                for (int part = 0; part < 2; part++) {
                    const float *src = part == 0 ? a : b;
                    const int64_t col = (part == 0 ? 0 : c) + h * d;
                    if (t >= 0) {
                        int64_t e = 0;
                        for (; e + VW <= d; e += VW) STOREV(dqkv + t * row + col + e, load_f32(src + e));
                        for (; e < d; e++) STORE(dqkv + t * row + col, e, src[e]);
                    } else
                        for (int64_t e = 0; e < d; e++) accpad[col + e] += src[e];
                }
            }
        }
    }
    }
    for (int t = 0; t < team; t++) {
        if (bufs[t] == NULL) continue;
        const float *acc = bufs[t] + acc_at, *accpad = acc + heads * n * n + dp;
        for (int64_t e = 0; e < heads * n * n; e++) dpos[e] += acc[e];
        for (int64_t e = 0; rows != NULL && e < row; e++) dpad[e] += accpad[e];
        for (int64_t e = 0; cosine != NULL && e < heads; e++) dcos[e] += accpad[row + e];
        free(bufs[t]);
    }
    free(bufs);
    return failed;
}
