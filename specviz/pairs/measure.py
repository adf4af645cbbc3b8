"""The pair check's measurements: greedy acceptance runs per kind of prompt, with a plain run beside each, and
token trees of a few node budgets on the same prompts.

alpha (written `a` here, as in the formula) counts only the positions the target judged; every count is
tally.Tally's, so the check, the benchmark and the sweep read the same numbers. p is the target, q the draft.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import zip_longest

from specviz.config import AUTO_GAMMA_MAX, SpecvizError
from specviz.engine.tally import Tally
from specviz.models.loaded import LoadedModel
from specviz.request import RunRequest
from specviz.theory import (
    alphas_at,
    expected_tokens_by_position,
    kept_shares,
    position_counts,
    speedup_per_round,
    wilson_interval,
)

CHECK_GAMMA = 4  # the block size of the acceptance run; a is per position, so it barely depends on this
PLAIN_TOKENS = 16  # a plain run this long beside each kind's acceptance runs: c's plain step is their mean. A run's
# first step costs more, so short runs read a step slower than long ones and the prediction as much too high; at
# 16 tokens that first step weighs little
TREE_BUDGETS = (4, 7)  # token trees the check measures: a verify of 8 positions at most, the CPU few-token
# kernel's range (kernels.py; past it a verify falls back to PyTorch's products and costs about twice)


@dataclass(frozen=True)
class KindAcceptance:
    kind: str  # chat, story, code, summarise, or "given" for the caller's own prompts
    a: float
    low: float  # 95% interval (Wilson) from the number of judged guesses
    high: float
    accepted: int
    tested: int


@dataclass(frozen=True)
class Acceptance:
    """What the greedy acceptance runs counted (tally.Tally's definitions); `tally` is their pooled Tally."""

    a: float  # alpha: accepted / tested positions, the per-token chance under the i.i.d. model (its MLE)
    accepted: int
    tested: int  # positions the target judged: every accepted one plus the first rejected of each round
    drafted: int
    rounds: int
    new_tokens: int
    low: float = 0.0  # 95% interval (Wilson) of a from the number of judged guesses
    high: float = 1.0
    by_kind: tuple[KindAcceptance, ...] = ()
    draft_s: float = 0.0  # seconds the drafter took over all rounds (its catching up included)
    decode_s: float = 0.0  # seconds of the decode loops, prefills excluded
    block_sizes: tuple[int, ...] = ()  # rounds that proposed k = 0, 1, ... tokens
    translate_s: float = 0.0  # a draft with another tokenizer: of draft_s, the seconds spent re-tokenising
    draft_calls: int = 0  # forward calls of the draft model
    # per draft position 1 .. CHECK_GAMMA (theory.position_counts): rounds that kept it, of those that reached it
    position_kept: tuple[int, ...] = ()
    position_reached: tuple[int, ...] = ()
    tally: Tally = field(default_factory=Tally, repr=False, compare=False)

    @classmethod
    def of(
        cls, t: Tally, block_sizes: tuple[int, ...], translate_s: float, positions=((), ()), by_kind=()
    ) -> Acceptance:
        """positions: (kept, reached) per draft position (theory.position_counts)."""
        low, high = wilson_interval(t.accepted, t.judged)
        return cls(
            t.alpha,
            t.accepted,
            t.judged,
            t.drafted,
            t.rounds,
            t.new_tokens,
            low,
            high,
            tuple(by_kind),
            t.draft_s,
            t.decode_s,
            tuple(block_sizes),
            translate_s,
            t.draft_calls,
            *map(tuple, positions),
            t,
        )

    def alphas(self, gamma: int) -> list[float]:
        """Conditional acceptance at draft positions 1 .. gamma: as measured where the runs reached (gamma
        CHECK_GAMMA), past that the measured rate of a guess whose predecessor was kept (theory.alphas_at)."""
        return alphas_at(self.position_kept, self.position_reached, gamma, self.a)

    def kept_shares(self, gamma: int) -> list[float]:
        """The predicted share of rounds of gamma guesses that keep the guess at each position: what vLLM's
        per-position acceptance counters read (accepted at position i / drafts)."""
        return kept_shares(self.alphas(gamma))

    def tokens_per_round(self, gamma: int) -> float:
        """The predicted tokens a round of gamma guesses yields: 1 + the kept shares (vLLM's mean acceptance
        length)."""
        return expected_tokens_by_position(self.alphas(gamma))


@dataclass(frozen=True)
class RoundCosts:
    """The acceptance runs' rounds and the plain runs' steps in seconds (means over their runs, tally.Tally's), split
    so that a round of another gamma is priced from the one measured: the check's prediction (`round_at`).

    A round as the loop paid it is guesses * guess_s + verify_s + rest_s. Drafting grows with gamma one draft call
    a guess; re-tokenising (a draft with another tokenizer: the reply re-encoded, the guess decoded) and the loop's
    own work are paid once a round whatever gamma is (`rest_s`); the verify call grows as the isolated calls of
    costs.forward_times grow with the block, scaled to what the loop paid for its verify calls. At the measured
    block sizes `round_at` gives the measured round back, so the prediction there is the measurement."""

    round_s: float  # one round, all of it: drafting, re-tokenising, the verify call, the loop's own work
    guesses: float  # guesses the target checked per round (fewer than CHECK_GAMMA where a run or a draft ended)
    guess_s: float  # drafting one guess: the draft model's calls (its catching up included), re-tokenising not
    verify_s: float  # the verify call and its accept/reject, a round
    isolated_s: float  # the same verify calls timed alone (forward_times over the measured block sizes), a round
    plain_s: float  # one plain decoding step: its forward and the loop's own work

    @property
    def rest_s(self) -> float:
        """A round's work paid once whatever gamma is: re-tokenising, the loop's own (accept, roll back, events)."""
        return self.round_s - self.guesses * self.guess_s - self.verify_s

    @classmethod
    def of(cls, acc: Acceptance, plain: Tally, times: list[float]) -> RoundCosts:
        """From the acceptance runs, the plain runs beside them, and times[k]: one target call over k + 1 tokens
        (forward_times)."""
        t, rounds = acc.tally, max(acc.rounds, 1)
        isolated = sum(n * times[min(k, len(times) - 1)] for k, n in enumerate(acc.block_sizes)) / rounds
        return cls(
            round_s=t.step_s,  # a speculative run's target calls are its rounds
            guesses=acc.drafted / rounds,
            guess_s=(acc.draft_s - acc.translate_s) / acc.drafted if acc.drafted else t.draft_call_s,
            verify_s=t.verify_s / rounds,
            isolated_s=isolated,
            plain_s=plain.step_s,
        )

    def verify_at(self, call_s: float) -> float:
        """Seconds the loop pays for a verify call that takes call_s alone (forward_times)."""
        return self.verify_s * call_s / self.isolated_s if self.isolated_s > 0 else call_s

    def round_at(self, gamma: int, call_s: float) -> float:
        """Seconds of a round of gamma guesses whose verify call takes call_s alone."""
        return gamma * self.guess_s + self.verify_at(call_s) + self.rest_s


def _within(events, deadline: float | None):
    """Pass events through; past `deadline` (a time.monotonic() value) one SpecvizError (checked every event)."""
    for ev in events:
        if deadline is not None and time.monotonic() > deadline:
            raise SpecvizError("The pair check ran past this server's time limit and was stopped; try fewer tokens.")
        yield ev


def _acceptance_runs(
    target: LoadedModel,
    draft: LoadedModel,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    deadline: float | None,
    drafter: str,
) -> tuple[Tally, list[int], float, tuple[list[int], list[int]]]:
    """Greedy speculative decoding of each prompt at CHECK_GAMMA: (their Tally, rounds by block size, seconds spent
    re-tokenising, (kept, reached) per draft position)."""
    from specviz.drafters.model import make_drafter
    from specviz.engine.loop import speculative_decode
    from specviz.engine.setup import lookup_options
    from specviz.events import Round
    from specviz.models.translate import needs_translation

    cfg = RunRequest(
        drafter=drafter, gamma=CHECK_GAMMA, tree="off", max_new_tokens=max_new_tokens, temperature=0.0
    ).spec
    t, sizes, translate_s, rounds = Tally(), [0] * (CHECK_GAMMA + 1), 0.0, []
    translated = drafter != "lookup" and needs_translation(target, draft)
    for ids in prompt_ids:
        made = None
        if translated:  # built here, so its re-tokenising time can be read after the run
            made = make_drafter(drafter, draft, target.vocab_size, target=target, **lookup_options(cfg, target))
        for ev in _within(speculative_decode(target, draft, ids, cfg, drafter=made), deadline):
            t.add(ev)
            if isinstance(ev, Round):
                sizes += [0] * (len(ev.drafted) + 1 - len(sizes))
                sizes[len(ev.drafted)] += 1
                rounds.append((len(ev.drafted), ev.n))
        translate_s += getattr(getattr(made, "model", made), "translate_s", 0.0)
    return t, sizes, translate_s, position_counts(rounds)


def measure_acceptance(
    target: LoadedModel,
    draft: LoadedModel,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    deadline: float | None = None,
    drafter: str = "model",
) -> Acceptance:
    """Greedy speculative decoding of each prompt (gamma 4); a counts only positions the target judged.

    deadline: a time.monotonic() value; past it the run stops with a SpecvizError (checked every round).

    accepted / drafted (the engine's acceptance_rate) would count proposals after a rejection as failures
    although nobody looked at them, which understates a: at a = 0.8 and gamma 4 it reads 0.59.
    """
    return Acceptance.of(*_acceptance_runs(target, draft, prompt_ids, max_new_tokens, deadline, drafter))


def acceptance_by_kind(
    target: LoadedModel,
    draft: LoadedModel,
    prompt_ids: dict[str, list[list[int]]],
    max_new_tokens: int,
    deadline: float | None = None,
    drafter: str = "model",
) -> tuple[Acceptance, Tally]:
    """measure_acceptance per kind of prompt, and over all of them (the overall a weighs every judged guess); and
    beside each kind's runs a short plain run on its first prompt, so a busy machine slows both alike: their
    pooled Tally is the plain step that c is measured against. Returns (the acceptance, the plain runs' Tally)."""
    from specviz.engine.loop import autoregressive_decode

    parts, plain = {}, Tally()
    plain_cfg = RunRequest(drafter="model", gamma=3, tree="off", max_new_tokens=PLAIN_TOKENS).spec
    # A plain run not counted, as the bench warms up: a process's first plain run read a step 15-35% slow (the tiny
    # cross-tokenizer pair), and the prediction as much too high
    Tally.of(_within(autoregressive_decode(target, next(iter(prompt_ids.values()))[0], plain_cfg), deadline))
    for k, ids in prompt_ids.items():
        plain += Tally.of(_within(autoregressive_decode(target, ids[0], plain_cfg), deadline))
        parts[k] = measure_acceptance(target, draft, ids, max_new_tokens, deadline, drafter)
    kinds = tuple(KindAcceptance(k, x.a, x.low, x.high, x.accepted, x.tested) for k, x in parts.items())
    sizes = tuple(map(sum, zip(*(x.block_sizes for x in parts.values()))))
    pooled = sum((x.tally for x in parts.values()), Tally())
    kept = map(sum, zip_longest(*(x.position_kept for x in parts.values()), fillvalue=0))
    reached = map(sum, zip_longest(*(x.position_reached for x in parts.values()), fillvalue=0))
    translate_s = sum(x.translate_s for x in parts.values())
    return Acceptance.of(pooled, sizes, translate_s, (kept, reached), kinds), plain


@dataclass(frozen=True)
class TreeTrial:
    """Greedy decoding with token trees of one node budget on the check's prompts, and what it is expected to
    gain: its measured tokens, draft time, verify calls and loop work per round, in target forward steps."""

    budget: int
    tokens_per_call: float
    nodes_per_call: float
    draft_cost: float  # drafting one tree (its draft calls), in target steps
    verify_cost: float  # one verify call over its nodes + 1 positions, in target steps (forward_times)
    overhead: float  # the loop's own work per round (the walk, the cache's gather)
    speedup: float  # expected over plain decoding (theory.speedup_per_round)


def measure_trees(
    target: LoadedModel,
    draft: LoadedModel,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    times: list[float],
    plain: float,
    deadline: float | None = None,
    drafter: str = "model",
) -> tuple[TreeTrial, ...]:
    """One TreeTrial per TREE_BUDGETS entry (depth at most AUTO_GAMMA_MAX); times[k]: a target call over k + 1
    tokens (forward_times), plain: one plain decoding step, in target steps."""
    from specviz.engine.loop import speculative_decode
    from specviz.events import Round

    step, out = times[0], []
    for budget in TREE_BUDGETS:
        cfg = RunRequest(drafter=drafter, gamma=AUTO_GAMMA_MAX, tree=budget, max_new_tokens=max_new_tokens).spec
        t, verify_s = Tally(), 0.0
        for ids in prompt_ids:
            for ev in _within(speculative_decode(target, draft, ids, cfg), deadline):
                t.add(ev)
                if isinstance(ev, Round):  # a verify over its nodes + 1 positions, as forward_times measured it
                    verify_s += times[min(ev.proposed, len(times) - 1)]
        r = max(t.rounds, 1)
        d, v = t.draft_s / r / step, verify_s / r / step
        o = max(0.0, t.decode_s - t.draft_s - verify_s) / r / step
        tokens = t.tokens_per_call
        out.append(TreeTrial(budget, tokens, t.drafted_per_call, d, v, o, speedup_per_round(tokens, d, v, o, plain)))
    return tuple(out)
