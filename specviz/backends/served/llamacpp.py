"""llama-cpp-python's OpenAI-compatible server as a served target: the second engine behind served.py.

Its `/v1/completions` takes text, not token ids, and names tokens by their text: with `echo: true` and
`logprobs: k` it sends, for every prompt token and the one it generates, the token's text, its logprob and the top
k as {text: logprob} (its server loads models with `logits_all`, so every prompt position has them). So a request
from a ServedRun goes through three steps here, and the run's verification (served.py) is then the same as vLLM's:

1. the token ids become their text (the tokenizer here; the server's own tokenizer was checked against it once,
   with its `/extras/tokenize`), and the server must read that text back as exactly those tokens: the echoed
   token texts must equal each id's text here, else one sentence (a text that re-tokenises otherwise, e.g. a
   split no tokenizer would write, cannot be scored token for token through a text interface);
2. each text the server names maps back to the token whose bytes it is (a byte-level vocabulary's tokens are
   distinct byte strings). llama-cpp-python writes every control token as "": a top token "" is read as the end of
   turn, the one control token a reply has. A piece of a split character is written as its whole part ("" or " "),
   so a reply that splits a character (some emoji, rare scripts) cannot be named for sure: one sentence where the
   text names no token, and where it names the whole one (" "), that one;
3. the answer is reshaped as vLLM's (token ids, prompt logprobs keyed by id) for ServedRun.

Greedy decoding is exact: the server's echoed logprobs are its raw model scores, a guess is kept when it is the top
token there, the correction and the bonus are its top tokens. At T > 0 the spec lane is refused with one
sentence (served.verify_mode): the exact residual needs samples in bulk (`n`) or every token's logprob by id, and
this server gives neither; the plain lane samples with the server's own sampler at any temperature.

Its echo leaves out every copy of the beginning-of-text token (SmolLM2's <|im_start|>), so guesses are scored up
to the first such guess and the engine's own token corrects there (LlamaCppRun.verify). What a round costs: the
server writes the echo's logprobs in Python, sorting the whole vocabulary for every prompt token, so a verify grows
with the text, where a plain step sends no echo and stays cheap. Through this server the
spec lane is exact but slower than plain decoding: it suits checking a pair's acceptance, not speed.
"""

from __future__ import annotations

import functools
import math

import torch

from specviz.backends.served.run import ServedRun
from specviz.config import SpecvizError
from specviz.sampling import Verdict

ENGINE = "llama-cpp-python"
TOKENIZE = "/extras/tokenize"  # {"input": text} -> {"tokens": [ids]}; control-token text becomes control tokens


def probe_tokens(client, text: str) -> list[int] | None:
    """The server's own token ids for `text` through llama-cpp-python's tokenize endpoint; None when the server
    has no such endpoint (it is not llama-cpp-python)."""
    try:
        data = client.post(TOKENIZE, {"input": text})
    except SpecvizError:
        return None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    return [int(t) for t in tokens] if isinstance(tokens, list) else None


@functools.lru_cache(maxsize=4)
def pieces(tok) -> tuple[dict[int, str], dict[str, int]]:
    """(id -> its text as llama-cpp-python writes it, text -> the token it names). Control and added tokens are
    written "", ordinary ones as their bytes read as UTF-8, a piece of a split character dropped; so a text names
    the token whose bytes it is exactly (" " is the space token, not one of the 37 that are a space and part of a
    character), else the one token it can be. A text that names no token for sure is left out."""
    from specviz.models.translate import token_bytes

    whole = token_bytes(tok)
    text = {i: b.decode("utf-8", errors="ignore") for i, b in whole.items()}
    for i in range(len(tok)):
        text.setdefault(i, "")
    ids: dict[str, list[int]] = {}
    for i, s in text.items():
        ids.setdefault(s, []).append(i)
    named = {}
    for s, cand in ids.items():
        exact = [i for i in cand if whole.get(i) == s.encode()]
        if len(exact) == 1 or len(cand) == 1:
            named[s] = (exact or cand)[0]
    return text, named


def request_body(model: str, text: str, fields: dict) -> dict:
    """llama-cpp-python's completion request for a ServedRun's fields: the text, echo where the prompt's logprobs
    are asked for (a verify; never for a plain step: echo costs the server a sort of the whole vocabulary per
    prompt token, each dearer than a whole step), at least one top logprob, and
    every sampling field explicit (its defaults, e.g. repeat_penalty 1.1 and min_p 0.05, would change p)."""
    top = max(1, int(fields.get("prompt_logprobs") or 0), int(fields.get("logprobs") or 0))
    echo = "prompt_logprobs" in fields
    body = {
        "model": model,
        "prompt": text,
        "max_tokens": int(fields.get("max_tokens", 1)),
        "echo": echo,
        "logprobs": top,
        "temperature": float(fields.get("temperature", 0.0)),
        "top_p": fields.get("top_p", 1.0),
        "top_k": fields.get("top_k", 0),
        "min_p": fields.get("min_p", 0.0),
        "repeat_penalty": fields.get("repetition_penalty", 1.0),
        "presence_penalty": fields.get("presence_penalty", 0.0),
        "frequency_penalty": fields.get("frequency_penalty", 0.0),
    }
    if "seed" in fields:
        body["seed"] = int(fields["seed"])
    return body


def as_vllm_choice(t, prompt: list[int], text: str, data, echo: bool = True) -> dict:
    """llama-cpp-python's answer to a request for `prompt` (sent as `text`; 1 token generated) in vLLM's shape:
    token_ids, logprobs of the generated token, prompt_logprobs keyed by id; one sentence where it cannot be read
    exactly.

    How its echoed entries line up (llama-cpp-python 0.3, read from its source and checked against transformers):
    the prompt's beginning-of-text token, if it starts with one, has no entry, nor has any later copy of it; with
    that token first, entry e carries the scores of its own position (its token's logprob and the top k there)
    and the generated token has the last entry; without it, entry e carries the scores of the *next* position
    (its token's text among them, with that position's logprob) and the generated token has no entry (the echoed
    text ends with it). Greedy verification needs only the top token at each position, which both give.
    """
    text_of, ids_of = pieces(t.tokenizer)
    choices = data.get("choices") if isinstance(data, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    lps = choice.get("logprobs") if choice else None
    if not isinstance(lps, dict) or not all(isinstance(lps.get(f), list) for f in ("tokens", "top_logprobs")):
        raise SpecvizError(
            f"The server at {t.url} sent a reply without the prompt's token logprobs; llama-cpp-python's server "
            "needs logits_all (its default) for them."
        )
    tokens, tops = lps["tokens"], lps["top_logprobs"]
    if not echo:  # a plain step: the one entry is the generated token's, with its own position's scores
        return _generated_only(t, choice, tokens, tops, lps, len(prompt), text_of, ids_of)
    bos = getattr(t.tokenizer, "bos_token_id", None)
    leads = bool(prompt) and prompt[0] == bos
    positions = [j for j in range(1 if leads else 0, len(prompt)) if prompt[j] != bos]  # entry e <-> positions[e]
    sent = [text_of.get(prompt[j], "") for j in positions]
    if tokens[: len(positions)] != sent:
        e = next((i for i, (a, b) in enumerate(zip(tokens, sent)) if a != b), min(len(tokens), len(sent)))
        raise SpecvizError(
            f"The server at {t.url} read the text back as other tokens ({tokens[e : e + 2]} where specviz sent "
            f"{sent[e : e + 2]}): the target wrote tokens its tokenizer would not write for that text, and "
            "llama-cpp-python's server takes text; a server that takes token ids (vLLM) continues from them exactly."
        )
    rows: list[dict | None] = [None] * (len(prompt) + 1)  # the scores at each position; the last: the generated
    for e, j in enumerate(positions):
        top = tops[e] if e < len(tops) and isinstance(tops[e], dict) else None
        if top is not None:
            rows[j if leads else j + 1] = _row(t, top, prompt[j], text_of, ids_of)
    n = len(prompt)
    if leads and len(tokens) > len(positions):  # the generated token's entry
        token = _named(t, tokens[len(positions)], ids_of)
        lp = lps["token_logprobs"][len(positions)]
        rows[n] = _row(t, tops[len(positions)] or {}, token, text_of, ids_of)
    else:
        made = choice.get("text", "")[len(text) :] if isinstance(choice.get("text"), str) else None
        if made == "" and choice.get("finish_reason") == "stop" and t.eos:  # it ended the turn: no entry, no text
            token, lp = _end_of_turn(t), None
        elif made:
            token, lp = _named(t, made, ids_of), None
        else:
            raise SpecvizError(f"The server at {t.url} sent a reply without the generated token.")
        lp = (rows[n] or {}).get(token) if lp is None else lp
    return _vllm_shape(token, lp, rows)


def _vllm_shape(token: int, lp, rows: list[dict | None]) -> dict:
    """vLLM's choice: the generated token, its logprob and top row (rows[-1]), prompt logprobs keyed by id."""
    top = rows[-1] or {}
    return {
        "token_ids": [token],
        "prompt_logprobs": [None if r is None else {str(k): {"logprob": v} for k, v in r.items()} for r in rows[:-1]],
        "logprobs": {
            "token_logprobs": [math.nan if lp is None else float(lp)],
            "top_logprobs": [{str(k): v for k, v in top.items()}],
        },
    }


def _generated_only(t, choice: dict, tokens: list, tops: list, lps: dict, n: int, text_of, ids_of) -> dict:
    """A reply without echo: the generated token named by its text, or the end of turn when it sent none."""
    rows: list[dict | None] = [None] * (n + 1)
    if tokens:
        token, lp = _named(t, tokens[0], ids_of), lps["token_logprobs"][0]
        rows[n] = _row(t, tops[0] or {}, token, text_of, ids_of) if tops and isinstance(tops[0], dict) else None
    elif choice.get("finish_reason") == "stop" and t.eos:  # it ended the turn: the end of turn has no entry
        token, lp = _end_of_turn(t), None
    else:
        raise SpecvizError(f"The server at {t.url} sent a reply without the generated token.")
    return _vllm_shape(token, lp, rows)


def _named(t, piece: str, ids_of: dict[str, int]) -> int:
    """The token `piece` names (see `pieces`); one sentence where it names none for sure."""
    if piece not in ids_of:
        raise SpecvizError(
            f"The server at {t.url} generated a token whose text several tokens share; "
            "a server that sends token ids (vLLM) says which."
        )
    return ids_of[piece]


def _row(t, top: dict, own: int, text_of: dict[int, str], ids_of: dict[str, int]) -> dict[int, float]:
    """{token id: logprob} from one entry's {text: logprob}: `own` (the entry's token, known by id) for its own
    text; "" for the end of turn; a text that names a token (`pieces`) for it; one that names none for sure is
    dropped where it cannot be the top one there, else one sentence."""
    out: dict[int, float] = {}
    unnamed = -math.inf
    for s, lp in top.items():
        if s == text_of.get(own):
            out[own] = float(lp)
        elif s == "" and t.eos:
            out.setdefault(_end_of_turn(t), float(lp))
        elif s in ids_of:
            out.setdefault(ids_of[s], float(lp))
        else:
            unnamed = max(unnamed, float(lp))
    if not out or unnamed > max(out.values()):
        raise SpecvizError(
            f"The server at {t.url} named its top token only by a text several tokens share; "
            "a server that sends token ids (vLLM) says which."
        )
    return out


def _end_of_turn(t) -> int:
    eos = getattr(t.tokenizer, "eos_token_id", None)
    return int(eos) if eos is not None and eos in t.eos else min(t.eos)


def text_of_ids(t, ids: list[int]) -> str:
    """The text a request sends for token ids: control tokens written out, so the server reads them back as such."""
    return t.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def step_body(t, prompt_ids: list[int], tokens: int) -> dict:
    """served.engine_step_s's request for this server: `tokens` greedy tokens after the prompt's text, its end of
    turn biased away (it has no ignore_eos), so every request generates all of them."""
    body = request_body(t.model, text_of_ids(t, prompt_ids), {"max_tokens": tokens})
    body.update(echo=False, logprobs=None, logit_bias={str(i): -100.0 for i in sorted(t.eos)})
    return body


class LlamaCppRun(ServedRun):
    """ServedRun over llama-cpp-python's server: each request sends text and its answer is read back into token
    ids (see the module docstring); everything else, verification included, is ServedRun's."""

    def _complete(self, prompt: list[int], **fields) -> list[dict]:
        body = request_body(self.t.model, text_of_ids(self.t, prompt), fields)
        data = self._post(body)
        return [as_vllm_choice(self.t, prompt, body["prompt"], data, body["echo"])]

    def verify(self, fed: list[int], x: list[int], q, s, gen):
        """ServedRun.verify with the guesses cut before the first the server cannot score (`scorable`): the guess
        there is judged against the engine's own token at that position, which the request for the guesses before
        it returns, and counted as turned down even where that token is the same (the output is the engine's
        greedy output either way). Greedy only (verify_mode)."""
        m = scorable(self.t.tokenizer, self.ids + fed, x)
        if m == len(x):
            return super().verify(fed, x, q, s, gen)
        v, logits = super().verify(fed, x[:m], None, s, gen)
        k = len(x)
        self._set(self.ids + x[m:])  # the engine rolls back over all k guesses
        flags = v.p_x + (0.0,) * (k - m)
        pad = torch.full((k - m, logits.shape[1]), -torch.inf)  # positions past the cut: not scored
        return Verdict(v.n, v.correction, flags, (1.0,) * k, flags, (math.nan,) * k), torch.cat([logits, pad])


def scorable(tok, ids: list[int], x: list[int]) -> int:
    """How many of the guesses x, after ids, the server can score: none is the beginning-of-text token (its echo
    leaves every copy of that token out, e.g. SmolLM2's <|im_start|>, which a draft may guess), and
    they read back as themselves when their text is tokenized again (a draft may split a text as the tokenizer
    would not)."""
    bos = getattr(tok, "bos_token_id", None)
    x = x[: x.index(bos)] if bos is not None and bos in x else x
    for m in range(len(x), 0, -1):
        want = ids + x[:m]
        if tok(tok.decode(want, clean_up_tokenization_spaces=False), add_special_tokens=False)["input_ids"] == want:
            return m
    return 0
