"""The Python API over the engine: `generate` (a result) and `stream` (the events), by model name or object.

Both take the options of request.RunRequest as keywords (its defaults are what a user gets) and build one;
`load_for` and `decode` are the two steps every caller of a request shares (the CLI, recordings, the bench).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from specviz.backends.served.connect import ServedTarget, is_url, load_served_pair
from specviz.config import BUILTIN_TARGET, MODEL_DRAFTERS, SpecvizError
from specviz.engine.loop import autoregressive_decode, speculative_decode
from specviz.events import Done, Event
from specviz.models.head import locate_head
from specviz.models.loaded import LoadedModel, chat_ids, load_model, load_pair
from specviz.request import RunRequest

MAX_PROMPT_CHARS = 100_000  # far beyond any context window; guards the tokenizer against absurd input


@dataclass(frozen=True)
class Result:
    token_ids: tuple[int, ...]  # the new tokens only
    text: str
    stats: dict
    finish_reason: str


def check_text(prompt: str) -> str:
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
    prompt = check_text(prompt)
    tok = lm.tokenizer
    if not raw and getattr(tok, "chat_template", None):
        return chat_ids(tok, prompt)
    ids = tok(prompt)["input_ids"]
    if not ids:
        raise SpecvizError("The prompt has no tokens; type something for the model to continue.")
    return ids


def load_for(req: RunRequest):
    """The models `req` names: (p, q), q None where no draft model is needed (plain decoding, lookup alone)."""
    target, draft = req.target, req.draft
    no_draft = (req.mode == "ar" or req.drafter not in MODEL_DRAFTERS) and draft is None
    if req.mode == "spec" and req.drafter.endswith("head"):
        locate_head(req.head)  # every input is found before any model loads (load_pair locates the two models)
    load = dict(device=req.device, dtype=req.dtype, quantize=req.quantize)
    if is_url(target) or isinstance(target, ServedTarget):  # p scores on its server, q drafts here (served.py)
        return load_served_pair(target, draft, tokenizer=req.tokenizer, need_draft=not no_draft, **load)
    if no_draft:  # no draft model needed: don't load one
        return load_model(target or BUILTIN_TARGET, **load), None
    return load_pair(target, draft, **load)


def decode(p, q, prompt: str, req: RunRequest) -> Iterator[Event]:
    """The events of `req` run on `prompt` with the loaded models p and q."""
    ids = encode_prompt(p, prompt, req.raw)
    return autoregressive_decode(p, ids, req.spec) if req.mode == "ar" else speculative_decode(p, q, ids, req.spec)


def prepare(prompt: str, req: RunRequest):
    """(p, the events of `req` on `prompt`): the prompt checked, then the models loaded (which may take seconds)."""
    check_text(prompt)
    p, q = load_for(req)
    return p, decode(p, q, prompt, req)


def result(prompt: str, req: RunRequest) -> Result:
    """Run `req` on `prompt` to the end: what `generate` returns."""
    p, events = prepare(prompt, req)
    done = next(ev for ev in events if isinstance(ev, Done))
    text = p.tokenizer.decode(list(done.token_ids), skip_special_tokens=True)
    return Result(done.token_ids, text, done.stats, done.finish_reason)


def stream(prompt: str, **options) -> Iterator[Event]:
    """The events of one run (Start, Round or Step ..., Done); options as in `generate`.

    Everything is validated before the first event, so a bad argument raises at the call, not midway.
    """
    return prepare(prompt, RunRequest.of(options, "stream"))[1]


def generate(prompt: str, **options) -> Result:
    """Decode `prompt` with the target (mode="ar") or speculatively with target and draft (mode="spec").

    Options (all keyword; request.RunRequest's fields, with its defaults): target, draft: a Hugging Face id, a local folder, a LoadedModel, or None for the
    built-in pair; target may also be a served target's address, "http://HOST:PORT/v1" (vLLM; served.py), with
    tokenizer its tokenizer's hub id or folder (default: the server's model name); mode "spec" or "ar"; drafter
    "model" | "lookup" | "lookup+model" | "head" | "lookup+head" | "model+head" | "lookup+model+head" (where guesses come from; head: the head
    drafters' head folder, "" = the built-in target's own head);
    gamma 1..16 or "auto"; gamma_policy "constant" | "heuristic" | "confidence" | "auto" (gamma is then the
    start or the most per round); confidence (the threshold of that policy); prompt_lookup_num_tokens,
    max_matching_ngram_size (lookup); tree "off" | a node budget 1..32 | "auto" (token trees from the draft
    model, verified in one call; drafters model and lookup+model; depth at most gamma); temperature 0 (greedy) .. 2; top_k (0 off); top_p (1 off);
    max_new_tokens; seed; raw (skip the chat template); detail (top candidates per drafted position, 0 off);
    relaxed_w (below 1: verify against w·p + (1 − w)·q, NOT exact; refused unless allow_lossy=True);
    device, dtype, quantize ("4bit" NF4 / "8bit" int8 with bitsandbytes, on any device it serves: CUDA, CPU ...). Raises SpecvizError on anything a caller can fix.
    """
    return result(prompt, RunRequest.of(options, "generate"))
