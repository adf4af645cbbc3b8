"""A lean forward pass for Llama-shaped models on the CPU: what a call of a few tokens costs when nothing but the
model's own arithmetic runs.

Why. Speculative decoding pays off when a verify of gamma + 1 tokens costs about one single-token step: both read
every weight once, and at these sizes reading the weights is the work. With specviz's few-token kernel the
linear layers of the built-in target are at that limit (four rows cost about what one costs), but transformers'
Llama spends about as long again around them, and a verify costs clearly more than a step, because its per-layer
bookkeeping (mask building, cache concatenation, the generic attention
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
   head without copies); an additive mask only where the call has more than one token (lean_torch.py; llama.c
   runs the same steps in one C call of up to 16 tokens, a prefill of a few dozen in several).

Numbers: the same model, in float32, up to rounding (the tests check the logits against transformers' and that
greedy speculative output equals greedy plain output on this path). Both lanes of a race run it, so the output
is still the target's own. A target quantised by bitsandbytes (int8, or NF4 in blocks of 64) runs here too, its
int8 rows and scales or NF4 nibbles and absmax read as they are stored (the numbers of quant.py's float32 products,
summed in another order). Where a model does not fit (another architecture, biases, other 4-bit formats, a GPU,
dynamic RoPE) the transformers forward runs as before; SPECVIZ_FORWARD=transformers forces that everywhere.
"""

from __future__ import annotations

import copy
import ctypes
import logging
import os

import torch
import torch.nn.functional as F

from specviz import quant
from specviz.host import cpus
from specviz.native import library as native
from specviz.native import panels as lean_panels
from specviz.native.kv_cache import LeanCache
from specviz.native.torch_layers import decoder_layers
from specviz.sampling import scatter_rows

log = logging.getLogger(__name__)

# The longest prefill llama.c runs in calls of up to 16 tokens, by weight type (float32, float16, int8, NF4); a longer
# one goes through PyTorch's batched products, which dequantise int8 and NF4 weights for the call. Set at or below
# the crossover `python benchmarks/prefill_costs.py [--quantize 8bit|4bit]` finds (docs/performance.md), as another
# CPU's may sit lower (faster batched products).
CHUNKED_PREFILL = {0: 48, 1: 48, 2: 128, 3: 256}
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # rope types whose cos/sin depend on the position only
_DTYPES = (torch.float32, torch.float16)


def mode() -> str:
    """SPECVIZ_FORWARD: "auto" (default: the lean forward where the model fits) or "transformers" (never)."""
    v = os.environ.get("SPECVIZ_FORWARD", "auto").strip().lower()
    return "transformers" if v in ("transformers", "hf", "0", "off", "no", "false") else "auto"


SKIP_ROWS_BELOW = 0.9  # compute a draft's output layer over the rows it may propose where they are under 9 in 10


def int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) -> (int8 (N, K), float32 scale (N,)): symmetric, one scale per output row, both contiguous."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous(), scale.contiguous()


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
    linears = [mod for layer in model.model.layers for mod in layer.modules() if isinstance(mod, torch.nn.Linear)]
    for mod in linears:
        if type(mod) is not torch.nn.Linear and not quant.read_as_stored(mod):
            return "its layers are quantised in a format it does not read (it reads bitsandbytes' int8 and NF4)"
    if len({mod.weight.dtype for mod in linears}) > 1:
        return "its layers mix weight types"
    if type(model.lm_head) is not torch.nn.Linear:  # bitsandbytes leaves it in float unless told otherwise
        return "its output layer is quantised"
    w = model.get_input_embeddings().weight
    if w.device.type != "cpu" or w.dtype not in _DTYPES:
        return "it runs on the CPU in float32 or float16 only"
    return None


def build(model: torch.nn.Module, path: str, blocked: torch.Tensor | None = None) -> LeanLlama | None:
    """The lean forward for a loaded model, or None where it does not fit or SPECVIZ_FORWARD=transformers.
    blocked: a draft's output rows that it never proposes (its specviz_vocab.json), left uncomputed where they are
    many (`LeanLlama.skip_rows`)."""
    if mode() == "transformers":
        return None
    why = why_not(model)
    if why is not None:
        log.info("specviz: %s runs on transformers' forward: %s", type(model).__name__, why)
        return None
    fwd = LeanLlama(model, path)
    if blocked is not None:
        fwd.skip_rows(blocked)
    return fwd


def _fuse(*linears: torch.nn.Linear) -> torch.Tensor:
    """One (sum of out, in) weight from several linear layers; each layer's weight becomes a view into it (a
    bitsandbytes int8 or NF4 layer keeps its parameter, with its scales, and reads its bytes from the fused one)."""
    fused = torch.cat([m.weight.detach() for m in linears]).contiguous()  # NF4: (bytes, 1) each
    start = 0
    for m in linears:
        n = m.weight.shape[0]
        if quant.read_as_stored(m):
            m.weight.data = fused[start : start + n]
        else:
            m.weight = torch.nn.Parameter(fused[start : start + n], requires_grad=False)
        start += n
    return fused


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
        self.scales: dict[int, torch.Tensor] = {}  # a weight's address -> int8: its rows' scales; NF4: code, absmax
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(
                (
                    layer.input_layernorm.weight.detach().float(),
                    self._weight(a.q_proj, a.k_proj, a.v_proj),  # (heads + 2 kv heads) * d rows
                    self._weight(a.o_proj),
                    layer.post_attention_layernorm.weight.detach().float(),
                    self._weight(m.gate_proj, m.up_proj),  # 2 * intermediate rows
                    self._weight(m.down_proj),
                )
            )
        self.inter = inner.layers[0].mlp.gate_proj.out_features
        lib = native.library() if path == "kernel" else None
        self.lib = lib if lib is not None and self.head.is_contiguous() else None
        self.engine = "llama.c" if self.lib is not None else "PyTorch ops"  # for headers, benches, recordings
        kind = {torch.int8: "int8", torch.uint8: "NF4"}.get(self.layers[0][1].dtype)
        self.quantised = kind is not None  # bitsandbytes quantised this target (a draft's int8 comes later: int8())
        if self.quantised:
            self.engine += f", {kind} weights from bitsandbytes"
        self.rows = self.head.shape[0]  # output rows: logits always have this many
        self.kept: torch.Tensor | None = None  # the rows the output layer computes, where not all (skip_rows)
        self._int8: LeanLlama | None = None
        self.copied_bytes = 0  # bytes held beyond the model's parameters: the kept output rows, an int8 variant
        self.packed: dict[int, torch.Tensor] = {}  # a weight's address -> its copy in panels (lean_panels)
        self.layout_timed_cold = False  # an int8 draft's layout, timed after a target step (lean_draft)
        self.act8: LeanLlama | None = None  # an int8 draft's copy taking int8 activations (lean_panels.with_act8)
        self.act8_pays: bool | None = None  # whether lean_draft chose it (timed once)
        self.int8_pays: dict[int, bool] = {}  # id(target forward) -> whether draft_forward chose int8 for it
        self.rotary = inner.rotary_emb
        self.cos = self.sin = self.sin_signed = torch.empty(0, self.d)
        self._rope(256)
        lean_panels.choose(self)  # last: a choice may time the forward's own calls

    def _weight(self, *linears: torch.nn.Linear) -> torch.Tensor:
        """The weight llama.c reads for these layers (fused where several), its scales noted (int8 and NF4)."""
        w = _fuse(*linears) if len(linears) > 1 else linears[0].weight.detach()
        if w.dtype == torch.int8:
            self.scales[w.data_ptr()] = torch.cat([quant.row_scales(m) for m in linears]).contiguous()
        elif w.dtype == torch.uint8:  # NF4: (out, in / 2) bytes; its code values, then every block's absmax
            w = w.view(sum(m.out_features for m in linears), -1)
            code = linears[0].weight.quant_state.code.float()
            self.scales[w.data_ptr()] = torch.cat([code, *[quant.nf4_absmax(m) for m in linears]]).contiguous()
        return w

    def weights(self) -> list[torch.Tensor]:
        """Every weight a forward reads, in order: 4 per layer (q/k/v, o, gate/up, down), then the output layer."""
        return [w for (_, qkv, o, _, gu, down) in self.layers for w in (qkv, o, gu, down)] + [self.head]

    def point(self) -> None:
        """For llama.c: the arguments of every call that depend on the model alone (the tensors held by self.layers,
        self.scales, self.norm and self.head keep the addresses alive): the weights', scales' and norms' addresses,
        4, 4 and 2 per layer, the weights' type and the shapes (`_layer_args`); the final norm and the output
        layer (`_head_args`)."""
        *weights, head = self.weights()
        self.wtype = native.WTYPES[weights[0].dtype]
        scales = [self.scales.get(w.data_ptr()) for w in [*weights, head]]  # None for float weights
        weights, head = (
            [self.packed.get(w.data_ptr(), w) for w in (*weights, head)],
            self.packed.get(head.data_ptr(), head),
        )
        weight_ptrs = (ctypes.c_void_p * len(weights))(*[w.data_ptr() for w in weights])
        scale_ptrs = (ctypes.c_void_p * len(weights))(*[None if sc is None else sc.data_ptr() for sc in scales[:-1]])
        norms = [t for (ln1, _, _, ln2, _, _) in self.layers for t in (ln1, ln2)]
        norm_ptrs = (ctypes.c_void_p * len(norms))(*[t.data_ptr() for t in norms])
        stored = native.wtype_of(weights[0])  # the element type, plus native.PANELS where packed
        shape = (len(self.layers), stored, self.H, self.heads, self.kv_heads, self.d, self.inter, self.eps)
        self._layer_args = (weight_ptrs, scale_ptrs, norm_ptrs, *shape)
        head_scale = None if scales[-1] is None else scales[-1].data_ptr()
        head_type = native.wtype_of(head)  # a target quantised by bitsandbytes keeps a float output layer
        self._head_args = (self.norm.data_ptr(), head.data_ptr(), head_scale, head_type, self.head.shape[0])

    def skip_rows(self, blocked: torch.Tensor) -> None:
        """Leave out of the output layer the rows a draft never proposes (their logits come back -inf, as the
        engine sets them anyway). Worth it where they are many: the built-in draft proposes 8,000 of its 21,513
        rows (training/draft_rows.py), and an output layer is a large share of a small draft's bytes, read again
        from memory every round after a verify."""
        keep = torch.ones(self.rows, dtype=torch.bool)
        keep[blocked] = False
        if int(keep.sum()) > SKIP_ROWS_BELOW * self.rows:
            return  # a copy of most rows: not worth the memory
        self.kept = keep.nonzero().view(-1)
        panels = self.packed.pop(self.head.data_ptr(), None)
        self.head = self.head[self.kept].contiguous()  # a copy (the input embedding keeps every row)
        self.copied_bytes += self.head.numel() * self.head.element_size()
        if panels is not None:  # the kept rows in panels too
            self.packed[self.head.data_ptr()] = native.pack(self.head)
            self.copied_bytes += (self.head.numel() - panels.numel()) * self.head.element_size()
        self.point()

    def int8(self) -> LeanLlama:
        """This model's forward with int8 weights in the decoder layers and the output layer (symmetric, one float32
        scale per output row): a quarter of float32's bytes, half of float16's. For a draft only (its weights are
        read cold every round, after the target's verify has streamed through the caches; kernels.draft_int8): a
        target keeps its own weights, since the output is the target's. Built once, kept."""
        if self.wtype >= native.WTYPES[torch.int8]:  # int8 already, or NF4 (a quantised model: kept as it is)
            return self
        if self._int8 is None:
            new = copy.copy(self)
            new.scales, new._int8, new.int8_pays, new.packed = {}, None, {}, {}
            new.act8, new.act8_pays = None, None

            def quantize(w: torch.Tensor) -> torch.Tensor:
                q, scale = int8_rows(w)
                new.scales[q.data_ptr()] = scale
                return q

            new.layers = [
                (a, quantize(qkv), quantize(o), b, quantize(gu), quantize(down))
                for (a, qkv, o, b, gu, down) in self.layers
            ]
            new.head = quantize(self.head)
            new.engine = f"{self.engine}, int8 weights"
            new.copied_bytes = new.weight_bytes + sum(t.numel() * t.element_size() for t in new.scales.values())
            lean_panels.choose(new)  # its own choice, timed on its own weights
            self._int8 = new
        return self._int8

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one forward reads: the decoder layers' products and the output layer (norms aside)."""
        return sum(w.numel() * w.element_size() for w in self.weights())

    @property
    def is_int8(self) -> bool:
        return self.wtype == native.WTYPES[torch.int8]

    @property
    def is_act8(self) -> bool:
        """Whether its products take int8 activations (it reads native.pack8's panels: lean_panels.with_act8)."""
        return any(native.wtype_of(t) == native.ACT8 for t in self.packed.values())

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

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x (L, in) float32 -> (L, out) float32 by the path chosen for this machine."""
        rows = x.shape[0]
        scale = self.scales.get(w.data_ptr())  # int8 and NF4 weights have one; float ones None
        if self.path == "kernel" and rows <= native.MAX_ROWS:
            return native.few_rows(x.contiguous(), w, scale)
        if w.dtype == torch.uint8:  # NF4 on PyTorch's path (a prefill): dequantised for the call
            return F.linear(x, quant.nf4_dense(w, scale))
        if scale is not None:  # int8 on PyTorch's path (a prefill): the same products, dequantised for the call
            return F.linear(x, w.float()) * scale
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
        kept_only: bool = False,
        chunked_up_to: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (L,) fed after the cache's rows -> (logits (L, or 1 with last_only, Vm), last hidden states (L, H)).

        positions (L,): RoPE positions (default: the cache's row numbers); mask (L, rows + L) additive: which rows
        each token sees (default: causal); kept_only: a draft's logits over its `kept` rows only, where it has
        them (a greedy step's argmax needs no -inf rows around them); chunked_up_to: the longest call run in llama.c
        calls of up to 16 tokens, not PyTorch's ops (default CHUNKED_PREFILL's). The cache grows by L rows."""
        x = F.embedding(ids.view(-1), self.embed).float()
        return self.forward_embedded(cache, x, positions, mask, last_only, kept_only, chunked_up_to)

    @torch.no_grad()
    def forward_embedded(
        self,
        cache: LeanCache,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        last_only: bool = False,
        kept_only: bool = False,
        chunked_up_to: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` from the tokens' input vectors x (L, H) float32 (a draft head's, head_native.py, are not an
        embedding table's rows); x is overwritten."""
        L, base = x.shape[0], cache.length
        cache.reserve(base + L)
        pos = torch.arange(base, base + L) if positions is None else positions.view(-1)
        self._rope(int(pos.max()) + 1)
        if self.lib is not None and L <= native.MAX_ROWS:
            logits, h = self._native(cache, x, base, pos, mask, 1 if last_only else L)
        elif self.lib is not None and L <= (CHUNKED_PREFILL[self.wtype] if chunked_up_to is None else chunked_up_to):
            logits, h = self._chunks(cache, x, base, pos, mask, last_only)
        else:
            x = decoder_layers(self, cache, x, base, pos, mask)
            h = F.rms_norm(x, (self.H,), self.norm, self.eps)  # (L, H): the last hidden states, as transformers gives
            logits = self.linear(h[-1:] if last_only else h, self.head)
        cache.length = base + L
        if self.kept is not None and not kept_only:  # (n, kept) -> (n, rows), -inf where a row is never proposed
            logits = scatter_rows(logits, self.kept, self.rows)
        return logits, h

    def _chunks(self, cache: LeanCache, x: torch.Tensor, base: int, pos: torch.Tensor, mask, last_only: bool):
        """A prefill of a few dozen tokens by llama.c in calls of up to MAX_ROWS, the output layer on the last call
        only where only the last token's logits are wanted (a row's numbers are those of its own call's)."""
        n, L, parts = native.MAX_ROWS, x.shape[0], []
        for a in range(0, L, n):
            b = min(a + n, L)
            m = mask[a:b, : base + b] if mask is not None else None
            rows = (1 if b == L else 0) if last_only else b - a
            parts.append(self._native(cache, x[a:b], base + a, pos[a:b], m, rows))
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def _native(self, cache: LeanCache, x: torch.Tensor, base: int, pos: torch.Tensor, mask, out_rows: int):
        """The forward pass by llama.c, in one call: x (L, H) the embeddings (overwritten), the cache written.
        Returns (logits (out_rows, Vm) of the last out_rows tokens, last hidden states (L, H))."""
        cos, sin = self.cos[pos], self.sin[pos]  # (L, d) each
        m = mask.float().contiguous() if mask is not None else None
        h, logits = torch.empty_like(x), torch.empty(out_rows, self.head.shape[0])  # (L, H), (out_rows, Vm)
        failed = self.lib.llama_forward(
            *self._layer_args,
            x.data_ptr(),
            x.shape[0],
            cache.k.data_ptr(),
            cache.v.data_ptr(),
            cache.k.shape[2],
            base,
            cos.data_ptr(),
            sin.data_ptr(),
            m.data_ptr() if m is not None else None,
            *self._head_args,
            out_rows,
            h.data_ptr(),
            logits.data_ptr(),
            cpus.threads(),
        )
        native.check(failed, "llama_forward")  # -2, -3: no memory (the tiles' x, the call's buffers): SpecvizError
        return logits, h
