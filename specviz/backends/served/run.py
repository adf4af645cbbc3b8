"""A run against a served target: p runs in a serving engine (vLLM's OpenAI-compatible server), q runs here.

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
  position (`prompt_logprobs: -1`: a whole vocabulary's logprobs at every position, far slower than decoding).
  specviz checks against the engine's top `APPROX_TOP` instead, renormalised, and says "approximate: top-20" in the
  run's stats, the page, the recording and the bench. What is lost: the mass outside the top-20, so p(x_i) is
  overstated and the residual misses every token outside the top-20; the bonus is still the engine's own sample.

The plain lane asks the same endpoint for one token per request (the engine's greedy token or its own sample; its
prefix cache applies, where prompt-logprob requests recompute the prefix), so both lanes pay the same round trip.
Requests go only to the URL the caller named (the page allows only the operator's SPECVIZ_TARGET_URLS, limits.py);
redirects and proxies are never followed. Every failure a user can cause is one SpecvizError sentence.

Here: `ServedRun`, one run's rounds and plain steps through vLLM's token-id interface (llamacpp.py's LlamaCppRun
reads llama-cpp-python's text interface into the same shape); served.py connects and picks the run.
"""

from __future__ import annotations

import math
import time

import torch

from specviz.backends.served.target import APPROX_TOP, ServedTarget, missing
from specviz.config import SamplingConfig, SpecvizError
from specviz.sampling import Verdict, greedy, probs_at, residual, sample, to_probs, verify_greedy, verify_sampled

RESIDUAL_SAMPLES = 8  # engine samples per request when drawing a rejected position's residual
RESIDUAL_REQUESTS = 4  # requests of them before asking for the whole distribution at that position
_SEED_MAX = 2**31 - 1
NO_TREES = "Token trees need a tree-masked verify, which a served target's API does not offer; use chains."


def sampling_body(s: SamplingConfig, gen: torch.Generator | None = None) -> dict:
    """The request's sampling fields, every one explicit: a server's defaults (from the model's
    generation_config: a top-p, a repetition penalty) must never change p behind our back. gen: the run's
    generator, which seeds the engine's sample (not needed when greedy)."""
    body = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k or 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }
    if not s.greedy:  # the engine's sample is drawn from a seed taken from the run's one generator
        body["seed"] = int(torch.randint(_SEED_MAX, (1,), generator=gen, device=gen.device))
    return body


def untempered(s: SamplingConfig) -> bool:
    """T = 1 and no top-k/top-p: p is the model's own softmax, the engine's logprobs as they come."""
    return s.temperature == 1.0 and s.top_k == 0 and s.top_p >= 1.0


def _token_id(key) -> int:
    """A token id from vLLM's keys: "123" (prompt logprobs) or "token_id:123" (return_tokens_as_token_ids)."""
    return int(str(key).removeprefix("token_id:"))


class ServedRun:
    """CachedModel's seam over a served target: the text so far lives here and each request sends it whole.

    A backends.TargetRun whose `decides` is True: `length`, `calls`, `prefill`, `feed` and `rollback` behave as
    CachedModel's; `verify` (one speculative round) and `next_token` (one plain step) let the engine's own numbers
    decide, as a server sends only some of p. No tree-masked verify. `stats` adds the request counts.
    """

    decides = True
    supports_trees = False  # an OpenAI-compatible completions request has no tree-masked verify

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

    def feed_tree(self, ids: torch.Tensor, parents: list[int], hidden: bool = False):
        raise SpecvizError(NO_TREES)

    def keep_path(self, prefix: int, rows: list[int]) -> None:
        raise SpecvizError(NO_TREES)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return greedy(logits)

    def probs_at(self, logits: torch.Tensor, rows: list[int], cols: list[int]) -> list[float]:
        return probs_at(logits, rows, cols)

    def mode(self, s: SamplingConfig, plain: bool = False) -> str:
        """How this run decides under s: "greedy", "exact", "approximate: top-20" (ServedTarget.verify_mode), or for
        the plain lane at T > 0 "engine sample" (the engine samples from its own p: exact at any temperature)."""
        return "engine sample" if plain and not s.greedy else self.t.verify_mode(s)

    def verify_note(self, s: SamplingConfig, plain: bool = False) -> str:
        return f"served {self.mode(s, plain)}"

    def run_stats(self, s: SamplingConfig, plain: bool = False) -> dict:
        """The requests this run sent and their seconds, and how it decided."""
        return {**self.stats, "verify": self.mode(s, plain)}

    def _set(self, ids: list[int]) -> None:
        self.ids, self.length = ids, len(ids)

    def _post(self, body: dict):
        """POST /v1/completions, counted and timed (calls, request_s) whether it answers or raises."""
        t0 = time.perf_counter()
        try:
            return self.t.client.post("/v1/completions", body)
        finally:
            self.calls += 1
            self.request_s += time.perf_counter() - t0

    def _complete(self, prompt: list[int], **fields) -> list[dict]:
        """POST /v1/completions with a token-id prompt; the choices, checked to carry what specviz reads."""
        body = {
            "model": self.t.model,
            "prompt": prompt,
            "max_tokens": 1,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "logprobs": 0,
            **fields,
        }
        data = self._post(body)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            raise missing(self.t, "choices")
        for c in choices:
            if not isinstance(c, dict) or not isinstance(c.get("token_ids"), list) or len(c["token_ids"]) != 1:
                raise missing(self.t, "the generated token's id (token_ids)")
            lp = (c.get("logprobs") or {}).get("token_logprobs")
            if not isinstance(lp, list) or len(lp) != 1 or not isinstance(lp[0], (int, float)):
                raise missing(self.t, "the generated token's logprob")
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
                raise missing(self.t, "a logprob for each prompt token") from None
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
        (choice,) = self._complete(self.ids, **sampling_body(SamplingConfig()), **({"prompt_logprobs": 1} if k else {}))
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
        (choice,) = self._complete(self.ids, **sampling_body(s, gen), **plp)
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
        return Verdict(
            n, correction, tuple(p_x.tolist()), tuple(q_x.tolist()), tuple(accept_prob.tolist()), tuple(r.tolist())
        )

    def _residual_sample(self, prompt: list[int], q_n: torch.Tensor, gen: torch.Generator) -> int:
        """One draw from norm(max(0, p − q)) at the position after `prompt`, p at T = 1 (see the module docstring)."""
        s = SamplingConfig(temperature=1.0)
        for _ in range(RESIDUAL_REQUESTS):
            for choice in self._complete(prompt, n=RESIDUAL_SAMPLES, **sampling_body(s, gen)):
                y, lp, _ = self._generated(choice)  # y ~ p, and log p(y)
                keep = max(0.0, 1.0 - float(q_n[y]) * math.exp(-lp)) if y < q_n.numel() else 1.0
                if float(torch.rand(1, generator=gen, device=gen.device)) < keep:
                    return y
        body = {**sampling_body(s, gen), "logprobs": -1}  # all of p at this one position
        (choice,) = self._complete(prompt, **body)
        p_n = torch.softmax(self._logits([self._generated(choice)[2]])[0], -1)  # (V,)
        return sample(residual(p_n, q_n).to(gen.device), gen)

    def next_token(self, pending: list[int], s: SamplingConfig, gen: torch.Generator) -> tuple[int, float]:
        """One plain step: the engine's greedy token or its own sample after the text and `pending`, and p of it
        (1.0 when greedy; NaN where p needs a normaliser the engine did not send)."""
        self._set(self.ids + pending)
        (choice,) = self._complete(self.ids, **sampling_body(s, gen))
        token, lp, _ = self._generated(choice)
        if s.greedy:
            return token, 1.0
        return token, math.exp(lp) if untempered(s) else float("nan")
