"""A draft head's guesses by specviz's native forward (llama.c), as the target's and the draft's run.

Why: in PyTorch a guess of the built-in head is a few dozen tensor operations, each dispatched on its own, and
read its output rows in float32, so its cost ratio c was several times the int8 draft's in llama.c. The head's block is a Llama decoder layer and its final norm and rows
are an output layer, so the head is a one-layer Llama model whose input vectors are fc([e(x); f]) instead of an
embedding table's rows: LeanLlama runs it (`forward_embedded`) in one call with no Python between its parts, and
`lean_draft.draft_forward` gives it int8 weights (a quarter of the bytes) where this machine runs them faster, as it
does for the draft. A guess only shapes what the target is asked to verify; the output is the target's either way.

The head's KV cache becomes a LeanCache (row j: the pair at position j + 1); rolling back sets its length.
"""

from __future__ import annotations

import logging

import torch

from specviz.native import draft as lean_draft
from specviz.native import forward as lean
from specviz.native import library as native

log = logging.getLogger(__name__)


class NativeHead:
    """A DraftHead's forward by llama.c: `step` feeds pairs and returns the predicted features and the last one's
    logits over the head's rows."""

    def __init__(self, head, target_lean: lean.LeanLlama | None):
        model = _as_llama(head)
        self.model = lean.LeanLlama(model, "kernel")
        self.forward = lean_draft.draft_forward(target_lean, self.model)  # int8 weights where they pay here
        self.int8 = self.forward.is_int8
        fc_w, self.fc_b = head.fc.weight.detach().float().contiguous(), head.fc.bias.detach().float().contiguous()
        if self.int8:  # the fc in int8 too, its scales where the forward's `linear` finds them
            self.fc_w, scale = lean.int8_rows(fc_w)
            self.forward.scales[self.fc_w.data_ptr()] = scale
        else:
            self.fc_w = fc_w
        self.embed = head.embed
        self.engine = self.forward.engine

    def new_cache(self):
        return self.forward.new_cache()

    def step(
        self, cache, tokens: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (L,) x_{t+1}, feats (L, H) f_t, positions (L,) -> (predicted features (L, H), logits (N,) of the
        last pair over the head's rows)."""
        pairs = torch.cat([self.embed[tokens].float(), feats.float()], dim=-1)  # (L, 2H)
        x = self.forward.linear(pairs, self.fc_w) + self.fc_b  # the kernel for a few rows, PyTorch for a prompt's
        logits, h = self.forward.forward_embedded(cache, x, positions, last_only=True)
        return h, logits[-1]


def _as_llama(head) -> torch.nn.Module:
    """A transformers LlamaForCausalLM of one layer holding the head's block, final norm and output rows (its
    input embedding is the rows too: only a timing run reads it, lean_draft.draft_forward's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c, rows = head.cfg, head.rows.detach().float()
    cfg = LlamaConfig(
        vocab_size=rows.shape[0],
        hidden_size=c["hidden"],
        intermediate_size=c["intermediate"],
        num_hidden_layers=1,
        num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"],
        head_dim=c["hidden"] // c["heads"],
        rms_norm_eps=c["eps"],
        rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]},
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    layer, inner = model.model.layers[0], model.model
    theirs = {
        layer.self_attn.q_proj: head.q,
        layer.self_attn.k_proj: head.k,
        layer.self_attn.v_proj: head.v,
        layer.self_attn.o_proj: head.o,
        layer.mlp.gate_proj: head.gate,
        layer.mlp.up_proj: head.up,
        layer.mlp.down_proj: head.down,
    }
    for mine, src in theirs.items():
        mine.weight = torch.nn.Parameter(src.weight.detach().float().clone(), requires_grad=False)
    for norm, src in (
        (layer.input_layernorm, head.norm_in),
        (layer.post_attention_layernorm, head.norm_mid),
        (inner.norm, head.norm_out),
    ):
        norm.weight = torch.nn.Parameter(src.detach().float().clone(), requires_grad=False)
    inner.embed_tokens.weight = torch.nn.Parameter(rows.clone(), requires_grad=False)
    model.lm_head.weight = inner.embed_tokens.weight
    inner.rotary_emb = type(inner.rotary_emb)(cfg)  # its inv_freq computed on the CPU, not on "meta"
    return model.eval()


def describe(head) -> str:
    """How a loaded head computes here, in words, for headers, benches and recordings."""
    fast = getattr(head, "native", None)
    return f"specviz forward ({fast.engine})" if fast is not None else "PyTorch ops"


def native_head(head, target_lm) -> NativeHead | None:
    """The native forward for `head` next to `target_lm` (a LoadedModel), or None where it cannot run here (no
    kernel library, SPECVIZ_FORWARD=transformers, a head on a GPU or in another dtype than float32)."""
    if lean.mode() == "transformers" or native.library() is None:
        return None
    if head.embed.device.type != "cpu" or head.fc.weight.dtype != torch.float32:
        return None
    try:
        return NativeHead(head, getattr(target_lm, "lean", None))
    except (ValueError, TypeError, RuntimeError) as e:  # a head shaped unlike a Llama layer: PyTorch's path
        log.info("specviz: the draft head runs in PyTorch: %s", e)
        return None
