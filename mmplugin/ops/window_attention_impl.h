/* The entry point of window_attention.c for one element type T (float or bf16 bits), with LOAD / STORE converting
 * to and from fp32; included once per type. A call handles the windows [begin, end), split over `threads` OpenMP
 * threads (torch's own, where the library shares torch's OpenMP runtime): every head of a window is packed in one pass over
 * the window's rows (which lie together in a fused qkv projection's output), attended, and written back row by row.
 * Returns 0, or 1 when a thread's scratch buffer cannot be allocated. */
int CAT(mmplugin_window_attention_, SUFFIX)(const T *q, const T *k, const T *v, int64_t q_w, int64_t q_h, int64_t q_n,
                                            int64_t k_w, int64_t k_h, int64_t k_n, int64_t v_w, int64_t v_h,
                                            int64_t v_n, const float *pos, const float *mask, const float *cosine, int64_t nw,
                                            int64_t heads, int64_t n, int64_t d, float scale, T *out,
                                            const int64_t *rows, const T *pad, int64_t img_rows, int threads,
                                            int64_t begin, int64_t end) {
    const int64_t np = round_up(n, KV * VW), dp = round_up(d, DV * VW), nq = round_up(n, ROWS);
    const int64_t per_head = nq * d + d * np + n * dp + n * dp; /* queries, keys transposed, values, results */
    /* + the padded position bias, the bias with a window's mask (with a mask only), and the attention's scratch:
     * scores, bf16 numerators, output sums (rows of np, np and dp; ROWS of each, 16 on AMX tiles) */
    const int64_t biases = mask == NULL ? 1 : 2;
    const int64_t floats = heads * per_head + biases * heads * n * np + 16 * (np + np + dp);
#if defined(BF16_DOT) && defined(IS_BF16)
    /* bf16 operands in the pair layouts of attend_unit_bf16dot (in the same per-head slots: bf16 takes half the
     * room): as they are, or for the cosine attention normalised in fp32 and rounded (the products then need no
     * scale) */
    const int dot = d % 2 == 0;
    const float dot_scale = cosine == NULL ? scale : 1.0f;
#else
    const int dot = 0;
#endif
#if defined(AMX) && defined(IS_BF16)
    /* on AMX tiles where enabled: head dims of whole tiles, and windows of at least 32 tokens, whose padded keys and
     * value pairs (np <= 2n) lie within the zeroed buffer slots */
    const int amx = dot && amx_on && d % 32 == 0 && np <= 2 * n;
#endif
    int failed = 0;
#pragma omp parallel num_threads(end - begin < threads ? (int)(end - begin > 0 ? end - begin : 1) : threads)
    {
    float *buf = (float *)malloc((size_t)floats * sizeof(float));
    if (buf == NULL) {
#pragma omp atomic write
        failed = 1;
    } else {
        memset(buf, 0, (size_t)floats * sizeof(float)); /* the padding rows and columns stay zero */
        for (int64_t row = 0; row < biases * heads * n; row++) /* the biases' padding columns stay -inf */
            for (int64_t j = n; j < np; j++) buf[heads * per_head + row * np + j] = -__builtin_inff();
        for (int64_t row = 0; row < heads * n; row++)
            memcpy(buf + heads * per_head + row * np, pos + row * n, (size_t)n * sizeof(float));
#if defined(AMX) && defined(IS_BF16)
        if (amx) amx_configure();
#endif
    }
    /* the position bias padded to np columns, once per call: the bias of every window whose mask is zero (most of a
     * shifted map's windows, all of an unshifted one's); bias: the position bias plus a window's nonzero mask */
    float *pos_padded = buf + heads * per_head, *bias = pos_padded + heads * n * np;
    float *scores = pos_padded + biases * heads * n * np, *numerators = scores + 16 * np;
#pragma omp for schedule(static)
    for (int64_t w = begin; w < end; w++) {
        if (buf == NULL) continue;
        if (w + AHEAD < end && q_h == d && k_h == d && v_h == d) /* the next window's q, k, v rows towards L2 while
                          * this one is computed (each token's heads side by side): gathered from a map larger than
                          * the caches, their first reads otherwise wait on memory */
            for (int64_t i = 0; i < n; i++) {
                const T *rq = q + (w + AHEAD) * q_w + i * q_n, *rk = k + (w + AHEAD) * k_w + i * k_n,
                        *rv = v + (w + AHEAD) * v_w + i * v_n;
                if (rows != NULL) {
                    const int64_t r = rows[((w + AHEAD) % nw) * n + i];
                    if (r < 0) continue;
                    const int64_t t = ((w + AHEAD) / nw) * img_rows + r;
                    rq = q + t * q_n, rk = k + t * k_n, rv = v + t * v_n;
                }
                for (int64_t e = 0; e < heads * d; e += 64 / (int64_t)sizeof(T)) {
                    __builtin_prefetch(rq + e, 0, 2);
                    __builtin_prefetch(rk + e, 0, 2);
                    __builtin_prefetch(rv + e, 0, 2);
                }
            }
#if defined(BF16_DOT) && defined(IS_BF16)
        const T *vprev = NULL; /* the previous token's value row (pairs of tokens, bf16 dot products) */
#endif
        for (int64_t i = 0; i < n; i++) {
            /* the token's q, k and v rows: in the windows' layout, or gathered from the map (padding: pad's row) */
            const T *qr = q + w * q_w + i * q_n, *kr = k + w * k_w + i * k_n, *vr = v + w * v_w + i * v_n;
            if (rows != NULL) {
                const int64_t r = rows[(w % nw) * n + i];
                const int64_t t = (w / nw) * img_rows + r;
                qr = r < 0 ? pad : q + t * q_n;
                kr = r < 0 ? pad + (k - q) : k + t * k_n;
                vr = r < 0 ? pad + (v - q) : v + t * v_n;
            }
#if defined(BF16_DOT) && defined(IS_BF16)
            if (dot)
                pack_token_bf16dot(qr, kr, vr, vprev, q_h, k_h, v_h, heads, i, n, d, nq, np, dp, per_head, cosine,
                                   scale, buf);
            vprev = vr;
#endif
            for (int64_t h = 0; !dot && h < heads; h++) {
                /* q (times the scale), k and v rows; k into the head's result slot, transposed once the window is
                 * packed (the slot is written only by the head's attention, after that) */
                float *restrict qp = buf + h * per_head + i * d, *restrict vp = buf + h * per_head + nq * d + d * np + i * dp,
                                *restrict kp = buf + h * per_head + nq * d + d * np + n * dp + i * d;
                const T *restrict qi = qr + h * q_h, *restrict ki = kr + h * k_h, *restrict vi = vr + h * v_h;
                int64_t c = 0;
                if (cosine == NULL) {
                    for (; c + VW <= d; c += VW) {
                        store_f32(qp + c, LOADV(qi + c) * splat(scale));
                        store_f32(kp + c, LOADV(ki + c));
                        store_f32(vp + c, LOADV(vi + c));
                    }
                    for (; c < d; c++) qp[c] = LOAD(qi, c) * scale, kp[c] = LOAD(ki, c), vp[c] = LOAD(vi, c);
                } else { /* F.normalize's x / max(|x|, 1e-12), q then times the head's logit scale */
                    vf qq = splat(0.0f), kk = splat(0.0f);
                    for (; c + VW <= d; c += VW) {
                        const vf a = LOADV(qi + c), b = LOADV(ki + c);
                        store_f32(qp + c, a);
                        store_f32(kp + c, b);
                        store_f32(vp + c, LOADV(vi + c));
                        qq += a * a;
                        kk += b * b;
                    }
                    float qs = hsum(qq), ks = hsum(kk);
                    for (; c < d; c++) {
                        qp[c] = LOAD(qi, c), kp[c] = LOAD(ki, c), vp[c] = LOAD(vi, c);
                        qs += qp[c] * qp[c];
                        ks += kp[c] * kp[c];
                    }
                    float qn = sqrtf(qs), kn = sqrtf(ks), s = cosine[h] * scale;
                    qn = qn < 1e-12f ? 1e-12f : qn; /* NaN stays NaN */
                    kn = kn < 1e-12f ? 1e-12f : kn;
                    for (c = 0; c + VW <= d; c += VW) {
                        store_f32(qp + c, load_f32(qp + c) / splat(qn) * splat(s));
                        store_f32(kp + c, load_f32(kp + c) / splat(kn));
                    }
                    for (; c < d; c++) qp[c] = qp[c] / qn * s, kp[c] = kp[c] / kn;
                }
            }
        }
        const float *mw = mask == NULL || zero_mask(mask + (w % nw) * n * n, n * n) ? NULL : mask + (w % nw) * n * n;
        const float *wb = mw == NULL ? pos_padded : bias;
        for (int64_t h = 0; mw != NULL && h < heads; h++) /* position bias + the window's mask, rows padded to np */
            for (int64_t i = 0; i < n; i++) {
                float *restrict b = bias + (h * n + i) * np;
                const float *restrict p = pos + (h * n + i) * n, *restrict m = mw + i * n;
                for (int64_t j = 0; j < n; j++) b[j] = p[j] + m[j];
            }
        for (int64_t h = 0; h < heads; h++) {
            float *qp = buf + h * per_head, *kt = qp + nq * d, *vp = kt + d * np, *res = vp + n * dp;
            transpose_values(res, n, dot ? d / 2 : d, dot ? d / 2 : d, kt, np); /* the packed key rows */
#if defined(BF16_DOT) && defined(IS_BF16)
            if (dot) {
#if defined(AMX) && defined(IS_BF16)
                if (amx) {
                    attend_unit_amx((const uint16_t *)qp, (const uint16_t *)kt, (const uint16_t *)vp, wb + h * n * np,
                                    n, d, np, dp, dot_scale, scores, (uint16_t *)numerators, numerators + 16 * np, res);
                    continue;
                }
#endif
                attend_unit_bf16dot((const uint16_t *)qp, (const uint16_t *)kt, (const uint16_t *)vp, wb + h * n * np,
                                    n, d, np, dp, dot_scale, scores, (uint16_t *)numerators, res);
                continue;
            }
#endif
            attend_unit(qp, kt, vp, wb + h * n * np, n, d, np, dp, scores, res);
        }
        for (int64_t i = 0; i < n; i++) {
            /* the token's output row: in the windows' layout, or its map row (padding tokens are not written) */
            T *o = out + (w * n + i) * heads * d;
            if (rows != NULL) {
                const int64_t r = rows[(w % nw) * n + i];
                if (r < 0) continue;
                o = out + ((w / nw) * img_rows + r) * heads * d;
            }
            for (int64_t h = 0; h < heads; h++) {
                const float *restrict res = buf + h * per_head + nq * d + d * np + n * dp + i * dp;
                T *restrict oi = o + h * d;
                int64_t c = 0;
                for (; c + VW <= d; c += VW) STOREV(oi + c, load_f32(res + c));
                for (; c < d; c++) STORE(oi, c, res[c]);
            }
        }
    }
#if defined(AMX) && defined(IS_BF16)
    if (amx && buf != NULL) amx_release();
#endif
    free(buf);
    }
    return failed;
}
