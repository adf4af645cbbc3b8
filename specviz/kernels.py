"""Faster CPU paths for the linear layers, chosen per machine by timing: a call of a few tokens, and a draft in float16.

1. The linear layers (`use_fast_linear`). Speculative decoding counts on a verify of gamma + 1 tokens costing
about one single-token step: both read every weight once, and at these sizes reading the weights is the work.
PyTorch's BLAS paths do not behave so for 2-8 rows, by CPU: on an AMD EPYC (MKL) `F.linear` for 2-16 rows took
about twice a one-row call and the transposed product (W·xᵀ)ᵀ got a 3-token call from 86 to 40 ms; on an Intel
Xeon the transposed product did the opposite (2 tokens 34 -> 70 ms) and `F.linear` jumped at 4 rows. So three paths
are timed once per process on the model's own layers (SPECVIZ_CPU_GEMM=auto), one row and four rows, the fastest
in sum used (the kernel unless another is faster by more than its margin, LEAN_MARGIN or KERNEL_MARGIN): "torch",
`F.linear`; "transposed", (W·xᵀ)ᵀ for 2-64 rows; "kernel", specviz's own few-token kernel (native.py,
csrc/few_rows.c) for 1-16 rows, near the memory-bound limit for any M up to 8 (`F.linear` for a prefill). Where it is
chosen a plain step uses it too, so a token's logits are the same bit for bit alone or inside a verify.
SPECVIZ_CPU_GEMM=torch / transposed / kernel forces one (0 and 1 mean torch and transposed). Under llama.c the
kernel reads a model's weights as stored, row by row, or packed in panels of 16 output columns (`panels_pay`), timed
once per model. The result is the same product up to float32 rounding; quantised layers, GPUs and other dtypes are
left alone.

2. A draft in float16 (`draft_dtype`). A draft's step reads all of its weights for one token, so it is bound by
memory traffic: in half precision it reads half the bytes (the built-in draft: 4.1 -> 1.6 ms a step on an EPYC),
which cuts c. CPUs that convert float16 slowly can lose instead, so (SPECVIZ_CPU_HALF_DRAFT=auto) a one-token
product in float16 and in float32 is timed once per process, each by its fastest path, and a draft loaded without a
dtype takes float16 only where clearly faster; `1` forces it, `0` never. Only the guesses change, not the output.
"""

from __future__ import annotations

import functools
import os
import time
import types
import weakref

import torch
import torch.nn.functional as F

from . import native

# The kernel is kept unless another path is clearly faster at the products alone (KERNEL_MARGIN): a busy neighbour
# can put one timing a few percent off, and where the kernel loses, `choose` draws again (Chromium starting beside a
# load on a Zen 4, 2 Dec 2026, once gave PyTorch's path: plain 12.9 tokens/s, not 33.5). Where the kernel also brings
# a Llama's whole forward in llama.c (lean.py), products timed one by one from Python cannot see it: on a 2-core Zen 3
# (3 Dec 2026) they took 97-151 ms for a step and a 4-token call (transposed 117-142) where llama.c's forward takes 41
# and PyTorch's 133 (`scripts/cpu_costs.py`), and 1 fresh process of 19 took PyTorch's path: LEAN_MARGIN there.
KERNEL_MARGIN = 1.15
LEAN_MARGIN = 2.0
MAX_ROWS = 64  # the transposed product's range: past a few dozen rows MKL's usual path is fine again (a prefill)
PATHS = ("torch", "transposed", "kernel")
_DTYPES = (torch.float32, torch.float16)


def _transposed(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // self.in_features if x.dim() else 0
    if not 2 <= rows <= MAX_ROWS or x.dtype != torch.float32 or x.device.type != "cpu":
        return F.linear(x, self.weight, self.bias)
    y = torch.mm(self.weight, x.reshape(rows, self.in_features).t()).t()
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*x.shape[:-1], self.out_features)


def _kernel(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // self.in_features if x.dim() else 0
    w = self.weight
    if (
        not 1 <= rows <= native.MAX_ROWS
        or x.device.type != "cpu"
        or w.dtype not in _DTYPES
        or not w.is_contiguous()
        or (w.requires_grad and torch.is_grad_enabled())  # training: autograd needs PyTorch's op
    ):
        return F.linear(x, w, self.bias)
    y = native.few_rows(x.reshape(rows, self.in_features).to(torch.float32).contiguous(), w)  # (rows, N) float32
    if self.bias is not None:
        y += self.bias
    return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


_FORWARDS = {"torch": None, "transposed": _transposed, "kernel": _kernel}


def mode() -> str:
    """SPECVIZ_CPU_GEMM: "auto" (default: time the paths once), or one path forced: torch, transposed, kernel."""
    v = os.environ.get("SPECVIZ_CPU_GEMM", "auto").strip().lower()
    if v in ("0", "false", "no", "off", "torch"):
        return "torch"
    if v in ("1", "true", "yes", "on", "transposed"):
        return "transposed"
    return "kernel" if v == "kernel" else "auto"


def candidates(dtype: torch.dtype) -> list[str]:
    """The paths that can run layers of this dtype here."""
    out = ["torch"]
    if dtype == torch.float32:
        out.append("transposed")
    if native.library() is not None:
        out.append("kernel")
    return out


def best_seconds(fn, reps: int = 5) -> float:
    """The best of `reps` timings of fn() after one warm-up (the least disturbed by other work on the machine)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _call(path: str, layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    forward = _FORWARDS[path]
    return F.linear(x, layer.weight, layer.bias) if forward is None else forward(layer, x)


@torch.inference_mode()
def time_paths(layers: list[torch.nn.Linear], paths: list[str], rows: tuple[int, ...] = (1, 4)) -> dict[str, list]:
    """Seconds of one pass over `layers` in order (as a forward pass reads them) for each path and row count.

    Paths are interleaved within each repetition, so a busy machine slows all of them alike.
    Returns {path: [seconds at rows[0], seconds at rows[1], ...]}.
    """
    dtype = layers[0].weight.dtype  # explicit dtypes: transformers may set another default while it builds a model
    inputs = {m: [torch.randn(m, layer.in_features, dtype=dtype) for layer in layers] for m in rows}
    out: dict[str, list] = {p: [float("inf")] * len(rows) for p in paths}
    for _ in range(3):
        for p in paths:
            for i, m in enumerate(rows):
                t = best_seconds(lambda p=p, m=m: [_call(p, layer, x) for layer, x in zip(layers, inputs[m])], reps=2)
                out[p][i] = min(out[p][i], t)
    return out


_CHOSEN: dict[tuple, str] = {}  # (dtype, margin, layer shapes) -> the path chosen for them in this process
_USED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> path it runs


def choose(layers: list[torch.nn.Linear], margin: float = KERNEL_MARGIN) -> str:
    """The path for these layers here: forced by SPECVIZ_CPU_GEMM, or timed once per set of shapes and margin."""
    dtype = layers[0].weight.dtype
    allowed = candidates(dtype)
    how = mode()
    if how != "auto":
        return how if how in allowed else "torch"  # a forced path this machine cannot run: PyTorch's own
    key = (dtype, margin, tuple(tuple(layer.weight.shape) for layer in layers))
    if key not in _CHOSEN:
        times = time_paths(layers, allowed)
        if "kernel" in allowed and _fastest(times, allowed, margin) != "kernel":  # a second draw, each the best
            again = time_paths(layers, allowed)
            times = {p: list(map(min, times[p], again[p])) for p in allowed}
        _CHOSEN[key] = _fastest(times, allowed, margin)
    return _CHOSEN[key]


def _fastest(times: dict[str, list], allowed: list[str], margin: float) -> str:
    """The path fastest in sum, or the kernel within `margin` of it."""
    best = min(allowed, key=lambda p: sum(times[p]))
    return "kernel" if "kernel" in allowed and sum(times["kernel"]) <= margin * sum(times[best]) else best


def use_fast_linear(model: torch.nn.Module, margin: float = KERNEL_MARGIN) -> str:
    """Switch the CPU `nn.Linear` layers of `model` (float32 or float16) to the fastest path here (the kernel kept
    within `margin`: hub.kernel_margin); returns its name."""
    layers = [
        mod
        for mod in model.modules()
        if type(mod) is torch.nn.Linear and mod.weight.dtype in _DTYPES and mod.weight.device.type == "cpu"
    ]
    if not layers or len({layer.weight.dtype for layer in layers}) > 1:
        return "torch"
    path = choose(layers, margin)
    forward = _FORWARDS[path]
    for mod in layers:
        if forward is None:
            mod.__dict__.pop("forward", None)  # back to nn.Linear's own
        else:
            mod.forward = types.MethodType(forward, mod)
    _USED[model] = path
    return path


def path_of(model: torch.nn.Module) -> str:
    """The linear-layer path `use_fast_linear` chose for this model ("torch" when it was never called)."""
    return _USED.get(model, "torch")


def describe(model: torch.nn.Module) -> str:
    """The linear-layer path a loaded model runs, in words for headers, benches and recordings."""
    path = _USED.get(model, "torch")
    if path == "kernel":
        n = torch.get_num_threads()
        return f"specviz kernel ({native.isa()}, {n} thread{'s' if n != 1 else ''})"
    return {"transposed": "PyTorch, transposed product"}.get(path, "PyTorch")


def switch(name: str) -> str:
    """An auto / on / off environment setting: "0" (0, false, no, off), "1" (1, true, yes, on), else "auto"."""
    v = os.environ.get(name, "auto").strip().lower()
    return "0" if v in ("0", "false", "no", "off") else "1" if v in ("1", "true", "yes", "on") else "auto"


def half_mode() -> str:
    """SPECVIZ_CPU_HALF_DRAFT: "auto" (default: time float16 against float32 once), "1" (always), "0" (never)."""
    return switch("SPECVIZ_CPU_HALF_DRAFT")


@torch.inference_mode()
def _time_halves(rows: int = 16384, cols: int = 576) -> tuple[float, float]:
    """Seconds of a one-token product with float32 and with float16 weights, each by its fastest path here: 38 MB
    in float32, more than most CPUs' last-level cache, so memory-bound like a real draft's step (the built-in one
    reads 60 MB)."""
    layer = torch.nn.Linear(cols, rows, bias=False, dtype=torch.float32)  # explicit: see time_paths
    full = time_paths([layer], candidates(torch.float32), rows=(1,))
    layer.to(torch.float16)
    half = time_paths([layer], candidates(torch.float16), rows=(1,))
    return min(t[0] for t in full.values()), min(t[0] for t in half.values())


@functools.cache
def half_is_faster() -> bool:
    """Whether float16 weights clearly beat float32 for one token on this CPU (timed once per process, ~0.2 s)."""
    full, half = _time_halves()
    return half < 0.8 * full


def draft_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype for a draft loaded without an explicit one: bfloat16 on a GPU that has it (else float16), float16 on
    MPS and on a CPU where that pays, else None (as p: float32). A draft's dtype changes only its guesses."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    how = half_mode()
    if device.type != "cpu" or how == "0":
        return None
    return torch.float16 if how == "1" or half_is_faster() else None


# Panels take a copy of the weights (the model keeps its own for PyTorch's paths), so a target keeps them only where
# a step's and a 4-token verify's passes over its products take this share of rows' time together or less
# (PANELS_SUM_MARGIN) and neither alone takes PANELS_GUARD times rows' or more (panels_pay); an int8 draft, judged by
# its step right after a target step (lean_draft), only where that is PANELS_MARGIN of rows' or less.
PANELS_MARGIN = 0.97
PANELS_SUM_MARGIN = 0.99
PANELS_GUARD = 1.06
LAYOUT_REPS = 4  # time_layouts' repetitions: about 0.7 s for the built-in target on a 2-core Zen 3


def layout_mode() -> str:
    """SPECVIZ_KERNEL_LAYOUT: "auto" (default: time both layouts once per model), "panels" or "rows" (forced)."""
    v = os.environ.get("SPECVIZ_KERNEL_LAYOUT", "auto").strip().lower()
    return v if v in ("panels", "rows") else "auto"


@torch.inference_mode()
def time_layouts(mats: list[tuple], rows: tuple[int, ...] = (1, 4)) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Seconds of a pass over a model's products by rows and in panels, for each of `rows` tokens (a plain step and
    a typical verify); mats: (weight as stored, the same packed, its scale or None) in the order a forward reads
    them. The layouts alternate within each of LAYOUT_REPS repetitions, so a busy machine slows both alike; the best
    of each."""
    inputs = {m: {w.shape[1]: torch.randn(m, w.shape[1]) for w, _, _ in mats} for m in rows}
    best = [[float("inf")] * len(rows) for _ in (0, 1)]
    for _ in range(LAYOUT_REPS):
        for i in (0, 1):
            for j, m in enumerate(rows):
                t = best_seconds(
                    lambda i=i, m=m: [
                        native.few_rows(inputs[m][w.shape[1]], (w, p)[i], sc, w.shape[0]) for w, p, sc in mats
                    ],
                    2,
                )
                best[i][j] = min(best[i][j], t)
    return tuple(best[0]), tuple(best[1])


@torch.inference_mode()
def time_passes(mats: list[tuple], wtype: int) -> tuple[int, ...]:
    """Rows of W per pass (native.passes) for each call size of 2..8 tokens on the AVX2 rows kernels, timed over
    these (weight, scale) products (enough of a model's weights to stream from memory, in a forward's order): every
    count up to the most each size takes (native.pass_limits), alternating within each of 3 repetitions; a count
    other than the default is kept only where it beat the default by PASSES_MARGIN in every repetition (one burst of
    other work must not decide a process's counts), the fastest such by its best time. A step's count (1 token)
    stays the compiled one, the best on every CPU measured (Xeon, Zen 1, 3, 4). Leaves the chosen counts set."""
    default, most = native.passes(wtype), native.pass_limits(wtype)[1]
    chosen = list(default)
    for m in range(2, 9):
        x = {w.shape[1]: torch.randn(m, w.shape[1]) for w, _ in mats}
        counts = range(1, most[m - 1] + 1)
        times: dict[int, list[float]] = {r: [] for r in counts}
        for _ in range(3):
            for r in counts:
                native.set_passes(wtype, tuple(chosen[: m - 1]) + (r,) + default[m:])
                times[r].append(
                    best_seconds(lambda x=x: [native.few_rows(x[w.shape[1]], w, sc, w.shape[0]) for w, sc in mats], 1)
                )
        base = times[default[m - 1]]
        wins = [r for r in counts if all(t < PASSES_MARGIN * b for t, b in zip(times[r], base))]
        if wins:
            chosen[m - 1] = min(wins, key=lambda r: min(times[r]))
    native.set_passes(wtype, tuple(chosen))
    return tuple(chosen)


PASSES_MARGIN = 0.95


def prefetch_mode() -> str | None:
    """SPECVIZ_KERNEL_PREFETCH: "auto" (default: timed once per process, `time_prefetch`) or the panels' prefetch
    forced ("none", "L1:32", "L2:64": native.panel_prefetch); a setting it cannot read counts as auto."""
    v = os.environ.get("SPECVIZ_KERNEL_PREFETCH", "auto").strip()
    try:
        native.parse_prefetch(v)
    except ValueError:
        return None
    return v


@torch.inference_mode()
def time_prefetch(call, rows: tuple[int, ...] = (2, 4)) -> dict[str, float]:
    """Seconds of a model's calls of `rows` tokens (call(m) runs one call of m tokens: a verify's whole forward, its
    attention and barriers included), summed over `rows`, for each of PREFETCHES, alternating within each of
    LAYOUT_REPS repetitions (the best of each). Leaves the setting as it found it. Whole calls, not the products: on
    the Zen 4 of 2 Dec 2026 the products understated the difference enough to keep L1:32 in one process of three."""
    was = native.panel_prefetch()
    best = {s: [float("inf")] * len(rows) for s in PREFETCHES}
    try:
        for _ in range(LAYOUT_REPS):
            for s in PREFETCHES:
                native.panel_prefetch(s)
                for j, m in enumerate(rows):
                    best[s][j] = min(best[s][j], best_seconds(lambda m=m: call(m), 2))
    finally:
        native.panel_prefetch(was)
    return {s: sum(t) for s, t in best.items()}


def prefetch_pays(times: dict[str, float]) -> str:
    """The setting to keep from `time_prefetch`'s sums: the fastest, where it was PREFETCH_MARGIN faster than the
    compiled one, else the compiled one. L1:32 made calls of 3-6 tokens 1.23-1.28 -> 1.17-1.20 steps on a 2-core Zen 5;
    on a 2-core Zen 4 2-5 tokens took 1.26-1.52 steps with it, 1.03-1.16 with none, 0.94-1.10 with L2:64."""
    fastest = min(times, key=times.get)
    return fastest if times[fastest] < PREFETCH_MARGIN * times[native.PANEL_PREFETCH] else native.PANEL_PREFETCH


def judged(draw, bar: float, ratio=None, most: int = 2) -> list[float]:
    """draw() -> [the base's time, the others'...]; while ratio(times) (default: the best of the others over the
    base's time) lands within CLOSE of bar, too close to call (a busy moment may have blurred it), another draw, up
    to `most` in all; each time the best of every draw so far."""
    ratio = ratio or (lambda t: min(t[1:]) / t[0])
    times = draw()
    for _ in range(most - 1):
        if abs(ratio(times) - bar) > CLOSE:
            break
        times = [min(a, b) for a, b in zip(times, draw())]
    return times


CLOSE = 0.1  # for every choice kept by a ratio to a bar: lean_draft's int8 and int8 activations, the panels' layout
# and prefetch


def judged_prefetch(call) -> str:
    """`prefetch_pays` of `time_prefetch(call)`, drawn again while too close to call (`judged`, PREFETCH_DRAWS at
    most). On the Zen 4 of 2 Dec 2026, with one draw, one load in three kept L1:32 (20 % slower). On the Zen 4
    without AVX-512 of 3 Dec, with two, 4 loads of 17 still did, each after two tied draws: the memory has slow spells
    in which every setting ties (a step 17-19 ms, not 14-15), and a draw in a fast moment sets L2:128 10-17 % ahead
    at 2-4 tokens."""

    def draw() -> list[float]:
        times = time_prefetch(call)
        return [times[s] for s in PREFETCHES]

    return prefetch_pays(dict(zip(PREFETCHES, judged(draw, PREFETCH_MARGIN, most=PREFETCH_DRAWS))))


PREFETCHES = (native.PANEL_PREFETCH, "none", "L2:64", "L2:128", "L2:256")  # the compiled one first: judged's base.
# L2:128 and L2:256: on the 2-core Zen 4 without AVX-512 (3 Dec 2026) a verify of 2-5 tokens took 1.06-1.19 steps
# with them against 1.10-1.35 with L1:32 and 1.15-1.33 with L2:64, in one process, interleaved (BENCHMARKS.md)
PREFETCH_MARGIN = 0.97
PREFETCH_DRAWS = 4  # about 2.5 s each for the built-in target


def passes_timed() -> bool:
    """SPECVIZ_KERNEL_PASSES: "auto" (default: the rows kernels' rows of W per pass timed once per process, on AVX2)
    or "default" (the compiled defaults, for comparing)."""
    return os.environ.get("SPECVIZ_KERNEL_PASSES", "auto").strip().lower() != "default"


def panels_pay(mats: list[tuple]) -> bool:
    """Whether this model's weights go to llama.c packed in panels: forced by SPECVIZ_KERNEL_LAYOUT, or timed on
    its own weights (`time_layouts`; under a second for the built-in target) and kept where a step and a 4-token
    verify take clearly less time together than by rows (PANELS_SUM_MARGIN) and neither is clearly slower alone
    (PANELS_GUARD). On a 2-core Zen 1 (28 Nov 2026) panels took a step 7 % faster but a 4-token call 9 % slower, and
    the race ran 1.28-1.34x against 1.50-1.54x by rows: rows. On a 2-core Zen 3 (1 Dec 2026) panels ran both lanes
    faster, but the products alone read a step 0.83-0.95 of rows' time and a 4-token call 0.85-1.05: the earlier
    rule (a 4-token call 3 % faster, a step not 3 % slower) took rows in 2 of 4 fresh processes. Judged by the two
    together, the noise of one size weighs half (BENCHMARKS.md, the Zen 1, Zen 5 and Zen 3 sections). Where the two
    together land within CLOSE of the margin, a second draw (`judged`): on the 2-core Zen 4 without AVX-512 of 3 Dec
    2026, 2 loads of 21 kept the target by rows (one timed 0.99 and 1.00, where the others read 0.51-0.79 and
    0.66-0.95)."""
    how = layout_mode()
    if how != "auto":
        return how == "panels"

    def draw() -> list[float]:
        rows, panels = time_layouts(mats)
        return [*rows, *panels]

    def together(t: list[float]) -> float:  # panels' time over rows', the step and the verify summed
        return (t[2] + t[3]) / (t[0] + t[1])

    step_rows, verify_rows, step_panels, verify_panels = times = judged(draw, PANELS_SUM_MARGIN, together)
    alone = max(step_panels / step_rows, verify_panels / verify_rows)
    return together(times) < PANELS_SUM_MARGIN and alone < PANELS_GUARD
