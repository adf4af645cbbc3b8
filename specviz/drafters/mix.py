"""The draft model and the head on one first guess ("model+head", and "lookup+model+head" with prompt lookup first).

A round's first guess is drawn from the mixture of the two guessers' distributions,

    q_1 = w * q_head + (1 - w) * q_draft          (w = config.HEAD_WEIGHT; at T = 0 the guess is q_1's argmax,
                                                    both read at T = 1)

and the later guesses from the draft alone, fed the first. The head reads the target's true feature of the last
verified position, the draft its own cache of the text: they are right on different tokens (on prompts neither
trained near, the first guess of the built-in pair's head is right 0.49 of the time, the draft's 0.46, one of
the two 0.61), and the mixture is right more often than either. At later guesses the head would read its own
predicted features, where it is weaker than the draft, so it stops after the first.

Exact like every drafter: the verify reads q_1, the distribution the first guess was drawn from (a mixture of
two distributions is one). At T = 0 a guess is a point mass, as the model drafter's are.
"""

from __future__ import annotations

import torch

from specviz.config import HEAD_WEIGHT
from specviz.drafters.base import STOP_CONFIDENCE, DraftContext, Drafter, Proposal, empty_proposal, widen
from specviz.sampling import sample, scatter_rows, to_probs


class MixDrafter(Drafter):
    """A ModelDrafter and a HeadDrafter over one target: the first guess from both (the mixture above), the rest
    from the draft."""

    name = "model+head"
    wants_hidden = True

    def __init__(self, model, head, weight: float = HEAD_WEIGHT):
        """model: a ModelDrafter; head: a HeadDrafter; weight: w, the head's share of the first guess."""
        self.model, self.head, self.w = model, head, weight
        self._ids: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # `_union`, once worked out
        self._rows: tuple[int, torch.Tensor, torch.Tensor] | None = None  # `_onto`, once worked out

    @property
    def calls(self) -> int:
        return self.model.calls + self.head.calls

    @property
    def chains_only(self) -> bool:
        return self.model.chains_only

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        self.model.begin(prompt_ids)
        self.head.begin(prompt_ids, hidden)

    def update(self, n: int, correction: int, hidden: torch.Tensor | None = None) -> None:
        self.head.update(n, correction, hidden)  # the draft catches up at its next proposal (ModelDrafter.sync)

    def _union(self, d_ids: torch.Tensor, h_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The target ids either guesser can propose (U), and where the draft's and the head's rows sit in U; worked
        out once (the built-in pair: 8,000 rows each, 9,187 together)."""
        if self._ids is None:
            U, where = torch.unique(torch.cat([d_ids, h_ids]), return_inverse=True)
            self._ids = (U, where[: d_ids.numel()], where[d_ids.numel() :])
        return self._ids

    def _onto(self) -> tuple[int, torch.Tensor, torch.Tensor] | None:
        """The draft's cut output layer (its number of rows), which of the head's rows it also has and where they sit
        in it; None without a cut output layer. Worked out once."""
        if self._rows is None:
            rows = self.model.run.kept_ids()
            if rows is None:
                return None
            h_ids = self.head.head.target_ids.to(rows.device)
            at = torch.full((int(max(rows.max(), h_ids.max())) + 1,), -1, dtype=torch.long, device=rows.device)
            at[rows] = torch.arange(rows.numel(), device=rows.device)
            at = at[h_ids]
            self._rows = (rows.numel(), at >= 0, at[at >= 0])
        return self._rows

    def _chain(self, x: torch.Tensor, k: int, read) -> torch.Tensor | None:
        """Greedy: the k guesses in the draft's one native chain call (lean_chain.greedy_chain), the first the argmax
        of the mixture over the draft's own output rows (on the built-in pair, over the 40 held-out and 40 unseen
        prompts, right exactly as often as the argmax over both guessers' rows), or None where it cannot run."""
        onto = self._onto()
        if onto is None:
            return None
        mix = None
        if read is not None:
            n, has, at = onto
            m = torch.zeros(n, dtype=torch.float32, device=has.device)
            m[at] = self.w * torch.softmax(read[1].float().to(has.device), -1)[has]
            mix = (m, 1.0 - self.w)
        return self.model.run.greedy_chain(x, k, mix)

    def first(self, x: torch.Tensor, read, ctx: DraftContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The mixture q_1 over the target ids U either guesser can propose (as `to_probs` gives a distribution; read at
        T = 1 when greedy), and U, after the draft is fed x (`ModelDrafter.sync`) and given the head's read; the draft
        alone where the head had nothing to read."""
        s, dev = ctx.sampling, ctx.device
        # greedy, the guess need only be deterministic (a greedy verify keeps what the target would write):
        # a plain softmax, not to_probs's checks for NaN and infinities
        probs = (lambda v: torch.softmax(v.float(), -1)) if s.greedy else (lambda v: to_probs(v, s))
        d_logits, d_ids = self.model.run.feed_rows(x)
        d_ids = torch.arange(ctx.V, device=dev) if d_ids is None else d_ids.to(dev)
        if read is None:
            return probs(d_logits.to(dev)), d_ids
        U, at_d, at_h = self._union(d_ids, self.head.head.target_ids.to(dev))
        mixed = d_logits.new_zeros(U.numel(), dtype=torch.float32, device=dev)
        mixed.index_add_(0, at_d, probs(d_logits.to(dev)), alpha=1.0 - self.w)
        return mixed.index_add_(0, at_h, probs(read[1].to(dev)), alpha=self.w), U

    def propose(self, seq: list[int], ctx: DraftContext) -> Proposal:
        k, why = ctx.k_for(self.name)
        if k == 0:
            return empty_proposal(ctx, 0, why)
        read = self.head.read(seq) if self.w > 0 else None  # first: the draft's weights stay warm for its chain
        x, s = self.model.sync(seq), ctx.sampling
        if s.greedy and not ctx.need_q and ctx.threshold <= 0:
            chain = self._chain(x, k, read)
            if chain is not None:
                self.model.spec = chain[:-1].tolist()  # the last guess was never fed
                return Proposal(chain.to(ctx.device), None, (self.name,) * k, k, why, ())
        q1, ids = self.first(x, read, ctx)
        if ctx.threshold > 0 and float(q1.max()) < ctx.threshold:
            return empty_proposal(ctx, k, STOP_CONFIDENCE)
        x = ids[ctx.argmax(q1) if s.greedy else sample(q1, ctx.generator)].view(1)
        q, shown = None, ()
        if ctx.need_q:  # (1, V): what x was drawn from (greedy: its point mass); the detail view's raw row
            row = scatter_rows(q1.log()[None], ids, ctx.V)
            q, shown = (to_probs(row, s) if s.greedy else widen(q1, ids, ctx.V)[None]), (row[0],)
        if k == 1:
            return Proposal(x, q, (self.name,), k, why, shown)
        rest = self.model.chain(x.to(self.model.lm.device), k - 1, ctx, why)
        self.model.spec.insert(0, int(x))  # the draft was fed x before its own guesses
        tokens = torch.cat([x, rest.tokens])
        if q is not None and rest.q is not None:
            q = torch.cat([q, rest.q])
        return Proposal(tokens, q, (self.name,) * len(tokens), k, rest.stop, shown + tuple(rest.q_logits))
