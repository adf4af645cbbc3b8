"""Faster CPU paths: the linear layers of a call holding a few tokens, and a draft's weights in float16.

1. A few tokens (a verify, a prefill chunk).

On the CPUs measured here (AMD EPYC, torch 2.13 with MKL), `F.linear(x, W)` = x·Wᵀ for 2-16 rows of float32
takes a slow path: a 3-token call costs about twice a 1-token one, although both read the same weights once.
Computing the same product as (W·xᵀ)ᵀ lets MKL use its fast small-N kernel, and a verify of gamma + 1 tokens
then costs about one single-token step, which is what speculative decoding counts on (measured, 2 threads,
SmolLM2-135M: 3 tokens 86 ms -> 40 ms, 1 token 42 ms either way). One token keeps `F.linear`.

Other CPUs differ: on an Intel Xeon with the same torch and MKL (measured 23 Nov 2026) the trick does the
opposite (a 2-token call 34 -> 70 ms), while plain `F.linear` already verifies 2-3 tokens for about one
step. So by default (SPECVIZ_CPU_GEMM=auto) the two ways are timed once per process on the model's largest
layer with 2, 4 and 8 rows, and the transposed product is used only where it is clearly faster here.
SPECVIZ_CPU_GEMM=1 forces it on, 0 off.

The result is the same product up to float32 rounding. It is applied to plain `nn.Linear` layers of float32
models on the CPU only (quantised layers and GPUs are left alone). The same loaded model serves every
method, so comparisons stay fair.

2. A draft in float16 (`draft_dtype`). A draft's step reads all of its weights for one token, so it is bound
by memory traffic: the built-in draft (15 M parameters) took 4.1 ms a step in float32 and 1.6 ms in float16
on the EPYC here (2 threads; bfloat16 2.2 ms), which cuts c, the draft's cost in target steps, by more than
half. CPUs that convert float16 slowly can lose instead, so by default (SPECVIZ_CPU_HALF_DRAFT=auto) a
one-token product with float16 and float32 weights is timed once per process and a draft loaded without an
explicit dtype takes float16 only where it is clearly faster; `1` forces it, `0` never. The target keeps
float32: only the guesses change, and speculative decoding's output does not depend on them.
"""

from __future__ import annotations

import functools
import os
import time
import types

import torch
import torch.nn.functional as F

MAX_ROWS = 64  # past a few dozen rows MKL's usual path is fine again (a long prompt's prefill)


def _linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // self.in_features if x.dim() else 0
    if not 2 <= rows <= MAX_ROWS or x.dtype != torch.float32 or x.device.type != "cpu":
        return F.linear(x, self.weight, self.bias)
    y = torch.mm(self.weight, x.reshape(rows, self.in_features).t()).t()
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*x.shape[:-1], self.out_features)


def mode() -> str:
    """SPECVIZ_CPU_GEMM: "auto" (default: time both ways once), "1" (always the transposed product), "0" (never)."""
    v = os.environ.get("SPECVIZ_CPU_GEMM", "auto").strip().lower()
    return "0" if v in ("0", "false", "no", "off") else "1" if v in ("1", "true", "yes", "on") else "auto"


def _seconds(fn, x: torch.Tensor, reps: int = 7, calls: int = 10) -> float:
    """The best of `reps` timings of `calls` calls (the least disturbed by other work on the machine)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(x)
        best = min(best, time.perf_counter() - t0)
    return best


def _time_both(layer: torch.nn.Linear, x: torch.Tensor) -> tuple[float, float]:
    """Seconds of F.linear and of the transposed product on x (rows, in_features)."""
    return _seconds(lambda v: F.linear(v, layer.weight, layer.bias), x), _seconds(lambda v: _linear(layer, v), x)


_FASTER: dict[tuple[int, int], bool] = {}  # weight shape -> whether the transposed product wins on this CPU


@torch.inference_mode()
def transposed_is_faster(layer: torch.nn.Linear) -> bool:
    """Whether (W·xᵀ)ᵀ beats F.linear for 2, 4 and 8 rows on this machine (timed once per weight shape)."""
    key = tuple(layer.weight.shape)
    if key not in _FASTER:
        plain, fast = 0.0, 0.0
        for rows in (2, 4, 8):
            x = torch.randn(rows, layer.in_features, dtype=layer.weight.dtype)  # explicit: see _time_halves
            p, f = _time_both(layer, x)
            plain, fast = plain + p, fast + f
        _FASTER[key] = fast < 0.8 * plain  # clearly faster, not a tie decided by noise
    return _FASTER[key]


def use_small_batch_gemm(model: torch.nn.Module) -> int:
    """Switch the float32 CPU `nn.Linear` layers of `model` to the few-token path where it pays; returns how many."""
    how = mode()
    layers = [
        mod
        for mod in model.modules()
        if type(mod) is torch.nn.Linear and mod.weight.dtype == torch.float32 and mod.weight.device.type == "cpu"
    ]
    if how == "0" or not layers:
        return 0
    if how == "auto" and not transposed_is_faster(max(layers, key=lambda m: m.weight.numel())):
        return 0
    for mod in layers:
        mod.forward = types.MethodType(_linear, mod)
    return len(layers)


def half_mode() -> str:
    """SPECVIZ_CPU_HALF_DRAFT: "auto" (default: time float16 against float32 once), "1" (always), "0" (never)."""
    v = os.environ.get("SPECVIZ_CPU_HALF_DRAFT", "auto").strip().lower()
    return "0" if v in ("0", "false", "no", "off") else "1" if v in ("1", "true", "yes", "on") else "auto"


def _time_halves(rows: int = 16384, cols: int = 576) -> tuple[float, float]:
    """Seconds of a one-token product with float32 and with float16 weights: 38 MB in float32, more than most
    CPUs' last-level cache, so memory-bound like a real draft's step (the built-in one reads 60 MB)."""
    # Explicit dtypes: transformers sets the process-wide default dtype while it builds a model, so on the app's
    # loading threads a float16 draft being built would otherwise turn these into float16 tensors.
    w = torch.randn(rows, cols, dtype=torch.float32)
    x = torch.randn(1, cols, dtype=torch.float32)
    w16, x16 = w.half(), x.half()
    return _seconds(lambda v: F.linear(v, w), x), _seconds(lambda v: F.linear(v, w16), x16)


@functools.cache
@torch.inference_mode()
def half_is_faster() -> bool:
    """Whether float16 weights clearly beat float32 for one token on this CPU (timed once per process, ~0.2 s)."""
    full, half = _time_halves()
    return half < 0.8 * full


def draft_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype for a draft loaded without an explicit one: float16 on a CPU where that pays, else None (as p)."""
    how = half_mode()
    if device.type != "cpu" or how == "0":
        return None
    return torch.float16 if how == "1" or half_is_faster() else None
