// few_rows.c: y (M, N) = x (M, K) . W (N, K)^T for a call of 1-16 tokens, reading W once.
//
// Why: a verify of a few tokens reads the same weights as a one-token step, so on a memory-bound CPU it should
// cost about one step. The BLAS paths PyTorch uses do not get there for 2-8 rows: they pick kernels made for large
// products, which read W more than once (docs/performance.md has the figures per CPU). Here each thread streams its share of W's rows once, prefetching the next
// block, and multiplies every loaded vector with all M rows of x, which sit in L1. A call of 9-16 rows (a token
// tree's verify) runs the register kernels on 8 rows of x at a time over each block of 32 rows of W, so the block
// is read from memory once and again from the core's own cache.
//
// Same numbers whatever M: every output element is the same sequence of operations (a fused multiply-add chain
// over K in vector-width chunks, a fixed horizontal sum, then the scalar tail), so a token's logits from a verify
// are bit for bit those of a one-token step on the same path.
//
// W is float32, float16 (a draft kept in half precision: half the bytes, converted in registers), int8 with a
// scale per row (a draft's weights in a quarter of the bytes, or a target's from bitsandbytes) or NF4 (a target's
// from bitsandbytes, two weights a byte); x and y are float32. The first three can also come packed in panels of
// 16 output columns (wtype + 4; the panel kernels below), and int8 in panels of 4-byte groups to meet x quantised to
// int8 (wtype 7: integer products for a draft's guesses). Dispatch at run time: AVX-512F, or AVX2 with FMA and
// F16C; without either the caller keeps PyTorch's path (few_rows_isa() returns 0). Threads: OpenMP, the team
// PyTorch's own libgomp already runs.

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_M 8     // rows of x one register kernel takes
#define MAX_CALL 16 // rows of x a call takes (in parts of MAX_M)
#define BLOCK 32    // rows of W a call of more than MAX_M rows goes through at a time

#define PRAGMA(x) _Pragma(#x)

// One kernel body for both ISAs and both weight types. VEC, ZERO, LOADW, LOADX, FMA, HSUM, W come from the caller.
// R rows of W at a time share each load of x; acc[r][m] holds row n+r against x's row m.
#define BODY(MM, R)                                                                                       \
    long n = n0;                                                                                          \
    for (; n + R <= n1; n += R) {                                                                         \
        VEC acc[R][MM];                                                                                   \
        PRAGMA(GCC unroll 8) for (int r = 0; r < R; r++)                                                  \
            PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++) acc[r][m] = ZERO;                           \
        long k = 0;                                                                                       \
        for (; k + W <= K; k += W) {                                                                      \
            VEC wv[R];                                                                                    \
            PRAGMA(GCC unroll 8) for (int r = 0; r < R; r++) {                                            \
                _mm_prefetch((const char*)(w + (n + R + r) * K + k), _MM_HINT_T0);                        \
                wv[r] = LOADW(w + (n + r) * K + k);                                                       \
            }                                                                                             \
            PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++) {                                           \
                VEC xv = LOADX(x + m * K + k);                                                            \
                PRAGMA(GCC unroll 8) for (int r = 0; r < R; r++) acc[r][m] = FMA(wv[r], xv, acc[r][m]);   \
            }                                                                                             \
        }                                                                                                 \
        PRAGMA(GCC unroll 8) for (int r = 0; r < R; r++)                                                  \
            PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++)                                             \
                y[m * N + n + r] = HSUM(acc[r][m]) + tail(w + (n + r) * K, x + m * K, k, K);              \
    }                                                                                                     \
    for (; n < n1; n++) {                                                                                 \
        VEC acc[MM];                                                                                      \
        PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++) acc[m] = ZERO;                                  \
        long k = 0;                                                                                       \
        for (; k + W <= K; k += W) {                                                                      \
            VEC wv = LOADW(w + n * K + k);                                                                \
            PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++) acc[m] = FMA(wv, LOADX(x + m * K + k), acc[m]); \
        }                                                                                                 \
        PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++)                                                 \
            y[m * N + n] = HSUM(acc[m]) + tail(w + n * K, x + m * K, k, K);                               \
    }

// The last K % width products, in order, with explicit fused multiply-adds (no compiler contraction choices).
#define TAIL(NAME, WT, CVT, ATTR)                                                                         \
    ATTR static inline float NAME(const WT* w, const float* x, long k, long K) {                          \
        float s = 0.0f;                                                                                   \
        for (; k < K; k++) s = __builtin_fmaf(CVT(w[k]), x[k], s);                                        \
        return s;                                                                                         \
    }

// A kernel per M (so acc[][] stays in registers), for one ISA and weight type.
#define KERNELS(SUF, WT, ATTR, R1, R2, R3, R4, R5, R6, R7, R8)                                            \
    ATTR static void rows_##SUF(const WT* restrict w, const float* restrict x, long M, long K, long N,    \
                                float* restrict y, long n0, long n1) {                                    \
        switch (M) {                                                                                      \
            case 1: { BODY(1, R1) } break;                                                                \
            case 2: { BODY(2, R2) } break;                                                                \
            case 3: { BODY(3, R3) } break;                                                                \
            case 4: { BODY(4, R4) } break;                                                                \
            case 5: { BODY(5, R5) } break;                                                                \
            case 6: { BODY(6, R6) } break;                                                                \
            case 7: { BODY(7, R7) } break;                                                                \
            default: { BODY(8, R8) } break;                                                               \
        }                                                                                                 \
    }

// The AVX2 kernels take R at run time, from the rows of W per pass a process chose for each M (few_rows_passes):
// what pays differs by CPU (more rows share each load of x but need more registers), so it is timed per process.
// Up to 4 rows for 1-3 tokens, 3 for 4-5, 2 for 6-8.
#define BODY_UPTO4(MM) switch (R) { case 1: { BODY(MM, 1) } break; case 2: { BODY(MM, 2) } break; \
                                    case 3: { BODY(MM, 3) } break; default: { BODY(MM, 4) } break; }
#define BODY_UPTO3(MM) switch (R) { case 1: { BODY(MM, 1) } break; case 2: { BODY(MM, 2) } break; \
                                    default: { BODY(MM, 3) } break; }
#define BODY_UPTO2(MM) switch (R) { case 1: { BODY(MM, 1) } break; default: { BODY(MM, 2) } break; }
#define KERNELS_R(SUF, WT, ATTR)                                                                          \
    ATTR static void rows_##SUF(const WT* restrict w, const float* restrict x, long M, long K, long N,    \
                                float* restrict y, long n0, long n1, int R) {                             \
        switch (M) {                                                                                      \
            case 1: BODY_UPTO4(1) break;                                                                  \
            case 2: BODY_UPTO4(2) break;                                                                  \
            case 3: BODY_UPTO4(3) break;                                                                  \
            case 4: BODY_UPTO3(4) break;                                                                  \
            case 5: BODY_UPTO3(5) break;                                                                  \
            case 6: BODY_UPTO2(6) break;                                                                  \
            case 7: BODY_UPTO2(7) break;                                                                  \
            default: BODY_UPTO2(8) break;                                                                 \
        }                                                                                                 \
    }
static const int MOST_PASSES[MAX_M + 1] = {0, 4, 4, 4, 3, 3, 2, 2, 2};

#define A512 __attribute__((target("avx512f,f16c,fma")))
#define A256 __attribute__((target("avx2,fma,f16c")))

static inline float f32(float v) { return v; }
static inline float i2f(int8_t v) { return (float)v; }
A512 static inline float h2f_512(uint16_t h) { return _cvtsh_ss(h); }
A256 static inline float h2f_256(uint16_t h) { return _cvtsh_ss(h); }

// ---- AVX-512: 16 lanes, 32 registers (R x M accumulators + R weights + 1 input <= 32) ----
#define VEC __m512
#define ZERO _mm512_setzero_ps()
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define HSUM(v) _mm512_reduce_add_ps(v)
#define LOADX(p) _mm512_loadu_ps(p)
#define W 16
TAIL(tail_f32_512, float, f32, A512)
#define tail tail_f32_512
#define LOADW(p) _mm512_loadu_ps(p)
KERNELS(f32_512, float, A512, 4, 4, 4, 4, 4, 4, 3, 3)
#undef LOADW
#undef tail
TAIL(tail_f16_512, uint16_t, h2f_512, A512)
#define tail tail_f16_512
#define LOADW(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p)))
KERNELS(f16_512, uint16_t, A512, 4, 4, 4, 4, 4, 4, 3, 3)
#undef LOADW
#undef tail
TAIL(tail_i8_512, int8_t, i2f, A512)
#define tail tail_i8_512
#define LOADW(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p))))
KERNELS(i8_512, int8_t, A512, 4, 4, 4, 4, 4, 4, 3, 3)
#undef LOADW
#undef tail
#undef VEC
#undef ZERO
#undef FMA
#undef HSUM
#undef LOADX
#undef W

// ---- AVX2 + FMA + F16C: 8 lanes, 16 registers ----
// float32: R x M accumulators + R weights + 1 input <= 16 (3 rows of W for 4 tokens, 2 for 7), but 4 rows for 3
// tokens and 3 for 5 (one register over: the input is reloaded from L1, cheaper than a second pass over W; timed
// with `scripts/cpu_costs.py --paths kernel`). Those are the defaults (passes256); a process may time others
// (lean_panels.choose_passes). R does not change the numbers: each output is the same chain of FMAs.
A256 static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#define VEC __m256
#define ZERO _mm256_setzero_ps()
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define HSUM(v) hsum256(v)
#define LOADX(p) _mm256_loadu_ps(p)
#define W 8
TAIL(tail_f32_256, float, f32, A256)
#define tail tail_f32_256
#define LOADW(p) _mm256_loadu_ps(p)
KERNELS_R(f32_256, float, A256)
#undef LOADW
#undef tail
TAIL(tail_f16_256, uint16_t, h2f_256, A256)
#define tail tail_f16_256
#define LOADW(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p)))
KERNELS_R(f16_256, uint16_t, A256)
#undef LOADW
#undef tail
TAIL(tail_i8_256, int8_t, i2f, A256)
#define tail tail_i8_256
#define LOADW(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p))))
KERNELS_R(i8_256, int8_t, A256)
#undef LOADW
#undef tail

// ---- NF4 (bitsandbytes' 4-bit NormalFloat, wtype 3), on the AVX2 path whatever the CPU's best ----
// W: two weights a byte, the first in the high nibble, row-major, K a multiple of 64. scale: the 16 code values,
// then one absmax per block of 64 weights (row n's j-th block at n * K / 64 + j). A weight is code[q] * absmax, as
// bitsandbytes dequantises it; the kernel sums code[q] * x over a block of 64 in one multiply-add chain, then adds
// absmax times that sum to the row's: the same operations for every row of x (rounded once more per block than a
// product of the dequantised weights; the tests hold it to a float64 product of those).
// nf4_32 rebuilds 32 code values from 16 bytes, 8 to a register in their own order: the bytes are reordered so that,
// split into one nibble a byte, four byte-wise table lookups (vpshufb; table b holds byte b of the 16 float32 code
// values) and two rounds of unpacking put each float where its weight belongs: fewer shuffles per weight than a
// lookup of 8 at a time with vpermps, which matters because NF4 products are compute-bound at 1-8 rows.
A256 static inline void nf4_32(const uint8_t* p, const __m256i tab[4], __m128i order, __m256i low4, __m256 v[4]) {
    __m128i b = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)p), order);  // bytes 0 1 4 5 8 9 12 13 | 2 3 6 7 ...
    __m256i h = _mm256_cvtepu8_epi16(b);
    __m256i q = _mm256_and_si256(_mm256_or_si256(_mm256_slli_epi16(h, 8), _mm256_srli_epi16(h, 4)), low4);
    __m256i t0 = _mm256_shuffle_epi8(tab[0], q), t1 = _mm256_shuffle_epi8(tab[1], q);
    __m256i t2 = _mm256_shuffle_epi8(tab[2], q), t3 = _mm256_shuffle_epi8(tab[3], q);
    __m256i l01 = _mm256_unpacklo_epi8(t0, t1), h01 = _mm256_unpackhi_epi8(t0, t1);
    __m256i l23 = _mm256_unpacklo_epi8(t2, t3), h23 = _mm256_unpackhi_epi8(t2, t3);
    v[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(l01, l23));  // weights 0-7
    v[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(l01, l23));  // 8-15
    v[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(h01, h23));  // 16-23
    v[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(h01, h23));  // 24-31
}

#define NF4_PASS(MM, R)                                                                                    \
    for (; n + R <= n1; n += R) {                                                                          \
        __m256 acc[R][MM];                                                                                 \
        PRAGMA(GCC unroll 8) for (int r = 0; r < R; r++)                                                   \
            PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++) acc[r][m] = _mm256_setzero_ps();             \
        for (long k = 0; k < K; k += 64) {                                                                 \
            PRAGMA(GCC unroll 8) for (int r = 0; r < R; r++) {                                             \
                long e = (n + r) * K + k;                                                                  \
                __m256 wv[4], part[MM];                                                                    \
                _mm_prefetch((const char*)(w + (e + R * K) / 2), _MM_HINT_T0);                             \
                PRAGMA(GCC unroll 8) for (int j = 0; j < 8; j++) { /* weights k + 8j .. */                 \
                    if (j % 4 == 0) nf4_32(w + e / 2 + 4 * j, tab, order, low4, wv);                       \
                    PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++) {                                    \
                        __m256 xv = _mm256_loadu_ps(x + m * K + k + 8 * j);                                \
                        part[m] = j ? _mm256_fmadd_ps(wv[j % 4], xv, part[m]) : _mm256_mul_ps(wv[0], xv);  \
                    }                                                                                      \
                }                                                                                          \
                __m256 a = _mm256_set1_ps(absmax[e >> 6]);                                                 \
                PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++)                                          \
                    acc[r][m] = _mm256_fmadd_ps(a, part[m], acc[r][m]);                                    \
            }                                                                                              \
        }                                                                                                  \
        PRAGMA(GCC unroll 8) for (int r = 0; r < R; r++)                                                   \
            PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++) y[m * N + n + r] = hsum256(acc[r][m]);       \
    }
#define NF4_BODY(MM, R) \
    long n = n0;        \
    NF4_PASS(MM, R)     \
    NF4_PASS(MM, 1)

A256 static void rows_nf4_256(const uint8_t* restrict w, const float* restrict scale, const float* restrict x, long M,
                              long K, long N, float* restrict y, long n0, long n1) {
    __m256i tab[4];  // byte b of each of the 16 code values, in both halves
    uint8_t bytes[4][32];
    for (int i = 0; i < 16; i++)
        for (int b = 0; b < 4; b++) bytes[b][i] = bytes[b][i + 16] = ((const uint8_t*)(scale + i))[b];
    for (int b = 0; b < 4; b++) tab[b] = _mm256_loadu_si256((const __m256i*)bytes[b]);
    const __m128i order = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i low4 = _mm256_set1_epi16(0x0F0F);
    const float* absmax = scale + 16;
    switch (M) {
        case 1: { NF4_BODY(1, 4) } break;
        case 2: { NF4_BODY(2, 2) } break;
        case 3: { NF4_BODY(3, 2) } break;
        case 4: { NF4_BODY(4, 1) } break;
        case 5: { NF4_BODY(5, 1) } break;
        case 6: { NF4_BODY(6, 1) } break;
        case 7: { NF4_BODY(7, 1) } break;
        default: { NF4_BODY(8, 1) } break;
    }
}

static int isa = -1;  // the level in use (few_rows_use_isa)

// Rows of W per pass of the AVX2 rows kernels, by weight type (float32, float16, int8) and rows of x (1..8): the
// compiled defaults, and what this process runs (few_rows_passes sets them).
#define DEFAULTS256 {{0, 4, 4, 4, 3, 3, 2, 2, 1}, {0, 4, 4, 3, 2, 2, 2, 1, 1}, {0, 4, 4, 3, 2, 2, 2, 1, 1}}
static const int default256[3][MAX_M + 1] = DEFAULTS256;
static int passes256[3][MAX_M + 1] = DEFAULTS256;

// The compiled defaults for weight type wtype (0-2) and the most rows per pass each call size takes, 1..8 in
// [1..8] of each. Returns 0, or -1 for another weight type.
int few_rows_pass_limits(int wtype, int* defaults, int* most) {
    if (wtype < 0 || wtype > 2) return -1;
    for (int m = 0; m <= MAX_M; m++) defaults[m] = default256[wtype][m], most[m] = MOST_PASSES[m];
    return 0;
}

// Read (r == NULL: into out) or set (from r[1..8], each 1..MOST_PASSES[m]) the AVX2 rows kernels' rows of W per pass
// for weight type wtype (0-2). Returns 0, or -1 for a value out of range (nothing changed).
int few_rows_passes(int wtype, const int* r, int* out) {
    if (wtype < 0 || wtype > 2) return -1;
    if (r) {
        for (int m = 1; m <= MAX_M; m++)
            if (r[m] < 1 || r[m] > MOST_PASSES[m]) return -1;
        for (int m = 1; m <= MAX_M; m++) passes256[wtype][m] = r[m];
    }
    if (out)
        for (int m = 0; m <= MAX_M; m++) out[m] = passes256[wtype][m];
    return 0;
}

// ---- Panels: W packed as (N / 16, K, 16), panel p holding output columns 16p .. 16p + 15 row after row of K ----
// (wtype 4, 5, 6: float32, float16, int8 with a scale per output column.) Each output is one multiply-add chain
// over k in order, in a lane of its own: no horizontal sums, and a thread reads its panels front to back, one
// stream per panel. Why: one sequential stream per panel keeps the hardware prefetchers ahead where rows' horizontal
// sums and scattered streams do not, so on CPUs where that pays the load chooses panels by timing both
// (`python scripts/cpu_costs.py --paths kernel@rows,kernel@panels` compares them). Up to 6 rows of x (AVX-512: 8,
// below) go through a group of panels at a time; more take another pass over the same panels, from the core's cache.
// Same numbers whatever M (each output is the same chain), though not the rows layout's (another order of
// additions): a model keeps one layout for every call (lean_panels.py).
// AVX-512: a call of 2 or more rows prefetches each panel PANEL_AHEAD rows of k ahead, since while the core does M
// multiply-adds per weight the hardware prefetchers alone let fast memory idle; a one-token step does not (its loop
// is loads, and the extra instructions only cost). 7-8 rows go through 3 panels at a time in one pass (8 x 3
// accumulators + 3 weights + a broadcast: 28 of 32 registers), not 6 rows and then the rest again, so the weights are
// read once; 9-16 rows take passes of 8.
#define PANEL_AHEAD 32
// The prefetch in use (few_rows_panel_ahead): how many rows of k ahead (0: none) and into which cache (0: L1, T0;
// 1: L2, T1). Which setting helps, and whether any does, differs by CPU and by how fast its memory is that minute:
// the setting is timed per process (lean_panels.time_prefetch), and any setting computes the same numbers.
static int ahead = PANEL_AHEAD, ahead_l2 = 0;
#define PREFETCH_PANEL(addr)                                                                               \
    do {                                                                                                   \
        if (l2) _mm_prefetch((const char*)(addr), _MM_HINT_T1);                                            \
        else _mm_prefetch((const char*)(addr), _MM_HINT_T0);                                               \
    } while (0)
#define PANEL_512(MM, G)                                                                                   \
    {                                                                                                      \
        __m512 acc[MM][G];                                                                                 \
        PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++)                                                  \
            PRAGMA(GCC unroll 4) for (int g = 0; g < G; g++) acc[m][g] = _mm512_setzero_ps();              \
        for (long k = 0; k < K; k++) {                                                                     \
            __m512 wv[G];                                                                                  \
            if (MM > 1 && ah) PRAGMA(GCC unroll 4) for (int g = 0; g < G; g++)                              \
                PREFETCH_PANEL(w + ((p + g) * K + k + ah) * 16);                                           \
            PRAGMA(GCC unroll 4) for (int g = 0; g < G; g++) wv[g] = LOADW(w + ((p + g) * K + k) * 16);    \
            PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++) {                                            \
                __m512 b = _mm512_set1_ps(x[m * K + k]);                                                   \
                PRAGMA(GCC unroll 4) for (int g = 0; g < G; g++) acc[m][g] = _mm512_fmadd_ps(wv[g], b, acc[m][g]); \
            }                                                                                              \
        }                                                                                                  \
        PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++)                                                  \
            PRAGMA(GCC unroll 4) for (int g = 0; g < G; g++) _mm512_storeu_ps(y + m * N + (p + g) * 16, acc[m][g]); \
    }
#define PANEL_512_M(G)                                                                                     \
    switch (mm) {                                                                                          \
        case 1: PANEL_512(1, G) break;                                                                     \
        case 2: PANEL_512(2, G) break;                                                                     \
        case 3: PANEL_512(3, G) break;                                                                     \
        case 4: PANEL_512(4, G) break;                                                                     \
        case 5: PANEL_512(5, G) break;                                                                     \
        default: PANEL_512(6, G) break;                                                                    \
    }
#define PANEL_512_M8(G)                                                                                    \
    switch (mm) {                                                                                          \
        case 7: PANEL_512(7, G) break;                                                                     \
        case 8: PANEL_512(8, G) break;                                                                     \
        default: PANEL_512_M(G) break;                                                                     \
    }
// AVX2: one panel at a time, as two 8-lane halves (2 weight registers, 2 x 6 accumulators, a broadcast <= 16). As on
// AVX-512, a call of 2 or more rows prefetches PANEL_AHEAD rows of k ahead; more than 6 rows of x go through a panel
// in balanced passes (7 as 4 + 3, 8 as 4 + 4: a pass of 1-2 rows is bound by its few multiply-add chains, not by
// the weights it rereads from cache), so every pass keeps enough chains in flight.
#define PANEL_256(MM)                                                                                      \
    {                                                                                                      \
        __m256 acc[MM][2];                                                                                 \
        PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();     \
        for (long k = 0; k < K; k++) {                                                                     \
            if (MM > 1 && ah) PREFETCH_PANEL(w + (p * K + k + ah) * 16);                                   \
            __m256 w0 = LOADW(w + (p * K + k) * 16), w1 = LOADW(w + (p * K + k) * 16 + 8);                 \
            PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++) {                                            \
                __m256 b = _mm256_broadcast_ss(x + m * K + k);                                             \
                acc[m][0] = _mm256_fmadd_ps(w0, b, acc[m][0]);                                             \
                acc[m][1] = _mm256_fmadd_ps(w1, b, acc[m][1]);                                             \
            }                                                                                              \
        }                                                                                                  \
        PRAGMA(GCC unroll 8) for (int m = 0; m < MM; m++) {                                                \
            _mm256_storeu_ps(y + m * N + p * 16, acc[m][0]);                                               \
            _mm256_storeu_ps(y + m * N + p * 16 + 8, acc[m][1]);                                           \
        }                                                                                                  \
    }
#define PANELS(SUF, WT, ATTR)                                                                              \
    ATTR static void panels_##SUF##_512(const WT* restrict w, const float* restrict x0, long M, long K, long N, \
                                        float* restrict y0, long p0, long p1) {                            \
        long most = M > 6 ? 3 : 4, part = M > 6 ? 8 : 6; /* panels at a time, rows of x a pass */         \
        const long ah = ahead;                                                                             \
        const int l2 = ahead_l2;                                                                           \
        for (long p = p0; p < p1;) {                                                                       \
            long g = p1 - p < most ? p1 - p : most;                                                        \
            for (long m0 = 0; m0 < M; m0 += part) {                                                        \
                long mm = M - m0 < part ? M - m0 : part;                                                   \
                const float* x = x0 + m0 * K;                                                              \
                float* y = y0 + m0 * N;                                                                    \
                if (part == 8) {                                                                           \
                    if (g == 3) PANEL_512_M8(3) else if (g == 2) PANEL_512_M8(2) else PANEL_512_M8(1)      \
                } else if (g == 4) PANEL_512_M(4) else if (g == 3) PANEL_512_M(3)                          \
                else if (g == 2) PANEL_512_M(2) else PANEL_512_M(1)                                        \
            }                                                                                              \
            p += g;                                                                                        \
        }                                                                                                  \
    }                                                                                                      \
    PANEL_TAIL(SUF##_512, WT, ATTR)
// The last panel where N is not a multiple of 16 (packed with zero columns past N): computed by the same kernel into
// 16 columns of its own, then its first N % 16 copied out (the same chain of operations for every output).
#define PANEL_TAIL(SUF, WT, ATTR)                                                                          \
    ATTR static void panel_tail_##SUF(const WT* restrict w, const float* restrict x, long M, long K, long N, \
                                      float* restrict y) {                                                 \
        long p = N / 16, n0 = p * 16;                                                                      \
        float part[16 * MAX_CALL];                                                                         \
        panels_##SUF(w, x, M, K, 16, part - n0, p, p + 1); /* y + m * 16 + p * 16 lands in part + m * 16 */ \
        for (long m = 0; m < M; m++)                                                                       \
            for (long n = n0; n < N; n++) y[m * N + n] = part[m * 16 + n - n0];                            \
    }
#define LOADW(p) _mm512_loadu_ps(p)
PANELS(f32, float, A512)
#undef LOADW
#define LOADW(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p)))
PANELS(f16, uint16_t, A512)
#undef LOADW
#define LOADW(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p))))
PANELS(i8, int8_t, A512)
#undef LOADW
#define PANELS2(SUF, WT)                                                                                   \
    A256 static void panels_##SUF##_256(const WT* restrict w, const float* restrict x0, long M, long K, long N, \
                                        float* restrict y0, long p0, long p1) {                            \
        long parts = (M + 5) / 6, part = (M + parts - 1) / parts; /* rows of x a pass, balanced */        \
        const long ah = ahead;                                                                             \
        const int l2 = ahead_l2;                                                                           \
        for (long p = p0; p < p1; p++)                                                                     \
            for (long m0 = 0; m0 < M; m0 += part) {                                                        \
                long mm = M - m0 < part ? M - m0 : part;                                                   \
                const float* x = x0 + m0 * K;                                                              \
                float* y = y0 + m0 * N;                                                                    \
                switch (mm) {                                                                              \
                    case 1: PANEL_256(1) break;                                                            \
                    case 2: PANEL_256(2) break;                                                            \
                    case 3: PANEL_256(3) break;                                                            \
                    case 4: PANEL_256(4) break;                                                            \
                    case 5: PANEL_256(5) break;                                                            \
                    default: PANEL_256(6) break;                                                           \
                }                                                                                          \
            }                                                                                              \
    }                                                                                                      \
    PANEL_TAIL(SUF##_256, WT, A256)
#define LOADW(p) _mm256_loadu_ps(p)
PANELS2(f32, float)
#undef LOADW
#define LOADW(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p)))
PANELS2(f16, uint16_t)
#undef LOADW
#define LOADW(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p))))
PANELS2(i8, int8_t)
#undef LOADW

// ---- int8 weights against int8 activations (wtype 7): a draft's products in integer arithmetic ----
// W int8 (N, K) packed as (ceil(N / 16), K / 4, 16, 4): panel p, group g holds output columns 16p .. 16p + 15, each
// with its 4 weights k = 4g .. 4g + 3 side by side (zero columns past N). Each row of x is quantised in blocks of
// QBLOCK: scale max |x| / 127, values rounded to the nearest integer (as llama.cpp's Q8_0 activations). A block's
// products are summed exactly in int32 (vpmaddubsw of |x| and w with x's sign, vpmaddwd of the pairs), its sum times
// its scale is added to a float32 chain, and the column's weight scale multiplies the result. Why: the int8 -> float32
// conversion, not the memory, bounds the float path of an int8 draft (a step there takes well over what reading its
// bytes costs), and integer products skip that conversion. Only guesses come from it (a draft's weights; lean_draft chooses it by timing):
// its numbers are not the float path's. The same numbers whatever M: each row of x goes through a panel on its own.
// Needs K a multiple of QBLOCK; |w| <= 127 (int8_rows' range: the pair sums of vpmaddubsw stay under 2^15).
#define QBLOCK 32
A256 static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
// x (M, K) -> q (M, K) int8 and s (M, K / QBLOCK) float32, q * s ~ x.
A256 static void quant_rows(const float* restrict x, long M, long K, int8_t* restrict q, float* restrict s) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (long m = 0; m < M; m++)
        for (long b = 0; b < K; b += QBLOCK) {
            const float* v = x + m * K + b;
            __m256 mx = _mm256_setzero_ps();
            for (int i = 0; i < QBLOCK; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(v + i), absmask));
            float a = hmax8(mx);
            s[m * (K / QBLOCK) + b / QBLOCK] = a / 127.0f;
            __m256 inv = _mm256_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
            for (int i = 0; i < QBLOCK; i += 8) {
                __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), inv));  // to nearest, even ties
                __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
                _mm_storel_epi64((__m128i*)(q + m * K + b + i), _mm_packs_epi16(h, h));
            }
        }
}
// One panel (K / 4 groups of 64 bytes) against one quantised row of x: 16 outputs, before the weights' scales.
A256 static void panel_q8(const int8_t* restrict w, const int8_t* restrict q, const float* restrict s, long K,
                          float* restrict out) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f0 = _mm256_setzero_ps(), f1 = _mm256_setzero_ps();
    for (long b = 0; b < K; b += QBLOCK) {
        __m256i i0 = _mm256_setzero_si256(), i1 = _mm256_setzero_si256();
        PRAGMA(GCC unroll 8) for (int g = 0; g < QBLOCK / 4; g++) {
            long k = b + 4 * g;
            int32_t four;
            __builtin_memcpy(&four, q + k, 4);
            __m256i xb = _mm256_set1_epi32(four), ax = _mm256_abs_epi8(xb);
            __m256i w0 = _mm256_loadu_si256((const __m256i*)(w + k * 16));
            __m256i w1 = _mm256_loadu_si256((const __m256i*)(w + k * 16 + 32));
            i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, xb)), ones));
            i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, xb)), ones));
        }
        __m256 sv = _mm256_set1_ps(s[b / QBLOCK]);
        f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), sv, f0);
        f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), sv, f1);
    }
    _mm256_storeu_ps(out, f0);
    _mm256_storeu_ps(out + 8, f1);
}
// The same with AVX-512 VNNI (where the CPU reports it): all 16 columns of a group in one register, w negated
// where x is negative (a byte mask: AVX-512 has no vpsignb) and vpdpbusd summing each column's 4 products of |x| and
// w into its int32 lane. The integers are the AVX2 path's exactly, and so is the float32 chain: the same bits.
#define AVNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
AVNNI static void panel_q8_vnni(const int8_t* restrict w, const int8_t* restrict q, const float* restrict s, long K,
                                float* restrict out) {
    const __m512i zero = _mm512_setzero_si512();
    __m512 f = _mm512_setzero_ps();
    for (long b = 0; b < K; b += QBLOCK) {
        __m512i acc = zero;
        PRAGMA(GCC unroll 8) for (int g = 0; g < QBLOCK / 4; g++) {
            long k = b + 4 * g;
            int32_t four;
            __builtin_memcpy(&four, q + k, 4);
            __m512i xb = _mm512_set1_epi32(four);
            __m512i wv = _mm512_loadu_si512((const void*)(w + k * 16));
            wv = _mm512_mask_sub_epi8(wv, _mm512_movepi8_mask(xb), zero, wv);
            acc = _mm512_dpbusd_epi32(acc, _mm512_abs_epi8(xb), wv);
        }
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(s[b / QBLOCK]), f);
    }
    _mm512_storeu_ps(out, f);
}
static int vnni = -1;  // whether the CPU has AVX-512 VNNI (and BW); used where the level in use is AVX-512
static __thread int8_t* q8_buf;  // each thread's quantised x (a call's rows), grown as needed, kept
static __thread long q8_cap;
// x quantised for wtype 7 into this thread's own buffer (M K values, about a microsecond for a draft's call; every
// thread its own copy); NULL when there is no memory for it (a few KB).
static int8_t* quantised(const float* x, long M, long K, float** s) {
    long need = M * K + (long)sizeof(float) * M * (K / QBLOCK) + 64;
    if (need > q8_cap) {
        int8_t* grown = realloc(q8_buf, need);
        if (!grown) return NULL;
        q8_buf = grown;
        q8_cap = need;
    }
    *s = (float*)(q8_buf + ((M * K + 63) & ~63L));
    quant_rows(x, M, K, q8_buf, *s);
    return q8_buf;
}

// NaN in y's columns 16 c0 .. min(16 c1, N) for every row: what a product gives where the thread had no memory to
// prepare x (wtypes 7 and 8, `prepared`).
static void nan_columns(float* y, long M, long N, long c0, long c1) {
    for (long m = 0; m < M; m++)
        for (long n = c0 * 16; n < c1 * 16 && n < N; n++) y[m * N + n] = __builtin_nanf("");
}

// Panels c0 .. c1 - 1 of wtype 7 (q, s: x quantised), each panel against every row of x while it sits in the core's
// cache (q NULL, no memory for it: `blocks` writes NaN instead, a draft's guesses only).
A256 static void panels_q8(const int8_t* w, const float* scale, const int8_t* q, const float* s, long M, long K, long N,
                           float* y, long c0, long c1) {
    float out[16];
    int fast = isa == 2 && vnni > 0;
    for (long p = c0; p < c1; p++)
        for (long m = 0; m < M; m++) {
            long n0 = p * 16, n1 = n0 + 16 < N ? n0 + 16 : N;
            if (fast) panel_q8_vnni(w + p * K * 16, q + m * K, s + m * (K / QBLOCK), K, out);
            else panel_q8(w + p * K * 16, q + m * K, s + m * (K / QBLOCK), K, out);
            for (long n = n0; n < n1; n++) y[m * N + n] = out[n - n0] * scale[n];
        }
}

// ---- float32 weights as two bfloat16 parts each, on AMX tiles (wtype 8) ----
// Why: past a few tokens a call on few cores is bound by its float32 multiply-adds, not by the memory, so a token
// tree's verify (up to 16 tokens) costs more than a chain's. An AMX tile multiply does 16 x 16 x 32 of them at once:
// the same products at 1-16 tokens then cost what reading the weights costs. AMX multiplies bfloat16 (8 bits of
// significand), so each weight is stored as hi + lo, two bfloat16 (hi = w rounded to nearest even, lo = w - hi
// rounded: 16 of float32's 24 bits, in float32's 4 bytes), each row of x likewise, and a product sums
// hi.hi + lo.hi + hi.lo in float32 (lo.lo, below 2^-16 of it, left out): the numbers of a float32 product to about
// 1e-5 of a logit's size, not its bits, so a model keeps this layout for every call (lean_panels) and plain and
// speculative decoding compute the same bits. Same numbers whatever M and whichever thread: every output is its own
// chain of tile multiply-adds over k in order (the tile unit's order within a 32-wide chunk is fixed by the CPU).
// Layout (native.tile): (ceil(N / 16), 2, K / 32, 16, 32) bfloat16: panel p of 16 output columns, its hi part then
// its lo part (two streams: one stream with the parts alternating per chunk was slower), chunk c of 32 k, row r holding k = 32c + 2r and 32c + 2r + 1 side by
// side for each column (AMX's pairs). K a multiple of 32. The Linux kernel hands a process the tiles' state only when
// asked (few_rows_amx).
// Products on the tiles whose thread had no memory to split x (their columns NaN, `blocks`): llama_forward and
// few_rows read it before and after a call and fail it where it grew, for a target's logits must not be NaN (a
// draft's guesses may be: wtype 7 keeps its NaN, which the draft's argmax never picks). few_rows_refuse_split(n):
// the next n splits fail as if realloc had (the tests' way to reach that path).
static atomic_long tiles_short;
static atomic_int split_refusals;
long few_rows_tiles_short(void) { return atomic_load(&tiles_short); }
void few_rows_refuse_split(int n) { atomic_store(&split_refusals, n); }
// AMX intrinsics came with GCC 11 and Clang 12: an older compiler builds the rest, and few_rows_amx says 0.
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define AAMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))
#define TILE (16 * 32)  // bfloat16 elements in a tile of W: 16 pairs of k by 16 columns
// Chunks of k the weights are prefetched ahead (panels_amx), into L1: a short distance keeps a one-token step as fast
// as floats in panels, where prefetching into L2 or further ahead did not.
#define TILE_AHEAD 2
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config_t;

static int amx = -1;  // whether this process can run the tiles (few_rows_amx)

// 1 where the CPU has AMX with bfloat16 and AVX-512 BF16 and the system gave this process the tiles' state, else 0.
int few_rows_amx(void) {
    if (amx < 0) {
        unsigned a, b, c, d, a1 = 0, b1, c1, d1;
        int cpu = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1) && (b >> 16 & 1) &&
                  (b >> 30 & 1) && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 >> 5 & 1);
        // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): refused where a thread's signal stack is too small
        amx = cpu && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    }
    return amx;
}

// The tiles this thread's calls use: 0-1 two panels' outputs (M x 16 float32), 2-3 x's hi and lo parts (M x 32), 4-7
// two panels' hi and lo weights (16 pairs x 16 columns).
AAMX static void tiles_begin(long M) {
    tile_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = i < 4 ? (uint8_t)M : 16;
    }
    // Not _tile_loadconfig: GCC 12's takes the 64 bytes as one pointer's worth of memory, and dropped the stores above
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

AAMX static void tiles_end(void) { _tile_release(); }

// x (M, K) float32 -> hi, lo (M, K) bfloat16 (lo right after hi): hi = x rounded to nearest even, lo = the rest
// rounded (M K a multiple of 16).
AAMX static void split_rows(const float* restrict x, long n, uint16_t* restrict hi, uint16_t* restrict lo) {
    for (long i = 0; i < n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
        __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        _mm256_storeu_si256((__m256i*)(hi + i), h);
        _mm256_storeu_si256((__m256i*)(lo + i), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back)));
    }
}

// One output tile (M x 16) into y's columns of panel p, the part past N left out.
AAMX static void tile_out(int which, float* y, long N, long M, long p) {
    if ((p + 1) * 16 <= N) {
        if (which == 0) _tile_stored(0, y + p * 16, N * 4);
        else _tile_stored(1, y + p * 16, N * 4);
        return;
    }
    float part[16 * MAX_CALL];
    if (which == 0) _tile_stored(0, part, 64);
    else _tile_stored(1, part, 64);
    for (long m = 0; m < M; m++)
        for (long n = p * 16; n < N; n++) y[m * N + n] = part[m * 16 + n - p * 16];
}

// Panels c0 .. c1 - 1, two at a time; xs: x's hi parts, then its lo parts (split_rows). tiles_begin(M) first.
AAMX static void panels_amx(const uint16_t* restrict w, const uint16_t* restrict xs, long M, long K, long N,
                            float* restrict y, long c0, long c1) {
    const uint16_t* xl = xs + M * K;
    long C = K / 32;
    for (long p = c0; p < c1; p += 2) {
        const uint16_t* a = w + p * C * 2 * TILE;  // panel p, then p + 1 right after it
        const uint16_t* b = a + C * 2 * TILE;
        int two = p + 1 < c1;
        _tile_zero(0);
        _tile_zero(1);
        for (long c = 0; c < C; c++) {
            if (c + TILE_AHEAD < C) {  // the weights TILE_AHEAD chunks on, into L1: 16 lines in each tile
                const char* f = (const char*)(a + (c + TILE_AHEAD) * TILE);
                for (int l = 0; l < 16; l++) {
                    _mm_prefetch(f + 64 * l, _MM_HINT_T0);
                    _mm_prefetch(f + C * TILE * 2 + 64 * l, _MM_HINT_T0);
                    if (two) {
                        _mm_prefetch(f + C * TILE * 4 + 64 * l, _MM_HINT_T0);
                        _mm_prefetch(f + C * TILE * 6 + 64 * l, _MM_HINT_T0);
                    }
                }
            }
            _tile_loadd(2, xs + c * 32, K * 2);
            _tile_loadd(3, xl + c * 32, K * 2);
            _tile_loadd(4, a + c * TILE, 64);
            _tile_loadd(5, a + (C + c) * TILE, 64);
            _tile_dpbf16ps(0, 2, 4);  // hi . hi
            _tile_dpbf16ps(0, 3, 4);  // lo . hi
            _tile_dpbf16ps(0, 2, 5);  // hi . lo
            if (two) {
                _tile_loadd(6, b + c * TILE, 64);
                _tile_loadd(7, b + (C + c) * TILE, 64);
                _tile_dpbf16ps(1, 2, 6);
                _tile_dpbf16ps(1, 3, 6);
                _tile_dpbf16ps(1, 2, 7);
            }
        }
        tile_out(0, y, N, M, p);
        if (two) tile_out(1, y, N, M, p + 1);
    }
}

static __thread uint16_t* split_buf;  // each thread's x in two bfloat16 parts (a call's rows), grown as needed, kept
static __thread long split_cap;

// x split for wtype 8 into this thread's own buffer, tiles_begin done; NULL when there is no memory for it.
static const uint16_t* tiles_ready(const float* x, long M, long K) {
    if (atomic_load(&split_refusals) > 0 && atomic_fetch_sub(&split_refusals, 1) > 0) return NULL;
    if (2 * M * K > split_cap) {
        uint16_t* grown = realloc(split_buf, sizeof(uint16_t) * 2 * M * K);
        if (!grown) return NULL;
        split_buf = grown;
        split_cap = 2 * M * K;
    }
    split_rows(x, M * K, split_buf, split_buf + M * K);
    tiles_begin(M);
    return split_buf;
}

#else
int few_rows_amx(void) { return 0; }
static void tiles_end(void) {}
static void panels_amx(const uint16_t* w, const uint16_t* xs, long M, long K, long N, float* y, long c0, long c1) {}
static const uint16_t* tiles_ready(const float* x, long M, long K) { return NULL; }
#endif

// Panels c0 .. c1 - 1 (ceil(N / 16) in all; the last one may be partial, done by PANEL_TAIL) of wtypes 4-6.
static void panels_range(const void* w, int wtype, const float* scale, const float* x, long M, long K, long N,
                         float* y, long c0, long c1) {
    long full = N / 16, q1 = c1 < full ? c1 : full;  // whole panels end at q1; a partial one follows if c1 > full
#define RUN(F, WT) { if (c0 < q1) panels_##F((const WT*)w, x, M, K, N, y, c0, q1); \
                     if (c1 > full) panel_tail_##F((const WT*)w, x, M, K, N, y); }
    if (isa == 2) {
        if (wtype == 6) RUN(i8_512, int8_t) else if (wtype == 5) RUN(f16_512, uint16_t) else RUN(f32_512, float)
    } else {
        if (wtype == 6) RUN(i8_256, int8_t) else if (wtype == 5) RUN(f16_256, uint16_t) else RUN(f32_256, float)
    }
#undef RUN
    long n1 = c1 * 16 < N ? c1 * 16 : N;
    if (wtype == 6)
        for (long m = 0; m < M; m++)
            for (long n = c0 * 16; n < n1; n++) y[m * N + n] *= scale[n];
}

// The panels' prefetch distance in rows of k (0: none); with rows >= 0 first set it (to at most 1024) and the cache
// it fills (level 0: L1, 1: L2).
int few_rows_panel_ahead(int rows, int level) {
    if (rows >= 0) {
        ahead = rows < 1024 ? rows : 1024;
        ahead_l2 = level == 1;
    }
    return ahead;
}

int few_rows_panel_level(void) { return ahead_l2; }

// 2 = AVX-512F, 1 = AVX2 + FMA + F16C, 0 = neither (the caller keeps PyTorch's path).
int few_rows_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return 1;
    return 0;
}


// The level in use; with level >= 0 first set it (for tests: the AVX2 path on a CPU that also has AVX-512). A level
// above what the CPU has gives the CPU's best.
int few_rows_use_isa(int level) {
    int best = few_rows_isa();
    vnni = best == 2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
    if (level >= 0) isa = level < best ? level : best;
    else if (isa < 0) isa = best;
    return isa;
}

// y's columns 16 c0 .. min(16 c1, N) for every row of x: panels c0 .. c1 - 1 (wtypes 4-7), or those blocks of 16
// rows of W (wtypes 0-3). q, qs: x quantised (wtype 7). An output element is the same chain of operations whatever
// range it falls in and whichever thread computes it. wtype: 0 float32, 1 float16, 2 int8 with one float32 scale
// per row of W (y[m][n] = scale[n] * the int8 row's product: the same operations for every row of x), 3 NF4 (scale:
// its 16 code values, then an absmax per 64 weights; above); 4-6 those first three in panels; 7 int8 in panels of
// 4-byte groups against int8 activations (a draft's; above); 8 float32 as two bfloat16 parts in AMX tiles (q: x
// split by tiles_ready, which also set up this thread's tiles; above).
static void blocks(const void* w, int wtype, const float* scale, const float* x, const void* q, const float* qs,
                   long M, long K, long N, float* y, long c0, long c1) {
    if ((wtype == 7 || wtype == 8) && !q) {
        if (wtype == 8) atomic_fetch_add(&tiles_short, 1);
        nan_columns(y, M, N, c0, c1);
        return;
    }
    if (wtype == 8) {
        panels_amx((const uint16_t*)w, (const uint16_t*)q, M, K, N, y, c0, c1);
        return;
    }
    if (wtype == 7) {
        panels_q8((const int8_t*)w, scale, (const int8_t*)q, qs, M, K, N, y, c0, c1);
        return;
    }
    if (wtype >= 4) {
        panels_range(w, wtype, scale, x, M, K, N, y, c0, c1);
        return;
    }
    long n0 = c0 * 16, n1 = c1 * 16 < N ? c1 * 16 : N;
    // Up to MAX_M rows: one pass over the range. More: each BLOCK of W's rows against x's rows in parts of MAX_M
    // (an output element is the same chain of operations either way).
    long step = M <= MAX_M ? n1 - n0 : BLOCK;
    for (long b0 = n0; b0 < n1; b0 += step) {
        long b1 = b0 + step < n1 ? b0 + step : n1;
        for (long m0 = 0; m0 < M; m0 += MAX_M) {
            long mm = M - m0 < MAX_M ? M - m0 : MAX_M;
            const float* xm = x + m0 * K;
            float* ym = y + m0 * N;
            if (wtype == 3) rows_nf4_256((const uint8_t*)w, scale, xm, mm, K, N, ym, b0, b1);
            else if (isa == 2) {
                if (wtype == 2) rows_i8_512((const int8_t*)w, xm, mm, K, N, ym, b0, b1);
                else if (wtype == 1) rows_f16_512((const uint16_t*)w, xm, mm, K, N, ym, b0, b1);
                else rows_f32_512((const float*)w, xm, mm, K, N, ym, b0, b1);
            } else {
                int R = passes256[wtype][mm];
                if (wtype == 2) rows_i8_256((const int8_t*)w, xm, mm, K, N, ym, b0, b1, R);
                else if (wtype == 1) rows_f16_256((const uint16_t*)w, xm, mm, K, N, ym, b0, b1, R);
                else rows_f32_256((const float*)w, xm, mm, K, N, ym, b0, b1, R);
            }
        }
    }
    if (wtype == 2)
        for (long m = 0; m < M; m++)
            for (long n = n0; n < n1; n++) y[m * N + n] *= scale[n];
}

// What a thread makes of x before its blocks: quantised (wtype 7) or split for the tiles (8), else nothing.
static const void* prepared(int wtype, const float* x, long M, long K, float** qs) {
    if (wtype == 7) return quantised(x, M, K, qs);
    if (wtype == 8) return tiles_ready(x, M, K);
    return NULL;
}

// After a thread's blocks: the tiles released where `prepared` set them up (other code on this thread finds them as
// the system left them).
static void finished(int wtype, const void* q) {
    if (wtype == 8 && q) tiles_end();
}

// Thread t of T's share of the ceil(N / 16) blocks of 16 columns: c0 .. c1 - 1, T contiguous shares.
void few_rows_share(long N, int t, int T, long* c0, long* c1) {
    long nb = (N + 15) / 16, share = (nb + T - 1) / T;
    *c0 = t * share < nb ? t * share : nb;
    *c1 = *c0 + share < nb ? *c0 + share : nb;
}

// Thread t of T computes its share of y's columns (few_rows_share). Called inside a parallel region, by few_rows.
void few_rows_part(const void* w, int wtype, const float* scale, const float* x, long M, long K, long N, float* y,
                   int t, int T) {
    if (isa < 0) few_rows_use_isa(-1);
    long c0, c1;
    few_rows_share(N, t, T, &c0, &c1);
    if (c0 >= c1) return;
    float* qs = NULL;
    const void* q = prepared(wtype, x, M, K, &qs);
    blocks(w, wtype, scale, x, q, qs, M, K, N, y, c0, c1);
    finished(wtype, q);
}

// Take up to n blocks from the front (front != 0) or the back of the blocks [lo, hi) left in *share (lo | hi << 32):
// the blocks taken, [*c0, *c1), or 0 when none are left.
static int take(atomic_long* share, long n, int front, long* c0, long* c1) {
    long v = atomic_load_explicit(share, memory_order_relaxed);
    for (;;) {
        long lo = v & 0xffffffffL, hi = v >> 32;
        if (lo >= hi) return 0;
        long k = hi - lo < n ? hi - lo : n;
        long next = front ? (lo + k) | (hi << 32) : lo | ((hi - k) << 32);
        if (atomic_compare_exchange_weak_explicit(share, &v, next, memory_order_relaxed, memory_order_relaxed)) {
            *c0 = front ? lo : hi - k;
            *c1 = front ? lo + k : hi;
            return 1;
        }
    }
}

// Like few_rows_part, but a thread that is through its own share takes what is left of the others' from their far
// ends, so none waits long for a slower core (llama.c's forward). shares: T words, word u holding share u's blocks
// (few_rows_share) as lo | hi << 32 before the product starts; each owner takes its own from the front, a few blocks
// at a time, reading its weights front to back as before. Which thread computes a column does not change its numbers.
void few_rows_steal(const void* w, int wtype, const float* scale, const float* x, long M, long K, long N, float* y,
                    int t, int T, atomic_long* shares) {
    if (isa < 0) few_rows_use_isa(-1);
    // the tiles run panels in pairs (panels_amx: two weight streams at once), so they are taken two at a time
    long pair = wtype == 8 ? 2 : 1, nb = (N + 15) / 16, grain = nb / (16L * T) > pair ? nb / (16L * T) : pair, c0, c1;
    grain += grain % pair;
    float* qs = NULL;
    const void* q = prepared(wtype, x, M, K, &qs);
    while (take(shares + t, grain, 1, &c0, &c1)) blocks(w, wtype, scale, x, q, qs, M, K, N, y, c0, c1);
    for (int o = 1; o < T; o++)
        while (take(shares + (t + o) % T, pair, 0, &c0, &c1)) blocks(w, wtype, scale, x, q, qs, M, K, N, y, c0, c1);
    finished(wtype, q);
}

int few_rows(const void* w, int wtype, const float* scale, const float* x, long M, long K, long N, float* y,
             int threads) {
    if (isa < 0) few_rows_use_isa(-1);
    if (isa == 0 || M < 1 || M > MAX_CALL || threads < 1 || wtype < 0 || wtype > 8) return -1;
    if (wtype == 8 && (K % 32 || !few_rows_amx())) return -1;
    if ((wtype == 2 || wtype == 3 || wtype == 6 || wtype == 7) && !scale) return -1;
    if (wtype == 7 && K % QBLOCK) return -1;
    if (wtype == 3 && K % 64) return -1;
    long short0 = few_rows_tiles_short();
#pragma omp parallel num_threads(threads)
    few_rows_part(w, wtype, scale, x, M, K, N, y, omp_get_thread_num(), omp_get_num_threads());
    return wtype == 8 && few_rows_tiles_short() != short0 ? -2 : 0;  // -2: no memory for the tiles' x
}
