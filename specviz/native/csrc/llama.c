// llama.c: the forward pass of a Llama model for a call of 1-16 tokens (decoder layers, final norm, output
// layer), in one parallel region.
//
// Why: with few_rows.c the linear layers of the built-in target read their weights at the memory-bound limit (a
// 4-token verify's products cost about a step's), but a forward pass of transformers' Llama costs far more than its
// products: the rest is a few hundred small tensor operations per token, each dispatched, allocated and
// synchronised on its own, and their number grows with the tokens fed. Here every layer is one pass through
// plain loops: RMSNorm, the fused q/k/v product, RoPE, the KV cache write, attention, the output product, the
// residual, RMSNorm, the fused gate/up product, SiLU, the down product, the residual; then the final RMSNorm and
// the output layer. The threads split each product's output columns (few_rows_steal: a share each, and a thread
// through its own takes what is left of the others') and each step's rows or heads, with a barrier between steps.
// The output layer is in the same region, so a forward is one call with no Python between its parts (and no
// second start of the threads).
//
// Same numbers whatever the call's length: every row of every step is computed by the same sequence of operations
// whether it is fed alone or with others (attention goes through the rows in order; a row a token may not see
// weighs exactly 0: it adds 0 to the softmax's sum and is skipped in the output), so a token's logits from a
// verify are bit for bit those of a one-token step, and a tree node's those of its line fed as a chain. Compiled
// with -ffp-contract=off: no multiply-add contraction the compiler might choose differently.
//
// Layout (all float32 but the weights): x (L, H) the residual stream, updated in place; the KV cache
// (layers, kv heads, cap, d) for keys and for values; cos and sin (L, d) for the tokens' positions; mask (L, T)
// additive or NULL (causal: token l sees rows 0 .. base + l); weights (4 per layer: qkv, o, gate_up, down),
// each (out, in) row-major, float32, float16, int8 or NF4 (wtype 0, 1, 2, 3; int8 with a float32 scale per row in
// `scales`, NF4 with its code values and block absmax there (few_rows.c), 4 per layer, NULL entries otherwise);
// norms (2 per layer) float32. Out: hn (L, H) the final-normed hidden states of every token, logits (out_rows, V)
// the output layer (`head`, (V, H), weight type `head_wtype`, `head_scale` for int8: a target quantised by
// bitsandbytes keeps a float32 output layer) for the last out_rows tokens (0: none, a prefill's early part).

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

void few_rows_share(long N, int t, int T, long* c0, long* c1);
int few_rows_amx(void);
long few_rows_tiles_short(void);
void few_rows_steal(const void* w, int wtype, const float* scale, const float* x, long M, long K, long N, float* y,
                    int t, int T, atomic_long* shares);
float row_max(const float* x, long n);  // greedy.c

#define A256 __attribute__((target("avx2,fma")))

// The forward's threads wait for each other 10 times a layer. libgomp's barriers spin a while, then sleep; and once
// a process has more OpenMP threads than CPUs (a second Python thread ran a parallel region: the app's load and
// compute threads) they hardly spin, so each wait was a sleep and a wake-up, and a call took far longer. So the
// steps meet at a barrier of their own that spins, yields the CPU after SPINS rounds (to a thread the system
// has descheduled) and never sleeps. Acquire and release order memory across it as an OpenMP barrier does.
#define SPINS 4096
typedef struct {
    atomic_int arrived, round;
} meet_t;

static void meet(meet_t* b, int nt) {
    if (nt < 2) return;
    int round = atomic_load_explicit(&b->round, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == nt - 1) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&b->round, round + 1, memory_order_release);
        return;
    }
    for (long i = 0; atomic_load_explicit(&b->round, memory_order_acquire) == round; i++) {
        if (i < SPINS) _mm_pause();
        else sched_yield();
    }
}

// Thread t of nt takes items [*lo, *hi) of n: contiguous shares, as OpenMP's static schedule gives.
static void span(long n, int t, int nt, long* lo, long* hi) {
    long share = (n + nt - 1) / nt;
    *lo = t * share < n ? t * share : n;
    *hi = *lo + share < n ? *lo + share : n;
}

// out = w * (x / sqrt(mean(x^2) + eps)), one row of H.
static void rmsnorm(const float* x, const float* w, float eps, long H, float* out) {
    float s = 0.0f;
    for (long k = 0; k < H; k++) s += x[k] * x[k];
    float r = 1.0f / sqrtf(s / (float)H + eps);
    for (long k = 0; k < H; k++) out[k] = w[k] * (x[k] * r);
}

// RoPE on one head of d: v[i] * cos[i] + rotate_half(v)[i] * sin[i], rotate_half(v) = (-v[d/2:], v[:d/2]).
static void rope(float* v, const float* cos, const float* sin, long d) {
    long h = d / 2;
    for (long i = 0; i < h; i++) {
        float a = v[i], b = v[i + h];
        v[i] = a * cos[i] - b * sin[i];
        v[i + h] = b * cos[i + h] + a * sin[i + h];
    }
}

A256 static inline float hsum8(__m256 acc) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

A256 static float dot(const float* a, const float* b, long d) {
    if (d % 8) {
        float s = 0.0f;
        for (long i = 0; i < d; i++) s += a[i] * b[i];
        return s;
    }
    __m256 acc = _mm256_setzero_ps();
    for (long i = 0; i < d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    return hsum8(acc);
}

// out += p * v over d.
A256 static void axpy(float p, const float* v, float* out, long d) {
    if (d % 8) {
        for (long i = 0; i < d; i++) out[i] += p * v[i];
        return;
    }
    __m256 pv = _mm256_set1_ps(p);
    for (long i = 0; i < d; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(out + i)));
}

// exp(x) for 8 lanes: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its degree-6 Taylor polynomial (relative error
// under 2e-7 there), times 2^n built in the exponent bits; x is clamped to [-87, 88] (exp(-87) ~ 1.6e-38), and
// below -87 (-inf included: a masked row) the result is 0.
A256 static inline __m256 exp8(__m256 x) {
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693145752f)));  // ln2 in two parts: exact n * hi
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(1.42860677e-6f)));
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// exp(v) for one value, through exp8's lanes (the same number exp8 gives v in any lane).
A256 static inline float exp_at(float v) { return _mm256_cvtss_f32(exp8(_mm256_set1_ps(v))); }

// The sum of exp(x[c] - best) over n scores, NaN counted as 0 (-inf gives 0): exp8 on 8 lanes at a time, summed in
// double in two 4-lane accumulators, then the last n % 8 one at a time (a softmax's total: probs_at, and a draft's
// tree read in chain.c). best: the scores' largest, finite.
A256 double sum_exp(const float* x, long n, float best) {
    __m256 b = _mm256_set1_ps(best);
    __m256d t0 = _mm256_setzero_pd(), t1 = t0;
    long c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 v = _mm256_loadu_ps(x + c);
        __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(v, b)), _mm256_cmp_ps(v, v, _CMP_ORD_Q));  // NaN: 0
        t0 = _mm256_add_pd(t0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        t1 = _mm256_add_pd(t1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double parts[4];
    _mm256_storeu_pd(parts, _mm256_add_pd(t0, t1));
    double total = parts[0] + parts[1] + parts[2] + parts[3];
    for (; c < n; c++)
        if (x[c] == x[c]) total += exp_at(x[c] - best);
    return total;
}

// exp over n floats in place: 8 at a time, the rest one lane at a time through the same code (so a value's exp
// does not depend on where it sits).
A256 static void exp_n(float* v, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, exp8(_mm256_loadu_ps(v + i)));
    for (; i < n; i++) v[i] = _mm256_cvtss_f32(exp8(_mm256_set1_ps(v[i])));
}

// One query head of one token against the rows it sees: softmax(q.K^T * scale + mask) . V -> out (d).
// keys, values: this kv head's rows (cap, d); n: rows to read; mask: this token's row of the mask, or NULL.
// For d a multiple of 8 (every Llama head size) the scores run four rows at a time, each row its own chain (the
// chain `dot` runs); the softmax's max, exp and division run 8 lanes at a time (its sum row by row); the output is
// summed in registers over all rows, 64 of its floats at a time, skipping rows of weight 0. Each row's numbers
// go through the same operations in the same order whatever the call and wherever masked rows sit, so a token's
// logits are the same alone, in a verify, or as a tree's node against its line fed as a chain. Why registers: one
// row at a time through memory (`axpy`) with scalar softmax loops rereads the output row per cached row, which
// grows with the text.
A256 static void attend(const float* q, const float* keys, const float* values, long d, long n, const float* mask,
                        float scale, float* s, float* out) {
    float mx = -INFINITY;
    long j = 0;
    if (d % 8 == 0)
        for (; j + 4 <= n; j += 4) {
            const float *k0 = keys + j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (long i = 0; i < d; i += 8) {
                __m256 qv = _mm256_loadu_ps(q + i);
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + i), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + i), a3);
            }
            s[j] = hsum8(a0) * scale;
            s[j + 1] = hsum8(a1) * scale;
            s[j + 2] = hsum8(a2) * scale;
            s[j + 3] = hsum8(a3) * scale;
        }
    for (; j < n; j++) s[j] = dot(q, keys + j * d, d) * scale;
    if (mask)  // a row this token may not see (the mask's minimum or -inf) gets -inf, so weight 0 below
        for (j = 0; j < n; j++) s[j] = mask[j] < -1e30f ? -INFINITY : s[j] + mask[j];
    // softmax: the maximum (exact in any order), exp and the division 8 lanes at a time
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    for (j = 0; j + 8 <= n; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + j));
    for (int c = 0; c < 8; c++) mx = fmaxf(mx, ((float*)&m8)[c]);
    for (; j < n; j++) mx = fmaxf(mx, s[j]);
    __m256 mv = _mm256_set1_ps(mx);
    for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, _mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    for (; j < n; j++) s[j] -= mx;
    exp_n(s, n);  // exp(-inf) = 0
    float sum = 0.0f;  // in row order, one at a time: a masked row adds an exact 0, so a tree's node gets the sum
    for (j = 0; j < n; j++) sum += s[j];  // of its line fed as a chain, bit for bit (8 lanes would not)
    __m256 sv = _mm256_set1_ps(sum);
    for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, _mm256_div_ps(_mm256_loadu_ps(s + j), sv));
    for (; j < n; j++) s[j] /= sum;  // a row of weight 0 is skipped below
    long i = 0;
    if (d % 8 == 0) {
        for (; i + 64 <= d; i += 64) {
            __m256 o[8];
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) o[c] = _mm256_setzero_ps();
            for (j = 0; j < n; j++) {
                if (s[j] == 0.0f) continue;
                __m256 pv = _mm256_set1_ps(s[j]);
                const float* v = values + j * d + i;
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) o[c] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 8 * c), o[c]);
            }
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) _mm256_storeu_ps(out + i + 8 * c, o[c]);
        }
        for (; i < d; i += 8) {
            __m256 o = _mm256_setzero_ps();
            for (j = 0; j < n; j++)
                if (s[j] != 0.0f) o = _mm256_fmadd_ps(_mm256_set1_ps(s[j]), _mm256_loadu_ps(values + j * d + i), o);
            _mm256_storeu_ps(out + i, o);
        }
        return;
    }
    for (i = 0; i < d; i++) out[i] = 0.0f;
    for (j = 0; j < n; j++)
        if (s[j] != 0.0f) axpy(s[j], values + j * d, out, d);
}

// The forward pass over x (L, H) (the tokens' embeddings; the residual stream, updated in place); the cache gets
// rows base .. base + L - 1. Returns 0, -1 when it cannot run (the caller keeps its own path), -2 when a product on
// the tiles had no memory for its x (its logits are not the model's), or -3 when the call had no memory for its own
// buffers (nothing computed; the cache unchanged). llama_refuse_buffers(n): the next n calls fail so, as if malloc
// had (the tests' way to reach that path).
static atomic_int buffer_refusals;
void llama_refuse_buffers(int n) { atomic_store(&buffer_refusals, n); }

int llama_forward(const void* const* weights, const float* const* scales, const float* const* norms, long layers,
                  int wtype, long H, long hq, long hk, long d, long I, float eps, float* x, long L, float* kc, float* vc,
                  long cap, long base, const float* cos, const float* sin, const float* mask, const float* fnorm,
                  const void* head, const float* head_scale, int head_wtype, long V, long out_rows, float* hn,
                  float* logits, int threads) {
    if (L < 1 || L > 16 || threads < 1 || hq % hk || base + L > cap || out_rows < 0 || out_rows > L) return -1;
    if ((wtype == 8 || head_wtype == 8) && (!few_rows_amx() || H % 32 || I % 32 || hq * d % 32)) return -1;  // tiles
    long nqkv = (hq + 2 * hk) * d, g = hq / hk, T = base + L, short0 = few_rows_tiles_short();
    float scale = 1.0f / sqrtf((float)d);
    int refused = atomic_load(&buffer_refusals) > 0 && atomic_fetch_sub(&buffer_refusals, 1) > 0;  // few_rows.c's way
    float* buf = refused ? NULL : malloc(sizeof(float) * (L * (H + nqkv + hq * d + H + 3 * I) + (long)threads * T));
    if (!buf) return -3;
    float *h = buf, *qkv = h + L * H, *att = qkv + L * nqkv, *tmp = att + L * hq * d, *gu = tmp + L * H;
    float *act = gu + L * 2 * I, *scores = act + L * I;
    // Each product's shares of its blocks of 16 columns, one word a thread asked for, set before any thread runs:
    // few_rows_steal lets a thread through its own share take from the far end of another's, so a core the system
    // or the memory slowed is not waited for (with fixed shares every thread waits at the barrier for the slowest),
    // and where OpenMP gives fewer threads than asked the ones that came compute every share.
    atomic_long* shares = malloc(sizeof(atomic_long) * (4 * layers + 1) * threads);
    if (!shares) {
        free(buf);
        return -3;
    }
    long outs[4] = {nqkv, H, 2 * I, H};
    for (long i = 0; i < 4 * layers + 1; i++)
        for (int u = 0; u < threads; u++) {
            long c0, c1;
            few_rows_share(i < 4 * layers ? outs[i % 4] : V, u, threads, &c0, &c1);
            atomic_init(shares + i * threads + u, c0 | (c1 << 32));
        }
    meet_t bar = {0, 0};
#define PRODUCT(i, W, WT, SC, X, M, K, N, Y) \
    few_rows_steal(W, WT, SC, X, M, K, N, Y, t, threads, shares + (i) * threads)
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        long r0, r1, p0, p1, e0, e1;  // this thread's rows, (token, query head) pairs and elements of x: span
        span(L, t, nt, &r0, &r1);
        span(L * hq, t, nt, &p0, &p1);
        span(L * H, t, nt, &e0, &e1);
        for (long li = 0; li < layers; li++) {
            const void* const* w = weights + 4 * li;
            const float* const* sc = scales + 4 * li;
            float *kl = kc + li * hk * cap * d, *vl = vc + li * hk * cap * d;
            // 1. h = RMSNorm(x); qkv = h . Wqkv^T
            for (long l = r0; l < r1; l++) rmsnorm(x + l * H, norms[2 * li], eps, H, h + l * H);
            meet(&bar, nt);
            PRODUCT(4 * li, w[0], wtype, sc[0], h, L, H, nqkv, qkv);
            meet(&bar, nt);
            // 2. RoPE on q and k; k and v into the cache
            for (long l = r0; l < r1; l++) {
                float* row = qkv + l * nqkv;
                for (long j = 0; j < hq + hk; j++) rope(row + j * d, cos + l * d, sin + l * d, d);
                for (long j = 0; j < hk; j++)
                    for (long i = 0; i < d; i++) {
                        kl[(j * cap + base + l) * d + i] = row[(hq + j) * d + i];
                        vl[(j * cap + base + l) * d + i] = row[(hq + hk + j) * d + i];
                    }
            }
            meet(&bar, nt);
            // 3. attention, a (token, query head) pair per iteration; head j reads kv head j / g
            for (long p = p0; p < p1; p++) {
                long l = p / hq, j = p % hq, kv = j / g;
                attend(qkv + l * nqkv + j * d, kl + kv * cap * d, vl + kv * cap * d, d, mask ? T : base + l + 1,
                       mask ? mask + l * T : NULL, scale, scores + (long)t * T, att + l * hq * d + j * d);
            }
            meet(&bar, nt);
            // 4. x += att . Wo^T; h = RMSNorm(x)
            PRODUCT(4 * li + 1, w[1], wtype, sc[1], att, L, hq * d, H, tmp);
            meet(&bar, nt);
            for (long l = r0; l < r1; l++) {
                for (long k = 0; k < H; k++) x[l * H + k] += tmp[l * H + k];
                rmsnorm(x + l * H, norms[2 * li + 1], eps, H, h + l * H);
            }
            meet(&bar, nt);
            // 5. x += (SiLU(h . Wgate^T) * (h . Wup^T)) . Wdown^T
            PRODUCT(4 * li + 2, w[2], wtype, sc[2], h, L, H, 2 * I, gu);
            meet(&bar, nt);
            for (long l = r0; l < r1; l++) {
                float *a = gu + l * 2 * I, *u = a + I, *out = act + l * I;
                for (long i = 0; i < I; i++) out[i] = -a[i];
                exp_n(out, I);
                for (long i = 0; i < I; i++) out[i] = a[i] / (1.0f + out[i]) * u[i];
            }
            meet(&bar, nt);
            PRODUCT(4 * li + 3, w[3], wtype, sc[3], act, L, I, H, tmp);
            meet(&bar, nt);
            for (long e = e0; e < e1; e++) x[e] += tmp[e];
            meet(&bar, nt);
        }
        // 6. hn = RMSNorm(x); logits = hn[L - out_rows:] . Whead^T
        for (long l = r0; l < r1; l++) rmsnorm(x + l * H, fnorm, eps, H, hn + l * H);
        meet(&bar, nt);
        if (out_rows)
            PRODUCT(4 * layers, head, head_wtype, head_scale, hn + (L - out_rows) * H, out_rows, H, V, logits);
    }
#undef PRODUCT
    free(shares);
    free(buf);
    return few_rows_tiles_short() != short0 ? -2 : 0;
}

// softmax(s[row[i]])[col[i]] for i < k: what a greedy tree round shows as p(x) at each node's parent (read at T = 1;
// engine._p_at_parents), without the softmax of whole rows: each distinct row's largest score and its sum of
// exponentials are taken once (the sum in double), then only the k chosen entries' exponentials. As sampling.to_probs
// reads a row: NaN counts as -inf, and a row with +inf entries gives them its mass, shared. exp8's relative error is
// under 2e-7 and the sum is in double, so a value is as near the exact softmax as the float32 x - max allows (within
// 2e-6 at the built-in target's scores, where PyTorch's float32 softmax is within 1.3e-5). s: rows of n scores,
// `stride` apart; col[i] < n. Returns 0, -1 where a chosen row has no score above -inf (the caller's PyTorch path
// then raises greedy's error), or -2 for more than MAX_PROBS_AT entries.
#define MAX_PROBS_AT 64  // the most entries a call reads: a tree's nodes (config.TREE_MAX, 32)
A256 int probs_at(const float* s, long n, long stride, const long* row, const long* col, long k, float* out) {
    long seen_row[MAX_PROBS_AT];
    float seen_max[MAX_PROBS_AT];
    double seen_sum[MAX_PROBS_AT];
    long seen = 0;
    if (k > MAX_PROBS_AT) return -2;
    for (long i = 0; i < k; i++) {
        long j = 0;
        while (j < seen && seen_row[j] != row[i]) j++;
        const float* x = s + row[i] * stride;
        if (j == seen) {
            float best = row_max(x, n);
            if (!(best > -INFINITY)) return -1;
            double total = 0.0;
            if (best == INFINITY) {
                for (long c = 0; c < n; c++) total += x[c] == INFINITY;
            } else {
                total = sum_exp(x, n, best);
            }
            seen_row[seen] = row[i], seen_max[seen] = best, seen_sum[seen] = total;
            seen++;
        }
        float v = x[col[i]], best = seen_max[j];
        if (best == INFINITY) out[i] = v == INFINITY ? (float)(1.0 / seen_sum[j]) : 0.0f;
        else out[i] = v == v ? (float)(exp_at(v - best) / seen_sum[j]) : 0.0f;
    }
    return 0;
}
