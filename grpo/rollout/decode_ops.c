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
    /* top 24 bits through int32 (exact): AVX2 has no vector uint64 -> float conversion, and GCC
     * emulated it lane by lane (the whole draw ran at 32 ns a token, 20x slower than on AVX-512) */
    int32_t k = (int32_t)(z >> 40);
    return ((float)k + 0.5f) * (1.0f / 16777216.0f);
}

/* tokens[i] = argmax_v scores[i, v] - log(-log(u_i(v))): the Gumbel-max draw from softmax(scores)
 * (Gumbel 1954; Maddison et al. 2014) with row i's noise fixed by base[i]. scores [n, V] (-inf where
 * a warper removed a token); work [n, V] scratch. The first of equal maxima wins, as torch.argmax.
 * Rows are independent and split over the OpenMP threads. */
void gumbel_argmax(const float *scores, int64_t n, int64_t V, const uint64_t *base, float *restrict work,
                   int64_t *tokens) {
#pragma omp parallel for schedule(static) if (n >= 2)
    for (int64_t i = 0; i < n; i++) {
        const float *s = scores + i * V;
        float *restrict w = work + i * V;
        uint64_t b = base[i];
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t v = 0; v < V; v++) {
            w[v] = s[v] - fast_log(-fast_log(keyed_u(b, (uint64_t)v)));
            mx = w[v] > mx ? w[v] : mx;
        }
        int64_t best = 0;
        while (best < V - 1 && !(w[best] == mx)) best++;
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

/* The vector width the build targets: 16 floats (one zmm register) where the compiler may use AVX-512,
 * else 8 (one ymm, AVX2). GCC splits a wider vector type into halves and, when the halves do not fit
 * the 16 ymm registers of AVX2, spills them through the stack on every use: the 16 accumulators of
 * 16 lanes that panel_linear kept on AVX-512 ran at 0.6 GB/s on an AVX2 core (20 GB/s with these). */
#if defined(__AVX512F__)
#define VL 16
#else
#define VL 8
#endif
typedef float vec __attribute__((vector_size(VL * 4), aligned(4)));  /* VL floats; unaligned loads */

int64_t vector_lanes(void) { return VL; }

/* init + sum_{i < count} c[i] * row_i[0:VL], row_i = base + i * stride: VL lanes in registers, four
 * partial sums over i (independent chains hide the FMA latency). */
static inline vec sum_rows(const float *c, const float *base, int64_t stride, int64_t count, vec init) {
    vec a0 = init, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t i = 0;
    for (; i + 4 <= count; i += 4) {
        a0 += c[i] * *(const vec *)(base + i * stride);
        a1 += c[i + 1] * *(const vec *)(base + (i + 1) * stride);
        a2 += c[i + 2] * *(const vec *)(base + (i + 2) * stride);
        a3 += c[i + 3] * *(const vec *)(base + (i + 3) * stride);
    }
    for (; i < count; i++) a0 += c[i] * *(const vec *)(base + i * stride);
    return (a0 + a1) + (a2 + a3);
}

/* s[l] = scale * sum_e q[e] kt[e, l] for l < len, keys transposed kt [D, stride]: VL positions at a
 * time. The last block may run past len: kt's rows are padded to a multiple of 16 (stride; VL
 * divides 16) and s has room for 15 more entries; what lands there is overwritten or never read. */
static void scores(const float *q, const float *kt, int64_t stride, int64_t len, float scale, int64_t D,
                   float *restrict s) {
    const vec zero = {0};
    for (int64_t l = 0; l < len; l += VL) *(vec *)(s + l) = sum_rows(q, kt + l, stride, D, zero) * scale;
}

/* acc[D] (= 0 first when fresh) += sum_l w[l] v[l, :] for v [len, D]: VL columns at a time; the last
 * D % VL columns one by one. */
static void weighted_sum(const float *w, const float *v, int64_t len, int64_t D, float *restrict acc, int fresh) {
    const vec zero = {0};
    int64_t e = 0;
    for (; e + VL <= D; e += VL)
        *(vec *)(acc + e) = sum_rows(w, v + e, D, len, fresh ? zero : *(const vec *)(acc + e));
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
 * transposed so that scores are computed VL positions at a time with no horizontal sums. */
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

/* Output columns per weight panel of panel_linear: two vectors on AVX-512 (32 zmm registers hold
 * 8 rows x 2 accumulators, the two weight vectors and a broadcast), one on AVX2 (16 ymm registers:
 * 8 accumulators, the weight vector, a broadcast). Measured on one AVX2 core: one vector per panel
 * 19.6-20.1 GB/s on the four layer products, two 14.2-14.5 GB/s (spilled), two with 4 rows a pass
 * 15.7-16.1. */
#if VL == 16
#define PANEL_VECTORS 2
#else
#define PANEL_VECTORS 1
#endif
#define PANEL (PANEL_VECTORS * VL)

int64_t panel_width(void) { return PANEL; }

/* Weights as the panel products read them: float32, or bfloat16 (the top 16 bits of a float32, rounded
 * by the caller) widened to float32 in registers, a zero-extend and a 16-bit shift: exact, on any AVX2
 * or AVX-512 core. Why bfloat16: a decode step of few rows reads every weight once and is bound by
 * memory bandwidth; half the bytes per weight is up to half the step (serving: the weights never change). */
typedef uint16_t hvec __attribute__((vector_size(VL * 2), aligned(2)));
typedef uint32_t uvec __attribute__((vector_size(VL * 4)));

static inline vec widen(const uint16_t *w) {
    uvec u = __builtin_convertvector(*(const hvec *)w, uvec) << 16;
    vec f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* One panel (K x PANEL weights, wf float32 or wh bfloat16) times ROWS rows of x into y: ROWS x
 * PANEL_VECTORS accumulators in registers, each x value broadcast. ROWS and the weight type are
 * constants at every call, so each call site compiles to its own loop. ``fetch``: prefetch the panel
 * (the pass that reads it from memory), one prefetch per 64-byte line, 4 KiB ahead: the hardware
 * prefetcher alone kept one AVX2 core at 13.6 GB/s on 30 layers' weights (past the caches), this at
 * 16.9 (2 cores: 21.6 -> 29.5). */
static inline __attribute__((always_inline)) void panel_rows(const float *x, int64_t K, const float *wf,
                                                             const uint16_t *wh, const int ROWS, int fetch,
                                                             float *y, int64_t N) {
    vec acc[8][PANEL_VECTORS];
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < PANEL_VECTORS; v++) acc[r][v] = (vec){0};
    for (int64_t k = 0; k < K; k++) {
        if (fetch)
            for (int64_t c = 0; c < PANEL; c += 16) {
                if (wf && (k * PANEL + c) % 16 == 0) __builtin_prefetch(wf + k * PANEL + c + 1024, 0, 0);
                if (wh && (k * PANEL + c) % 32 == 0) __builtin_prefetch(wh + k * PANEL + c + 2048, 0, 0);
            }
        vec wv[PANEL_VECTORS];
        for (int v = 0; v < PANEL_VECTORS; v++)
            wv[v] = wf ? *(const vec *)(wf + k * PANEL + v * VL) : widen(wh + k * PANEL + v * VL);
        for (int r = 0; r < ROWS; r++) {
            float xr = x[r * K + k];
            for (int v = 0; v < PANEL_VECTORS; v++) acc[r][v] += xr * wv[v];
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int v = 0; v < PANEL_VECTORS; v++) *(vec *)(y + r * N + v * VL) = acc[r][v];
}

/* One pass of ROWS rows over panel p (a constant ROWS at each call: its own loop). */
#define PANEL_PASS(ROWS) \
    (f ? panel_rows(x + r0 * K, K, f, 0, ROWS, r0 == 0, y + r0 * N + p * PANEL, N) \
       : panel_rows(x + r0 * K, K, 0, h, ROWS, r0 == 0, y + r0 * N + p * PANEL, N))

/* y[n, N] = x[n, K] @ W^T for weights packed in panels of PANEL output columns, wp [N / PANEL, K, PANEL]
 * (each panel's K x PANEL block contiguous, read start to end): for each panel, passes of 8 rows, then
 * one pass of the 1-7 rows left (a step of 1-7 rows computes only its own rows; the panel, 18-49 KiB,
 * comes from memory once and from L1/L2 for the other passes). A pass costs about the same for 1 to 8
 * rows (each weight loaded, and widened from bfloat16, once per pass; SmolLM2-135M's products on the
 * AVX-512 EPYC, bfloat16: 4 rows in one pass 5.1 ms, one row at a time 14.3 ms), so the rows left take
 * one pass, not one each. Each row's sums run in the same order in a pass of any size: a row's result
 * does not depend on the rows beside it. The panels are split over the OpenMP threads (static
 * schedule: a thread's panels are consecutive, so its prefetches run into the panel it reads next).
 * ``wh`` (bfloat16 panels) is read where ``wf`` is NULL. */
static void panels(const float *x, int64_t n, int64_t K, const float *wf, const uint16_t *wh, int64_t N, float *y) {
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < N / PANEL; p++) {
        const float *f = wf ? wf + p * K * PANEL : 0;
        const uint16_t *h = wf ? 0 : wh + p * K * PANEL;
        int64_t r0 = 0;
        for (; r0 + 8 <= n; r0 += 8) PANEL_PASS(8);
        switch (n - r0) {  /* a constant ROWS per case: each its own loop, its accumulators in registers */
            case 7: PANEL_PASS(7); break;
            case 6: PANEL_PASS(6); break;
            case 5: PANEL_PASS(5); break;
            case 4: PANEL_PASS(4); break;
            case 3: PANEL_PASS(3); break;
            case 2: PANEL_PASS(2); break;
            case 1: PANEL_PASS(1); break;
        }
    }
}

void panel_linear(const float *x, int64_t n, int64_t K, const float *wp, int64_t N, float *y) {
    panels(x, n, K, wp, 0, N, y);
}

/* panel_linear with the weights rounded to bfloat16 (the sums stay float32): the product of x and the
 * rounded weights. */
void panel_linear_bf16(const float *x, int64_t n, int64_t K, const uint16_t *wp, int64_t N, float *y) {
    panels(x, n, K, 0, wp, N, y);
}

/* Attention of m query tokens over a paged KV cache (serving: continuous batching).
 *   qkv [m, (Hq + 2 Hk) D]: each token's q, k, v before the rotary embedding; cos, sin [m, D];
 *   kp [pages, Hk, D, S]: keys, each page's S positions transposed (S a multiple of 16);
 *   vp [pages, Hk, S, D]: values;
 *   table [rows, W]: the pages of each row, in position order (page k holds positions k S .. k S + S - 1);
 *   row [m], pos [m]: token i is row row[i]'s token at position pos[i]; its key and value are written
 *     there, then it attends to that row's positions 0 .. pos[i] (a row's tokens in one call are
 *     consecutive positions: a chunk of its prompt, or one decoded token);
 *   work [attention_threads(), Hq / Hk, W S + 16] scratch; out [m, Hq D].
 * Two passes: every key and value is written before any token attends, so a prompt chunk's tokens
 * see each other's keys (causal: token i reads only positions <= pos[i]). A row's positions need no
 * padding or mask: a row holds its own tokens from position 0, so rows of any lengths share a call.
 * Query head h reads key-value head h / (Hq / Hk), as HF's repeat_kv orders them. */
void paged_attention(const float *qkv, const float *cos, const float *sin, float *kp, float *vp, int64_t S,
                     const int64_t *table, int64_t W, const int64_t *row, const int64_t *pos, int64_t m,
                     int64_t Hq, int64_t Hk, int64_t D, float scale, float *work, float *out) {
    int64_t G = Hq / Hk, width = (Hq + 2 * Hk) * D, span = W * S + 16;
#pragma omp parallel for schedule(static) if (m >= 4)
    for (int64_t i = 0; i < m; i++) {
        float kt[D];
        const float *x = qkv + i * width, *ci = cos + i * D, *si = sin + i * D;
        int64_t page = table[row[i] * W + pos[i] / S], at = pos[i] % S;
        for (int64_t j = 0; j < Hk; j++) {
            float *col = kp + (page * Hk + j) * D * S + at, *vslot = vp + ((page * Hk + j) * S + at) * D;
            rope(x + (Hq + j) * D, ci, si, kt, D);
            for (int64_t e = 0; e < D; e++) col[e * S] = kt[e];
            memcpy(vslot, x + (Hq + Hk + j) * D, D * sizeof(float));
        }
    }
#pragma omp parallel for schedule(dynamic, 1) if (m >= 2)
    for (int64_t i = 0; i < m; i++) {
        float q[Hq * D], acc[D];
#ifdef _OPENMP
        float *scratch = work + (int64_t)omp_get_thread_num() * G * span;
#else
        float *scratch = work;
#endif
        const float *x = qkv + i * width, *ci = cos + i * D, *si = sin + i * D;
        const int64_t *pages = table + row[i] * W;
        int64_t L = pos[i] + 1, npages = (L + S - 1) / S;
        for (int64_t h = 0; h < Hq; h++) rope(x + h * D, ci, si, q + h * D, D);
        for (int64_t j = 0; j < Hk; j++) {
            for (int64_t a = 0; a < G; a++) {  /* query head h = j G + a */
                const float *qh = q + (j * G + a) * D;
                float *restrict s = scratch + a * span, mx = -3.0e38f, sum = 0.0f;
                for (int64_t b = 0; b < npages; b++) {  /* in order: a page's overrun is rewritten by the next */
                    int64_t len = b + 1 < npages ? S : L - b * S;
                    scores(qh, kp + (pages[b] * Hk + j) * D * S, S, len, scale, D, s + b * S);
                }
#pragma omp simd reduction(max : mx)
                for (int64_t l = 0; l < L; l++) mx = s[l] > mx ? s[l] : mx;
#pragma omp simd
                for (int64_t l = 0; l < L; l++) s[l] = fast_exp(s[l] - mx);
#pragma omp simd reduction(+ : sum)
                for (int64_t l = 0; l < L; l++) sum += s[l];
                for (int64_t b = 0; b < npages; b++) {
                    int64_t len = b + 1 < npages ? S : L - b * S;
                    weighted_sum(s + b * S, vp + (pages[b] * Hk + j) * S * D, len, D, acc, b == 0);
                }
                float *o = out + i * Hq * D + (j * G + a) * D, inv = 1.0f / sum;
                for (int64_t e = 0; e < D; e++) o[e] = acc[e] * inv;
            }
        }
    }
}
