"""A served target: p runs in a serving engine (vLLM's OpenAI-compatible server), the draft q runs here.

specviz keeps the drafting, the verification rule and the counts; the engine scores. One request per round:
`POST /v1/completions` with the text so far plus the drafted tokens x_1..x_k as a token-id prompt, `max_tokens: 1`
and `prompt_logprobs`, which gives at every drafted position the engine's log-probability of the drafted token
(always, with its rank) and its top tokens; the one token it generates sits at the bonus position.

What is exact (p target, q draft, r the uniform draw, as in sampling.py):
- greedy: x_i is kept when it is the engine's top-1 at its position; the correction is the top-1 there and the bonus
  the engine's own greedy token, so the output is the engine's greedy output token for token.
- temperature 1 with no top-k/top-p: vLLM's prompt logprobs are the model's untempered log-probabilities (its model
  runner: "prompt tokens skip sampling processors"), which at T = 1 *are* p, so r < p(x_i)/q(x_i) is the paper's test
  and the bonus is the engine's own sample. A rejected position needs a sample from norm(max(0, p − q)), which needs
  all of p: it is drawn by rejection from the engine's own samples there (one more request for `n` of them; y ~ p
  kept with probability max(0, 1 − q(y)/p(y)) leaves exactly that residual), and, if none is kept, from the whole
  distribution at that one position (`logprobs: -1`, which needs the server's `--max-logprobs -1`).
- any other temperature, or a top-k/top-p filter: p needs its normaliser, i.e. every token's logprob at every drafted
  position (`prompt_logprobs: -1`: 47 s per round for a 49,152-token vocabulary on the 2-core CPU server we measured).
  specviz checks against the engine's top `APPROX_TOP` instead, renormalised, and says "approximate: top-20" in the
  run's stats, the page, the recording and the bench. What is lost: the mass outside the top-20, so p(x_i) is
  overstated and the residual misses every token outside the top-20; the bonus is still the engine's own sample.

The plain lane asks the same endpoint for one token per request (the engine's greedy token or its own sample; its
prefix cache applies, where prompt-logprob requests recompute the prefix), so both lanes pay the same round trip.
Requests go only to the URL the caller named (the page allows only the operator's SPECVIZ_TARGET_URLS, limits.py);
redirects and proxies are never followed. Every failure a user can cause is one SpecvizError sentence.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import SamplingConfig, SpecvizError
from .sampling import Verdict, residual, sample, to_probs, verify_greedy, verify_sampled

APPROX_TOP = 20  # vLLM's default --max-logprobs: what any vLLM server gives per position
RESIDUAL_SAMPLES = 8  # engine samples per request when drawing a rejected position's residual
RESIDUAL_REQUESTS = 4  # requests of them before asking for the whole distribution at that position
TIMEOUT_S = 60.0  # one request; a CPU server's first request compiles for a few seconds
PROBE_TEXT = "Speculative decoding checks 4 guesses at once: déjà vu, naïve café!"
_SEED_MAX = 2**31 - 1


def is_url(name) -> bool:
    """Whether a target name is a served target's address (http:// or https://)."""
    return isinstance(name, str) and name.strip().lower().startswith(("http://", "https://"))


def base_url(url: str) -> str:
    """The OpenAI base ("http://host:port/v1") of a URL given with or without /v1; SpecvizError if malformed."""
    raw = url.strip()
    try:
        parts = urllib.parse.urlsplit(raw)
        port = parts.port  # raises on a port that is not a number
    except ValueError:
        raise SpecvizError(f"{raw[:80]} is not a valid server address; use http://HOST:PORT/v1.") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise SpecvizError(f"{raw[:80]} is not a valid server address; use http://HOST:PORT/v1.")
    if parts.username or parts.password:
        raise SpecvizError("A server address must not carry a user name or password.")
    path = parts.path.rstrip("/")
    path = path if path.endswith("/v1") else path + "/v1"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}{path}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # a redirect could point anywhere: it surfaces as an HTTP error instead


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def _server_message(body: bytes) -> str:
    """The server's own error message, short: vLLM sends {"error": {"message": ...}} or {"message": ...}."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
        err = data.get("error", data) if isinstance(data, dict) else data
        text = str(err.get("message") if isinstance(err, dict) and err.get("message") else err)
    except ValueError:
        pass
    line = next((x.strip() for x in text.splitlines() if x.strip()), "no message")
    return line[:200].rstrip(" .")


class Client:
    """HTTP to one server: JSON in and out, a timeout per request, no redirects, no proxies; errors as sentences."""

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S):
        self.base = base_url(url)
        self.root = self.base[: -len("/v1")]
        self.timeout_s = timeout_s

    def get(self, path: str) -> bytes:
        return self._send(urllib.request.Request(self.root + path, method="GET"))

    def post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.root + path, data=data, headers={"Content-Type": "application/json"})
        return self._json(self._send(req), path)

    def get_json(self, path: str) -> dict:
        return self._json(self.get(path), path)

    def _json(self, raw: bytes, path: str):
        try:
            return json.loads(raw)
        except ValueError:
            raise SpecvizError(
                f"The server at {self.base} sent {path} a reply that is not JSON, so it is not an OpenAI-compatible server."
            ) from None

    def _send(self, req: urllib.request.Request) -> bytes:
        where = self.base
        try:
            with _OPENER.open(req, timeout=self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            if 300 <= e.code < 400:
                raise SpecvizError(
                    f"The server at {where} answered with a redirect, which specviz does not follow."
                ) from None
            what = urllib.parse.urlsplit(req.full_url).path
            raise SpecvizError(
                f"The server at {where} answered {e.code} to {what}: {_server_message(e.read())}."
            ) from None
        except TimeoutError:
            raise SpecvizError(f"The server at {where} did not answer within {self.timeout_s:g} seconds.") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise SpecvizError(f"The server at {where} did not answer within {self.timeout_s:g} seconds.") from None
            raise SpecvizError(
                f"The server at {where} cannot be reached ({_reason(e.reason)}); check that it runs and the address."
            ) from None
        except (ConnectionError, OSError) as e:
            raise SpecvizError(f"The connection to the server at {where} failed ({_reason(e)}).") from None


def _reason(reason) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    text = str(getattr(reason, "strerror", None) or reason)
    return re.sub(r"\s+", " ", text)[:120].rstrip(" .") or type(reason).__name__


# --- the served target: what the engine reads of a LoadedModel ------------------------------------------


@dataclass(eq=False)
class ServedTarget:
    """The target p behind a server: its tokenizer and vocabulary here, its scores there (see `connect`)."""

    name: str  # the address as the caller gave it
    client: Client = field(repr=False)
    model: str  # the server's model name (what every request names)
    tokenizer: object = field(repr=False)
    vocab_size: int
    eos: frozenset[int]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    quantize: str | None = None
    memory_bytes: int = 0  # nothing of it is held here
    max_model_len: int = 0
    n_params: int = 0  # not known here: the weights live on the server
    engine: str = "vllm"  # or llamacpp.ENGINE: llama-cpp-python's server, which takes text (llamacpp.py)

    @property
    def precision(self) -> str:
        """How its weights are held, in words (LoadedModel.precision's counterpart): the server's business."""
        return "served"

    @property
    def url(self) -> str:
        return self.client.base

    def verify_mode(self, s: SamplingConfig) -> str:
        """ "greedy", "exact" (T = 1, no filter) or "approximate: top-20": how this target verifies under `s`;
        one sentence where it cannot (llama-cpp-python's server at T > 0, llamacpp.py)."""
        if s.greedy:
            return "greedy"
        if self.engine != "vllm":
            raise SpecvizError(
                f"The server at {self.url} ({self.engine}) names tokens by their text, which verifies greedy "
                "decoding exactly but not sampling; use temperature 0 here, or a vLLM server."
            )
        if _untempered(s):
            return "exact"
        return f"approximate: top-{APPROX_TOP}"

    def open_run(self) -> ServedRun:
        if self.engine != "vllm":
            from .llamacpp import LlamaCppRun

            return LlamaCppRun(self)
        return ServedRun(self)


def _untempered(s: SamplingConfig) -> bool:
    """T = 1 and no top-k/top-p: p is the model's own softmax, the engine's logprobs as they come."""
    return s.temperature == 1.0 and s.top_k == 0 and s.top_p >= 1.0


def _sampling_body(s: SamplingConfig, gen: torch.Generator | None = None) -> dict:
    """The request's sampling fields, every one explicit: a server's defaults (from the model's
    generation_config: a top-p, a repetition penalty) must never change p behind our back. gen: the run's
    generator, which seeds the engine's sample (not needed when greedy)."""
    body = {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k or 0, "min_p": 0.0,
            "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}  # fmt: skip
    if not s.greedy:  # the engine's sample is drawn from a seed taken from the run's one generator
        body["seed"] = int(torch.randint(_SEED_MAX, (1,), generator=gen, device=gen.device))
    return body


def open_run(lm, V: int):
    """The run object the engine feeds: a ServedRun for a served target, a CachedModel (own KV cache) otherwise."""
    from .models import CachedModel

    return lm.open_run() if isinstance(lm, ServedTarget) else CachedModel(lm, V)


def _token_id(key) -> int:
    """A token id from vLLM's keys: "123" (prompt logprobs) or "token_id:123" (return_tokens_as_token_ids)."""
    return int(str(key).removeprefix("token_id:"))


class ServedRun:
    """CachedModel's seam over a served target: the text so far lives here and each request sends it whole.

    `length`, `calls`, `prefill`, `feed` and `rollback` behave as CachedModel's; `verify` (one speculative round)
    and `next_token` (one plain step) let the engine's own numbers decide. `stats` adds the request counts.
    """

    def __init__(self, target: ServedTarget):
        self.t = target
        self.ids: list[int] = []
        self.length = 0
        self.calls = 0  # requests this run sent (lanes racing on one target each count their own)
        self.request_s = 0.0  # seconds this run waited on them

    @property
    def stats(self) -> dict:
        return {"served": self.t.url, "requests": self.calls, "request_s": self.request_s}

    def prefill(self, prompt: torch.Tensor, hidden: bool = False) -> None:
        if hidden:
            raise SpecvizError("A served target does not send hidden states; use the model or lookup drafters.")
        self._set(prompt.tolist()[:-1])
        return None

    def rollback(self, keep: int) -> None:
        self._set(self.ids[:keep])

    def _set(self, ids: list[int]) -> None:
        self.ids, self.length = ids, len(ids)

    def _complete(self, prompt: list[int], **fields) -> list[dict]:
        """POST /v1/completions with a token-id prompt; the choices, checked to carry what specviz reads."""
        body = {"model": self.t.model, "prompt": prompt, "max_tokens": 1, "return_token_ids": True,
                "return_tokens_as_token_ids": True, "logprobs": 0, **fields}  # fmt: skip
        t0 = time.perf_counter()
        try:
            data = self.t.client.post("/v1/completions", body)
        finally:
            self.calls += 1
            self.request_s += time.perf_counter() - t0
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            raise _missing(self.t, "choices")
        for c in choices:
            if not isinstance(c, dict) or not isinstance(c.get("token_ids"), list) or len(c["token_ids"]) != 1:
                raise _missing(self.t, "the generated token's id (token_ids)")
            lp = (c.get("logprobs") or {}).get("token_logprobs")
            if not isinstance(lp, list) or len(lp) != 1 or not isinstance(lp[0], (int, float)):
                raise _missing(self.t, "the generated token's logprob")
        return choices

    def _rows(self, choice: dict, start: int, k: int) -> list[dict[int, float]]:
        """The engine's logprobs at the k prompt positions from `start`: {token id: logprob}, each holding the
        prompt's own token there."""
        plp = choice.get("prompt_logprobs")
        if not isinstance(plp, list) or len(plp) < start + k:
            raise SpecvizError(
                f"The server at {self.t.url} sent no prompt logprobs; specviz needs a server whose /v1/completions "
                "takes prompt_logprobs, such as vLLM."
            )
        rows = []
        for entry in plp[start : start + k]:
            try:
                rows.append({_token_id(t): float(v["logprob"]) for t, v in entry.items()})
            except (AttributeError, KeyError, TypeError, ValueError):
                raise _missing(self.t, "a logprob for each prompt token") from None
        return rows

    def _logits(self, rows: list[dict[int, float]]) -> torch.Tensor:
        """(L, V) logits holding what the engine sent (its logprobs), -inf elsewhere."""
        V = self.t.vocab_size
        out = torch.full((len(rows), V), -torch.inf)
        for i, row in enumerate(rows):
            ids = [t for t in row if 0 <= t < V]
            if len(ids) != len(row):
                raise SpecvizError(f"The server at {self.t.url} sent token ids past the tokenizer's {V:,}.")
            out[i, ids] = torch.tensor([row[t] for t in ids])
        return out

    @staticmethod
    def _generated(choice: dict) -> tuple[int, float, dict[int, float]]:
        """(token id, its logprob, {id: logprob} of the top tokens sent) at the generated position."""
        lps = choice["logprobs"]
        top = (lps.get("top_logprobs") or [None])[0] or {}
        token, lp = int(choice["token_ids"][0]), float(lps["token_logprobs"][0])
        return token, lp, {**{_token_id(t): float(v) for t, v in top.items()}, token: lp}

    # --- the seam ------------------------------------------------------------------------------------

    def feed(self, ids: torch.Tensor, last_only: bool = False, hidden: bool = False) -> torch.Tensor:
        """Greedy scores of ids (L,) appended to the text: (L or 1, V) logits with the engine's top-1 at each
        position (the last: its greedy token), -inf elsewhere. The request a greedy verify of L - 1 guesses sends."""
        if hidden:
            raise SpecvizError("A served target does not send hidden states; use the model or lookup drafters.")
        new = ids.tolist()
        start = self.length + 1
        self._set(self.ids + new)
        k = len(new) - 1
        (choice,) = self._complete(
            self.ids, **_sampling_body(SamplingConfig()), **({"prompt_logprobs": 1} if k else {})
        )
        rows = self._rows(choice, start, k) if k else []
        token, lp, top = self._generated(choice)
        logits = self._logits([*rows, top])
        return logits[-1:] if last_only else logits

    def verify(self, fed: list[int], x: list[int], q: torch.Tensor | None, s: SamplingConfig, gen: torch.Generator):
        """One round: the engine scores the guesses x (k,) after the text and `fed`; (Verdict, (k+1, V) logits of
        what it sent). q (k, V): the draft's probabilities the guesses were drawn from (None when greedy)."""
        mode = self.t.verify_mode(s)
        if mode == "greedy":
            logits = self.feed(torch.tensor(fed + x))
            return verify_greedy(torch.tensor(x, dtype=torch.long), logits), logits
        k, start = len(x), self.length + len(fed)
        self._set(self.ids + fed + x)
        plp = {} if not k else {"prompt_logprobs": 0 if mode == "exact" else APPROX_TOP}
        (choice,) = self._complete(self.ids, **_sampling_body(s, gen), **plp)
        rows = self._rows(choice, start, k) if k else []
        token, lp, top = self._generated(choice)
        logits = self._logits([*rows, top])
        xs = torch.tensor(x, dtype=torch.long)
        q = (q if k else torch.zeros(0, self.t.vocab_size)).float().cpu()
        if mode != "exact":  # top-20 rows renormalised under s; the bonus row is the engine's own sample
            p = torch.cat(
                [to_probs(logits[:k], s), torch.nn.functional.one_hot(torch.tensor([token]), logits.shape[1])]
            )
            return verify_sampled(xs, q, p.float(), gen), logits
        return self._verify_exact(xs, q, rows, token, start, gen), logits

    def _verify_exact(self, x, q, rows, bonus: int, start: int, gen: torch.Generator) -> Verdict:
        """Speculative sampling at T = 1 with p(x_i) from the engine: r < p/q; the bonus is the engine's sample."""
        k = x.shape[0]
        p_x = torch.tensor([math.exp(row[int(t)]) for row, t in zip(rows, x)])  # (k,)
        q_x = q[torch.arange(k), x]  # (k,)
        ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(1e-30), torch.where(p_x > 0, torch.inf, 0.0))
        accept_prob = ratio.clamp(max=1.0)
        r = torch.rand(k, generator=gen, device=gen.device, dtype=torch.float32).cpu()
        accepted = (r < accept_prob).tolist()
        n = accepted.index(False) if False in accepted else k
        correction = bonus if n == k else self._residual_sample(self.ids[: start + n], q[n], gen)
        return Verdict(n, correction, tuple(p_x.tolist()), tuple(q_x.tolist()), tuple(accept_prob.tolist()),
                       tuple(r.tolist()))  # fmt: skip

    def _residual_sample(self, prompt: list[int], q_n: torch.Tensor, gen: torch.Generator) -> int:
        """One draw from norm(max(0, p − q)) at the position after `prompt`, p at T = 1 (see the module docstring)."""
        s = SamplingConfig(temperature=1.0)
        for _ in range(RESIDUAL_REQUESTS):
            for choice in self._complete(prompt, n=RESIDUAL_SAMPLES, **_sampling_body(s, gen)):
                y, lp, _ = self._generated(choice)  # y ~ p, and log p(y)
                keep = max(0.0, 1.0 - float(q_n[y]) * math.exp(-lp)) if y < q_n.numel() else 1.0
                if float(torch.rand(1, generator=gen, device=gen.device)) < keep:
                    return y
        body = {**_sampling_body(s, gen), "logprobs": -1}  # all of p at this one position
        (choice,) = self._complete(prompt, **body)
        p_n = torch.softmax(self._logits([self._generated(choice)[2]])[0], -1)  # (V,)
        return sample(residual(p_n, q_n).to(gen.device), gen)

    def next_token(self, pending: list[int], s: SamplingConfig, gen: torch.Generator) -> tuple[int, float]:
        """One plain step: the engine's greedy token or its own sample after the text and `pending`, and p of it
        (1.0 when greedy; NaN where p needs a normaliser the engine did not send)."""
        self._set(self.ids + pending)
        (choice,) = self._complete(self.ids, **_sampling_body(s, gen))
        token, lp, _ = self._generated(choice)
        if s.greedy:
            return token, 1.0
        return token, math.exp(lp) if _untempered(s) else float("nan")


def _missing(t: ServedTarget, what: str) -> SpecvizError:
    return SpecvizError(f"The server at {t.url} sent a reply without {what}; specviz needs vLLM's /v1/completions.")


# --- connecting: once per (address, tokenizer, device), every check made then -------------------------------

_CONNECTIONS: dict[tuple, ServedTarget] = {}
_LOCK = threading.Lock()


def connect(url: str, tokenizer: str | None = None, device=None, timeout_s: float = TIMEOUT_S) -> ServedTarget:
    """The served target at `url` (http://HOST:PORT/v1), checked once per connection and reused.

    tokenizer: a hub id or folder for p's tokenizer (default: the server's model name, as /v1/models gives it).
    The checks: the server answers, names a model, that model's tokenizer loads here and splits a probe text as the
    server's own /tokenize does, and /v1/completions returns prompt logprobs for a token-id prompt.
    """
    from .models import _resolve_device

    client = Client(url, timeout_s)
    dev = _resolve_device(device)
    key = (client.base, tokenizer or "", str(dev))
    with _LOCK:
        known = _CONNECTIONS.get(key)
    if known is not None:
        return known
    target = _connect(client, url.strip(), tokenizer, dev)
    with _LOCK:
        _CONNECTIONS[key] = target
    return target


def forget_connections() -> None:
    """Drop the checked connections (a restarted server is checked again on the next use)."""
    with _LOCK:
        _CONNECTIONS.clear()


def _connect(client: Client, name: str, tokenizer: str | None, dev: torch.device) -> ServedTarget:
    data = client.get_json("/v1/models")
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict) or not models[0].get("id"):
        raise SpecvizError(
            f"The server at {client.base} lists no model at /v1/models; is it an OpenAI-compatible server?"
        )
    info = models[0]
    model = str(info["id"])
    source = tokenizer or str(info.get("root") or model)
    tok, vocab_size, eos = _tokenizer(source, model, tokenizer is not None)
    engine, theirs = _probe_tokenize(client, model)
    target = ServedTarget(name=name, client=client, model=model, tokenizer=tok, vocab_size=vocab_size, eos=eos,
                          device=dev, max_model_len=int(info.get("max_model_len") or 0), engine=engine)  # fmt: skip
    _check_tokenizer(target, source, theirs)
    _check_prompt_logprobs(target)
    return target


def _tokenizer(source: str, model: str, named: bool):
    """(tokenizer, vocabulary size, EOS ids) of p from a hub id or folder; one sentence when it is not here."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from .models import hub_reachable, resolve_source

    try:
        where = resolve_source(source)
        cache_only = not Path(where).is_dir() and not hub_reachable()
        tok = AutoTokenizer.from_pretrained(where, local_files_only=cache_only)
    except Exception:
        hint = "" if named else " (name a local folder that holds it with --tokenizer / tokenizer=)"
        raise SpecvizError(
            f"The tokenizer for the served model {model}, {source}, is not available here{hint}."
        ) from None
    eos, vocab_size = set(), len(tok)
    if tok.eos_token_id is not None:
        eos.add(int(tok.eos_token_id))
    for load in (AutoConfig.from_pretrained, GenerationConfig.from_pretrained):
        try:
            cfg = load(where, local_files_only=cache_only)
        except Exception:
            continue
        e = getattr(cfg, "eos_token_id", None)
        eos.update(int(i) for i in (e if isinstance(e, (list, tuple)) else [e] if e is not None else []))
        vocab_size = max(vocab_size, int(getattr(cfg, "vocab_size", 0) or 0))
    return tok, vocab_size, frozenset(eos)


def _probe_tokenize(client: Client, model: str) -> tuple[str, object]:
    """(engine, the server's token ids of PROBE_TEXT): vLLM's /tokenize, else llama-cpp-python's own endpoint
    (llamacpp.py); a server with neither gets the /tokenize request's sentence."""
    from . import llamacpp

    try:
        data = client.post("/tokenize", {"model": model, "prompt": PROBE_TEXT, "add_special_tokens": False})
    except SpecvizError:
        theirs = llamacpp.probe_tokens(client, PROBE_TEXT)
        if theirs is None:
            raise
        return llamacpp.ENGINE, theirs
    return "vllm", data.get("tokens") if isinstance(data, dict) else None


def _check_tokenizer(t: ServedTarget, source: str, theirs) -> None:
    """The tokenizer here must split a probe text as the server's own tokenizer does (its tokenize endpoint)."""
    from .llamacpp import same_tokens

    if not isinstance(theirs, list):
        raise _missing(t, "the token ids of /tokenize")
    ours = t.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    if not same_tokens(list(map(int, theirs)), list(ours), t.tokenizer):
        raise SpecvizError(
            f"The tokenizer {source} splits text differently from the server's model {t.model}; "
            "name the model's own tokenizer."
        )


def _check_prompt_logprobs(t: ServedTarget) -> None:
    """One token-id request with prompt logprobs: the server must send a logprob and rank for each prompt token."""
    ids = t.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"][:6]
    run = t.open_run()
    run._set(ids[:-2])
    logits = run.feed(torch.tensor(ids[-2:]))  # (2, V)
    scored = logits[0, ids[-1]] if t.engine == "vllm" else logits[0].max()  # llama-cpp-python: its top tokens
    if not torch.isfinite(scored):
        raise SpecvizError(f"The server at {t.url} sent no logprob for a prompt token; specviz needs them.")


@dataclass(frozen=True)
class EngineSpec:
    """The engine's own speculative decoding, from its /metrics counters (cumulative since the server started)."""

    drafts: int  # rounds in which the engine drafted
    draft_tokens: int
    accepted: int
    accepted_per_pos: tuple[int, ...]  # accepted at draft position i (0-based)

    @property
    def acceptance_per_pos(self) -> tuple[float, ...]:
        """Of the engine's drafts, the share whose guess at position i was kept (vLLM: per_pos[i] / drafts)."""
        return tuple(a / self.drafts for a in self.accepted_per_pos) if self.drafts else ()

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per engine step while it speculates: 1 + accepted / drafts (vLLM's definition)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else 0.0


_METRIC = re.compile(r"^(vllm:spec_decode_[a-z_]+?)(?:_total)?(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)\s*$")


def parse_spec_metrics(text: str) -> EngineSpec | None:
    """The engine's speculative-decoding counters from Prometheus text; None when the server does not speculate."""
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                per_pos[int(pos.group(1))] = per_pos.get(int(pos.group(1)), 0.0) + value
        else:
            sums[name] = sums.get(name, 0.0) + value
    need = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    if not all(n in sums for n in need):
        return None
    drafts, tokens, accepted = (int(sums[n]) for n in need)
    positions = tuple(int(per_pos.get(i, 0)) for i in range(max(per_pos) + 1)) if per_pos else ()
    return EngineSpec(drafts=drafts, draft_tokens=tokens, accepted=accepted, accepted_per_pos=positions)


def engine_spec(target: ServedTarget) -> EngineSpec | None:
    """What the engine's own speculative decoding measured so far (GET /metrics); None when it does not speculate."""
    if target.engine != "vllm":  # llama-cpp-python's server has no /metrics
        return None
    return parse_spec_metrics(target.client.get("/metrics").decode("utf-8", "replace"))


def load_served_pair(
    url: str | ServedTarget,
    draft=None,
    *,
    tokenizer: str | None = None,
    need_draft: bool = True,
    device=None,
    dtype=None,
    quantize: str | None = None,
    timeout_s: float | None = None,
):
    """(p served at `url`, q loaded here or None): the served counterpart of models.load_pair.

    The draft runs on this machine's device (float16 where this CPU runs it faster, as load_pair does); a draft
    whose vocabulary cannot serve p is refused with load_pair's sentence.
    """
    from .config import BUILTIN_DRAFT
    from .kernels import draft_dtype
    from .models import _resolve_device, load_model, vocab_gap

    if quantize:
        raise SpecvizError("Quantisation applies to a target loaded here; a served target is quantised by its server.")
    p = url if isinstance(url, ServedTarget) else connect(url, tokenizer, device=device)
    if not need_draft and draft is None:
        return p, None
    q_dtype = dtype if dtype not in (None, "", "auto") else draft_dtype(_resolve_device(p.device)) or dtype
    q = load_model(draft or BUILTIN_DRAFT, device=p.device, dtype=q_dtype, timeout_s=timeout_s)
    gap = vocab_gap(p, q)
    if gap:
        raise SpecvizError(gap)
    return p, q


def engine_step_s(target: ServedTarget, prompt_ids: list[int], n: int = 16, reps: int = 3) -> float:
    """Seconds of one decoding step inside the engine, without a round trip: a request generating n tokens
    against one generating 1 (same prompt, greedy, EOS ignored), interleaved, medians; (t_n - t_1) / (n - 1)."""
    import statistics

    def timed(tokens: int) -> float:
        body = {"model": target.model, "prompt": prompt_ids, "max_tokens": tokens, "temperature": 0.0,
                "ignore_eos": True}  # fmt: skip
        if target.engine != "vllm":  # text in; its end of turn kept out by a logit bias (it has no ignore_eos)
            from .llamacpp import step_body

            body = step_body(target, prompt_ids, tokens)
        t0 = time.perf_counter()
        target.client.post("/v1/completions", body)
        return time.perf_counter() - t0

    timed(n)  # warm-up
    one, many = [], []
    for _ in range(reps):
        one.append(timed(1))
        many.append(timed(n))
    return max((statistics.median(many) - statistics.median(one)) / (n - 1), 1e-6)
