"""vLLM's own speculative rounds for one reply, from the counts it returns with it.

vLLM (0.32) started with speculative decoding and `--per-request-spec-decode-metrics detailed` returns with each
single-sequence reply `metrics.speculative_decoding`: per verify step the guesses it drafted and how many the target
kept (`per_step_drafted`, `per_step_accepted`) and the histogram of kept counts. It does not return the guesses the
target turned down, and it records only steps that drafted: a step whose drafter proposed nothing (prompt lookup
without a match) is an ordinary one-token step absent from the arrays.

`server_rounds` lays those counts over the reply's token ids: the first token comes from the prefill, then each
verify step adds its kept guesses and the one token the target itself chose (the correction, or the bonus when it
kept all). Where the counts add up to the reply (`exact`), the rounds and their tokens are the server's; where they
add up to less (steps that drafted nothing), the places of those plain steps are unknown: `gaps` says how many
tokens they added, the counts still hold and the tokens are laid out as if they came last. Where the last step was
cut by the token limit or the end of text, its tokens stop early.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerRound:
    """One verify step of the server: `kept` the guesses the target kept (token ids; fewer than `accepted` where the
    reply ended inside them), `added` the token the target chose itself (None where the reply ended first),
    `drafted` how many it guessed (the rest were turned down and are not returned), `accepted` how many it kept,
    as the server counted them."""

    kept: tuple[int, ...]
    added: int | None
    drafted: int
    accepted: int = -1  # -1: len(kept)

    def __post_init__(self) -> None:
        if self.accepted < 0:
            object.__setattr__(self, "accepted", len(self.kept))

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.kept + (() if self.added is None else (self.added,))


@dataclass(frozen=True)
class ServerRun:
    first: int | None  # the token the prefill chose
    rounds: tuple[ServerRound, ...]
    gaps: int  # tokens from steps that drafted nothing, whose places the counts do not give (0: exact)
    histogram: tuple[int, ...]  # the server's: steps that kept j guesses, j = 0 .. k
    token_ids: tuple[int, ...] = ()  # the reply's, as the server sent them

    @property
    def exact(self) -> bool:
        return self.gaps == 0

    def counted_histogram(self) -> tuple[int, ...]:
        """The histogram as these rounds count it (each round's kept count), to set beside the server's."""
        out = [0] * len(self.histogram)
        for r in self.rounds:
            out[r.accepted] += 1
        return tuple(out)


def speculative_metrics(reply: dict) -> dict | None:
    """The reply's `metrics.speculative_decoding`, or None where the server sent none (no speculative decoding,
    or not started with --per-request-spec-decode-metrics)."""
    metrics = reply.get("metrics") if isinstance(reply, dict) else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    return spec if isinstance(spec, dict) else None


def server_rounds(token_ids: list[int], spec: dict) -> ServerRun:
    """The server's rounds over the reply's `token_ids` from its `spec` counts (speculative_metrics)."""
    accepted = [int(x) for x in spec.get("per_step_accepted") or ()]
    drafted = [int(x) for x in spec.get("per_step_drafted") or ()]
    if len(accepted) != len(drafted):
        raise ValueError("per_step_accepted and per_step_drafted differ in length")
    histogram = tuple(int(x) for x in spec.get("acceptance_histogram") or ())
    if not token_ids:
        return ServerRun(None, (), 0, histogram, ())
    first, at, rounds = token_ids[0], 1, []
    for n, d in zip(accepted, drafted):
        kept = tuple(token_ids[at : at + n])
        at += len(kept)
        added = token_ids[at] if at < len(token_ids) else None
        at += added is not None
        rounds.append(ServerRound(kept, added, d, n))
    return ServerRun(first, tuple(rounds), max(len(token_ids) - at, 0), histogram, tuple(token_ids))


NO_COUNTS = (
    "The server sent no per-step speculative counts; start vLLM with --speculative-config and "
    "--per-request-spec-decode-metrics detailed to see its own rounds."
)


def reply_rounds(client, model: str, prompt_ids: list[int], max_tokens: int, sampling: dict | None = None) -> ServerRun:
    """One request of `prompt_ids` to a vLLM server (`client`: http.Client, so only the address the operator
    allowed), greedy unless `sampling` gives temperature, top_k, top_p, seed; the server's rounds for its reply.
    One SpecvizError sentence where the reply carries no counts or no token ids."""
    from specviz.config import SpecvizError

    body = {"model": model, "prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": 0.0}
    body |= {k: v for k, v in (sampling or {}).items() if v is not None}
    body["return_token_ids"] = True
    reply = client.post("/v1/completions", body)
    counts = speculative_metrics(reply)
    if counts is None:
        raise SpecvizError(NO_COUNTS)
    choices = reply.get("choices") if isinstance(reply, dict) else None
    ids = (
        choices[0].get("token_ids") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    )
    if not isinstance(ids, list):
        raise SpecvizError(
            "The server's reply carries no token ids (return_token_ids); specviz needs them to draw its rounds."
        )
    return server_rounds([int(x) for x in ids], counts)
