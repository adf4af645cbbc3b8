"""The decoder layers of a lean Llama forward (lean.py) in PyTorch ops: for a prefill longer than llama.c's calls
take in a few (or of a model whose weights PyTorch's batched products read faster), and where llama.c is not built.
One tensor op per piece of arithmetic: fused q/k/v and gate/up products by the model's linear-layer path
(`LeanLlama.linear`), RoPE on q and k at once, the KV cache written in place, attention as two batched products
over the cache (grouped-query heads share their key-value head without copies), an additive mask only where the
call has more than one token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from specviz.native.kv_cache import LeanCache


def decoder_layers(m, cache: LeanCache, x: torch.Tensor, base: int, pos: torch.Tensor, mask) -> torch.Tensor:
    """The decoder layers of m (a lean.LeanLlama: its weights, shapes, RoPE tables and linear path) in PyTorch ops:
    x (L, H) the embeddings -> the residual stream (L, H); the cache gets rows base .. base + L - 1."""
    L, T = x.shape[0], base + x.shape[0]
    hq, hk, d, g = m.heads, m.kv_heads, m.d, m.heads // m.kv_heads
    cos, sin = m.cos[pos][:, None], m.sin_signed[pos][:, None]  # (L, 1, d): over heads
    if mask is None and L > 1:
        mask = torch.full((L, T), -torch.inf).triu_(base + 1)  # causal: token l sees rows 0 .. base + l
    if mask is not None:  # (L, T) -> (L g, T): the query heads of a group read the same rows
        mask = mask.float().repeat_interleave(g, dim=0)
    for i, (ln1, qkv_w, o_w, ln2, gu_w, down_w) in enumerate(m.layers):
        h = F.rms_norm(x, (m.H,), ln1, m.eps)
        qkv = m.linear(h, qkv_w)  # (L, (hq + 2 hk) d)
        qk = qkv[:, : (hq + hk) * d].view(L, hq + hk, d)
        qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), sin)  # RoPE on q and k at once
        cache.k[i, :, base:T] = qk[:, hq:].transpose(0, 1)
        cache.v[i, :, base:T] = qkv[:, (hq + hk) * d :].view(L, hk, d).transpose(0, 1)
        q = qk[:, :hq].reshape(L, hk, g, d).transpose(0, 1).reshape(hk, L * g, d)  # rows: token-major
        keys, values = cache.k[i, :, :T], cache.v[i, :, :T]  # (hk, T, d)
        if mask is None:
            s = torch.bmm(q, keys.transpose(1, 2)).mul_(m.scale)  # (hk, g, T)
        else:
            s = torch.baddbmm(mask, q, keys.transpose(1, 2), alpha=m.scale)  # (hk, L g, T)
        o = torch.bmm(torch.softmax(s, dim=-1), values)  # (hk, L g, d)
        o = o.view(hk, L, g, d).transpose(0, 1).reshape(L, hq * d)
        x = x + m.linear(o, o_w)
        h = F.rms_norm(x, (m.H,), ln2, m.eps)
        gu = m.linear(h, gu_w)  # (L, 2 I)
        x = x + m.linear(F.silu(gu[:, : m.inter]) * gu[:, m.inter :], down_w)
    return x
