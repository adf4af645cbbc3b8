"""Where guesses come from: one seam, several siblings (in the spirit of transformers' `CandidateGenerator`).

A drafter proposes up to k tokens for the current text together with the distribution q each was drawn
from, and is told after each verify how many were accepted (n) and which token the target added.

- `ModelDrafter` ("model", here): a small draft model with its own KV cache, rolled back to what the text kept.
- `LookupDrafter` ("lookup", drafters_lookup.py): prompt lookup. The tokens that followed the most recent earlier
  occurrence of the text's last n tokens are proposed; q is a point mass, which keeps the rule exact.
- `HeadDrafter` ("head", drafters_head.py): a feature-level head (EAGLE, head.py) that guesses from the target's
  own last hidden states; it asks the engine for them (`wants_hidden`).
- `MixDrafter` ("model+head", drafters_mix.py): the draft model and the head together; a round's first guess is
  drawn from the mixture of their distributions, the later ones from the draft.
- `LookupModelDrafter` ("lookup+model", "lookup+head", "lookup+model+head", drafters_lookup.py): lookup where the
  text has a match, the model (or the head, or both) otherwise.
- `TranslatingDrafter` (the "model" drafter for a draft with another tokenizer, drafters_translating.py): the
  draft reads and writes text, translated to and from the target's tokens (translate.py).

The seam they share (`DraftContext`, `Proposal`, `Drafter`, the STOP_* reasons) is drafters_base.py's; every
public name of those modules is importable from here, and `make_drafter` builds any of them by name.

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

import torch

from specviz.backends import open_run
from specviz.config import DRAFTERS, SamplingConfig, SpecvizError
from specviz.drafters.base import (
    STOP_BUDGET,
    STOP_CONFIDENCE,
    STOP_GAMMA,
    STOP_TREE,
    DraftContext,
    Drafter,
    Proposal,
    draw,
    empty_proposal,
    widen,
)
from specviz.drafters.head import HeadDrafter
from specviz.drafters.lookup import LookupDrafter, LookupModelDrafter
from specviz.drafters.mix import MixDrafter
from specviz.drafters.translating import TranslatingDrafter, translation_of  # noqa: F401 (translation_of: as before)
from specviz.models.loaded import LoadedModel
from specviz.sampling import sample, scatter_rows, to_probs

TREE_CHILDREN = 4  # the most children a tree node gets (its draft's top 4: 2nd-4th are right 22% of the time)


class ModelDrafter(Drafter):
    """A small causal LM proposing one token per cached forward call.

    Its cache holds the confirmed text plus the proposals it fed itself; before each proposal it keeps the
    longest prefix the text still agrees with, drops the rest, and feeds what it has not seen (this also
    catches up on rounds another drafter proposed).
    """

    name = "model"

    def __init__(self, draft: LoadedModel, V: int):
        self.lm, self.run = draft, open_run(draft, V)
        self.ids = draft.proposable  # the target ids it can propose (a trimmed draft), or None: all V
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

    def sync(self, seq: list[int]) -> torch.Tensor:
        """Roll the cache back to what `seq` still agrees with and take `seq` as confirmed; return the tokens of `seq`
        it must still see (at least one: the text's last token is never cached yet)."""
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
        self.spec, self.confirmed = [], len(seq)
        return torch.tensor(seq[keep:], device=self.lm.device)

    def propose(self, seq: list[int], ctx: DraftContext) -> Proposal:
        if self.run.supports_trees and ctx.grows_tree(self.name):
            return self._propose_tree(seq, ctx)
        k, why = ctx.k_for(self.name)
        if k == 0:
            return empty_proposal(ctx, 0, why)
        return self.chain(self.sync(seq), k, ctx, why)

    def chain(self, x: torch.Tensor, k: int, ctx: DraftContext, why: str) -> Proposal:
        """Feed x (L,) (what `sync` returned, or a guess made after it) and guess k tokens, each fed for the next."""
        s, fast = ctx.sampling, ctx.sampling.greedy and not ctx.need_q and ctx.threshold <= 0
        if fast:  # the loop below in one native call, where it can
            chain = self.run.greedy_chain(x, k)
            if chain is not None:
                self.spec = chain[:-1].tolist()  # the last proposal was never fed
                return Proposal(chain.to(ctx.device), None, (self.name,) * k, k, why, ())
        elif not s.greedy and ctx.threshold <= 0 and s.top_k == 0 and s.top_p >= 1.0:
            drawn = self.run.sampled_chain(x, k, s.temperature, ctx.generator)
            if drawn is not None:
                return self._drawn(*drawn, ctx, why)
        tokens, logits_rows, q_rows, stop = [], [], [], why
        ids = self._ids(ctx)
        for _ in range(k):
            if fast:  # greedy, nothing else needed: argmax in the draft's own vocabulary
                x = self.run.next_greedy(x)
            else:
                logits = self.run.feed(x, last_only=True)[-1].to(ctx.device)  # (V,)
                x, q_row = draw(logits, ctx, ids)
                if x is None:
                    self.spec = [int(t) for t in tokens]  # every proposal so far was fed
                    stop = STOP_CONFIDENCE
                    break
                logits_rows.append(logits)
                q_rows.append(q_row)
            tokens.append(x.to(ctx.device))
        else:
            self.spec = [int(t) for t in tokens[:-1]]  # the last proposal was never fed
        t = torch.cat(tokens) if tokens else torch.empty(0, dtype=torch.long, device=ctx.device)
        q = None  # (k, V): at T > 0 the rows drawn from; greedy, the argmax's point masses
        if logits_rows and ctx.need_q:
            q = to_probs(torch.stack(logits_rows), s) if s.greedy else torch.stack(q_rows)
        return Proposal(t, q, (self.name,) * len(tokens), k, stop, tuple(logits_rows))

    def _drawn(self, chain: torch.Tensor, scores: torch.Tensor, probs: torch.Tensor, ctx: DraftContext, why: str):
        """The Proposal of a sampled chain: its q rows and raw scores widened to V as `draw` and `feed` give them."""
        self.spec = chain[:-1].tolist()  # the last proposal was never fed
        ids, k = self._ids(ctx), chain.numel()
        q, rows = widen(probs.to(ctx.device), ids, ctx.V), scatter_rows(scores.to(ctx.device), ids, ctx.V)
        return Proposal(chain.to(ctx.device), q, (self.name,) * k, k, why, tuple(rows))

    def _ids(self, ctx: DraftContext) -> torch.Tensor | None:
        """The target ids it can propose, on the round's device (None: all V)."""
        return None if self.ids is None else self.ids.to(ctx.device)

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
            return empty_proposal(ctx, 0, STOP_BUDGET)
        x = self.sync(seq)
        g = _Growth(ctx, budget, depth_max, self.confirmed - 1, self._ids(ctx))
        self._read(g, -1, x, None)
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
                self._read(g, u, torch.tensor([g.tokens[u]], device=self.lm.device), g.rows[g.parents[u]])
                g.rows[u] = self.run.length - 1
                g.calls += 1
                g.push_child(u)
            else:
                i = g.add_child(u, score)
                g.push_child(u)
                if g.depth[i] < depth_max:
                    heapq.heappush(g.heap, (-score * ctx.tree.first(), g.next_order(), i, 1))
        ctx.tree.observe(g.curve, g.spent)
        if not g.tokens:  # no candidate at all (cannot happen with a softmax row, but never stack nothing)
            return empty_proposal(ctx, 0, STOP_TREE)
        self.tree = {}
        for i, par in enumerate(g.parents):
            self.tree.setdefault(par, []).append((g.tokens[i], g.rows.get(i, -1), i))
        return g.proposal(self.name)

    def _read(self, g: _Growth, u: int, x: torch.Tensor, parent: int | None) -> None:
        """Read node u of g (-1: the round's root, x fed as a plain call; else the token x continuing cache row
        `parent`): at T = 0 with nothing but the top children wanted, in one native call where the draft has one
        (CachedModel.tree_read: no V-wide row, mask or positions built in torch per node), else fed and read in
        torch."""
        if g.native:
            top = self.run.tree_read(x, parent, TREE_CHILDREN)
            if top is not None:
                g.ranked[u] = top
                return
            g.native = False  # no such call for this draft (or this root): the rest of the round reads in torch
        out = self.run.feed(x, last_only=True) if parent is None else self.run.feed_tree(x, [parent])
        g.read(u, out[-1].to(g.ctx.device))


class _Growth:
    """The state of one tree being grown best-first (ModelDrafter._propose_tree): nodes, candidates, the curve."""

    def __init__(self, ctx: DraftContext, budget: int, depth_max: int, root_row: int, ids: torch.Tensor | None = None):
        self.ctx, self.budget, self.depth_max, self.ids = ctx, budget, depth_max, ids  # ids: as in drafters_base.draw
        self.horizon = budget if ctx.tree.fixed is not None else ctx.tree.max_nodes
        s = ctx.sampling
        self.s_view = s if not s.greedy else SamplingConfig(1.0)  # confidence is read at T = 1 when greedy
        self.view: dict[int, torch.Tensor] = {}  # node -> (V,) what its children are drawn from and scored by
        # whether a read may be one native call (ModelDrafter._read): greedy, nothing read but the top children
        self.native = s.greedy and not ctx.need_q
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
        """A read node's row: its probabilities (over the ids the draft can propose, where it says: the same law)
        and its top candidates."""
        ids = self.ids
        view = to_probs(logits if ids is None else logits[ids], self.s_view)
        top = torch.topk(view, min(TREE_CHILDREN, view.shape[-1]))
        self.ranked[u] = (top.values.tolist(), (top.indices if ids is None else ids[top.indices]).tolist())
        if self.ctx.need_q or not self.ctx.sampling.greedy:  # q rows: drawn from, shown or verified against
            self.view[u] = widen(view, ids, logits.shape[-1])

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
            t = sample(q_u, self.ctx.generator)
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
        # (N, V) each node's parent's row; None where nothing reads it (greedy, no detail: `said` has each q(x))
        q = torch.stack([self.view[par] for par in self.parents]) if self.view else None
        if all(par == i - 1 for i, par in enumerate(self.parents)):  # it never branched: an ordinary chain
            stop = STOP_GAMMA if N == self.budget or self.depth[-1] == self.depth_max else STOP_TREE
            return Proposal(t, q if ctx.need_q else None, (name,) * N, self.budget, stop, said=tuple(self.said))
        return Proposal(
            t,
            q,
            (name,) * N,
            self.budget,
            STOP_TREE,
            parents=tuple(self.parents),
            ranks=tuple(self.ranks),
            said=tuple(self.said),
        )


def make_drafter(
    name: str, draft: LoadedModel | None, V: int, head=None, target: LoadedModel | None = None, **lookup
) -> Drafter:
    """The drafter called `name` (one of DRAFTERS); `head` is the loaded DraftHead for the head drafters.
    With `target`, a draft model with another tokenizer guesses through a TranslatingDrafter."""
    if name not in DRAFTERS:
        raise SpecvizError(f"Unknown drafter {name!r}; use one of {', '.join(DRAFTERS)}.")
    if name == "lookup":
        return LookupDrafter(**lookup)
    if name.endswith("head") and head is None:
        raise SpecvizError(f"The {name} drafter needs a draft head for this target; give one with head=FOLDER.")
    if "model" in name and draft is None:
        raise SpecvizError(f"The {name} drafter needs a draft model.")
    from specviz.models.translate import needs_translation

    translated = "model" in name and target is not None and needs_translation(target, draft)
    if name.endswith("model+head"):
        if translated:
            raise SpecvizError(
                f"The {name} drafter mixes the draft's and the head's guesses token by token, so the draft must "
                "share the target's tokenizer; use lookup+model for this pair."
            )
        inner: Drafter = MixDrafter(ModelDrafter(draft, V), HeadDrafter(head, V))
    elif name.endswith("head"):
        inner = HeadDrafter(head, V)
    else:
        inner = TranslatingDrafter(draft, target) if translated else ModelDrafter(draft, V)
    return LookupModelDrafter(inner, **lookup) if name.startswith("lookup+") else inner
