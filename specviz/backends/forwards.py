"""The two forwards a model loaded here runs through, chosen once per run (`forward_of`): the native llama.c forward
(`NativeForward`, native/forward.py) where the model has one, else transformers' own (`TransformersForward`).
CachedModel (local.py) calls one of them and never asks which: each makes its own KV cache, runs a call over it,
moves rows of it (a tree's accepted path), and copies the rows a prefill wrote (the kept chat-template opening).
`cache_kwargs` hands transformers a model's cache under the keyword its version takes.
"""

from __future__ import annotations

import copy
import functools
import inspect

import torch

from specviz.models.loaded import LoadedModel


def cache_kwargs(model: torch.nn.Module, cache) -> dict:
    """The keyword that hands a model its KV cache: `cache` from transformers 5.24 on, `past_key_values` before
    (5.24 still takes the old name but warns that 5.40 drops it). Read from the model's own forward signature."""
    return {_cache_kwarg(type(model)): cache}


@functools.cache
def _cache_kwarg(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class NativeForward:
    """The native forward (LeanLlama) over a LeanCache; its hidden states come with every call at no cost."""

    hidden_free = True  # a kept opening's hidden states are taken with its rows, not on demand

    def __init__(self, lm: LoadedModel):
        self.lm, self.lean = lm, lm.lean
        self.key = lm.lean  # what computes a model's rows: a draft's int8 variant is another one
        self.kept = lm.lean.kept  # the output rows it computes, where not all (a trimmed draft); None: all

    def new_cache(self):
        return self.lean.new_cache()

    def __call__(self, cache, x: torch.Tensor, last_only: bool, hidden: bool, mask, position_ids, kept_only: bool):
        """x (1, L) the model's own rows -> (logits (L or 1, Vm), last hidden states (L, H) or None)."""
        if mask is not None:  # (L, T) float32, -inf where a row is hidden: as the native forward takes it
            position_ids = position_ids.view(-1)
        logits, h = self.lean.forward(cache, x.view(-1), position_ids, mask, last_only, kept_only)
        if self.lm.blocked_rows is not None and self.kept is None:  # kept: the native forward did it
            logits.index_fill_(-1, self.lm.blocked_rows, -torch.inf)
        return logits, (h if hidden else None)

    def supports_trees(self, cache) -> bool:
        return True

    def move_rows(self, cache, src: torch.Tensor, dst: torch.Tensor) -> None:
        cache.move_rows(src, dst)

    def opening_rows(self, cache, n: int):
        """A copy of the cache's first n rows, (keys, values) (layers, kv heads, n, head dim) each."""
        return cache.k[:, :, :n].clone(), cache.v[:, :, :n].clone()

    def with_opening(self, cache, rows, n: int):
        """`cache` (empty) holding the opening's `rows` as its first n."""
        cache.reserve(n)
        cache.k[:, :, :n], cache.v[:, :, :n] = rows
        cache.length = n
        return cache


class TransformersForward:
    """transformers' forward over a DynamicCache; hidden states cost an extra output, so they are asked for."""

    hidden_free = False

    def __init__(self, lm: LoadedModel):
        self.lm = lm
        self.key = lm.model
        self.kept = None

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.lm.model.config)

    def __call__(self, cache, x: torch.Tensor, last_only: bool, hidden: bool, mask, position_ids, kept_only: bool):
        """x (1, L) the model's own rows -> (logits (L or 1, Vm), last hidden states (L, H) or None)."""
        model = self.lm.model
        if mask is not None:  # (L, T) with -inf -> transformers' (1, 1, L, T) in the model's dtype, its minimum there
            dtype = model.dtype if model.dtype.is_floating_point else torch.float32
            mask = mask.clamp(min=torch.finfo(dtype).min).to(dtype)[None, None]
        extra = {} if mask is None else {"attention_mask": mask, "position_ids": position_ids}
        out = model(
            input_ids=x,
            **cache_kwargs(model, cache),
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
            output_hidden_states=hidden,
            **extra,
        )
        h = out.hidden_states[-1][0] if hidden else None  # (L, H)
        if self.lm.blocked_rows is not None:  # a draft's catch-all rows: q(x) = 0 there
            return out.logits[0].index_fill_(-1, self.lm.blocked_rows, -torch.inf), h
        return out.logits[0], h

    def supports_trees(self, cache) -> bool:
        """Plain full-attention layers only (a sliding window or a recurrent state cannot take a tree's rows)."""
        from transformers.cache_utils import DynamicLayer

        return all(type(layer) is DynamicLayer for layer in cache.layers)

    def move_rows(self, cache, src: torch.Tensor, dst: torch.Tensor) -> None:
        for layer in cache.layers:
            layer.keys[..., dst, :] = layer.keys[..., src, :]
            layer.values[..., dst, :] = layer.values[..., src, :]

    def opening_rows(self, cache, n: int):
        """The cache itself: it holds the opening's n rows only (each run gets its own copy, `with_opening`)."""
        return cache

    def with_opening(self, cache, rows, n: int):
        return copy.deepcopy(rows)


def forward_of(lm: LoadedModel) -> NativeForward | TransformersForward:
    """The forward a run of `lm` goes through: the native one where the model has it, else transformers'."""
    return NativeForward(lm) if lm.lean is not None else TransformersForward(lm)
