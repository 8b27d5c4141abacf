/* The small, memory-light parts of a Llama-family decode step, one call each instead of ~10-20
 * PyTorch ops (native.py builds this file with the system C compiler and calls it through ctypes).
 *
 * Dimension letters: n live rows, H hidden size, Hq / Hk query / key-value heads, D head dim,
 * I intermediate size, B prompts, P prompt positions, C completion positions, N = B * G rows.
 * All tensors are contiguous float32, row-major.
 *
 * The arithmetic is HF's LlamaRMSNorm, apply_rotary_pos_emb, eager attention (softmax in float32)
 * and SiLU MLP, summed in another order: equal to PyTorch's results to float32 rounding.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Threads decode_attention splits its rows over: OpenMP's (the runtime PyTorch loaded, so the same
 * threads and settings as its own ops), or 1 where the file was built without OpenMP. */
int64_t attention_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* exp(x) for float32 (Cephes' expf: x = k ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial for
 * exp(r), times 2^k; ~1e-7 relative error), written so that the compiler vectorises the loops that
 * call it (libm's expf is a scalar call). Inputs below -87 give ~1e-38 rather than 0. */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;  /* (not fminf/fmaxf: their NaN rules stop vectorising) */
    float k = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - k * 0.693359375f + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);  /* 2^k from its exponent bits (a bit cast that vectorises) */
    return (p * r * r + r + 1.0f) * scale;
}

/* log(x) for normal float32 x > 0 (Cephes' logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)), a
 * polynomial in m - 1; ~1e-7 relative error), vectorisable like fast_exp. */
static inline float fast_log(float x) {
    int32_t bits;
    memcpy(&bits, &x, sizeof bits);
    float e = (float)(((bits >> 23) & 0xff) - 126);
    bits = (bits & 0x007fffff) | 0x3f000000;  /* the mantissa as a float in [0.5, 1) */
    float m;
    memcpy(&m, &bits, sizeof m);
    int small = m < 0.70710678f;
    e = small ? e - 1.0f : e;
    m = small ? m + m - 1.0f : m - 1.0f;
    float z = m * m, y = 7.0376836292e-2f;
    y = y * m - 1.1514610310e-1f;
    y = y * m + 1.1676998740e-1f;
    y = y * m - 1.2420140846e-1f;
    y = y * m + 1.4249322787e-1f;
    y = y * m - 1.6668057665e-1f;
    y = y * m + 2.0000714765e-1f;
    y = y * m - 2.4999993993e-1f;
    y = y * m + 3.3333331174e-1f;
    y = y * m * z - 2.12194440e-4f * e - 0.5f * z;
    return m + y + 0.693359375f * e;
}

/* The keyed uniform number of token v in a row's stream: splitmix64 (Steele et al. 2014) of
 * base + (v + 1) * golden, its top 24 bits as (k + 0.5) / 2^24, in (0, 1). hf.keyed_gumbel computes
 * the same numbers with PyTorch integer ops. */
static inline float keyed_u(uint64_t base, uint64_t v) {
    uint64_t z = base + (v + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

/* tokens[i] = argmax_v scores[i, v] - log(-log(u_i(v))): the Gumbel-max draw from softmax(scores)
 * (Gumbel 1954; Maddison et al. 2014) with row i's noise fixed by base[i]. scores [n, V] (-inf where
 * a warper removed a token); work [V] scratch. The first of equal maxima wins, as torch.argmax. */
void gumbel_argmax(const float *scores, int64_t n, int64_t V, const uint64_t *base, float *restrict work,
                   int64_t *tokens) {
    for (int64_t i = 0; i < n; i++) {
        const float *s = scores + i * V;
        uint64_t b = base[i];
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t v = 0; v < V; v++) {
            work[v] = s[v] - fast_log(-fast_log(keyed_u(b, (uint64_t)v)));
            mx = work[v] > mx ? work[v] : mx;
        }
        int64_t best = 0;
        while (best < V - 1 && !(work[best] == mx)) best++;
        tokens[i] = best;
    }
}

/* h[n, H] += delta[n, H] (when delta is not NULL), then x = h / sqrt(mean(h^2) + eps), times
 * weight[H] when weight is not NULL (the RMSNorm weight; NULL where it is folded into the product
 * that follows). */
void add_rms(float *h, const float *delta, float *x, const float *weight, int64_t n, int64_t H, float eps) {
    for (int64_t i = 0; i < n; i++) {
        float *hi = h + i * H, *xi = x + i * H;
        float ss = 0.0f;
        if (delta) {
            const float *di = delta + i * H;
#pragma omp simd
            for (int64_t j = 0; j < H; j++) hi[j] += di[j];
        }
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < H; j++) ss += hi[j] * hi[j];
        float r = 1.0f / sqrtf(ss / (float)H + eps);
        if (weight) {
#pragma omp simd
            for (int64_t j = 0; j < H; j++) xi[j] = weight[j] * (hi[j] * r);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < H; j++) xi[j] = hi[j] * r;
        }
    }
}

/* act[n, I] = silu(gu[:, :I]) * gu[:, I:] for gu [n, 2 I] (gate and up from one product). */
void silu_mul(const float *gu, float *act, int64_t n, int64_t I) {
    for (int64_t i = 0; i < n; i++) {
        const float *g = gu + i * 2 * I, *u = g + I;
        float *a = act + i * I;
#pragma omp simd
        for (int64_t j = 0; j < I; j++) a[j] = g[j] / (1.0f + fast_exp(-g[j])) * u[j];
    }
}

/* out[D] = x * cos + rotate_half(x) * sin, rotate_half(x) = (-x[D/2:], x[:D/2]). */
static void rope(const float *x, const float *cos, const float *sin, float *out, int64_t D) {
    int64_t half = D / 2;
    for (int64_t j = 0; j < half; j++) {
        out[j] = x[j] * cos[j] - x[j + half] * sin[j];
        out[j + half] = x[j + half] * cos[j + half] + x[j] * sin[j + half];
    }
}

typedef float v16 __attribute__((vector_size(64), aligned(4)));  /* 16 floats; unaligned loads */

/* init + sum_{i < count} c[i] * row_i[0:16], row_i = base + i * stride: 16 lanes in registers, four
 * partial sums over i (independent chains hide the FMA latency). */
static v16 sum_rows16(const float *c, const float *base, int64_t stride, int64_t count, v16 init) {
    v16 a0 = init, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t i = 0;
    for (; i + 4 <= count; i += 4) {
        a0 += c[i] * *(const v16 *)(base + i * stride);
        a1 += c[i + 1] * *(const v16 *)(base + (i + 1) * stride);
        a2 += c[i + 2] * *(const v16 *)(base + (i + 2) * stride);
        a3 += c[i + 3] * *(const v16 *)(base + (i + 3) * stride);
    }
    for (; i < count; i++) a0 += c[i] * *(const v16 *)(base + i * stride);
    return (a0 + a1) + (a2 + a3);
}

/* s[l] = scale * sum_e q[e] kt[e, l] for l < len, keys transposed kt [D, stride]: 16 positions at a
 * time. The last block may run past len: kt's rows are padded to a multiple of 16 (stride) and s has
 * room for 15 more entries; what lands there is overwritten or never read. */
static void scores(const float *q, const float *kt, int64_t stride, int64_t len, float scale, int64_t D,
                   float *restrict s) {
    const v16 zero = {0};
    for (int64_t l = 0; l < len; l += 16) *(v16 *)(s + l) = sum_rows16(q, kt + l, stride, D, zero) * scale;
}

/* acc[D] (= 0 first when fresh) += sum_l w[l] v[l, :] for v [len, D]: 16 columns at a time; the last
 * D % 16 columns one by one. */
static void weighted_sum(const float *w, const float *v, int64_t len, int64_t D, float *restrict acc, int fresh) {
    const v16 zero = {0};
    int64_t e = 0;
    for (; e + 16 <= D; e += 16)
        *(v16 *)(acc + e) = sum_rows16(w, v + e, D, len, fresh ? zero : *(const v16 *)(acc + e));
    for (; e < D; e++) {
        float a = fresh ? 0.0f : acc[e];
        for (int64_t l = 0; l < len; l++) a += w[l] * v[l * D + e];
        acc[e] = a;
    }
}

/* One decode step of attention for every live row.
 *   qkv [n, (Hq + 2 Hk) D]: this step's q, k, v (before the rotary embedding);
 *   cos, sin [n, D]: each row's rotary angles at its position;
 *   pkt [B, Hk, D, P16], pv [B, Hk, P, D]: the prompts' keys (transposed, rows padded to P16, a
 *     multiple of 16) and values, one copy per prompt, read by its G rows;
 *   pmask [B, P]: 1 where the prompt has a token (left padding is 0), or NULL when none is padding;
 *   ckt [N, Hk, D, C], cv [N, Hk, C, D]: the completions' keys (transposed; C a multiple of 16) and
 *     values by global row;
 *     this step writes slot t, and each row attends to slots 0..t (every live row has decoded t
 *     tokens before this one);
 *   rows [n]: the global row of each live row, whose prompt is rows[i] / g;
 *   work [attention_threads(), Hq / Hk, P + C + 16] scratch, one slice per thread; out [n, Hq D].
 * Rows are independent (each writes its own cache slots and output row), so they are split over the
 * threads; at batch 32 this step was ~20% of a decode step on one core.
 * Query head h reads key-value head h / (Hq / Hk), as HF's repeat_kv orders them. Keys are stored
 * transposed so that scores are computed 16 positions at a time with no horizontal sums. */
void decode_attention(const float *qkv, const float *cos, const float *sin, const float *pkt, const float *pv,
                      const uint8_t *pmask, int64_t P, int64_t P16, float *ckt, float *cv, int64_t C, int64_t t,
                      const int64_t *rows, int64_t g, int64_t n, int64_t Hq, int64_t Hk, int64_t D, float scale,
                      float *work, float *out) {
    int64_t G = Hq / Hk, L = P + t + 1, width = (Hq + 2 * Hk) * D, W = P + C + 16;
#pragma omp parallel for schedule(static) if (n >= 4)
    for (int64_t i = 0; i < n; i++) {
        float q[Hq * D], kt[D], acc[D];
#ifdef _OPENMP
        float *scratch = work + (int64_t)omp_get_thread_num() * G * W;
#else
        float *scratch = work;
#endif
        const float *x = qkv + i * width, *ci = cos + i * D, *si = sin + i * D;
        int64_t r = rows[i], b = r / g;
        for (int64_t h = 0; h < Hq; h++) rope(x + h * D, ci, si, q + h * D, D);
        for (int64_t j = 0; j < Hk; j++) {  /* this step's key and value into slot t */
            float *col = ckt + (r * Hk + j) * D * C + t, *vslot = cv + ((r * Hk + j) * C + t) * D;
            rope(x + (Hq + j) * D, ci, si, kt, D);
            for (int64_t e = 0; e < D; e++) col[e * C] = kt[e];
            memcpy(vslot, x + (Hq + Hk + j) * D, D * sizeof(float));
        }
        const uint8_t *m = pmask ? pmask + b * P : 0;
        for (int64_t j = 0; j < Hk; j++) {
            const float *kp = pkt + (b * Hk + j) * D * P16, *vp = pv + (b * Hk + j) * P * D;
            const float *kc = ckt + (r * Hk + j) * D * C, *vc = cv + (r * Hk + j) * C * D;
            for (int64_t a = 0; a < G; a++) {  /* query head h = j G + a */
                const float *qh = q + (j * G + a) * D;
                float *restrict s = scratch + a * W, mx = -3.0e38f, sum = 0.0f;
                scores(qh, kp, P16, P, scale, D, s);
                scores(qh, kc, C, t + 1, scale, D, s + P);
                if (m)  /* padding positions of the prompt: no weight */
                    for (int64_t p = 0; p < P; p++) s[p] = m[p] ? s[p] : -3.0e38f;
#pragma omp simd reduction(max : mx)
                for (int64_t l = 0; l < L; l++) mx = s[l] > mx ? s[l] : mx;
#pragma omp simd
                for (int64_t l = 0; l < L; l++) s[l] = fast_exp(s[l] - mx);
                if (m)
                    for (int64_t p = 0; p < P; p++) s[p] = m[p] ? s[p] : 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int64_t l = 0; l < L; l++) sum += s[l];
                weighted_sum(s, vp, P, D, acc, 1);
                weighted_sum(s + P, vc, t + 1, D, acc, 0);
                float *o = out + i * Hq * D + (j * G + a) * D, inv = 1.0f / sum;
                for (int64_t e = 0; e < D; e++) o[e] = acc[e] * inv;
            }
        }
    }
}

/* y[8, N] = x[8, K] @ W^T for weights packed in panels of 32 output columns, wp [N / 32, K, 32] (each
 * panel's K x 32 block contiguous, read start to end): 16 sums of 16 lanes in registers per panel, every
 * weight read once for the 8 rows, each x value broadcast. The panels are split over the OpenMP threads. */
void panel_linear8(const float *x, int64_t K, const float *wp, int64_t N, float *y) {
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < N / 32; p++) {
        const float *w = wp + p * K * 32;
        v16 a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
        v16 a4 = {0}, b4 = {0}, a5 = {0}, b5 = {0}, a6 = {0}, b6 = {0}, a7 = {0}, b7 = {0};
        for (int64_t k = 0; k < K; k++) {
            v16 u = *(const v16 *)(w + k * 32), v = *(const v16 *)(w + k * 32 + 16);
            float x0 = x[k], x1 = x[K + k], x2 = x[2 * K + k], x3 = x[3 * K + k];
            float x4 = x[4 * K + k], x5 = x[5 * K + k], x6 = x[6 * K + k], x7 = x[7 * K + k];
            a0 += x0 * u; b0 += x0 * v; a1 += x1 * u; b1 += x1 * v;
            a2 += x2 * u; b2 += x2 * v; a3 += x3 * u; b3 += x3 * v;
            a4 += x4 * u; b4 += x4 * v; a5 += x5 * u; b5 += x5 * v;
            a6 += x6 * u; b6 += x6 * v; a7 += x7 * u; b7 += x7 * v;
        }
        float *o = y + p * 32;
        *(v16 *)(o) = a0; *(v16 *)(o + 16) = b0; *(v16 *)(o + N) = a1; *(v16 *)(o + N + 16) = b1;
        *(v16 *)(o + 2 * N) = a2; *(v16 *)(o + 2 * N + 16) = b2; *(v16 *)(o + 3 * N) = a3; *(v16 *)(o + 3 * N + 16) = b3;
        *(v16 *)(o + 4 * N) = a4; *(v16 *)(o + 4 * N + 16) = b4; *(v16 *)(o + 5 * N) = a5; *(v16 *)(o + 5 * N + 16) = b5;
        *(v16 *)(o + 6 * N) = a6; *(v16 *)(o + 6 * N + 16) = b6; *(v16 *)(o + 7 * N) = a7; *(v16 *)(o + 7 * N + 16) = b7;
    }
}
