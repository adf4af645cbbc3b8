// chain.c: a draft's guesses for one round in one call: k forward passes (llama.c), each fed the argmax (greedy.c)
// of the one before, or at T > 0 a draw from its softmax.
//
// Why: a lean draft's greedy step is short enough that the Python around each call (the token's embedding, RoPE
// rows, buffers, the argmax's row mapped back to a token id, the proposal's bookkeeping) is a large share of it.
// Here the loop between calls is a few lines of C.
//
// Same numbers as the per-call path (lean.py's `_native` then `sampling.greedy`): the first call feeds the L
// tokens the draft has not seen (their embeddings, x (L, H), from the caller), each later call one token, whose
// embedding row is `next_row[r]` for the output row r that won (the token's row in the draft's own input
// vocabulary: lean_chain.py builds the table from the draft's vocabulary maps), read from `embed` (float32, or
// float16 when embed_f16) exactly as F.embedding(...).float() reads it. cos and sin are the model's tables from
// position 0; the cache's rows are the positions (no tree). The last guess is never fed (as in the loop).
//
// Returns the number of calls made: k, or fewer where a call's scores had no maximum (every one NaN or -inf:
// out[i] is then -1 and the caller raises greedy's error), -1 where llama_forward refused its arguments, or -3 where
// a call had no memory for its buffers (the caller's out-of-memory sentence).
//
// With uniforms u (not NULL) it is the same loop at T > 0 (drafters_base.draw called k times): each call's scores,
// put in the order of the target ids the draft proposes (`order`), become probabilities as sampling.to_probs makes
// them (NaN read as -inf, +inf entries sharing the mass, else a softmax of the scores times inv_t = 1 / T), and the
// guess is drawn from them as sampling.sample draws (the first entry whose running sum, in double, passes u[i]
// times the total; u[i] the caller took from the run's generator). It writes each call's scores and probabilities in
// that order (logits_out, probs_out: k rows of V): the rows the guesses were drawn from, for the verify.
//
// With mix (not NULL; greedy only) the first guess is the first argmax of keep * softmax(scores) + mix[j] (mix over
// the same V output rows): the draft's and a head's first guesses mixed (drafters_mix.py), the later ones the
// draft's own. The softmax is to_probs_row's at T = 1, written over the call's scores.

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int llama_forward(const void* const* weights, const float* const* scales, const float* const* norms, long layers,
                  int wtype, long H, long hq, long hk, long d, long I, float eps, float* x, long L, float* kc, float* vc,
                  long cap, long base, const float* cos, const float* sin, const float* mask, const float* fnorm,
                  const void* head, const float* head_scale, int head_wtype, long V, long out_rows, float* hn,
                  float* logits, int threads);
void first_max(const float* s, long rows, long n, long stride, long* out);
double sum_exp(const float* x, long n, float best);
float row_max(const float* x, long n);

#define A256 __attribute__((target("avx2")))

// The k (<= 16) largest of n scores above -inf, largest first, the lower index first among equals, into rows and s;
// returns how many there were (fewer than k where fewer are above -inf). 8 scores at a time are compared with the
// k-th largest so far, and only those above it are placed (NaN compares false, so never).
A256 static long largest_n(const float* x, long n, long k, long* rows, float* s) {
    long found = 0;
    if (k < 1) return 0;
    for (long j = 0; j < n; j += 8) {
        float bar = found == k ? s[k - 1] : -INFINITY;
        unsigned hit = 0;
        if (j + 8 <= n) hit = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), _mm256_set1_ps(bar),
                                                                          _CMP_GT_OQ));
        else
            for (long c = j; c < n; c++) hit |= (unsigned)(x[c] > bar) << (c - j);
        for (; hit; hit &= hit - 1) {
            long c = j + __builtin_ctz(hit);
            float v = x[c];
            if (found == k && !(v > s[k - 1])) continue;
            long i = found < k ? found++ : k - 1;
            for (; i > 0 && v > s[i - 1]; i--) s[i] = s[i - 1], rows[i] = rows[i - 1];
            s[i] = v, rows[i] = c;
        }
    }
    return found;
}

__attribute__((target("f16c"))) static void embed_row(const void* embed, int f16, long row, long H, float* x) {
    if (!f16) {
        memcpy(x, (const float*)embed + row * H, sizeof(float) * H);
        return;
    }
    const unsigned short* e = (const unsigned short*)embed + row * H;
    for (long h = 0; h < H; h++) x[h] = _cvtsh_ss(e[h]);
}

// Probabilities of one call's scores s (V, in proposal order) at 1 / inv_t, into p; -1 where no score is above -inf.
static int to_probs_row(const float* s, long V, float inv_t, float* p) {
    float best = -INFINITY;
    long inf = 0;
    for (long j = 0; j < V; j++) {
        if (s[j] == INFINITY) inf++;
        if (s[j] > best) best = s[j];  // NaN never compares greater
    }
    if (inf) {
        for (long j = 0; j < V; j++) p[j] = s[j] == INFINITY ? 1.0f / (float)inf : 0.0f;
        return 0;
    }
    if (!(best > -INFINITY)) return -1;
    float top = best * inv_t, sum = 0.0f;
    for (long j = 0; j < V; j++) {
        p[j] = s[j] > -INFINITY ? expf(s[j] * inv_t - top) : 0.0f;  // NaN and -inf: 0
        sum += p[j];
    }
    for (long j = 0; j < V; j++) p[j] /= sum;
    return 0;
}

// sampling.sample: the first j whose running sum (double) passes u * total; past the end, the last j of p > 0.
static long draw_row(const float* p, long V, double u) {
    double total = 0.0, run = 0.0;
    for (long j = 0; j < V; j++) total += p[j];
    double at = u * total;
    for (long j = 0; j < V; j++) {
        run += p[j];
        if (run > at) return j;
    }
    for (long j = V - 1; j >= 0; j--)
        if (p[j] > 0.0f) return j;
    return -1;
}

long llama_chain(const void* const* weights, const float* const* scales, const float* const* norms, long layers,
                 int wtype, long H, long hq, long hk, long d, long I, float eps, float* x, long L, float* kc, float* vc,
                 long cap, long base, const float* cos, const float* sin, const float* fnorm, const void* head,
                 const float* head_scale, int head_wtype, long V, float* hn, float* logits, int threads,
                 const void* embed, int embed_f16, const long* next_row, long k, long* out, float inv_t,
                 const double* u, const long* order, float* logits_out, float* probs_out, const float* mix,
                 float keep) {
    for (long i = 0; i < k; i++) {
        int failed = llama_forward(weights, scales, norms, layers, wtype, H, hq, hk, d, I, eps, x, L, kc, vc, cap, base,
                                   cos + base * d, sin + base * d, NULL, fnorm, head, head_scale, head_wtype, V, 1, hn,
                                   logits, threads);
        if (failed == -1 || failed == -3)
            return failed;  // -2, no memory for the tiles' x: NaN scores, as wtype 7's (guesses only; the target rules)
        base += L;
        if (u == NULL && i == 0 && mix != NULL) {
            out[i] = -1;
            if (!to_probs_row(logits, V, 1.0f, logits)) {
                float best = -INFINITY;
                for (long j = 0; j < V; j++) {
                    float v = keep * logits[j] + mix[j];
                    if (v > best) best = v, out[i] = j;
                }
            }
        } else if (u == NULL) {
            first_max(logits, 1, V, V, out + i);
        } else {
            float *s = logits_out + i * V, *p = probs_out + i * V;
            for (long j = 0; j < V; j++) s[j] = logits[order[j]];
            long j = to_probs_row(s, V, inv_t, p) ? -1 : draw_row(p, V, u[i]);
            out[i] = j < 0 ? -1 : order[j];  // the output row, as the greedy chain gives it
        }
        if (out[i] < 0) return i + 1;
        if (i + 1 < k) embed_row(embed, embed_f16, next_row[out[i]], H, x);
        L = 1;
    }
    return k;
}

// The n (<= 16) likeliest of V scores at T = 1, largest first, the lower row first among equals, into top_r and
// top_p (-1 and 0.0 past the rows whose probability is above 0), the probabilities as to_probs_row makes them (NaN
// read as -inf, +inf entries sharing the mass, else a softmax at T = 1, its total summed in double: within a few parts
// in 10^7 of torch.softmax's). Returns 0, -1 for n out of range, or -2 where no score is above -inf. A tree read's
// last step (below).
A256 int top_probs(const float* logits, long V, long n, long* top_r, float* top_p) {
    if (n < 0 || n > 16) return -1;
    float best = row_max(logits, V);
    if (!(best > -INFINITY)) return -2;
    for (long i = 0; i < n; i++) top_r[i] = -1, top_p[i] = 0.0f;
    if (best == INFINITY) {  // the first n +inf rows share the mass
        long inf = 0;
        for (long j = 0; j < V; j++) inf += logits[j] == INFINITY;
        for (long j = 0, i = 0; i < n && j < V; j++)
            if (logits[j] == INFINITY) top_p[i] = 1.0f / (float)inf, top_r[i++] = j;
        return 0;
    }
    // The n largest scores, the lower row first among equals: a softmax is monotone, so they are the n largest
    // probabilities, and only their n exponentials are taken beside the total's (by expf, which goes on into float's
    // subnormals where exp8 stops at exp(-87): a row's probability is 0 exactly where torch's read gives it 0).
    // The total in 8 lanes: scalar expf over every row was a visible share of a draft call.
    double total = sum_exp(logits, V, best);
    float top_s[16];
    long found = largest_n(logits, V, n, top_r, top_s);
    for (long i = 0; i < found; i++) {
        float p = (float)(expf(top_s[i] - best) / total);
        if (!(p > 0.0f)) {  // below float's range: no probability, and neither has any row after it
            for (long r = i; r < found; r++) top_r[r] = -1, top_p[r] = 0.0f;
            break;
        }
        top_p[i] = p;
    }
    return 0;
}

// A token tree's read at T = 0 (drafters.ModelDrafter._propose_tree through lean_chain.tree_read): one llama.c call
// over the L tokens whose input rows are rows[0..L-1] (their embeddings read as embed_row reads them, into x (L, H)),
// written to cache rows base .. base + L - 1 at positions pos0 .. pos0 + L - 1 (cos and sin: the tables from
// position 0). With seen >= 0 the call is one token (L = 1), a tree node, that sees cache rows 0 .. seen - 1, the
// n_extra rows of `extra` (its ancestors fed as tree nodes) and itself; with seen < 0 the rows fed see what a plain
// call's do. The last token's scores over the V output rows become probabilities at T = 1 (what a node's children
// are scored by), and the n largest (n <= 16) go to top_p, their rows to top_r, largest first, the lower row first
// among equals; where fewer than n rows have a probability above 0, the rest of top_r is -1.
// The Python read it stands for (feed_tree or feed, then to_probs and topk) built a V-wide row, a mask and positions
// in torch for every node, which cost more than the node's own forward.
// Returns 0; -1 where llama_forward refused its arguments; -2 where no score is above -inf (greedy's error); -3 where
// the mask or the call's buffers had no memory.
long llama_tree_read(const void* const* weights, const float* const* scales, const float* const* norms, long layers,
                     int wtype, long H, long hq, long hk, long d, long I, float eps, float* x, long L, float* kc,
                     float* vc, long cap, long base, const float* cos, const float* sin, const float* fnorm,
                     const void* head, const float* head_scale, int head_wtype, long V, float* hn, float* logits,
                     int threads, const void* embed, int embed_f16, const long* rows, long pos0, long seen,
                     const long* extra, long n_extra, long n, long* top_r, float* top_p) {
    if (L < 1 || n < 0 || n > 16 || (seen >= 0 && L != 1)) return -1;
    for (long l = 0; l < L; l++) embed_row(embed, embed_f16, rows[l], H, x + l * H);
    float* mask = NULL;
    if (seen >= 0) {
        long T = base + 1;
        mask = malloc(sizeof(float) * T);
        if (!mask) return -3;
        for (long r = 0; r < T; r++) mask[r] = r < seen ? 0.0f : -INFINITY;
        for (long i = 0; i < n_extra; i++)
            if (extra[i] >= 0 && extra[i] < T) mask[extra[i]] = 0.0f;
        mask[base] = 0.0f;
    }
    int failed = llama_forward(weights, scales, norms, layers, wtype, H, hq, hk, d, I, eps, x, L, kc, vc, cap, base,
                               cos + pos0 * d, sin + pos0 * d, mask, fnorm, head, head_scale, head_wtype, V, 1, hn,
                               logits, threads);
    free(mask);
    if (failed == -1 || failed == -3) return failed;  // -2 (no memory for the tiles' x): NaN scores, read as -inf below
    return top_probs(logits, V, n, top_r, top_p);
}
