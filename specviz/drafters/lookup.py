"""Prompt lookup: guesses copied from earlier in the text, alone ("lookup") or before a model ("lookup+model").

`LookupDrafter` finds the text's last n tokens (n = max_matching_ngram_size down to 1) earlier in the prompt plus
the output so far and proposes what followed their most recent occurrence. It is deterministic, so q is a point
mass: token x is accepted with probability min(1, p(x) / 1) = p(x), and a rejection resamples from
norm(max(0, p - onehot(x))), which is p with x removed and renormalised: exact, with no change to the verification
rule. With a fixed tree budget it proposes the trie of several earlier continuations (tree="auto" prices trees
by the draft model's curve, which a trie has none of, so there lookup proposes its chain). `LookupModelDrafter` uses a match
where the text has one and the model (or head) drafter otherwise.
"""

from __future__ import annotations

import torch

from specviz.config import MAX_MATCHING_NGRAM_SIZE, PROMPT_LOOKUP_NUM_TOKENS, SpecvizError  # noqa: F401 (importable here)
from specviz.drafters.base import (
    STOP_GAMMA,
    STOP_MATCH_END,
    STOP_NO_MATCH,
    STOP_TREE,
    DraftContext,
    Drafter,
    Proposal,
    empty_proposal,
)

LOOKUP_BRANCHES = 4  # a lookup tree follows at most this many earlier occurrences of the text's last tokens


class LookupDrafter(Drafter):
    """Prompt lookup: propose what followed the most recent earlier occurrence of the text's last n tokens."""

    name = "lookup"

    def __init__(
        self,
        prompt_lookup_num_tokens: int = PROMPT_LOOKUP_NUM_TOKENS,
        max_matching_ngram_size: int = MAX_MATCHING_NGRAM_SIZE,
        never: frozenset[int] = frozenset(),
    ):
        """never: ids it does not copy (a continuation ends before the first of them): the target's control tokens
        but its end of turn (`never_copied`), which a chat template puts in the prompt and a reply never holds."""
        if prompt_lookup_num_tokens < 1 or max_matching_ngram_size < 1:
            raise SpecvizError("prompt_lookup_num_tokens and max_matching_ngram_size must be at least 1.")
        self.num_tokens, self.max_ngram, self.never = prompt_lookup_num_tokens, max_matching_ngram_size, never
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
            found = self._copy(seq, start, k) if start is not None else []
            if found:
                return n, found
        return 0, []

    def _copy(self, seq: list[int], start: int, k: int) -> list[int]:
        """What follows position `start`: at most k tokens, ending before the first id it never copies."""
        out = seq[start : start + k]
        cut = next((i for i, t in enumerate(out) if t in self.never), len(out))
        return out[:cut]

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
                    c = self._copy(seq, start, k)
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
        specviz.training.lookup_stats), so auto learns each length apart."""
        return f"{self.name}:{n}"

    def propose(self, seq: list[int], ctx: DraftContext) -> Proposal:
        if (
            ctx.tree is not None and ctx.tree.fixed is not None
        ):  # auto prices trees by the draft's curve: a trie has none
            tree = self._propose_tree(seq, ctx)
            if tree is not None:
                return tree
        n, found = self.find(seq, self.num_tokens)
        k, why = ctx.k_for(self.key(n) if found else self.name)
        k_eff = min(k, self.num_tokens)
        found = found[:k_eff]
        if not found:
            return empty_proposal(ctx, k, STOP_NO_MATCH if k_eff > 0 else why)
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
        return Proposal(
            t,
            q,
            (self.name,) * len(tokens),
            k,
            STOP_TREE,
            estimate=self.key(n),
            parents=tuple(parents),
            ranks=tuple(ranks),
        )


def never_copied(target) -> frozenset[int]:
    """The target's control tokens but its end of turn (a chat template's <|im_start|> and the like): prompt lookup
    copies none of them, since the prompt holds them and a reply does not (the built-in target's first round used
    to guess `<|im_start|>`, copied from the template, and lose it)."""
    from specviz.backends import eos_ids

    tok = getattr(target, "tokenizer", None)
    return frozenset(int(i) for i in getattr(tok, "all_special_ids", None) or ()) - eos_ids(target)


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
    def chains_only(self) -> bool:
        return self.model.chains_only

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
