"""How many tokens a round drafts (gamma): constant, heuristic, confidence, or auto.

- `constant`: gamma every round (the papers' setting).
- `heuristic`: transformers' schedule: start at gamma, +2 after a round whose every guess was accepted, -1
  otherwise (never below 1).
- `confidence`: draft up to gamma, but stop as soon as the draft's top probability falls below a threshold
  (transformers' `assistant_confidence_threshold`, llama.cpp's `--draft-p-min`; at temperature 0 the top
  probability is read at temperature 1).
- `auto`: each round, the k <= gamma that maximises expected tokens per second, from running estimates of
  the acceptance at each draft position (per drafter source, and lookup's per length of the matched suffix:
  lookup guesses and model guesses differ, and so do guesses after a 1-token and a 3-token match) and the
  cost of a draft step and of a verify of k + 1 tokens measured on this machine once per loaded model
  (`costs.py`). The costs are not re-read from each round's timings, so the choices depend only on the run's
  own acceptances: a seeded sampled run repeats exactly within a process (a new process measures again).

A policy is told each round's outcome with `update`; it never sees the text.
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import CONFIDENCE_THRESHOLD, GAMMA_MAX
from .theory import expected_tokens_by_position

AUTO_DECAY = 0.95  # older rounds count less: acceptance changes along an answer (a list, then prose)
AUTO_PRIOR = 2.0  # pseudo-rounds of each position's estimate at the source's overall alpha


class GammaPolicy:
    name = "constant"
    threshold = 0.0

    def __init__(self, gamma: int):
        self.gamma = gamma

    def k(self, source: str) -> int:
        """The most tokens `source` may propose this round."""
        return self.gamma

    def update(self, source: str, proposed: int, n: int, draft_s: float, verify_s: float) -> None:
        """A round's outcome: `proposed` tokens from `source`, n accepted, and what drafting and verifying cost."""


class Heuristic(GammaPolicy):
    name = "heuristic"

    def __init__(self, gamma: int):
        super().__init__(gamma)
        self.current = gamma

    def k(self, source: str) -> int:
        return self.current

    def update(self, source: str, proposed: int, n: int, draft_s: float, verify_s: float) -> None:
        if proposed == 0:
            return
        self.current = min(self.current + 2, GAMMA_MAX) if n == proposed else max(self.current - 1, 1)


class Confidence(GammaPolicy):
    name = "confidence"

    def __init__(self, gamma: int, threshold: float = CONFIDENCE_THRESHOLD):
        super().__init__(gamma)
        self.threshold = threshold


class Auto(GammaPolicy):
    """Maximise expected tokens per second: E(k) / (k t_draft + t_verify(k + 1)) over k = 1 .. gamma."""

    name = "auto"

    def __init__(self, gamma: int, verify_s: Sequence[float], draft_step_s: float, paid: str = "model"):
        """verify_s[i]: seconds of one target call over i + 1 tokens (i = 0 .. gamma); draft_step_s: one call of
        the paid source `paid` ("model" or "head")."""
        super().__init__(gamma)
        self.verify_s = list(verify_s[: gamma + 1])
        self.step_s = {paid: draft_step_s}  # a lookup costs nothing worth counting (a dict look-up)
        self.reached: dict[str, list[float]] = {}
        self.kept: dict[str, list[float]] = {}
        self.last: dict[str, int] = {}

    def alphas(self, source: str) -> list[float]:
        """Estimated conditional acceptance at positions 1 .. gamma for `source`."""
        r = self.reached.setdefault(source, [0.0] * self.gamma)
        a = self.kept.setdefault(source, [0.0] * self.gamma)
        overall = (sum(a) + 1.0) / (sum(r) + 2.0)  # a Beta(1, 1) prior on the source's alpha
        return [(a[j] + AUTO_PRIOR * overall) / (r[j] + AUTO_PRIOR) for j in range(self.gamma)]

    def rate(self, source: str, k: int) -> float:
        """Expected tokens per second if `source` proposes k tokens."""
        seconds = k * self.step_s.get(source, 0.0) + self.verify_s[min(k, len(self.verify_s) - 1)]
        return expected_tokens_by_position(self.alphas(source)[:k]) / seconds

    def k(self, source: str) -> int:
        best = max(range(1, self.gamma + 1), key=lambda k: self.rate(source, k))
        self.last[source] = best
        return best

    def best_rate(self, source: str) -> float:
        """Expected tokens per second of `source` at its best k (lookup+model asks which drafter to use)."""
        return max(self.rate(source, k) for k in range(1, self.gamma + 1))

    def update(self, source: str, proposed: int, n: int, draft_s: float, verify_s: float) -> None:
        if proposed == 0:
            return
        self.alphas(source)  # its estimates exist from here on
        r, a = self.reached[source], self.kept[source]
        for j in range(self.gamma):
            r[j] *= AUTO_DECAY
            a[j] *= AUTO_DECAY
        for j in range(min(n + 1, proposed)):
            r[j] += 1.0
            a[j] += j < n


def make_policy(name: str, gamma: int, threshold: float, verify_s: Sequence[float] = (), draft_step_s: float = 0.0,
                paid: str = "model"):  # fmt: skip
    if name == "heuristic":
        return Heuristic(gamma)
    if name == "confidence":
        return Confidence(gamma, threshold)
    if name == "auto":
        return Auto(gamma, verify_s, draft_step_s, paid)
    return GammaPolicy(gamma)
