"""One fold over a run's events: what a run counted and took, and every quantity read from those counts.

`Tally.add(event)` folds a Start, Round, Step or Done in; `a + b` pools runs; `Tally.of(events)` folds a stream.
The engine's `Done.stats`, metrics, the page's stats and lanes, the exported page, the pair check, the benchmark,
the sweep and the lessons all read these properties, so the same run shows the same numbers everywhere.

Names as in Leviathan et al. 2023: gamma the guesses of a round, n the accepted count of a round, alpha the
per-token acceptance, c the cost of one draft call relative to one target step. Each is defined once, here:

- A round is one `Round` (one verify call of the target), a plain step one `Step` (one forward call); a target
  call is either. A served target's extra requests (its exact resampling) are the engine's `requests`, not calls.
- drafted: the guesses the target checked, a chain's gamma or a token tree's nodes (`Round.proposed`);
  accepted: the sum of n.
- rejected: the rounds in which the target turned a guess down (n < len(Round.drafted), a tree's walked line).
  It counts whether or not the correction that followed made it into the text: a correction cut off by EOS or
  the token budget was still a guess the target ruled on and refused. (The engine once counted a rejection only
  when its correction was emitted, so its alpha and the page's could differ on one run.)
- judged = accepted + rejected, the guesses the target ruled on (those after a rejection never are), and
  alpha = accepted / judged (theory.alpha), what the speedup formula assumes; acceptance_rate = accepted /
  drafted, which counts the unjudged guesses as failures.
- resampled / bonus / plain: the corrections of each kind that were emitted (the text's own tokens by origin).
- tokens per target call = new tokens / target calls; tokens per second = new tokens / this run's own compute,
  prefill included (`elapsed_s`).
- c = (draft seconds / draft calls of a run) / (seconds per step of a plain run), both as the decode loops pay
  them. Means, not medians: the speedup is a ratio of total times, which means add up to, and a mean pools
  under `+`. c is 0 when no draft model was called (lookup's guesses cost no call), NaN with no plain step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from specviz.events import Done, Round, Start, Step
from specviz.theory import alpha, cost_ratio

_NOT_COUNTS = ("_base", "round_tokens")


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


@dataclass
class Tally:
    """Counts and seconds of one or more runs; derived quantities are properties (see the module docstring)."""

    runs: int = 0  # Start events folded in
    rounds: int = 0  # speculative rounds: one verify call each
    tree_rounds: int = 0  # of those, rounds whose guesses formed a token tree
    steps: int = 0  # plain decoding steps: one forward call each
    drafted: int = 0  # guesses the target checked (a tree's every node)
    accepted: int = 0  # the sum of n
    rejected: int = 0  # rounds that turned a guess down
    resampled: int = 0  # corrections emitted after a rejection
    bonus: int = 0  # corrections emitted after every guess was kept
    plain: int = 0  # corrections emitted in rounds with no guess
    new_tokens: int = 0
    round_tokens: tuple[int, ...] = ()  # how many rounds emitted 0, 1, 2 ... tokens
    draft_calls: int = 0  # forward calls of a draft model (Round.draft_calls)
    prefill_s: float = 0.0
    calibration_s: float = 0.0  # setup before the run, not in elapsed_s: auto's cost measurements, the opening kept
    draft_s: float = 0.0
    verify_s: float = 0.0  # the target's calls: rounds' verify and accept/resample, steps' forward and sampling
    elapsed_s: float = 0.0  # every run's own compute, prefill included
    _base: float = field(default=0.0, repr=False, compare=False)  # elapsed_s when the current run started

    def add(self, ev) -> Tally:
        """Fold one event in (a Start begins another run); returns self."""
        if isinstance(ev, Start):
            self.runs += 1
            self._base = self.elapsed_s
            self.prefill_s += ev.prefill_s
            self.calibration_s += ev.calibration_s
            self.elapsed_s += ev.prefill_s
        elif isinstance(ev, Round):
            self.rounds += 1
            self.tree_rounds += ev.tree is not None
            self.drafted += ev.proposed
            self.accepted += ev.n
            self.rejected += ev.n < len(ev.drafted)
            if len(ev.tokens) == ev.n + 1:  # the correction made it into the text
                setattr(self, ev.kind, getattr(self, ev.kind) + 1)
            self._emitted(len(ev.tokens))
            self.draft_calls += ev.draft_calls
            self.draft_s += ev.draft_s
            self.verify_s += ev.verify_s
            self.elapsed_s = self._base + ev.elapsed_s
        elif isinstance(ev, Step):
            self.steps += 1
            self._emitted(1)
            self.verify_s += ev.forward_s
            self.elapsed_s = self._base + ev.elapsed_s
        elif not isinstance(ev, Done):
            raise TypeError(f"A Tally folds engine events, not {type(ev).__name__}.")
        return self

    def _emitted(self, k: int) -> None:
        self.new_tokens += k
        counts = list(self.round_tokens) + [0] * (k + 1 - len(self.round_tokens))
        counts[k] += 1
        self.round_tokens = tuple(counts)

    @classmethod
    def of(cls, events: Iterable) -> Tally:
        """The Tally of a stream of events (one run, or several one after another)."""
        t = cls()
        for ev in events:
            t.add(ev)
        return t

    def __add__(self, other: Tally) -> Tally:
        if not isinstance(other, Tally):
            return NotImplemented
        out = {}
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "round_tokens":
                a, b = list(a), list(b)
                n = max(len(a), len(b))
                out[f.name] = tuple(x + y for x, y in zip(a + [0] * (n - len(a)), b + [0] * (n - len(b))))
            elif f.name != "_base":
                out[f.name] = a + b
        return Tally(**out, _base=out["elapsed_s"])

    def __radd__(self, other) -> Tally:  # sum(tallies) starts from 0
        return self if other == 0 else NotImplemented

    def counts(self) -> dict:
        """The folded counts and seconds, flat (round_tokens left out); `from_counts` rebuilds the Tally."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _NOT_COUNTS}

    @classmethod
    def from_counts(cls, counts: dict) -> Tally:
        """A Tally from `counts()` (a table's row: numbers of any numeric type; missing ones 0)."""
        kinds = {f.name: type(f.default) for f in dataclasses.fields(cls) if f.name not in _NOT_COUNTS}
        t = cls(**{k: kind(counts[k]) for k, kind in kinds.items() if k in counts})
        t._base = t.elapsed_s
        return t

    # --- what they mean -----------------------------------------------------------------------------

    @property
    def target_calls(self) -> int:
        return self.rounds + self.steps

    @property
    def judged(self) -> int:
        """Guesses the target ruled on: every accepted one and the one turned down in each rejecting round."""
        return self.accepted + self.rejected

    @property
    def alpha(self) -> float:
        """Per-token acceptance: accepted / judged (0 when nothing was judged)."""
        return alpha(self.accepted, self.rejected)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted: the unjudged guesses after a rejection count as failures (0 with no guess)."""
        return _ratio(self.accepted, self.drafted)

    @property
    def tokens_per_call(self) -> float:
        return _ratio(self.new_tokens, self.target_calls)

    @property
    def drafted_per_call(self) -> float:
        return _ratio(self.drafted, self.target_calls)

    @property
    def decode_s(self) -> float:
        """Compute after the prompt: elapsed_s without the prefill."""
        return self.elapsed_s - self.prefill_s

    @property
    def other_s(self) -> float:
        """The loop's own work beyond drafting and the target's calls: rollback, bookkeeping, the detail view."""
        return max(self.decode_s - self.draft_s - self.verify_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def step_s(self) -> float:
        """Mean seconds of one target call in the decode loop (a plain run's: one plain step); NaN with none."""
        return self.decode_s / self.target_calls if self.target_calls else float("nan")

    @property
    def draft_call_s(self) -> float:
        """Mean seconds of drafting per draft call (0 when no draft model was called)."""
        return _ratio(self.draft_s, self.draft_calls)

    def c(self, plain: Tally) -> float:
        """c: one draft call of this run against one step of the plain run `plain`."""
        return cost_ratio(self.draft_s, self.draft_calls, plain.step_s)

    def speedup(self, plain: Tally) -> float:
        """This run's tokens per second over the plain run `plain`'s, each on its own compute clock (0 when the plain
        run made no token)."""
        return self.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s > 0 else 0.0

    def stats(self) -> dict:
        """The numbers of `Done.stats` (flat: a recording keeps them), every one from this Tally."""
        return {
            "new_tokens": self.new_tokens,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "rounds": self.rounds,
            "tree_rounds": self.tree_rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "resampled": self.resampled,
            "bonus": self.bonus,
            "plain": self.plain,
            "acceptance_rate": self.acceptance_rate,
            "alpha": self.alpha,
            "tokens_per_target_call": self.tokens_per_call,
            "prefill_s": self.prefill_s,
            "calibration_s": self.calibration_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "other_s": self.other_s,
            "wall_s": self.elapsed_s,
            "tokens_per_s": self.tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
        }


def with_prefill(speedup: float, plain: Tally, spec: Tally) -> float | None:
    """A decoding speedup (prefills left out, as the pair check predicts it) as a whole run's, the way the race and
    the benchmark time one: a run of the speculative runs' mean length N, plain (a plain run's mean prefill, then N
    steps at the plain runs' decoding seconds per token) over speculative (its runs' mean prefill, then N tokens
    `speedup` times as fast). Given two sets of equally long runs and the decoding speedup they measured, it is
    their tokens-per-second ratio. None without tokens on either side."""
    if plain.new_tokens <= 0 or spec.new_tokens <= 0 or speedup <= 0:
        return None
    n, step = spec.new_tokens / spec.runs, plain.decode_s / plain.new_tokens
    return (plain.prefill_s / plain.runs + n * step) / (spec.prefill_s / spec.runs + n * step / speedup)
