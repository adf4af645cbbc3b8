"""The step-through's view of a round (SpecConfig.detail > 0): the top candidates of p and of q at each position
the target checked, and what was left of p for the resample there (events.Candidates). It only describes a round
the engine decided; nothing here draws or decides. p is the target, q the draft.
"""

from __future__ import annotations

import torch

from specviz.config import SamplingConfig
from specviz.drafters.base import Proposal
from specviz.events import Candidates
from specviz.sampling import residual, residual_after, to_probs


def candidates(p: torch.Tensor, q: torch.Tensor, k: int, left: dict | None = None) -> tuple[Candidates, ...]:
    """Top-k of p and of q at each position, for the step-through view. p, q (G, V) probabilities; left: what was
    left of p at a position where a tree's walk turned several guesses down (else norm(max(0, p - q)))."""
    res = []
    for i, (p_i, q_i) in enumerate(zip(p, q)):
        ids = torch.unique(torch.cat([torch.topk(p_i, k).indices, torch.topk(q_i, k).indices]))
        ids = ids[torch.argsort(p_i[ids], descending=True)]
        res_i = left[i] if left and i in left else residual(p_i, q_i)
        res.append(
            Candidates(
                tuple(ids.tolist()), tuple(p_i[ids].tolist()), tuple(q_i[ids].tolist()), tuple(res_i[ids].tolist())
            )
        )
    return tuple(res)


def chain_candidates(prop: Proposal, p_logits: torch.Tensor, s: SamplingConfig, k: int) -> tuple[Candidates, ...]:
    """Top candidates of p and q at each proposed position and the bonus one (the step-through view)."""
    s_view = s if not s.greedy else SamplingConfig(1.0, s.top_k, s.top_p)  # greedy: show the T=1 shapes
    V = p_logits.shape[-1]
    if prop.q_logits:
        q_rows = to_probs(torch.stack(prop.q_logits), s_view)  # (k, V)
    else:  # a deterministic drafter: point masses
        q_rows = torch.nn.functional.one_hot(prop.tokens, V).float()
    q_full = torch.cat([q_rows, q_rows.new_zeros(1, V)])  # (k+1, V): the bonus position has no draft
    return candidates(to_probs(p_logits, s_view), q_full, k)


def tree_candidates(prop: Proposal, line: list[int], n: int, p_logits: torch.Tensor, s: SamplingConfig, k: int):
    """Top candidates of p and q along a tree round's walked line (its n kept guesses, then the first one turned
    down, if any) and at the position after it (step-through); where the walk stopped, what was left of p."""
    s_view = s if not s.greedy else SamplingConfig(1.0, s.top_k, s.top_p)
    rows = [prop.parents[i] + 1 for i in line] + [line[-1] + 1 if line else 0]  # p rows: each line node's parent
    p = to_probs(p_logits[rows], s_view)  # (L + 1, V)
    q = torch.cat([prop.q[line], prop.q.new_zeros(1, prop.q.shape[1])]) if line else prop.q.new_zeros(1, p.shape[1])
    left = {}
    if len(line) > n and not s.greedy:  # the walk stopped at line[n]'s parent, every child there turned down
        tried = [i for i, par in enumerate(prop.parents) if par == prop.parents[line[n]]]
        left[n] = residual_after(p[n], prop.q[tried], prop.tokens[tried].tolist())
    return candidates(p, q, k, left)
