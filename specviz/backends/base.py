"""The one seam between the engine and what runs the target p: `TargetRun`, the calls a decoding loop makes on p,
and `Limits`, what a kind of target cannot do, stated once.

Two families implement it: `local.CachedModel` (a model loaded here with its own KV cache, on transformers or the
native forward) and `served.run.ServedRun` (p in vLLM or llama-cpp-python's server, scored there). The engine and
the drafters name neither: they open a run with `backends.open_run`, read a target's limits with
`backends.limits_of`, and branch only on what the run says of itself (`decides`, `supports_trees`).
Imports torch and config only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specviz.config import SamplingConfig


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What a kind of target can give the engine; every refusal sentence that names a limit reads it here."""

    runs_here: bool  # p computes on this machine: its calls can be timed beside the draft's
    tree_verify: bool  # it can verify a token tree in one tree-masked call
    hidden_states: bool  # it sends its last hidden states (the head drafters read them)
    all_of_p: bool  # it sends p at every position (relaxed verification mixes all of it with q)
    what: str  # how a sentence names it: "a served target"


LOCAL = Limits(runs_here=True, tree_verify=True, hidden_states=True, all_of_p=True, what="a model loaded here")
SERVED = Limits(runs_here=False, tree_verify=False, hidden_states=False, all_of_p=False, what="a served target")


@runtime_checkable
class TargetRun(Protocol):
    """One run's hold on p: the text so far (as cache rows or as ids sent whole), fed, scored and rolled back.

    `length` counts the tokens held (every token of the text but the last, which the next call feeds); `calls` the
    forward calls or requests so far. A run whose `decides` is False returns p's scores and the engine applies the
    rule (sampling.verify_*); one whose `decides` is True applies it with its own numbers (a DecidingRun's `verify`
    and `next_token`), because it does not send all of p.
    """

    length: int
    calls: int
    decides: bool  # True: `verify` / `next_token` decide; False: `feed` / `feed_tree` return p and the engine does
    supports_trees: bool  # `feed_tree` / `keep_path` work on this run

    def prefill(self, prompt: torch.Tensor, hidden: bool = False) -> torch.Tensor | None:
        """Hold every prompt token (P,) but the last; with `hidden`, their last hidden states (P - 1, H)."""

    def feed(self, ids: torch.Tensor, last_only: bool = False, hidden: bool = False):
        """ids (L,) appended: p's logits (L or 1, V), and the last hidden states (L, H) with `hidden`."""

    def feed_tree(self, ids: torch.Tensor, parents: list[int], hidden: bool = False):
        """Tokens that branch (token i continues row parents[i]) in one tree-masked call: logits (L, V)."""

    def keep_path(self, prefix: int, rows: list[int]) -> None:
        """Keep the first `prefix` rows and then the tree rows `rows`; drop every other."""

    def rollback(self, keep: int) -> None:
        """Drop the tokens held past the first `keep`."""

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """greedy(logits) over the last axis, by this run's fastest exact way (the same ids as sampling.greedy)."""

    def probs_at(self, logits: torch.Tensor, rows: list[int], cols: list[int]) -> list[float]:
        """sampling.probs_at's numbers (p at T = 1 of chosen entries), by this run's fastest way."""

    def verify_note(self, s: SamplingConfig, plain: bool = False) -> str:
        """How this run decides under s, for the page header and recordings (Start.verify); "" for p computed here."""

    def run_stats(self, s: SamplingConfig, plain: bool = False) -> dict:
        """What a Done event's stats add for this run (a served run's requests and their seconds); {} for none."""


@runtime_checkable
class DecidingRun(TargetRun, Protocol):
    """A run whose `decides` is True: it verifies and steps with its own numbers (a served target)."""

    def verify(self, fed: list[int], x: list[int], q: torch.Tensor | None, s: SamplingConfig, gen: torch.Generator):
        """One chain's verify and verdict: (sampling.Verdict, (k + 1, V) logits of what p sent)."""

    def next_token(self, pending: list[int], s: SamplingConfig, gen: torch.Generator) -> tuple[int, float]:
        """One plain step: (token, p of it)."""
