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

from specviz.config import CONFIDENCE_THRESHOLD, GAMMA_MAX
from specviz.theory import expected_tokens_by_position

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

    def __init__(
        self,
        gamma: int,
        verify_s: Sequence[float],
        draft_step_s: float,
        paid: str = "model",
        next_step_s: float | None = None,
    ):
        """verify_s[i]: seconds of one target call over i + 1 tokens (i = 0 .. gamma); draft_step_s: a round's first
        call of the paid source `paid` ("model" or "head"), next_step_s each further one (default: the same). A
        draft's first step reads its weights back from memory after the verify, the next ones from cache: priced
        alike, a longer chain looked dearer than it is."""
        super().__init__(gamma)
        self.verify_s = list(verify_s[: gamma + 1])
        self.step_s = {paid: draft_step_s}  # a lookup costs nothing worth counting (a dict look-up)
        self.next_s = {paid: draft_step_s if next_step_s is None else next_step_s}
        self.reached: dict[str, list[float]] = {}
        self.kept: dict[str, list[float]] = {}
        self.last: dict[str, int] = {}
        self._rates: dict[str, list[float]] = {}  # source -> rate at k = 1 .. gamma, until its next update

    def alphas(self, source: str) -> list[float]:
        """Estimated conditional acceptance at positions 1 .. gamma for `source`."""
        r = self.reached.setdefault(source, [0.0] * self.gamma)
        a = self.kept.setdefault(source, [0.0] * self.gamma)
        overall = (sum(a) + 1.0) / (sum(r) + 2.0)  # a Beta(1, 1) prior on the source's alpha
        return [(a[j] + AUTO_PRIOR * overall) / (r[j] + AUTO_PRIOR) for j in range(self.gamma)]

    def rate(self, source: str, k: int, alphas: list[float] | None = None) -> float:
        """Expected tokens per second if `source` proposes k tokens (alphas: its `alphas`, where known)."""
        drafting = self.step_s.get(source, 0.0) + (k - 1) * self.next_s.get(source, 0.0) if k else 0.0
        seconds = drafting + self.verify_s[min(k, len(self.verify_s) - 1)]
        return expected_tokens_by_position((alphas or self.alphas(source))[:k]) / seconds

    def rates(self, source: str) -> list[float]:
        """`rate` at k = 1 .. gamma, worked out once between two updates of `source` (a round of lookup+model asks
        for them several times; every ask recomputing every estimate cost about 0.1 ms a round)."""
        known = self._rates.get(source)
        if known is None:
            alphas = self.alphas(source)
            known = self._rates[source] = [self.rate(source, k, alphas) for k in range(1, self.gamma + 1)]
        return known

    def k(self, source: str) -> int:
        rates = self.rates(source)
        best = 1 + max(range(self.gamma), key=rates.__getitem__)  # the smallest k of the best rate
        self.last[source] = best
        return best

    def best_rate(self, source: str) -> float:
        """Expected tokens per second of `source` at its best k (lookup+model asks which drafter to use)."""
        return max(self.rates(source))

    def update(self, source: str, proposed: int, n: int, draft_s: float, verify_s: float) -> None:
        if proposed == 0:
            return
        self._rates.pop(source, None)
        self.alphas(source)  # its estimates exist from here on
        r, a = self.reached[source], self.kept[source]
        for j in range(self.gamma):
            r[j] *= AUTO_DECAY
            a[j] *= AUTO_DECAY
        for j in range(min(n + 1, proposed)):
            r[j] += 1.0
            a[j] += j < n


def chain_outcome(parents: Sequence[int], ranks: Sequence[int], path: Sequence[int]) -> tuple[int, int]:
    """What the draft's chain would have got in a verified tree round: (guesses checked, guesses kept), for the
    gamma policy's estimates of that chain (`update`). The chain is the tree's spine of first choices (rank 0):
    it keeps the path's leading rank-0 nodes, and its next guess is checked where the node it stopped at has a
    child in the tree (that child was the first tried there: turned down, at T = 0 and T > 0 alike). Counting the
    walked line instead (a rank-1 sibling kept counted as the chain's success) made the chain look better than it
    is wherever trees ran, so auto gave trees too few rounds and chains too many guesses."""
    n = 0
    for i in path:
        if ranks[i] != 0:
            break
        n += 1
    at = path[n - 1] if n else -1
    return (n + 1 if at in parents else n), n


def make_policy(
    name: str,
    gamma: int,
    threshold: float,
    verify_s: Sequence[float] = (),
    draft_step_s: float = 0.0,
    paid: str = "model",
    next_step_s: float | None = None,
):
    if name == "heuristic":
        return Heuristic(gamma)
    if name == "confidence":
        return Confidence(gamma, threshold)
    if name == "auto":
        return Auto(gamma, verify_s, draft_step_s, paid, next_step_s)
    return GammaPolicy(gamma)


class TreePolicy:
    """How large a round's token tree grows, and how the draft's confidence is read as a chance of acceptance.

    A tree is grown best-first (drafters.py): the next node is the candidate most likely to end up on the
    accepted path, score = (the parent's score) * (the draft's probability of the candidate, the j-th largest
    at its parent) * cal[j], where cal[j] corrects the draft's confidence by what the target really kept at sibling
    rank j (a running ratio). A node's score is then the chance the walk reaches and keeps it, so a tree of k
    nodes expects 1 + (the sum of their scores) tokens per target call.

    `nodes`: a fixed budget, or None for auto: each round the k <= max_nodes that maximises expected tokens per
    second, E_k / (draft calls for k nodes * t_read + t_verify(k + 1)), from the running means of past rounds'
    score curves, the verify cost of k + 1 positions and the cost of reading one node with the draft (a tree-masked
    call and its distribution, dearer than a chain's greedy step), both measured on this machine
    (costs.calibration, costs.tree_read_calibration). Auto also weighs the tree against the chain (`grows`): a
    round grows a tree only where the best tree is expected to yield more tokens per second than the gamma
    policy's best chain, so on a machine where trees do not pay, auto runs the chain. The size and the shape are
    fixed before the round draws anything, so sampled output stays exact.
    """

    RANKS = 3  # calibration per rank 0, 1 and 2+ (the built-in draft: the target's token is its 1st choice 50%
    # of the time, its 2nd 12%, its 3rd 6% on held-out greedy replies; specviz.training.eval_draft --ranks)
    PRIOR = 1.0  # pseudo-mass of cal = 1: take the draft at its word until the target has said otherwise
    START = 4  # auto's first round, before any curve is known
    EXPLORE_EVERY = 8  # under auto, one round in 8 that would be a chain grows a tree anyway: its curve keeps learning

    def __init__(self, nodes: int | None, max_nodes: int, verify_s: Sequence[float] = (), read_s: float = 0.0):
        """verify_s[i]: seconds of one target call over i + 1 positions; read_s: seconds of one node read by the
        draft (what each draft call of a tree costs)."""
        self.fixed, self.max_nodes = nodes, max_nodes
        self.verify_s = list(verify_s)
        self.read_s = read_s
        self.chains = 0  # rounds in a row auto gave to the chain
        self.kept = [0.0] * self.RANKS  # decayed sums: children of reached nodes the target kept, by rank
        self.said = [0.0] * self.RANKS  # and the draft's probabilities for them
        self.gain = [0.0] * max_nodes  # decayed sums of the k-th node's score over rounds
        self.calls = [0.0] * max_nodes  # and the draft calls needed up to the k-th node
        self.weight = 0.0  # decayed count of rounds in those sums
        self.top = [0.0, 0.0]  # decayed sum of the draft's top probability at reached nodes, and their count
        self.last = 0
        self._expected: list[float] | None = None  # expected()'s curve until the next observe

    @property
    def name(self) -> str:
        return "auto" if self.fixed is None else str(self.fixed)

    def cal(self, rank: int) -> float:
        j = min(rank, self.RANKS - 1)
        return (self.kept[j] + self.PRIOR) / (self.said[j] + self.PRIOR)

    def first(self) -> float:
        """What reading a node promises: the chance its first child is kept, given the node is (the draft's mean
        top probability at the nodes the walk reached, times cal[0])."""
        top = (self.top[0] + 0.5 * self.PRIOR) / (self.top[1] + self.PRIOR)
        return min(top * self.cal(0), 1.0)

    def expected(self) -> list[float]:
        """E_k: expected tokens per target call of the best-first tree of k = 1 .. max_nodes nodes (worked out once
        between two `observe`s: a round asks `rate` of every k, each of which read the whole curve again)."""
        if self._expected is None:
            out, total = [], 1.0
            for g in self.gain:
                total += g / self.weight if self.weight else 0.0
                out.append(total)
            self._expected = out
        return self._expected

    def rate(self, k: int) -> float:
        """Expected tokens per second of a k-node tree (0 until a curve and the costs are known)."""
        if not self.weight or k > len(self.verify_s) - 1:
            return 0.0
        return self.expected()[k - 1] / (self.calls[k - 1] / self.weight * self.read_s + self.verify_s[k])

    def best_rate(self) -> float:
        """Expected tokens per second of the best tree (0 until a curve and the costs are known)."""
        return max(self.rate(k) for k in range(1, self.max_nodes + 1))

    def grown_rate(self) -> float:
        """Expected tokens per second of the trees this policy grows: its fixed budget's, or auto's best (0 until
        a curve and the costs are known)."""
        return self.best_rate() if self.fixed is None else self.rate(self.fixed)

    def grows(self, chain_rate: float | None) -> bool:
        """Whether this round proposes a tree rather than the drafter's chain. A fixed budget always does; auto
        does until it knows a curve, wherever the best tree is expected to beat `chain_rate` (the gamma policy's
        expected tokens per second of its best chain; None: that policy makes no estimate, so trees are sized but
        never weighed against it), and once in EXPLORE_EVERY rounds it would give to the chain."""
        if self.fixed is not None or chain_rate is None or not self.weight or self.best_rate() > chain_rate:
            self.chains = 0
            return True
        self.chains += 1
        if self.chains % self.EXPLORE_EVERY == 0:
            return True
        return False

    def nodes(self) -> int:
        """The node budget of this round."""
        if self.fixed is not None:
            self.last = self.fixed
        elif not self.weight:
            self.last = min(self.START, self.max_nodes)
        else:
            self.last = max(range(1, self.max_nodes + 1), key=self.rate)
        return self.last

    def observe(self, scores: Sequence[float], calls: Sequence[int]) -> None:
        """A grown tree's curve: the score of its k-th node and the draft calls spent up to it, in the order it grew
        (as far as the drafter could see: past the budget, candidates it already had the draft's probabilities for)."""
        if not scores:
            return
        self._expected = None
        for k in range(self.max_nodes):
            self.gain[k] *= AUTO_DECAY
            self.calls[k] *= AUTO_DECAY
            self.gain[k] += scores[k] if k < len(scores) else 0.0
            self.calls[k] += calls[min(k, len(calls) - 1)]
        self.weight = self.weight * AUTO_DECAY + 1.0

    def update(
        self,
        said: Sequence[float],
        ranks: Sequence[int],
        parents: Sequence[int],
        path: Sequence[int],
        kept: Sequence[bool],
    ) -> None:
        """A verified tree: the draft's probability `said` for each node and whether the target kept it. Only the
        children of nodes the walk reached count (the others were never in play). A tree without the draft's
        probabilities (prompt lookup's) teaches nothing here."""
        if not said:
            return
        reached = {-1, *path}
        for j in range(self.RANKS):
            self.kept[j] *= AUTO_DECAY
            self.said[j] *= AUTO_DECAY
        self.top = [self.top[0] * AUTO_DECAY, self.top[1] * AUTO_DECAY]
        for i, par in enumerate(parents):
            if par in reached:
                j = min(ranks[i], self.RANKS - 1)
                self.kept[j] += float(kept[i])
                self.said[j] += said[i]
                if j == 0:
                    self.top = [self.top[0] + said[i], self.top[1] + 1.0]
