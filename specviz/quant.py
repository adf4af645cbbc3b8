"""Quantised targets with bitsandbytes: 4-bit NF4 or 8-bit int8 weights, on any device the installed bitsandbytes
serves (CUDA; the CPU too from its multi-backend releases, e.g. 0.50). Only the target p is ever quantised.

Exact on the CPU. Speculative decoding's greedy output equals plain greedy output only if the target computes
each token the same whether it comes alone (a plain step) or inside a block of k + 1 (a verify). bitsandbytes'
own CPU kernels do not: NF4 rounds the activations to bfloat16 and int8 quantises them per row to 8 bits, so
the float32 rounding noise by which a 1-row and a 4-row attention call differ (1e-7) becomes whole rounding
steps, and near-ties flip. Measured on the built-in target: "Give me three tips for sleeping well." starts
with token 33 when plain and 27455 when verified in a block (NF4; logit margin 0.08); int8 parted at token 7
of "What is AI?". So on the CPU each quantised layer here multiplies in float32 with its weights dequantised
for that call (weight-only quantisation): memory as bitsandbytes stores it, the numbers of a float32 model
with those weights, and the speed of a dequantise plus a float32 product (README, "Your own pair").

A quantised Llama target does not go through these layers in a race: the lean forward (lean.py, csrc/llama.c)
reads the same int8 rows and row scales (`row_scales`), or NF4 nibbles and block absmax (`nf4_absmax`), straight
from bitsandbytes' parameters, with float32 activations and one chain of multiply-adds per output (several times
the tokens per second of transformers' forward over these layers: no dequantised copy per call).
"""

from __future__ import annotations

import logging
import types

import torch
import torch.nn.functional as F

from specviz.config import SpecvizError

QUANTIZE = (None, "4bit", "8bit")
QUANT_LABELS = {"4bit": "NF4, bitsandbytes", "8bit": "int8, bitsandbytes"}  # how the page and the check name them


class _QuietBitsAndBytes(logging.Filter):
    """Drops two lines bitsandbytes logs on the CPU that ask nothing of anyone: an int8 layer casting its float32
    input to float16 (once per layer per call: thousands in one reply), and an optional hub kernel it could not
    fetch (its own built-in CPU kernel runs instead)."""

    QUIET = ("MatMul8bitLt: inputs will be cast", "Failed to load CPU gemm_4bit_forward")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.QUIET)


_QUIET = _QuietBitsAndBytes()


def quant_config(quantize: str | None, device: torch.device):
    """transformers' BitsAndBytesConfig for "4bit" (NF4) or "8bit" (int8), or None; a SpecvizError where the
    installed bitsandbytes has no backend for `device` (releases before its multi-backend work serve CUDA only)."""
    if quantize is None:
        return None
    if quantize not in QUANTIZE:
        raise SpecvizError(f"Unknown quantisation {quantize!r}; use 4bit or 8bit.")
    for name in ("bitsandbytes.autograd._functions", "bitsandbytes.backends.cpu.ops"):
        logging.getLogger(name).addFilter(_QUIET)  # the same filter object: adding it again changes nothing
    try:
        import accelerate  # noqa: F401
        import bitsandbytes
        from transformers import BitsAndBytesConfig
    except ImportError:
        raise SpecvizError("Quantised loading needs the bitsandbytes and accelerate packages.") from None
    served = getattr(bitsandbytes, "supported_torch_devices", {"cuda"})
    if device.type not in served:
        raise SpecvizError(
            f"The installed bitsandbytes ({getattr(bitsandbytes, '__version__', '?')}) cannot run 4-bit or 8-bit "
            f"layers on {device.type}; load without --quantize here."
        )
    if quantize == "4bit":  # the CPU multiplies in float32 (see exact_cpu_layers); GPUs keep bfloat16
        compute = torch.float32 if device.type == "cpu" else torch.bfloat16
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute)
    return BitsAndBytesConfig(load_in_8bit=True)


def _nf4_forward(self, x: torch.Tensor) -> torch.Tensor:
    """NF4 weights, dequantised for this call, times float32 activations: one float32 product."""
    from bitsandbytes.functional import dequantize_4bit

    w = dequantize_4bit(self.weight.data, self.weight.quant_state).to(x.dtype)  # (out, in)
    return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))


def is_int8_layer(mod: torch.nn.Module) -> bool:
    """Whether `mod` is a bitsandbytes int8 layer holding int8 rows and their scales (the lean forward reads those)."""
    w = getattr(mod, "weight", None)
    return type(mod).__name__ == "Linear8bitLt" and w is not None and w.dtype == torch.int8 and _scb(mod) is not None


def _scb(mod: torch.nn.Module) -> torch.Tensor | None:
    """An int8 layer's absolute row maxima (bitsandbytes keeps them on the weight, or on the layer's state)."""
    scb = getattr(mod.weight, "SCB", None)
    return scb if scb is not None else getattr(getattr(mod, "state", None), "SCB", None)


def row_scales(mod: torch.nn.Module) -> torch.Tensor:
    """(out,) float32: what each int8 row of a bitsandbytes int8 layer is multiplied by, SCB / 127."""
    return _scb(mod).float() / 127


def is_nf4_layer(mod: torch.nn.Module) -> bool:
    """Whether `mod` is a bitsandbytes NF4 layer the lean forward reads: blocks of 64 weights along rows whose length
    is a multiple of 64, dequantised to float32 (a bfloat16 one rounds its weights: another model's numbers)."""
    w = getattr(mod, "weight", None)
    qs = getattr(w, "quant_state", None)
    return (
        type(mod).__name__ == "Linear4bit"
        and qs is not None
        and (qs.quant_type, qs.blocksize, qs.dtype, w.dtype) == ("nf4", 64, torch.float32, torch.uint8)
        and qs.shape[1] % 64 == 0
    )


def read_as_stored(mod: torch.nn.Module) -> bool:
    """Whether the lean forward reads this bitsandbytes layer's weights as they are stored (int8 or NF4)."""
    return is_int8_layer(mod) or is_nf4_layer(mod)


def nf4_absmax(mod: torch.nn.Module) -> torch.Tensor:
    """(out * in / 64,) float32: an NF4 layer's absmax per block of 64 weights (a nested state's expanded as
    bitsandbytes' dequantize_4bit expands it)."""
    qs = mod.weight.quant_state
    if not qs.nested:
        return qs.absmax.float()
    from bitsandbytes.functional import dequantize_blockwise

    return (dequantize_blockwise(qs.absmax, qs.state2) + qs.offset).float()


def nf4_dense(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(N, K / 2) uint8 NF4 (first weight of a byte in its high nibble) and scale (16 code values, then the absmax of
    each block of 64) -> (N, K) float32: code[q] * absmax, bitsandbytes' dequantisation."""
    q = torch.stack([packed >> 4, packed & 15], dim=-1).view(packed.shape[0], -1).long()  # (N, K)
    return (scale[:16][q].view(-1, 64) * scale[16:, None]).view(q.shape)


def _int8_forward(self, x: torch.Tensor) -> torch.Tensor:
    """int8 weights times float32 activations in one float32 product, each output then times its row's scale
    SCB / 127 (the same numbers as dequantising first, in another order, and far cheaper: scaling the weight matrix
    is the slow part)."""
    y = F.linear(x, self.weight.data.to(x.dtype)) * row_scales(self).to(x.dtype)  # (..., out)
    return y if self.bias is None else y + self.bias.to(x.dtype)


def exact_cpu_layers(model: torch.nn.Module) -> int:
    """Make a quantised model's bitsandbytes layers on the CPU multiply in float32 (see the module docstring);
    returns how many. Called once at load, before the first forward call (NF4 repacks its weights on that call)."""
    try:
        from bitsandbytes.nn import Linear4bit, Linear8bitLt
    except ImportError:
        return 0
    n = 0
    for mod in model.modules():
        forward = (
            _nf4_forward if isinstance(mod, Linear4bit) else _int8_forward if isinstance(mod, Linear8bitLt) else None
        )
        if forward is not None and mod.weight.device.type == "cpu":
            mod.forward = types.MethodType(forward, mod)
            n += 1
    return n


def weights_held(p: torch.Tensor) -> int:
    """How many weights a parameter holds: a bitsandbytes 4-bit one packs two to a byte (its shape before packing
    is in its quant_state)."""
    qs = getattr(p, "quant_state", None)
    return int(torch.Size(qs.shape).numel()) if qs is not None else p.numel()


def quant_state_bytes(model: torch.nn.Module) -> int:
    """Bytes a quantised model keeps outside its parameters and buffers: a 4-bit layer's scales (one float per
    block of 64 weights, an eighth of its packed weights' bytes) and code book, an int8 layer's row scales."""
    total = 0
    for p in model.parameters():
        parts = [getattr(p, "SCB", None)]
        qs = getattr(p, "quant_state", None)
        while qs is not None:  # a nested state (double quantisation) holds the scales' own scales
            parts += [qs.absmax, qs.code]
            qs = getattr(qs, "state2", None)
        total += sum(t.numel() * t.element_size() for t in parts if isinstance(t, torch.Tensor))
    return total
