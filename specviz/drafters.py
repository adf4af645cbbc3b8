"""Where guesses come from: one seam, several siblings (in the spirit of transformers' `CandidateGenerator`).

A drafter proposes up to k tokens for the current text together with the distribution q each was drawn
from, and is told after each verify how many were accepted (n) and which token the target added.

- `ModelDrafter` ("model"): a small draft model with its own KV cache, rolled back to what the text kept.
- `LookupDrafter` ("lookup"): prompt lookup. The last n tokens (n = max_matching_ngram_size down to 1) are
  looked up in the prompt plus the output so far; the tokens that followed their most recent earlier
  occurrence are proposed. It is deterministic, so q is a point mass: token x is accepted with probability
  min(1, p(x) / 1) = p(x), and a rejection resamples from norm(max(0, p - onehot(x))), which is p with x
  removed and renormalised. That is exact, with no change to the verification rule.
- `HeadDrafter` ("head"): a feature-level head (EAGLE, head.py) that guesses from the target's own last
  hidden states; it asks the engine for them (`wants_hidden`).
- `LookupModelDrafter` ("lookup+model", "lookup+head"): lookup where the text has a match, the model (or
  the head) otherwise.
- `TranslatingDrafter` (the "model" drafter for a draft with another tokenizer): the draft reads and writes
  text, translated to and from the target's tokens (translate.py).

With a tree policy in the context (`SpecConfig.tree`), the model and lookup drafters may propose a token tree
instead of a chain (`Proposal.parents`): the model grows one best-first, reading the nodes it expands in cached,
tree-masked calls; lookup proposes the trie of several earlier continuations. A tree that never branched is
returned as the chain it is.

How many tokens a drafter may propose in a round is the gamma policy's call (`policies.py`); a drafter asks
it per source (`ctx.k_for(source)`), so "auto" can keep separate estimates for free and paid guesses.
A proposal may be empty: the round is then one plain target step.

Names as in the papers: p the target, q the draft, gamma (here k) the proposals of one round, n accepted.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

import torch

from .config import DRAFTERS, SamplingConfig, SpecvizError
from .models import CachedModel, LoadedModel, scatter_rows
from .policies import GammaPolicy, TreePolicy
from .sampling import greedy, to_probs

PROMPT_LOOKUP_NUM_TOKENS = 10  # transformers' name and default: the most tokens one match may propose
MAX_MATCHING_NGRAM_SIZE = 3  # the longest suffix looked up first (transformers' default is 2; the issue asks 3)

# Why a round proposed fewer tokens than it could (shown in the race's gamma timeline)
STOP_GAMMA = "gamma"  # it proposed as many as the policy allowed
STOP_BUDGET = "budget"  # the answer's token budget left no room for more
STOP_CONFIDENCE = "confidence"  # the draft's top probability fell below the threshold
STOP_NO_MATCH = "no match"  # lookup found no earlier occurrence of the text's last tokens
STOP_MATCH_END = "match end"  # lookup's continuation ran out before k tokens
STOP_UNTRANSLATED = "no translation"  # a draft with another tokenizer guessed text the target's tokens cannot write
STOP_END = "end of turn"  # a draft with another tokenizer ended its turn (or wrote a token only it has)
STOP_TREE = "tree"  # a token tree: as many nodes as its budget allowed, or as the draft had candidates
LOOKUP_BRANCHES = 4  # a lookup tree follows at most this many earlier occurrences of the text's last tokens
TREE_CHILDREN = 4  # the most children a tree node gets (its draft's top 4: 2nd-4th are right 22% of the time)


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

    @property
    def threshold(self) -> float:
        """The confidence policy's threshold on the draft's top probability (0: none)."""
        return self.policy.threshold

    def prefers(self, a: str, b: str) -> bool:
        """Whether the policy expects at least as many tokens per second from source a as from b (True when it
        has no estimates: then the cheaper drafter, a, goes first)."""
        rate = getattr(self.policy, "best_rate", None)
        return rate is None or rate(a) >= rate(b)

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


def _empty(ctx: DraftContext, planned: int, stop: str) -> Proposal:
    return Proposal(torch.empty(0, dtype=torch.long, device=ctx.device), None, (), planned, stop)


def _draw(logits: torch.Tensor, ctx: DraftContext) -> torch.Tensor | None:
    """The next guess (1,) from a draft's (V,) logits row, or None when the draft's top probability is under the
    confidence threshold (read at T = 1 when decoding greedily)."""
    s = ctx.sampling
    if ctx.threshold > 0:
        top = float(to_probs(logits, s if not s.greedy else SamplingConfig(1.0)).max())
        if top < ctx.threshold:
            return None
    if s.greedy:
        return greedy(logits).view(1)
    return torch.multinomial(to_probs(logits, s), 1, generator=ctx.generator)


class Drafter:
    """The seam. `begin` once per run, then `propose` / `update` once per round."""

    name = "drafter"
    wants_hidden = False  # True: `begin` and `update` receive the target's last hidden states

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


class ModelDrafter(Drafter):
    """A small causal LM proposing one token per cached forward call.

    Its cache holds the confirmed text plus the proposals it fed itself; before each proposal it keeps the
    longest prefix the text still agrees with, drops the rest, and feeds what it has not seen (this also
    catches up on rounds another drafter proposed).
    """

    name = "model"

    def __init__(self, draft: LoadedModel, V: int):
        self.lm, self.run = draft, CachedModel(draft, V)
        self.confirmed = 0  # tokens of the text its cache holds
        self.spec: list[int] = []  # proposals it fed after those, in order
        # after a tree: node -> its children as (token, cache row or -1 if never fed, child node); -1 the root
        self.tree: dict[int, list[tuple[int, int, int]]] | None = None

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        self.run.prefill(torch.tensor(prompt_ids, device=self.lm.device))
        self.confirmed = max(len(prompt_ids) - 1, 0)

    @property
    def calls(self) -> int:
        return self.run.calls

    def _sync(self, seq: list[int]) -> torch.Tensor:
        """Roll the cache back to what `seq` still agrees with; return the tokens of `seq` it must still see."""
        if self.tree is not None:  # last round's tree: keep the rows of the path the text took, in place
            rows, node = [], -1
            for t in seq[self.confirmed :]:
                node = next((c for c in self.tree.get(node, []) if c[0] == t), None)
                if node is None or node[1] < 0:  # not in the tree, or never fed to the draft
                    break
                rows.append(node[1])
                node = node[2]
            rows = rows[: len(seq) - 1 - self.confirmed]  # the text's last token is always fed again
            self.run.keep_path(self.confirmed, rows)
            self.tree, keep = None, self.confirmed + len(rows)
        else:
            keep = self.confirmed
            for t in self.spec:
                if keep < len(seq) and seq[keep] == t:
                    keep += 1
                else:
                    break
            self.run.rollback(keep)
        self.spec = []
        return torch.tensor(seq[keep:], device=self.lm.device)

    def propose(self, seq: list[int], ctx: DraftContext) -> Proposal:
        if ctx.tree is not None and self.run.supports_trees:
            return self._propose_tree(seq, ctx)
        k, why = ctx.k_for(self.name)
        if k == 0:
            return _empty(ctx, 0, why)
        x = self._sync(seq)  # (L,) at least one token: the last one of the text is never cached yet
        self.confirmed = len(seq)
        s, fast = ctx.sampling, ctx.sampling.greedy and not ctx.need_q and ctx.threshold <= 0
        tokens, logits_rows, stop = [], [], why
        for _ in range(k):
            if fast:  # greedy, nothing else needed: argmax in the draft's own vocabulary
                x = self.run.next_greedy(x)
            else:
                logits = self.run.feed(x, last_only=True)[-1].to(ctx.device)  # (V,)
                x = _draw(logits, ctx)
                if x is None:
                    self.spec = [int(t) for t in tokens]  # every proposal so far was fed
                    stop = STOP_CONFIDENCE
                    break
                logits_rows.append(logits)
            tokens.append(x.to(ctx.device))
        else:
            self.spec = [int(t) for t in tokens[:-1]]  # the last proposal was never fed
        t = torch.cat(tokens) if tokens else torch.empty(0, dtype=torch.long, device=ctx.device)
        q = to_probs(torch.stack(logits_rows), s) if logits_rows and ctx.need_q else None  # (k, V)
        return Proposal(t, q, (self.name,) * len(tokens), k, stop, tuple(logits_rows))

    def _propose_tree(self, seq: list[int], ctx: DraftContext) -> Proposal:
        """A token tree grown best-first (in the spirit of EAGLE-2's dynamic trees; TreePolicy defines the score).

        The candidates are the next child of each node the draft has read (its j-th choice: at T = 0 its j-th
        most likely token, at T > 0 a draw from q without the children drawn before) and reading a node (one
        cached draft call in which the node sees only its ancestors, `feed_tree`), worth what its first child
        promises. A child's existence is settled before it is drawn and the size before anything is, so sampled
        output stays exact. Past the budget the growth goes on on paper only (no draws, no calls) to tell an
        auto budget what a larger tree would have expected.
        """
        depth_max = min(ctx.policy.gamma, ctx.budget)
        budget = ctx.tree.nodes() if depth_max > 0 else 0
        if budget == 0:
            return _empty(ctx, 0, STOP_BUDGET)
        x = self._sync(seq)
        self.confirmed = len(seq)
        g = _Growth(ctx, budget, depth_max, self.confirmed - 1)
        g.read(-1, self.run.feed(x, last_only=True)[-1].to(ctx.device))
        g.push_child(-1)
        while g.heap and len(g.curve) < g.horizon:
            score, _, u, kind = heapq.heappop(g.heap)
            score = -score
            if len(g.tokens) >= budget:  # on paper: a node of this score (after a call, for a read), then its child
                g.calls += kind == 1
                g.curve.append(score)
                g.spent.append(g.calls)
                if kind == 0:
                    g.kids[u] += 1
                    g.push_child(u)
                heapq.heappush(g.heap, (-score * ctx.tree.first(), g.next_order(), u, 1))
                continue
            if kind == 1:  # read node u: its children become candidates
                out = self.run.feed_tree(torch.tensor([g.tokens[u]], device=self.lm.device), [g.rows[g.parents[u]]])
                g.rows[u] = self.run.length - 1
                g.calls += 1
                g.read(u, out[-1].to(ctx.device))
                g.push_child(u)
            else:
                i = g.add_child(u, score)
                g.push_child(u)
                if g.depth[i] < depth_max:
                    heapq.heappush(g.heap, (-score * ctx.tree.first(), g.next_order(), i, 1))
        ctx.tree.observe(g.curve, g.spent)
        if not g.tokens:  # no candidate at all (cannot happen with a softmax row, but never stack nothing)
            return _empty(ctx, 0, STOP_TREE)
        self.tree = {}
        for i, par in enumerate(g.parents):
            self.tree.setdefault(par, []).append((g.tokens[i], g.rows.get(i, -1), i))
        return g.proposal(self.name)


class _Growth:
    """The state of one tree being grown best-first (ModelDrafter._propose_tree): nodes, candidates, the curve."""

    def __init__(self, ctx: DraftContext, budget: int, depth_max: int, root_row: int):
        self.ctx, self.budget, self.depth_max = ctx, budget, depth_max
        self.horizon = budget if ctx.tree.fixed is not None else ctx.tree.max_nodes
        s = ctx.sampling
        self.s_view = s if not s.greedy else SamplingConfig(1.0)  # confidence is read at T = 1 when greedy
        self.view: dict[int, torch.Tensor] = {}  # node -> (V,) what its children are drawn from and scored by
        self.ranked: dict[int, tuple[list[float], list[int]]] = {}  # node -> its top probabilities, their tokens
        self.rows = {-1: root_row}  # node -> its row in the draft's cache
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.ranks: list[int] = []
        self.said: list[float] = []  # the draft's probability of each node (its j-th largest at the parent)
        self.scores: list[float] = []
        self.depth: list[int] = []
        self.kids: dict[int, int] = {-1: 0}  # node -> children so far (also counted on paper past the budget)
        self.heap: list[tuple[float, int, int, int]] = []  # (-score, order, node, kind 0: its next child, 1: read it)
        self.order = 0
        self.calls = 1  # the root's read
        self.curve: list[float] = []  # each node's score in the order it grew (on paper past the budget)
        self.spent: list[int] = []  # draft calls up to it

    def next_order(self) -> int:
        self.order += 1
        return self.order

    def read(self, u: int, logits: torch.Tensor) -> None:
        self.view[u] = to_probs(logits, self.s_view)
        top = torch.topk(self.view[u], min(TREE_CHILDREN, self.ctx.V))
        self.ranked[u] = (top.values.tolist(), top.indices.tolist())

    def push_child(self, u: int) -> None:
        """u's next child as a candidate: score = u's score * the draft's j-th largest probability * cal[j]."""
        j, probs = self.kids[u], self.ranked[u][0]
        if j < len(probs) and probs[j] > 0.0:
            reach = 1.0 if u < 0 else self.scores[u]
            heapq.heappush(self.heap, (-reach * probs[j] * self.ctx.tree.cal(j), self.next_order(), u, 0))

    def add_child(self, u: int, score: float) -> int:
        """Draw u's next child (at T = 0 its j-th most likely token; else from q without the siblings drawn)."""
        j = self.kids[u]
        probs, top_ids = self.ranked[u]
        if self.ctx.sampling.greedy:
            t = top_ids[j]
        else:
            q_u = self.view[u].clone()
            q_u[[self.tokens[c] for c, par in enumerate(self.parents) if par == u]] = 0.0
            t = int(torch.multinomial(q_u, 1, generator=self.ctx.generator))
        i = len(self.tokens)
        self.tokens.append(t)
        self.parents.append(u)
        self.ranks.append(j)
        self.said.append(probs[j])
        self.scores.append(score)
        self.depth.append(1 if u < 0 else self.depth[u] + 1)
        self.kids[u] += 1
        self.kids[i] = 0
        self.curve.append(score)
        self.spent.append(self.calls)
        return i

    def proposal(self, name: str) -> Proposal:
        """The grown tree as a Proposal (a chain when it never branched)."""
        ctx, N = self.ctx, len(self.tokens)
        t = torch.tensor(self.tokens, dtype=torch.long, device=ctx.device)
        q = torch.stack([self.view[par] for par in self.parents])  # (N, V) each node's parent's row
        if all(par == i - 1 for i, par in enumerate(self.parents)):  # it never branched: an ordinary chain
            stop = STOP_GAMMA if N == self.budget or self.depth[-1] == self.depth_max else STOP_TREE
            return Proposal(t, q if ctx.need_q else None, (name,) * N, self.budget, stop, said=tuple(self.said))
        return Proposal(t, q, (name,) * N, self.budget, STOP_TREE, parents=tuple(self.parents),
                        ranks=tuple(self.ranks), said=tuple(self.said))  # fmt: skip


class LookupDrafter(Drafter):
    """Prompt lookup: propose what followed the most recent earlier occurrence of the text's last n tokens."""

    name = "lookup"

    def __init__(self, prompt_lookup_num_tokens: int = PROMPT_LOOKUP_NUM_TOKENS,
                 max_matching_ngram_size: int = MAX_MATCHING_NGRAM_SIZE):  # fmt: skip
        if prompt_lookup_num_tokens < 1 or max_matching_ngram_size < 1:
            raise SpecvizError("prompt_lookup_num_tokens and max_matching_ngram_size must be at least 1.")
        self.num_tokens, self.max_ngram = prompt_lookup_num_tokens, max_matching_ngram_size
        self.index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_matching_ngram_size + 1)]
        self.indexed = 0  # n-grams ending before this position are in the index
        # for token trees only: every earlier occurrence, oldest first (built on the first tree proposal)
        self.every: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_matching_ngram_size + 1)]
        self.indexed_every = 0

    def _extend(self, seq: list[int]) -> None:
        """Index every n-gram that ends before the last token: index[n][gram] = where its continuation starts."""
        for end in range(max(self.indexed, 1), len(seq)):  # the continuation seq[end] exists
            for n in range(1, min(self.max_ngram, end) + 1):
                self.index[n][tuple(seq[end - n : end])] = end  # later occurrences overwrite: the most recent
        self.indexed = max(self.indexed, len(seq))

    def find(self, seq: list[int], k: int) -> tuple[int, list[int]]:
        """(n, proposal) for `seq`: the length of the longest suffix found earlier and the (at most k) tokens that
        followed it; (0, []) when nothing matches."""
        self._extend(seq)
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            start = self.index[n].get(tuple(seq[-n:]))
            if start is not None:
                return n, seq[start : start + k]
        return 0, []

    def find_branches(self, seq: list[int], k: int, most: int) -> tuple[int, list[list[int]]]:
        """(n, continuations) for a token tree: the longest suffix found earlier, and what followed up to `most` of
        its occurrences (at most k tokens each, different ones only), the most recent first (find's proposal)."""
        self._extend(seq)
        for end in range(max(self.indexed_every, 1), len(seq)):
            for n in range(1, min(self.max_ngram, end) + 1):
                self.every[n].setdefault(tuple(seq[end - n : end]), []).append(end)
        self.indexed_every = max(self.indexed_every, len(seq))
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            ends = self.every[n].get(tuple(seq[-n:]))
            if ends:
                found: list[list[int]] = []
                for start in reversed(ends):
                    c = seq[start : start + k]
                    if c and c not in found:
                        found.append(c)
                        if len(found) == most:
                            break
                return n, found
        return 0, []

    def match(self, seq: list[int], k: int) -> list[int]:
        """The proposal for `seq` (at most k tokens; empty when nothing matches)."""
        return self.find(seq, k)[1]

    def key(self, n: int) -> str:
        """The policy's estimate for matches of n tokens: a 3-token match is right far more often than a 1-token
        one (its first guess 0.81 vs 0.20 of the time on the built-in target's greedy replies, measured by
        scripts/lookup_stats.py), so auto learns each length apart."""
        return f"{self.name}:{n}"

    def propose(self, seq: list[int], ctx: DraftContext) -> Proposal:
        if ctx.tree is not None:
            tree = self._propose_tree(seq, ctx)
            if tree is not None:
                return tree
        n, found = self.find(seq, self.num_tokens)
        k, why = ctx.k_for(self.key(n) if found else self.name)
        k_eff = min(k, self.num_tokens)
        found = found[:k_eff]
        if not found:
            return _empty(ctx, k, STOP_NO_MATCH if k_eff > 0 else why)
        t = torch.tensor(found, dtype=torch.long, device=ctx.device)
        q = torch.nn.functional.one_hot(t, ctx.V).float() if ctx.need_q else None  # (k, V) point masses
        stop = why if len(found) == k else (STOP_GAMMA if len(found) == k_eff else STOP_MATCH_END)
        return Proposal(t, q, (self.name,) * len(found), k, stop, estimate=self.key(n))

    def _propose_tree(self, seq: list[int], ctx: DraftContext) -> Proposal | None:
        """Where the text's last tokens occurred several times with different continuations: their trie, the most
        recent continuation first and whole (today's chain), the others branching off it while the tree's node
        budget lasts. Every node is a point mass (q one-hot), so the walk's rule stays exact. None: one
        continuation or none (the chain proposal is then made as without trees)."""
        n, found = self.find_branches(seq, self.num_tokens, LOOKUP_BRANCHES)
        if len(found) < 2:
            return None
        k, why = ctx.k_for(self.key(n))
        k_eff = min(k, self.num_tokens)
        conts = list(dict.fromkeys(tuple(c[:k_eff]) for c in found if c[:k_eff]))
        if len(conts) < 2:
            return None
        budget = max(ctx.tree.nodes(), len(conts[0]))
        tokens, parents, ranks, at = [], [], [], {}  # at[(parent, token)] = node
        kids: dict[int, int] = {}
        for c in conts:
            u = -1
            for t in c:
                if (u, t) not in at:
                    if len(tokens) >= budget:
                        break
                    at[(u, t)] = len(tokens)
                    tokens.append(t)
                    parents.append(u)
                    ranks.append(kids.get(u, 0))
                    kids[u] = kids.get(u, 0) + 1
                u = at[(u, t)]
        t = torch.tensor(tokens, dtype=torch.long, device=ctx.device)
        q = torch.nn.functional.one_hot(t, ctx.V).float()  # (N, V) point masses
        return Proposal(t, q, (self.name,) * len(tokens), k, STOP_TREE, estimate=self.key(n), parents=tuple(parents),
                        ranks=tuple(ranks))  # fmt: skip


class HeadDrafter(Drafter):
    """Guesses from a feature-level head (head.py) over the target's own last hidden states.

    The head's cache holds pairs (token x_{j+1}, true feature f_j) for j < `fed`; `pending` holds the true
    features the engine sent since (positions fed, fed + 1, ...). A proposal feeds them in one call (its last
    output guesses the first token), then one call per further guess on the head's own predicted feature;
    `update` drops those guessed pairs again and queues the n + 1 new true features.
    """

    name = "head"
    wants_hidden = True

    def __init__(self, head, V: int):
        from .head import HeadCache

        self.head, self.V = head, V
        self.cache = HeadCache()
        self.fed = 0  # pairs in the cache built from true features
        self.pending: torch.Tensor | None = None  # (m, H) true features of positions fed .. fed + m - 1
        self.n_calls = 0

    @property
    def calls(self) -> int:
        return self.n_calls

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        self.cache.crop(0)
        self.fed, self.n_calls = 0, 0
        self.pending = hidden

    def update(self, n: int, correction: int, hidden: torch.Tensor | None = None) -> None:
        self.cache.crop(self.fed)  # the guessed pairs were built on predicted features
        if hidden is not None:
            self.pending = hidden if self.pending is None else torch.cat([self.pending, hidden])

    def _step(self, tokens: list[int], feats: torch.Tensor, start: int) -> torch.Tensor:
        """Feed pairs (tokens[i], feats[i]) at positions start + 1 + i; return the predicted features (L, H)."""
        dev = self.head.embed.device
        pos = torch.arange(start + 1, start + 1 + len(tokens), device=dev)
        self.n_calls += 1
        return self.head(torch.tensor([tokens], device=dev), feats[None].to(dev, self.head.embed.dtype), pos,
                         self.cache)[0]  # fmt: skip

    def _logits(self, f: torch.Tensor, ctx: DraftContext) -> torch.Tensor:
        """(H,) predicted feature -> (V,) logits in the target's vocabulary (-inf outside the head's rows)."""
        rows = self.head.logits(f).float().to(ctx.device)
        return scatter_rows(rows[None], self.head.target_ids.to(ctx.device), self.V)[0]

    def propose(self, seq: list[int], ctx: DraftContext) -> Proposal:
        k, why = ctx.k_for(self.name)
        m = 0 if self.pending is None else int(self.pending.shape[0])
        if k == 0 or self.fed + m == 0:  # nothing to read yet: a one-token prompt's first round
            return _empty(ctx, k, why)
        if m == 0 or self.fed + m != len(seq) - 1:  # the engine sends n + 1 features after every verify
            raise RuntimeError(f"head drafter out of step: {self.fed} + {m} features for {len(seq)} tokens")
        f = self._step(seq[self.fed + 1 :], self.pending, self.fed)[-1]  # (H,) the feature after seq[-1]
        self.fed, self.pending = self.fed + m, None
        tokens, rows, stop = [], [], why
        for i in range(k):
            logits = self._logits(f, ctx)
            x = _draw(logits, ctx)
            if x is None:
                stop = STOP_CONFIDENCE
                break
            tokens.append(x.to(ctx.device))
            rows.append(logits)
            if i + 1 < k:  # the next guess reads this one with the head's own predicted feature
                f = self._step([int(x)], f[None], len(seq) - 1 + i)[-1]
        t = torch.cat(tokens) if tokens else torch.empty(0, dtype=torch.long, device=ctx.device)
        q = to_probs(torch.stack(rows), ctx.sampling) if rows and ctx.need_q else None  # (k, V)
        return Proposal(t, q, (self.name,) * len(tokens), k, stop, tuple(rows))


class LookupModelDrafter(Drafter):
    """Lookup where the text has a match, the draft model (or head) otherwise.

    Under the auto policy a match is used only when the policy expects more tokens per second from it than
    from the model (lookup's guesses are free but, on open questions, rarely right), judged from earlier matches
    of the same length (`LookupDrafter.key`); one match in
    `EXPLORE_EVERY` is used anyway, so the estimate of lookup keeps learning when the text turns quotable.
    """

    EXPLORE_EVERY = 8

    def __init__(self, inner: Drafter, **lookup):
        self.lookup, self.model = LookupDrafter(**lookup), inner
        self.name = f"lookup+{inner.name}"
        self.wants_hidden = inner.wants_hidden
        self.matches = 0

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        self.model.begin(prompt_ids, hidden)

    def update(self, n: int, correction: int, hidden: torch.Tensor | None = None) -> None:
        self.model.update(n, correction, hidden)  # the head needs every true feature, whoever guessed

    @property
    def calls(self) -> int:
        return self.model.calls

    def propose(self, seq: list[int], ctx: DraftContext) -> Proposal:
        found = self.lookup.propose(seq, ctx)
        if found.tokens.numel():
            self.matches += 1
            if self.matches % self.EXPLORE_EVERY == 0 or ctx.prefers(found.key, self.model.name):
                return found
        return self.model.propose(seq, ctx)


def make_drafter(
    name: str, draft: LoadedModel | None, V: int, head=None, target: LoadedModel | None = None, **lookup
) -> Drafter:
    """The drafter called `name` (one of DRAFTERS); `head` is the loaded DraftHead for the head drafters.
    With `target`, a draft model with another tokenizer guesses through a TranslatingDrafter."""
    if name not in DRAFTERS:
        raise SpecvizError(f"Unknown drafter {name!r}; use one of {', '.join(DRAFTERS)}.")
    if name == "lookup":
        return LookupDrafter(**lookup)
    if name.endswith("head"):
        if head is None:
            raise SpecvizError(f"The {name} drafter needs a draft head for this target; give one with head=FOLDER.")
        inner: Drafter = HeadDrafter(head, V)
    else:
        if draft is None:
            raise SpecvizError(f"The {name} drafter needs a draft model.")
        from .translate import needs_translation

        translated = target is not None and needs_translation(target, draft)
        inner = TranslatingDrafter(draft, target) if translated else ModelDrafter(draft, V)
    return LookupModelDrafter(inner, **lookup) if name.startswith("lookup+") else inner


class TranslatingDrafter(Drafter):
    """A draft model with another tokenizer than the target's: it reads the reply as text in its own tokens and
    its guesses are translated into the target's (translate.py says how, and why each method is exact).

    Its cache holds its own prompt (through its own chat template) and the reply re-encoded with its own
    tokenizer; before each proposal the reply is encoded again and the cache kept up to the longest common
    prefix of token ids (a rejected guess, or a reply it split otherwise, is dropped from there).
    """

    name = "model"

    def __init__(self, draft: LoadedModel, target: LoadedModel, method: str | None = None):
        from .engine import eos_ids
        from .translate import METHODS, translator

        if method is not None and method not in METHODS:
            raise SpecvizError(f"Unknown translation method {method!r}; use one of {', '.join(METHODS)}.")
        self.lm, self.target, self.method = draft, target, method  # method None: by the sampling settings
        self.tr = translator(target.tokenizer, draft.tokenizer)
        self.run = CachedModel(draft, draft.vocab_size)  # logits in its own vocabulary
        self.q_eos, self.p_eos = eos_ids(draft), _first_eos(target)
        tok = draft.tokenizer
        self.q_special = set(getattr(tok, "all_special_ids", ()) or ()) | set(
            getattr(tok, "added_tokens_decoder", {}) or ()
        )
        self.q_prompt: list[int] = []
        self.fed: list[int] = []  # its own ids in its cache, in order
        self.prompt_len = 0  # target tokens of the prompt
        self.translate_s = 0.0  # seconds spent encoding and decoding text (the pair check reports it)
        self._shared = None
        self._shared_map: tuple | None = None

    @property
    def calls(self) -> int:
        return self.run.calls

    @property
    def shared(self):
        """The vocabularies' shared tokens (translate.SharedVocabulary), built on first use."""
        if self._shared is None:
            self._shared = self.tr.shared(self.lm.vocab_size)
        return self._shared

    def method_for(self, sampling: SamplingConfig) -> str:
        """ "text" when greedy; at T > 0 "intersection" where enough of the draft's vocabulary is shared, else "match"."""
        from .translate import sampling_method

        if self.method is not None:
            return self.method
        return "text" if sampling.greedy else sampling_method(self.shared)

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        t0 = time.perf_counter()
        self.q_prompt = self.tr.draft_prompt(list(prompt_ids))
        self.prompt_len = len(prompt_ids)
        self.translate_s += time.perf_counter() - t0
        self.run.prefill(torch.tensor(self.q_prompt, device=self.lm.device))
        self.fed = self.q_prompt[:-1]

    def _sync(self, seq: list[int]) -> list[int]:
        """Bring the cache in line with the reply in `seq`; return its own ids for prompt + reply."""
        t0 = time.perf_counter()
        want = self.q_prompt + self.tr.to_draft(self.tr.reply_text(seq[self.prompt_len :]))
        self.translate_s += time.perf_counter() - t0
        keep = 0
        for a, b in zip(self.fed, want[:-1]):  # at least one token is fed: its logits guess the next
            if a != b:
                break
            keep += 1
        self.run.rollback(keep)
        self.fed = want[:keep]
        return want

    def _feed(self, ids: list[int]) -> torch.Tensor:
        """Feed its own ids; (Vq,) logits after the last."""
        self.fed += ids
        return self.run.feed(torch.tensor(ids, device=self.lm.device), last_only=True)[-1]

    def propose(self, seq: list[int], ctx: DraftContext) -> Proposal:
        k, why = ctx.k_for(self.name)
        if k == 0:
            return _empty(ctx, 0, why)
        want = self._sync(seq)
        logits = self._feed(want[len(self.fed) :])  # (Vq,)
        if self.method_for(ctx.sampling) == "intersection":
            return self._propose_shared(logits, k, why, ctx)
        guess, stop, ended = [], why, False
        for i in range(k):
            x = _draw(logits, ctx)
            if x is None:
                stop = STOP_CONFIDENCE
                break
            x = int(x)
            if x in self.q_eos or x in self.q_special:  # its end of turn becomes the target's; other specials end it
                ended, stop = x in self.q_eos, STOP_END
                break
            guess.append(x)
            if i + 1 < k:
                logits = self._feed([x])
        t0 = time.perf_counter()
        reply = want[len(self.q_prompt) :]
        text = self.tr.new_text(reply, guess)
        tokens = self.tr.to_target(seq, text)[:k]
        origins = self.tr.origins(seq, tokens, reply, guess) if tokens else ()
        if ended and self.p_eos is not None and len(tokens) < k and (tokens or not guess):
            tokens.append(self.p_eos)
            origins += ("(the draft's end of turn)",)
        self.translate_s += time.perf_counter() - t0
        if guess and not tokens:
            stop = STOP_UNTRANSLATED
        t = torch.tensor(tokens, dtype=torch.long, device=ctx.device)
        q = torch.nn.functional.one_hot(t, ctx.V).float() if ctx.need_q else None  # (m, V) point masses: exact
        return Proposal(t, q, (self.name,) * len(tokens), k, stop, origins=origins)

    def _propose_shared(self, logits: torch.Tensor, k: int, why: str, ctx: DraftContext) -> Proposal:
        """The token-level intersection: q over the shared tokens only, scattered into the target's ids."""
        rows, ids, back = self._intersection(logits.device)
        tokens, q_rows, origins, stop = [], [], [], why
        for i in range(k):
            row = scatter_rows(logits[rows][None].float(), ids, ctx.V)[0].to(ctx.device)  # (V,) -inf off the shared
            x = _draw(row, ctx)
            if x is None:
                stop = STOP_CONFIDENCE
                break
            tokens.append(int(x))
            q_rows.append(row)
            own = back[int(x)]
            origins.append(self.lm.tokenizer.convert_ids_to_tokens(own))
            if own in self.q_eos:
                stop = STOP_END
                break
            if i + 1 < k:
                logits = self._feed([own])
        t = torch.tensor(tokens, dtype=torch.long, device=ctx.device)
        q = to_probs(torch.stack(q_rows), ctx.sampling) if q_rows and ctx.need_q else None  # (m, V)
        return Proposal(t, q, (self.name,) * len(tokens), k, stop, tuple(q_rows), origins=tuple(origins))

    def _intersection(self, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, dict[int, int]]:
        """(draft rows, their target ids, target id -> draft row) of the shared tokens, its end of turn mapped to
        the target's; built once per run."""
        if self._shared_map is None:
            shared = self.shared
            rows, ids = shared.q_rows.tolist(), shared.p_ids.tolist()
            eos_row = next((r for r in sorted(self.q_eos) if r < self.lm.vocab_size), None)
            if self.p_eos is not None and eos_row is not None and self.p_eos not in ids:
                rows, ids = rows + [eos_row], ids + [self.p_eos]
            self._shared_map = (torch.tensor(rows, device=dev), torch.tensor(ids, device=dev), dict(zip(ids, rows)))
        return self._shared_map


def _first_eos(lm: LoadedModel) -> int | None:
    """The token a model ends its turn with: its tokenizer's EOS when that is one of its stop tokens, else the
    smallest of them."""
    from .engine import eos_ids

    ids = eos_ids(lm)
    e = getattr(lm.tokenizer, "eos_token_id", None)
    return e if e in ids else min(ids) if ids else None


def translation_of(drafter: Drafter, sampling: SamplingConfig) -> str:
    """In words, how a translating drafter (alone or inside lookup+model) turns guesses into the target's tokens
    at these sampling settings; "" for a drafter with the target's own tokenizer."""
    from .translate import METHODS

    inner = getattr(drafter, "model", drafter)
    if not isinstance(inner, TranslatingDrafter):
        return ""
    return f"{inner.method_for(sampling)}: {METHODS[inner.method_for(sampling)]}"
