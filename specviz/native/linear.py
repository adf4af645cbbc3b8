"""Faster CPU paths for the linear layers, chosen per machine by timing: a call of a few tokens, and a draft in float16.

1. The linear layers (`use_fast_linear`). Speculative decoding counts on a verify of gamma + 1 tokens costing
about one single-token step: both read every weight once, and at these sizes reading the weights is the work.
PyTorch's BLAS paths do not behave so for 2-8 rows, and not alike on every CPU: `F.linear` can cost about twice a
one-row call, and the transposed product (W·xᵀ)ᵀ halves that on some CPUs and doubles it on others. So three paths
are timed once per process on the model's own layers (SPECVIZ_CPU_GEMM=auto), one row and four rows, the fastest
in sum used (the kernel unless another is faster by more than its margin, LEAN_MARGIN or KERNEL_MARGIN): "torch",
`F.linear`; "transposed", (W·xᵀ)ᵀ for 2-64 rows; "kernel", specviz's own few-token kernel (native.py,
csrc/few_rows.c) for 1-16 rows, near the memory-bound limit for any M up to 8 (`F.linear` for a prefill). Where it is
chosen a plain step uses it too, so a token's logits are the same bit for bit alone or inside a verify.
SPECVIZ_CPU_GEMM=torch / transposed / kernel forces one (0 and 1 mean torch and transposed). Under llama.c the
kernel reads a model's weights as stored, row by row, or packed in panels of 16 output columns (`lean_panels.panels_pay`),
timed once per model. The result is the same product up to float32 rounding; quantised layers, GPUs and other dtypes are
left alone.

2. A draft in float16 (`draft_dtype`). A draft's step reads all of its weights for one token, so it is bound by
memory traffic: in half precision it reads half the bytes, which cuts c. CPUs that convert float16 slowly can lose instead, so (SPECVIZ_CPU_HALF_DRAFT=auto) a one-token
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

from specviz.native import library as native

# The kernel is kept unless another path is clearly faster at the products alone (KERNEL_MARGIN): a busy neighbour
# can put one timing a few percent off (a browser starting beside a load once gave PyTorch's path, several times
# slower), and where the kernel loses, `choose` draws again. Where the kernel also brings a Llama's whole forward in
# llama.c (lean.py), products timed one by one from Python cannot see it: their Python overhead can make the kernel
# look no faster while llama.c's forward is several times PyTorch's (`scripts/cpu_costs.py` compares the whole
# forwards): LEAN_MARGIN there.
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


def verify_call(fwd, cached: int = 16):
    """call(m): one call of a lean forward over m tokens after `cached` tokens in its own cache (a plain step at
    m = 1, a verify above), the cache rolled back before each, for timing whole calls (lean_panels' prefetch,
    lean_tiles' layout). fwd: a lean.LeanLlama."""
    cache, ids = fwd.new_cache(), torch.arange(cached + 16) % fwd.embed.shape[0]
    fwd.forward(cache, ids[:cached])

    def call(m: int) -> None:
        cache.length = cached
        fwd.forward(cache, ids[cached : cached + m])

    return call


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
    """Whether float16 weights clearly beat float32 for one token on this CPU (timed once per process)."""
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
