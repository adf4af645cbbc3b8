"""A lean forward pass for Llama-shaped models on the CPU: what a call of a few tokens costs when nothing but the
model's own arithmetic runs.

Why. Speculative decoding pays off when a verify of gamma + 1 tokens costs about one single-token step: both read
every weight once, and at these sizes reading the weights is the work. With specviz's few-token kernel the
linear layers of the built-in target are at that limit (16.9 ms for one row, 17.3 ms for four, on a 2-core
Xeon), but transformers' Llama spends as long again around them: a step took 32.9 ms and a verify of four
tokens 1.18 steps, because its per-layer bookkeeping (mask building, cache concatenation, the generic attention
interface, about 185 small copies) grows with the tokens fed. This module runs the same model with one tensor
op per piece of arithmetic and nothing else (after gpt-fast's `model.py`: preallocated KV cache, fused q/k/v and
gate/up products):

1. q, k and v are one product and gate and up another (the model's own weight tensors are re-bound as views into
   the fused ones, so no weight is held twice and the transformers model stays usable);
2. the KV cache is one preallocated tensor per model, (layers, kv heads, capacity, head dim), written in place;
   rolling back is setting its length, keeping a tree's path is a gather of rows;
3. RoPE's cos and sin come from the model's own rotary module, once per position, so every rope type it computes
   statically is computed as transformers does;
4. attention is two batched products and a softmax over the cache (grouped-query heads share their key-value
   head without copies); an additive mask only where the call has more than one token.

Numbers: the same model, in float32, up to rounding (the tests check the logits against transformers' and that
greedy speculative output equals greedy plain output on this path). Both lanes of a race run it, so the output
is still the target's own. Where a model does not fit (another architecture, biases, quantised layers, a GPU,
dynamic RoPE) the transformers forward runs as before; SPECVIZ_FORWARD=transformers forces that everywhere.
"""

from __future__ import annotations

import ctypes
import logging
import os

import torch
import torch.nn.functional as F

from . import native

log = logging.getLogger(__name__)

_STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # rope types whose cos/sin depend on the position only
_DTYPES = (torch.float32, torch.float16)


def mode() -> str:
    """SPECVIZ_FORWARD: "auto" (default: the lean forward where the model fits) or "transformers" (never)."""
    v = os.environ.get("SPECVIZ_FORWARD", "auto").strip().lower()
    return "transformers" if v in ("transformers", "hf", "0", "off", "no", "false") else "auto"


def why_not(model: torch.nn.Module) -> str | None:
    """Why the lean forward cannot run this model, in words; None when it can."""
    c = model.config
    if c.model_type != "llama" or type(model).__name__ != "LlamaForCausalLM":
        return f"it runs Llama models only, not {c.model_type}"
    if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False) or c.hidden_act != "silu":
        return "the model has biases or another activation"
    if getattr(c, "pretraining_tp", 1) != 1:
        return "the model splits its layers (pretraining_tp)"
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) not in _STATIC_ROPE:
        return f"its RoPE ({rope.get('rope_type')}) depends on the sequence length"
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and type(mod) is not torch.nn.Linear:
            return "its layers are quantised"
    w = model.get_input_embeddings().weight
    if w.device.type != "cpu" or w.dtype not in _DTYPES:
        return "it runs on the CPU in float32 or float16 only"
    return None


def build(model: torch.nn.Module, path: str) -> LeanLlama | None:
    """The lean forward for a loaded model, or None where it does not fit or SPECVIZ_FORWARD=transformers."""
    if mode() == "transformers":
        return None
    why = why_not(model)
    if why is not None:
        log.info("specviz: %s runs on transformers' forward: %s", type(model).__name__, why)
        return None
    return LeanLlama(model, path)


def _fuse(*linears: torch.nn.Linear) -> torch.Tensor:
    """One (sum of out, in) weight from several linear layers; each layer's weight becomes a view into it."""
    fused = torch.cat([m.weight.detach() for m in linears]).contiguous()
    start = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight = torch.nn.Parameter(fused[start : start + n], requires_grad=False)
        start += n
    return fused


class LeanCache:
    """Keys and values of every layer: (layers, kv heads, capacity, head dim) each, `length` rows in use.

    The capacity doubles when a call needs more; rows past `length` are garbage and never read.
    """

    FIRST_ROWS = 128  # the capacity a cache starts with: a chat prompt and a short reply

    def __init__(self, layers: int, kv_heads: int, head_dim: int):
        self.k = torch.zeros(layers, kv_heads, self.FIRST_ROWS, head_dim)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    @classmethod
    def rows_for(cls, n: int) -> int:
        """The capacity a cache has once it holds n rows."""
        cap = cls.FIRST_ROWS
        while cap < n:
            cap *= 2
        return cap

    def reserve(self, n: int) -> None:
        if n <= self.k.shape[2]:
            return
        cap = self.rows_for(n)
        k, v = self.k, self.v
        self.k = k.new_zeros(k.shape[0], k.shape[1], cap, k.shape[3])
        self.v = torch.zeros_like(self.k)
        self.k[:, :, : self.length] = k[:, :, : self.length]
        self.v[:, :, : self.length] = v[:, :, : self.length]

    def get_seq_length(self) -> int:
        """Rows in use (transformers' cache spelling)."""
        return self.length

    def crop(self, count: int) -> None:
        """Drop the last -count rows (a negative count, as transformers' DynamicCache.crop takes)."""
        self.length = max(0, self.length + count)

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy rows src -> dst in every layer (a tree's accepted path into place)."""
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]


class LeanLlama:
    """The forward pass of a `LlamaForCausalLM` on the CPU, over a `LeanCache`; built once per loaded model."""

    def __init__(self, model: torch.nn.Module, path: str):
        c = model.config
        self.model, self.path = model, path  # path: the linear-layer path kernels.py chose ("kernel", ...)
        self.H, self.heads = c.hidden_size, c.num_attention_heads
        self.kv_heads = c.num_key_value_heads
        self.d = getattr(c, "head_dim", None) or self.H // self.heads
        self.scale = self.d**-0.5
        self.eps = float(c.rms_norm_eps)
        inner = model.model
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach().float()
        self.head = model.lm_head.weight.detach()
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(
                (
                    layer.input_layernorm.weight.detach().float(),
                    _fuse(a.q_proj, a.k_proj, a.v_proj),  # (heads + 2 kv heads) * d rows
                    a.o_proj.weight.detach(),
                    layer.post_attention_layernorm.weight.detach().float(),
                    _fuse(m.gate_proj, m.up_proj),  # 2 * intermediate rows
                    m.down_proj.weight.detach(),
                )
            )
        self.inter = inner.layers[0].mlp.gate_proj.weight.shape[0]
        self.half = int(self.embed.dtype == torch.float16)
        # for llama.c: the weights' and norms' addresses, 4 and 2 per layer (the tensors above keep them alive)
        lib = native.library() if path == "kernel" else None
        self.lib = lib if lib is not None and hasattr(lib, "llama_layers") else None
        ptrs = [t.data_ptr() for (_, qkv, o, _, gu, down) in self.layers for t in (qkv, o, gu, down)]
        self.weight_ptrs = (ctypes.c_void_p * len(ptrs))(*ptrs)
        ptrs = [t.data_ptr() for (ln1, _, _, ln2, _, _) in self.layers for t in (ln1, ln2)]
        self.norm_ptrs = (ctypes.c_void_p * len(ptrs))(*ptrs)
        self.engine = "llama.c" if self.lib is not None else "PyTorch ops"  # for headers, benches, recordings
        self.rotary = inner.rotary_emb
        self.cos = self.sin = self.sin_signed = torch.empty(0, self.d)
        self._rope(256)

    def new_cache(self) -> LeanCache:
        return LeanCache(len(self.layers), self.kv_heads, self.d)

    def _rope(self, n: int) -> None:
        """cos and sin (n, d) for positions 0..n-1 (and more: the table doubles), from the model's rotary module;
        `sin_signed` with its first half negated, so that rotate_half(x) * sin = roll(x, d/2) * sin_signed."""
        if n <= self.cos.shape[0]:
            return
        n = max(n, 2 * self.cos.shape[0])
        pos = torch.arange(n).view(1, -1)
        cos, sin = self.rotary(torch.zeros(1, dtype=torch.float32), pos)  # (1, n, d) each
        half = self.d // 2
        self.cos, self.sin = cos[0].float().contiguous(), sin[0].float().contiguous()
        self.sin_signed = torch.cat([-self.sin[:, :half], self.sin[:, half:]], dim=-1)

    def _linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x (L, in) float32 -> (L, out) float32 by the path chosen for this machine."""
        rows = x.shape[0]
        if self.path == "kernel" and rows <= native.MAX_ROWS:
            return native.few_rows(x.contiguous(), w)
        if w.dtype != torch.float32:
            return F.linear(x.to(w.dtype), w).float()
        if self.path == "transposed" and 2 <= rows <= 64:
            return torch.mm(w, x.t()).t()
        return F.linear(x, w)

    @torch.no_grad()  # not inference_mode: callers may change the logits in place (a draft's blocked rows)
    def forward(
        self,
        cache: LeanCache,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (L,) fed after the cache's rows -> (logits (L, or 1 with last_only, Vm), last hidden states (L, H)).

        positions (L,): RoPE positions (default: the cache's row numbers); mask (L, rows + L) additive: which rows
        each token sees (default: causal). The cache grows by L rows.
        """
        L, base = ids.numel(), cache.length
        cache.reserve(base + L)
        pos = torch.arange(base, base + L) if positions is None else positions.view(-1)
        self._rope(int(pos.max()) + 1)
        x = F.embedding(ids.view(-1), self.embed).float()  # (L, H)
        if self.lib is not None and L <= native.MAX_ROWS:
            self._native(cache, x, base, pos, mask)
        else:
            x = self._torch(cache, x, base, pos, mask)
        cache.length = base + L
        h = F.rms_norm(x, (self.H,), self.norm, self.eps)  # (L, H): the last hidden states, as transformers gives
        return self._linear(h[-1:] if last_only else h, self.head), h

    def _native(self, cache: LeanCache, x: torch.Tensor, base: int, pos: torch.Tensor, mask) -> None:
        """The decoder layers by llama.c, in one call: x (L, H) updated in place, the cache written."""
        cos, sin = self.cos[pos], self.sin[pos]  # (L, d) each
        m = mask.float().contiguous() if mask is not None else None
        failed = self.lib.llama_layers(
            self.weight_ptrs, self.norm_ptrs, len(self.layers), self.half,
            self.H, self.heads, self.kv_heads, self.d, self.inter, self.eps,
            x.data_ptr(), x.shape[0], cache.k.data_ptr(), cache.v.data_ptr(), cache.k.shape[2], base,
            cos.data_ptr(), sin.data_ptr(), m.data_ptr() if m is not None else None, torch.get_num_threads(),
        )  # fmt: skip
        if failed:
            raise RuntimeError("llama_layers refused its arguments")  # unreachable: forward checks them

    def _torch(self, cache: LeanCache, x: torch.Tensor, base: int, pos: torch.Tensor, mask) -> torch.Tensor:
        """The decoder layers in PyTorch ops (a prefill, or where llama.c is not built): x (L, H) -> x."""
        L, T = x.shape[0], base + x.shape[0]
        hq, hk, d, g = self.heads, self.kv_heads, self.d, self.heads // self.kv_heads
        cos, sin = self.cos[pos][:, None], self.sin_signed[pos][:, None]  # (L, 1, d): over heads
        if mask is None and L > 1:
            mask = torch.full((L, T), -torch.inf).triu_(base + 1)  # causal: token l sees rows 0 .. base + l
        if mask is not None:  # (L, T) -> (L g, T): the query heads of a group read the same rows
            mask = mask.float().repeat_interleave(g, dim=0)
        for i, (ln1, qkv_w, o_w, ln2, gu_w, down_w) in enumerate(self.layers):
            h = F.rms_norm(x, (self.H,), ln1, self.eps)
            qkv = self._linear(h, qkv_w)  # (L, (hq + 2 hk) d)
            qk = qkv[:, : (hq + hk) * d].view(L, hq + hk, d)
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), sin)  # RoPE on q and k at once
            cache.k[i, :, base:T] = qk[:, hq:].transpose(0, 1)
            cache.v[i, :, base:T] = qkv[:, (hq + hk) * d :].view(L, hk, d).transpose(0, 1)
            q = qk[:, :hq].reshape(L, hk, g, d).transpose(0, 1).reshape(hk, L * g, d)  # rows: token-major
            keys, values = cache.k[i, :, :T], cache.v[i, :, :T]  # (hk, T, d)
            if mask is None:
                s = torch.bmm(q, keys.transpose(1, 2)).mul_(self.scale)  # (hk, g, T)
            else:
                s = torch.baddbmm(mask, q, keys.transpose(1, 2), alpha=self.scale)  # (hk, L g, T)
            o = torch.bmm(torch.softmax(s, dim=-1), values)  # (hk, L g, d)
            o = o.view(hk, L, g, d).transpose(0, 1).reshape(L, hq * d)
            x = x + self._linear(o, o_w)
            h = F.rms_norm(x, (self.H,), ln2, self.eps)
            gu = self._linear(h, gu_w)  # (L, 2 I)
            x = x + self._linear(F.silu(gu[:, : self.inter]) * gu[:, self.inter :], down_w)
        return x
