"""The accounting, defined once: alpha, c, acceptance per draft position, and the expected speedup.

Names as in Leviathan et al. 2023: alpha is the chance a drafted token is accepted (per token: of the
proposals the target ruled on, the share it kept; proposals after a rejection are never ruled on), c the
cost of one draft step relative to one target step, gamma the proposals of a round.

- `expected_tokens(alpha, gamma)`: tokens per round with one alpha at every position, 1 + alpha + ... + alpha^gamma.
- `expected_tokens_by_position(alphas)`: the same from conditional acceptance per position alpha_1, alpha_2, ...:
  1 + sum over i of prod over j <= i of alpha_j. Where acceptance rises or falls along a round, the equal-alpha
  formula is wrong by the difference.
- `position_counts`, `alphas_at`, `kept_shares`: acceptance per position counted, extended past the positions a run
  measured, and read as the share of rounds that keep each position (what an engine's per-position counters show).
- `expected_speedup(alpha, gamma, c)`: Theorem 3.8, (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)); it assumes
  a verify of gamma + 1 tokens costs one target step. `expected_speedup_measured` uses measured costs: the
  verify call, the decode loop's own work per round, and a plain decoding step's.
Every page, the sweep, the pair check and the benchmark read these, through tally.Tally where a run's events are
counted; nothing else computes them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence

from specviz.config import GAMMA_MAX, SpecvizError


def alpha(accepted: int, rejected: int) -> float:
    """Per-token acceptance: accepted / (accepted + rejected); 0 when nothing was ruled on."""
    judged = accepted + rejected
    return accepted / judged if judged else 0.0


def cost_ratio(draft_s: float, draft_calls: int, target_step_s: float) -> float:
    """c: seconds of one draft call over seconds of one target step; 0 when no draft call was made (free
    guesses), NaN when the step is unknown. Which seconds: tally.Tally.c."""
    if not target_step_s > 0:
        return float("nan")
    return draft_s / draft_calls / target_step_s if draft_calls > 0 else 0.0


def position_counts(rounds: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(kept, reached) per draft position k = 1, 2, ...: the rounds that reached position k (proposed at least k
    tokens and accepted the k - 1 before it), and of those the ones that accepted it.

    rounds: (proposed, accepted) per round. Positions no round reached are left out (the lists end there).
    """
    reached: list[int] = []
    kept: list[int] = []
    for k, n in rounds:
        for j in range(min(n + 1, k)):  # positions 0 .. n were ruled on (n is the rejected one, if any)
            if j == len(reached):
                reached.append(0)
                kept.append(0)
            reached[j] += 1
            kept[j] += j < n
    return kept, reached


def position_alphas(rounds: Iterable[tuple[int, int]]) -> list[float]:
    """Conditional acceptance alpha_k per draft position k = 1, 2, ...: of the rounds that reached position k, the
    share that accepted it (position_counts)."""
    kept, reached = position_counts(rounds)
    return [a / r for a, r in zip(kept, reached)]


def alphas_at(kept: Sequence[int], reached: Sequence[int], gamma: int, a: float) -> list[float]:
    """Conditional acceptance at positions 1 .. gamma from position_counts measured over fewer positions: each
    measured position its own; past them the pooled rate of positions 2 and on (a guess given the one before was
    kept), else `a`. The first guess of a round is kept less often than a later one whose predecessor was, so one
    alpha for every position mispredicts each position although the tokens per round come out close."""
    measured = [k / r for k, r in zip(kept, reached)][:gamma]  # every listed position was reached (r > 0)
    later_r = sum(reached[1:])
    later = sum(kept[1:]) / later_r if later_r else a
    return measured + [later] * (gamma - len(measured))


def kept_shares(alphas: Sequence[float]) -> list[float]:
    """Per position, the share of rounds whose guess there is kept (and every one before it): the running product
    of the conditional alphas. What vLLM logs as its per-position acceptance rate (accepted at i / drafts)."""
    out, reach = [], 1.0
    for x in alphas:
        reach *= x
        out.append(reach)
    return out


def accepted_histogram(rounds: Iterable[tuple[int, int]]) -> list[int]:
    """How many rounds accepted n = 0, 1, ... proposals (rounds that proposed nothing are left out)."""
    counts: list[int] = []
    for k, n in rounds:
        if k == 0:
            continue
        counts.extend([0] * (n + 1 - len(counts)))
        counts[n] += 1
    return counts


def _gamma(gamma) -> int:
    try:
        g = operator.index(gamma)  # int, numpy integers; not 2.5
    except TypeError:
        g = 0
    if isinstance(gamma, bool) or g < 1:
        raise SpecvizError(f"gamma must be a whole number of at least 1, not {gamma!r}.")
    return g


def _check(a: float, c: float) -> tuple[float, float]:
    try:
        a, c = float(a), float(c)
    except (TypeError, ValueError):
        raise SpecvizError(f"alpha and c must be numbers, not {a!r} and {c!r}.") from None
    if not 0.0 <= a <= 1.0:
        raise SpecvizError(f"The acceptance rate alpha must be between 0 and 1, not {a}.")
    if not (math.isfinite(c) and c >= 0.0):
        raise SpecvizError(f"The cost ratio c must be a finite number of at least 0, not {c}.")
    return a, c


def expected_tokens(a: float, gamma: int) -> float:
    """Expected tokens per round, 1 + a + ... + a^gamma (a = 1 gives gamma + 1, a = 0 gives 1)."""
    return sum(a**i for i in range(_gamma(gamma) + 1))


def expected_tokens_by_position(alphas: Sequence[float]) -> float:
    """Expected tokens per round from conditional acceptance per position: 1 + sum_i prod_{j<=i} alpha_j."""
    return 1.0 + sum(kept_shares(alphas))


def expected_speedup(a: float, gamma: int, c: float) -> float:
    """Expected walltime speedup over plain decoding: (1 - a^(gamma+1)) / ((1 - a)(gamma c + 1)).

    It assumes the target verifies gamma + 1 tokens as fast as it decodes one (true while memory-bound).
    """
    a, c = _check(a, c)
    return expected_tokens(a, gamma) / (_gamma(gamma) * c + 1.0)


def expected_speedup_measured(
    alphas: Sequence[float], c: float, verify_cost: float, overhead: float = 0.0, plain_cost: float = 1.0
) -> float:
    """Speedup with measured costs, all in target forward steps (one call over one token = 1):

        tokens per round * plain_cost / (gamma c + v + overhead)

    c: drafting one proposal; v: one verify call over gamma + 1 tokens; overhead: the decode loop's own work per
    round (accept/reject, roll back, bookkeeping); plain_cost: one plain decoding step, its forward and its own
    work. v = 1, overhead 0 and plain_cost 1 give `expected_speedup` when every alpha is equal."""
    return speedup_per_round(expected_tokens_by_position(alphas), len(alphas) * c, verify_cost, overhead, plain_cost)


def speedup_per_round(
    tokens: float, draft_cost: float, verify_cost: float, overhead: float = 0.0, plain_cost: float = 1.0
) -> float:
    """Speedup from what one round yields and costs, in target forward steps: tokens * plain_cost / (draft_cost +
    verify_cost + overhead). A chain's draft cost is gamma c; a token tree's is its draft calls', and its verify
    is one call over its nodes + 1 positions."""
    denom = draft_cost + verify_cost + overhead
    if denom <= 0:
        return float("nan")
    return tokens * plain_cost / denom


def speedup_table(a: float, c: float, gammas: Iterable[int] = range(1, GAMMA_MAX + 1)) -> tuple[float, ...]:
    """expected_speedup for each gamma (1..16 by default)."""
    return tuple(expected_speedup(a, g, c) for g in gammas)


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """A 95% interval for a proportion (Wilson score), e.g. alpha from `trials` judged guesses."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    d = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / d
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / d
    return max(0.0, centre - half), min(1.0, centre + half)
