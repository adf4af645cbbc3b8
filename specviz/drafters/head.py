"""The head drafter ("head"): guesses from a feature-level head (EAGLE, head.py) that reads the target's own
last hidden states, which it asks the engine for (`wants_hidden`).
"""

from __future__ import annotations

import torch

from specviz.drafters.base import STOP_CONFIDENCE, DraftContext, Drafter, Proposal, draw_guess, empty_proposal
from specviz.sampling import scatter_rows, to_probs


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
        from specviz.models.head import HeadCache

        self.head, self.V = head, V
        self.native = getattr(head, "native", None)  # its forward by llama.c where that runs here (head_native.py)
        self.cache = self.native.new_cache() if self.native is not None else HeadCache()
        self.fed = 0  # pairs in the cache built from true features
        self.pending: torch.Tensor | None = None  # (m, H) true features of positions fed .. fed + m - 1
        self.n_calls = 0

    @property
    def calls(self) -> int:
        return self.n_calls

    def _keep(self, pairs: int) -> None:
        """Keep the cache's first `pairs` pairs."""
        if self.native is not None:
            self.cache.length = pairs
        else:
            self.cache.crop(pairs)

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        self._keep(0)
        self.fed, self.n_calls = 0, 0
        self.pending = hidden

    def update(self, n: int, correction: int, hidden: torch.Tensor | None = None) -> None:
        self._keep(self.fed)  # the guessed pairs were built on predicted features
        if hidden is not None:
            self.pending = hidden if self.pending is None else torch.cat([self.pending, hidden])

    def _step(self, tokens: list[int], feats: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed pairs (tokens[i], feats[i]) at positions start + 1 + i; return the last predicted feature (H,) and
        its logits over the head's rows (N,)."""
        dev = self.head.embed.device
        pos = torch.arange(start + 1, start + 1 + len(tokens), device=dev)
        self.n_calls += 1
        if self.native is not None:
            f, rows = self.native.step(self.cache, torch.tensor(tokens), feats, pos)
            return f[-1], rows
        f = self.head(torch.tensor([tokens], device=dev), feats[None].to(dev, self.head.embed.dtype), pos, self.cache)
        return f[0, -1], self.head.logits(f[0, -1])

    def logits(self, rows: torch.Tensor, ctx: DraftContext) -> torch.Tensor:
        """(N,) logits over the head's rows -> (V,) logits in the target's vocabulary (-inf outside them)."""
        return scatter_rows(rows.float().to(ctx.device)[None], self.head.target_ids.to(ctx.device), self.V)[0]

    def read(self, seq: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Feed the true features the engine sent since the last read: the predicted feature after seq[-1] (H,) and
        its logits over the head's rows (N,); None while there is nothing to read (a one-token prompt's first
        round)."""
        m = 0 if self.pending is None else int(self.pending.shape[0])
        if self.fed + m == 0:
            return None
        if m == 0 or self.fed + m != len(seq) - 1:  # the engine sends n + 1 features after every verify
            raise RuntimeError(f"head drafter out of step: {self.fed} + {m} features for {len(seq)} tokens")
        out = self._step(seq[self.fed + 1 :], self.pending, self.fed)
        self.fed, self.pending = self.fed + m, None
        return out

    def propose(self, seq: list[int], ctx: DraftContext) -> Proposal:
        k, why = ctx.k_for(self.name)
        read = self.read(seq) if k > 0 else None
        if read is None:
            return empty_proposal(ctx, k, why)
        f, head_rows = read
        tokens, rows, stop = [], [], why
        for i in range(k):
            logits = self.logits(head_rows, ctx)
            x = draw_guess(logits, ctx)
            if x is None:
                stop = STOP_CONFIDENCE
                break
            tokens.append(x.to(ctx.device))
            rows.append(logits)
            if i + 1 < k:  # the next guess reads this one with the head's own predicted feature
                f, head_rows = self._step([int(x)], f[None], len(seq) - 1 + i)
        t = torch.cat(tokens) if tokens else torch.empty(0, dtype=torch.long, device=ctx.device)
        q = to_probs(torch.stack(rows), ctx.sampling) if rows and ctx.need_q else None  # (k, V)
        return Proposal(t, q, (self.name,) * len(tokens), k, stop, tuple(rows))
