// greedy.c: greedy decoding's token for rows of scores, without PyTorch's argmax (sampling.greedy).
//
// Why: a round of greedy speculative decoding takes the argmax of the target's (gamma + 1) x 49,152 logits and of
// each draft step's scores; torch's argmax plus the finiteness check sampling.greedy needs are several dispatched
// operations, each a pass over the row, a visible share of a round. Two plain passes over a row the forward has just written (it is in cache): the largest
// score, then the first place it occurs.
//
// The answer is sampling.greedy's: NaN never counts (PyTorch's argmax would pick it; greedy then reads NaN as
// -inf), +inf counts as the largest (greedy gives a row's +inf entries the row's mass; the first one wins), ties
// go to the first index (torch.argmax's rule). A row with no score above -inf gets -1: greedy raises there.

#include <immintrin.h>
#include <math.h>

// Every CPU the library loads on has AVX2 (native.py: few_rows_isa() is 0 otherwise, and nothing is called).
#define A256 __attribute__((target("avx2")))

// The largest of n scores: NaN never counts, +inf does; -inf where none is above it. Four running maxima of 8 lanes
// (_mm256_max_ps(v, m) returns m where v is NaN). Also a softmax's first step (llama.c's probs_at, chain.c's
// top_probs).
A256 float row_max(const float* x, long n) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    long j = 0;
    for (; j + 32 <= n; j += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + j), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + j + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(x + j + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(x + j + 24), m3);
    }
    float lanes[8], best = -INFINITY;
    _mm256_storeu_ps(lanes, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    for (int k = 0; k < 8; k++) best = lanes[k] > best ? lanes[k] : best;
    for (; j < n; j++) best = x[j] > best ? x[j] : best;
    return best;
}

A256 static long first_max_row(const float* x, long n) {
    // 1. the largest score
    float best = row_max(x, n);
    if (!(best > -INFINITY)) return -1;
    // 2. its first place: 32 scores at a time, then the lowest set bit of the first block that holds it
    __m256 b = _mm256_set1_ps(best);
    long j;
    for (j = 0; j + 32 <= n; j += 32) {
        unsigned hit = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), b, _CMP_EQ_OQ)) |
                       (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j + 8), b, _CMP_EQ_OQ)) << 8 |
                       (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j + 16), b, _CMP_EQ_OQ)) << 16 |
                       (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j + 24), b, _CMP_EQ_OQ)) << 24;
        if (hit) return j + __builtin_ctz(hit);
    }
    for (; j < n; j++)
        if (x[j] == best) return j;
    return -1;  // unreachable: best is one of the scores
}

void first_max(const float* s, long rows, long n, long stride, long* out) {
    for (long r = 0; r < rows; r++) out[r] = first_max_row(s + r * stride, n);
}
