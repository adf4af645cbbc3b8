"""The Python API over the engine: `generate` (a result) and `stream` (the events), by model name or object."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .config import (
    BUILTIN_TARGET,
    DEFAULT_DRAFTER,
    DEFAULT_GAMMA_SETTING,
    MODEL_DRAFTERS,
    SamplingConfig,
    SpecConfig,
    SpecvizError,  # fmt: skip
)
from .engine import autoregressive_decode, speculative_decode
from .events import Done, Event
from .models import LoadedModel, load_model, load_pair
from .served import ServedTarget, is_url, load_served_pair

MODES = ("spec", "ar")
MAX_PROMPT_CHARS = 100_000  # far beyond any context window; guards the tokenizer against absurd input


@dataclass(frozen=True)
class Result:
    token_ids: tuple[int, ...]  # the new tokens only
    text: str
    stats: dict
    finish_reason: str


def _check_text(prompt: str) -> str:
    """The prompt as valid UTF-8 text, or a SpecvizError; cheap, so it runs before any model is loaded."""
    if not isinstance(prompt, str):
        raise SpecvizError("The prompt must be text.")
    if not prompt.strip():
        raise SpecvizError("The prompt is empty; type something for the model to continue.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise SpecvizError(f"The prompt is too long ({len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,}).")
    return prompt.encode("utf-8", "replace").decode("utf-8")  # lone surrogates and the like


def encode_prompt(lm: LoadedModel, prompt: str, raw: bool = False) -> list[int]:
    """Token ids for `prompt`: through the chat template when the model has one, unless `raw`."""
    prompt = _check_text(prompt)
    tok = lm.tokenizer
    if not raw and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return tok(text, add_special_tokens=False)["input_ids"]
    ids = tok(prompt)["input_ids"]
    if not ids:
        raise SpecvizError("The prompt has no tokens; type something for the model to continue.")
    return ids


def _config(
    gamma, temperature, top_k, top_p, max_new_tokens, seed, detail=0, relaxed_w=1.0, allow_lossy=False, **drafting
) -> SpecConfig:
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    cfg = SpecConfig(gamma=gamma, max_new_tokens=max_new_tokens, seed=seed, sampling=sampling, detail=detail,
                     relaxed_w=relaxed_w, **drafting)  # fmt: skip
    if cfg.relaxed_w < 1.0 and allow_lossy is not True:
        raise SpecvizError(
            "relaxed_w below 1 makes the output stop following the target (not exact); "
            "pass allow_lossy=True to use it anyway."
        )
    return cfg


def _prepare(
    prompt,
    target,
    draft,
    mode,
    gamma,
    temperature,
    top_k,
    top_p,
    max_new_tokens,
    seed,
    raw,
    detail,
    relaxed_w,
    allow_lossy,
    device,
    dtype,
    quantize,
    tokenizer,
    **drafting,
):
    # everything a caller can get wrong is checked before a model is loaded (which may take seconds)
    _check_text(prompt)
    if mode not in MODES:
        raise SpecvizError(f"Unknown mode {mode!r}; use 'spec' (speculative) or 'ar' (plain decoding).")
    cfg = _config(gamma, temperature, top_k, top_p, max_new_tokens, seed, detail, relaxed_w, allow_lossy, **drafting)
    no_draft = (mode == "ar" or cfg.drafter not in MODEL_DRAFTERS) and draft is None
    if is_url(target) or isinstance(target, ServedTarget):  # p scores on its server, q drafts here (served.py)
        p, q = load_served_pair(target, draft, tokenizer=tokenizer, need_draft=not no_draft, device=device,
                                dtype=dtype, quantize=quantize)  # fmt: skip
    elif no_draft:  # no draft model needed: don't load one
        p, q = load_model(target or BUILTIN_TARGET, device=device, dtype=dtype, quantize=quantize), None
    else:
        p, q = load_pair(target, draft, device=device, dtype=dtype, quantize=quantize)
    ids = encode_prompt(p, prompt, raw)
    events = autoregressive_decode(p, ids, cfg) if mode == "ar" else speculative_decode(p, q, ids, cfg)
    return p, events


def _options(kwargs: dict, fn: str) -> dict:
    unknown = set(kwargs) - set(_DEFAULTS)
    if unknown:
        raise SpecvizError(f"Unknown option {sorted(unknown)[0]!r} for {fn}; the options are {', '.join(_DEFAULTS)}.")
    return {**_DEFAULTS, **kwargs}


def stream(prompt: str, **options) -> Iterator[Event]:
    """The events of one run (Start, Round or Step ..., Done); options as in `generate`.

    Everything is validated before the first event, so a bad argument raises at the call, not midway.
    """
    return _prepare(prompt, **_options(options, "stream"))[1]


def generate(prompt: str, **options) -> Result:
    """Decode `prompt` with the target (mode="ar") or speculatively with target and draft (mode="spec").

    Options (all keyword): target, draft: a Hugging Face id, a local folder, a LoadedModel, or None for the
    built-in pair; target may also be a served target's address, "http://HOST:PORT/v1" (vLLM; served.py), with
    tokenizer its tokenizer's hub id or folder (default: the server's model name); mode "spec" or "ar"; drafter
    "model" | "lookup" | "lookup+model" | "head" | "lookup+head" (where guesses come from; head: the head
    drafters' head folder, "" = the built-in target's own head);
    gamma 1..16 or "auto"; gamma_policy "constant" | "heuristic" | "confidence" | "auto" (gamma is then the
    start or the most per round); confidence (the threshold of that policy); prompt_lookup_num_tokens,
    max_matching_ngram_size (lookup); tree "off" | a node budget 1..32 | "auto" (token trees from the draft
    model, verified in one call; drafters model and lookup+model; depth at most gamma); temperature 0 (greedy) .. 2; top_k (0 off); top_p (1 off);
    max_new_tokens; seed; raw (skip the chat template); detail (top candidates per drafted position, 0 off);
    relaxed_w (below 1: verify against w·p + (1 − w)·q, NOT exact; refused unless allow_lossy=True);
    device, dtype, quantize ("4bit" NF4 / "8bit" int8 with bitsandbytes, on any device it serves: CUDA, CPU ...). Raises SpecvizError on anything a caller can fix.
    """
    p, events = _prepare(prompt, **_options(options, "generate"))
    done = next(ev for ev in events if isinstance(ev, Done))
    text = p.tokenizer.decode(list(done.token_ids), skip_special_tokens=True)
    return Result(done.token_ids, text, done.stats, done.finish_reason)


_CFG = SpecConfig()  # the defaults, defined once in config.py
_DEFAULTS = dict(
    target=None,
    draft=None,
    mode="spec",
    drafter=DEFAULT_DRAFTER,
    gamma=DEFAULT_GAMMA_SETTING,
    gamma_policy=_CFG.gamma_policy,
    confidence=_CFG.confidence,
    prompt_lookup_num_tokens=_CFG.prompt_lookup_num_tokens,
    max_matching_ngram_size=_CFG.max_matching_ngram_size,
    head=_CFG.head,
    tree=_CFG.tree,
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    max_new_tokens=64,
    seed=0,
    raw=False,
    detail=0,
    relaxed_w=1.0,
    allow_lossy=False,
    device=None,
    dtype=None,
    quantize=None,
    tokenizer=None,
)
