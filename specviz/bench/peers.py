"""transformers' own generate as the benchmark's peer: a view of our draft q that its assisted generation accepts,
and one timed call of generate on the target p (plain, assisted, or prompt lookup).

The view shares q's weights and maps ids exactly as our engine does (LoadedModel.to_target_logits), so
transformers' assisted generation and ours draft with the same model; a draft with another tokenizer is handed to
transformers' Universal Assisted Generation as it is.
"""

from __future__ import annotations

import copy
import time

import torch

from specviz.config import SpecConfig, SpecvizError
from specviz.engine.loop import eos_ids
from specviz.models.loaded import LoadedModel
from specviz.models.translate import needs_translation

# the transformers peers run at transformers' own defaults, not specviz's (RunRequest's), even where they agree
HF_LOOKUP_TOKENS = 10  # prompt_lookup_num_tokens
HF_ASSIST_TOKENS, HF_ASSIST_CONFIDENCE = 20, 0.4  # num_assistant_tokens, assistant_confidence_threshold


class _MapIds(torch.nn.Module):
    """The draft's input embedding, fed target ids: each read as the draft's row, as our engine reads it
    (LoadedModel.rows_of: unknown -> row 0)."""

    def __init__(self, draft: LoadedModel):
        super().__init__()
        self.embed, self.draft = draft.model.get_input_embeddings(), draft

    @property
    def weight(self) -> torch.Tensor:
        return self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(self.draft.rows_of(ids))


class _FullVocab(torch.nn.Module):
    """The draft's output layer, widened to the target's V with the engine's own mapping (LoadedModel.to_target_logits)."""

    def __init__(self, draft: LoadedModel, V: int):
        super().__init__()
        self.head, self.draft, self.V = draft.model.get_output_embeddings(), draft, V
        self.register_buffer("blocked", draft.blocked_rows, persistent=False)  # rows never proposed, as in our engine

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        z = self.head(h)  # (B, L, N)
        if self.blocked is not None:
            z = z.index_fill(-1, self.blocked, -torch.inf)
        return self.draft.to_target_logits(z.reshape(-1, z.shape[-1]), self.V).view(*z.shape[:-1], self.V)


def hf_assistant(draft: LoadedModel, target: LoadedModel, gamma: int) -> torch.nn.Module:
    """A view of q that transformers' assisted generation accepts, sharing q's weights (q is not modified).

    transformers needs an assistant that reads and writes the target's token ids with the target's vocabulary
    size; specviz's built-in draft has a trimmed vocabulary (row i = target id vocab_map[i]). The view is the
    same architecture built on the meta device, given q's blocks, an input embedding that maps ids and an
    output layer that scatters logits into the target's V (exactly what our engine does). Its own generation
    config fixes gamma: num_assistant_tokens=gamma, schedule "constant", no confidence early stop.

    A draft with another tokenizer is given to transformers as it is (a shallow copy with its own generation
    config): its Universal Assisted Generation translates through text itself (`assist_kwargs`).
    """
    m, V = draft.model, target.vocab_size
    if needs_translation(target, draft):
        view = copy.copy(m)  # the same modules; only the generation config is its own
        view.generation_config = copy.deepcopy(m.generation_config)
        view.generation_config.num_assistant_tokens = gamma
        view.generation_config.num_assistant_tokens_schedule = "constant"
        view.generation_config.assistant_confidence_threshold = 0.0
        return view
    cfg = copy.deepcopy(m.config)
    cfg.vocab_size = V
    prefix = getattr(m, "base_model_prefix", "model")
    try:
        with torch.device("meta"):
            view = type(m)(cfg)
        src, dst = getattr(m, prefix), getattr(view, prefix)
        for name, child in src.named_children():
            setattr(dst, name, child)
        view.set_input_embeddings(_MapIds(draft) if draft.input_map is not None else m.get_input_embeddings())
        view.set_output_embeddings(_FullVocab(draft, V))
    except (AttributeError, TypeError, ValueError, RuntimeError) as e:
        raise SpecvizError(f"transformers' assisted generation cannot use this draft ({e}).") from None
    if any(t.is_meta for t in list(view.parameters()) + list(view.buffers())):
        raise SpecvizError("transformers' assisted generation cannot use this draft (unmapped weights).")
    view.generation_config = copy.deepcopy(m.generation_config)
    view.generation_config.num_assistant_tokens = gamma
    view.generation_config.num_assistant_tokens_schedule = "constant"
    view.generation_config.assistant_confidence_threshold = 0.0  # draft exactly gamma, like ours
    return view.eval()


def assist_kwargs(target: LoadedModel, draft: LoadedModel, view: torch.nn.Module) -> dict:
    """generate()'s keywords for assisted generation with `view`: with another tokenizer also both tokenizers,
    which makes it transformers' Universal Assisted Generation (greedy; at T > 0 its heterogeneous-vocabulary
    speculative sampling, the token-level intersection)."""
    kw = {"assistant_model": view}
    if needs_translation(target, draft):
        kw.update(tokenizer=target.tokenizer, assistant_tokenizer=draft.tokenizer)
    return kw


def hf_generate(target: LoadedModel, ids: list[int], cfg: SpecConfig, **extra) -> dict:
    """transformers' generate on the target: plain, or with `extra` (an assistant model, prompt lookup ...)."""
    s = cfg.sampling
    x = torch.tensor([ids], device=target.device)
    kw = dict(max_new_tokens=cfg.max_new_tokens, eos_token_id=sorted(eos_ids(target)), do_sample=not s.greedy)
    kw["pad_token_id"] = kw["eos_token_id"][0]
    if not s.greedy:
        kw.update(temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p)
    torch.manual_seed(cfg.seed)  # transformers samples from the global generator
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(input_ids=x, attention_mask=torch.ones_like(x), **kw, **extra)
    seconds = time.perf_counter() - t0
    return {"tokens": out[0, len(ids) :].tolist(), "seconds": seconds}
