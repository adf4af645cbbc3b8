"""A faster CPU path for the linear layers when a forward call holds a few tokens (a verify, a prefill chunk).

On the CPUs measured here (AMD EPYC, torch 2.13 with MKL), `F.linear(x, W)` = x·Wᵀ for 2-16 rows of float32
takes a slow path: a 3-token call costs about twice a 1-token one, although both read the same weights once.
Computing the same product as (W·xᵀ)ᵀ lets MKL use its fast small-N kernel, and a verify of gamma + 1 tokens
then costs about one single-token step, which is what speculative decoding counts on (measured, 2 threads,
SmolLM2-135M: 3 tokens 86 ms -> 40 ms, 1 token 42 ms either way). One token keeps `F.linear`.

The result is the same product up to float32 rounding. It is applied to plain `nn.Linear` layers of float32
models on the CPU only (quantised layers and GPUs are left alone) and can be turned off with
SPECVIZ_CPU_GEMM=0. The same loaded model serves every method, so comparisons stay fair.
"""

from __future__ import annotations

import os
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


def enabled() -> bool:
    return os.environ.get("SPECVIZ_CPU_GEMM", "1").strip().lower() not in ("0", "false", "no", "off")


def use_small_batch_gemm(model: torch.nn.Module) -> int:
    """Switch the float32 CPU `nn.Linear` layers of `model` to the fast few-token path; returns how many."""
    if not enabled():
        return 0
    n = 0
    for mod in model.modules():
        if type(mod) is torch.nn.Linear and mod.weight.dtype == torch.float32 and mod.weight.device.type == "cpu":
            mod.forward = types.MethodType(_linear, mod)
            n += 1
    return n
