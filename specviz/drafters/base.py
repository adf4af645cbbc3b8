"""The seam between the engine and every drafter: what a round asks (`DraftContext`), what a drafter hands back
(`Proposal`: a chain or a token tree, with the distribution q of each token), the `Drafter` interface, and the
reasons a proposal stopped short (STOP_*, shown in the race's gamma timeline). The drafters themselves are in
drafters.py (the model drafter, and the public face of all of them), drafters_lookup.py, drafters_head.py and
drafters_translating.py.

Names as in the papers: p the target, q the draft, gamma (here k) the proposals of one round, n accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specviz.config import SamplingConfig
from specviz.drafters.policies import GammaPolicy, TreePolicy
from specviz.sampling import greedy, sample, to_probs

# Why a round proposed fewer tokens than it could (shown in the race's gamma timeline)
STOP_GAMMA = "gamma"  # it proposed as many as the policy allowed
STOP_BUDGET = "budget"  # the answer's token budget left no room for more
STOP_CONFIDENCE = "confidence"  # the draft's top probability fell below the threshold
STOP_NO_MATCH = "no match"  # lookup found no earlier occurrence of the text's last tokens
STOP_MATCH_END = "match end"  # lookup's continuation ran out before k tokens
STOP_UNTRANSLATED = "no translation"  # a draft with another tokenizer guessed text the target's tokens cannot write
STOP_END = "end of turn"  # a draft with another tokenizer ended its turn (or wrote a token only it has)
STOP_TREE = "tree"  # a token tree: as many nodes as its budget allowed, or as the draft had candidates


@dataclass
class DraftContext:
    """What a drafter needs from the engine for one round."""

    sampling: SamplingConfig
    generator: torch.Generator
    V: int  # the target's vocabulary size: q rows are V wide
    device: torch.device  # the target's device: proposals and q rows are returned there
    policy: GammaPolicy  # how many tokens a source may propose this round
    budget: int  # tokens the answer may still add: proposals past it could never be emitted
    need_q: bool = True  # False: greedy verification with no detail view, so q rows are never built
    tree: TreePolicy | None = None  # set: drafters that can branch propose token trees of this policy's size
    argmax: Callable[[torch.Tensor], torch.Tensor] = greedy  # greedy's ids, the run's fast way (TargetRun.argmax)

    @property
    def threshold(self) -> float:
        """The confidence policy's threshold on the draft's top probability (0: none)."""
        return self.policy.threshold

    def prefers(self, a: str, b: str) -> bool:
        """Whether the policy expects at least as many tokens per second from source a as from b (True when it
        has no estimates: then the cheaper drafter, a, goes first). b is the model drafter (lookup+model): under
        tree=auto it grows a tree wherever that is expected to beat its chain (b's best is the better of the two),
        with a fixed budget always (b's is the tree's, where its costs are known)."""
        rate = getattr(self.policy, "best_rate", None)
        if rate is None:
            return True
        other, tree = rate(b), self.tree
        if tree is not None and tree.weight:
            grown = tree.grown_rate()
            other = max(other, grown) if tree.fixed is None else grown or other
        return rate(a) >= other

    def grows_tree(self, source: str) -> bool:
        """Whether `source` proposes a token tree this round: there is a tree policy, and it judges a tree worth
        more than the gamma policy's best chain for `source` (TreePolicy.grows)."""
        if self.tree is None:
            return False
        rate = getattr(self.policy, "best_rate", None)
        return self.tree.grows(rate(source) if rate is not None else None)

    def k_for(self, source: str) -> tuple[int, str]:
        """The most tokens `source` may propose now, and why that many (the policy, or the budget)."""
        k = self.policy.k(source)
        return (k, STOP_GAMMA) if k <= self.budget else (self.budget, STOP_BUDGET)


@dataclass(frozen=True)
class Proposal:
    tokens: torch.Tensor  # (k,) long target ids on the target's device; k may be 0
    q: torch.Tensor | None  # (k, V) float32 distributions they were drawn from, or None when not needed
    sources: tuple[str, ...]  # which drafter proposed each token
    planned: int  # the most tokens the policy allowed this round
    stop: str  # why the proposal ended where it did (STOP_*)
    q_logits: tuple[torch.Tensor, ...] = field(default=())  # the model's raw logits rows (detail view)
    estimate: str = ""  # the policy's estimate this round counts toward, when not its source's (lookup: by match)
    origins: tuple[str, ...] = field(default=())  # a translated guess: the draft's own tokens each token came from
    # A tree (empty for a chain): node i continues node parents[i] (-1: the text's last token), parents before
    # children, siblings distinct; q[i] is the distribution node i was drawn from with its earlier siblings'
    # tokens removed (siblings sampled without replacement share their parent's row; a deterministic guess
    # is a one-hot row). ranks: the node's place among its siblings; said: the draft's probability of it.
    parents: tuple[int, ...] = field(default=())
    ranks: tuple[int, ...] = field(default=())
    said: tuple[float, ...] = field(default=())

    @property
    def is_tree(self) -> bool:
        return bool(self.parents)

    @property
    def key(self) -> str:
        """The name under which the gamma policy learns from this round ("" for an empty proposal)."""
        return self.estimate or (self.sources[0] if self.sources else "")


def empty_proposal(ctx: DraftContext, planned: int, stop: str) -> Proposal:
    """No guesses this round: the round is one plain target step."""
    return Proposal(torch.empty(0, dtype=torch.long, device=ctx.device), None, (), planned, stop)


def draw(
    logits: torch.Tensor, ctx: DraftContext, ids: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The next guess (1,) from a draft's (V,) logits row and, at T > 0, the (V,) distribution q it was drawn from;
    (None, None) when the draft's top probability is under the confidence threshold (read at T = 1 when decoding
    greedily). ids: the ascending target ids the draft can propose (LoadedModel.proposable; every other logit is
    -inf): the probabilities and the draw then run over those alone, the same law in a sixth of the work (the
    built-in draft's 8,000 of 49,152)."""
    s = ctx.sampling
    rows = logits if ids is None else logits[ids]
    probs = to_probs(rows, s if not s.greedy else SamplingConfig(1.0)) if ctx.threshold > 0 or not s.greedy else None
    if ctx.threshold > 0 and float(probs.max()) < ctx.threshold:
        return None, None
    if s.greedy:
        return ctx.argmax(logits).view(1), None
    i = sample(probs, ctx.generator)
    token = torch.tensor([i], device=logits.device) if ids is None else ids[i].view(1)
    return token, widen(probs, ids, logits.shape[-1])


def widen(probs: torch.Tensor, ids: torch.Tensor | None, V: int) -> torch.Tensor:
    """(..., n) probabilities over `ids` (as `draw` computes them) -> (..., V), 0 on every other id; ids None: as
    it is."""
    if ids is None:
        return probs
    return probs.new_zeros(*probs.shape[:-1], V).scatter_(-1, ids.expand_as(probs), probs)


def draw_guess(logits: torch.Tensor, ctx: DraftContext) -> torch.Tensor | None:
    """The next guess (1,) from a draft's (V,) logits row, or None under the confidence threshold (`draw`)."""
    return draw(logits, ctx)[0]


class Drafter:
    """The seam. `begin` once per run, then `propose` / `update` once per round."""

    name = "drafter"
    wants_hidden = False  # True: `begin` and `update` receive the target's last hidden states
    chains_only = False  # True: it guesses a line at a time and cannot grow token trees (a translated draft)

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        """The prompt, before the first round (a model drafter encodes it here).

        hidden (P - 1, H): the target's last hidden states at every prompt position but the last (only if
        wants_hidden; the last one comes with the first verify)."""

    def propose(self, seq: list[int], ctx: DraftContext) -> Proposal:
        raise NotImplementedError

    def update(self, n: int, correction: int, hidden: torch.Tensor | None = None) -> None:
        """After a verify: n of the proposals were accepted and the target added `correction`.

        hidden (n + 1, H): the target's last hidden states at the positions just confirmed (only if wants_hidden).
        """

    @property
    def calls(self) -> int:
        """Forward calls of a draft model so far (0 for free drafters)."""
        return 0
