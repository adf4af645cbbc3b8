"""Pure math on logits: tempered/filtered probabilities, the accept/reject test and the residual.

Notation as in Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023: p is the target's distribution,
q the draft's, x_i the i-th drafted token, r_i ~ U(0, 1) the draw that accepts it when r_i < p(x_i)/q(x_i).
All probability math runs in float32, whatever dtype the models compute in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specviz.config import SamplingConfig, SpecvizError

BROKEN = "The model returned NaN or infinite scores for every token; it may be broken or overflowing in this dtype."


def scatter_rows(logits: torch.Tensor, ids: torch.Tensor, V: int) -> torch.Tensor:
    """(L, N) logits over a subset of V ids (column i is id ids[i]: a trimmed draft's target token, or an output
    row the lean forward computed) -> (L, V), -inf elsewhere. (scatter_ rather than index_copy_: the cheaper of the
    two, and it runs every draft step.)"""
    return logits.new_full((logits.shape[0], V), -torch.inf).scatter_(1, ids.view(1, -1).expand_as(logits), logits)


def clean_logits(logits: torch.Tensor) -> torch.Tensor:
    """float32 logits with NaN as -inf; where a row has +inf entries, those share the row's mass equally. Where every
    row's maximum is finite (amax propagates a NaN), there is nothing to clean: x as it is (a draft's 49,152 scores,
    mostly -inf: no copy on each sampled step)."""
    x = logits.float()
    if x.numel() and torch.isfinite(x.amax(dim=-1)).all():
        return x
    x = torch.nan_to_num(x, nan=-torch.inf, posinf=torch.inf, neginf=-torch.inf)
    pos = torch.isposinf(x)
    if pos.any():
        rows = pos.any(dim=-1, keepdim=True)
        x = torch.where(rows, torch.where(pos, 0.0, -torch.inf), x)
    if not torch.isfinite(x.amax(dim=-1)).all():
        raise SpecvizError(BROKEN)
    return x


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last axis, NaN-safe; no softmax needed: the first index of each row's largest score, NaN read
    as -inf, +inf as the largest. Where every row's maximum is finite (PyTorch's argmax picks a NaN or a +inf first
    where there is one), the plain argmax is the answer, with no cleaned copy. A run on this machine takes the same
    ids faster in C where it can (backends.local.fast_greedy, a TargetRun's `argmax`); this is the definition."""
    idx = logits.argmax(dim=-1)
    if torch.isfinite(logits.gather(-1, idx.unsqueeze(-1))).all():
        return idx
    return clean_logits(logits).argmax(dim=-1)


def probs_at(logits: torch.Tensor, rows: list[int], cols: list[int]) -> list[float]:
    """[to_probs(logits[rows[i]]) at T = 1, entry cols[i], for each i]: the softmax of the distinct rows only."""
    distinct = sorted(set(rows))
    view = to_probs(logits[distinct], SamplingConfig(1.0))  # (distinct rows, V): the same rows' same numbers
    at = {r: i for i, r in enumerate(distinct)}
    return view[[at[r] for r in rows], cols].tolist()


def to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities after temperature, top-k and top-p.

    The same function is applied to p and to q, and q is exactly what the draft samples from.
    """
    if cfg.greedy:  # the limit T -> 0: all mass on the argmax
        return torch.nn.functional.one_hot(greedy(logits), logits.shape[-1]).float()
    x = clean_logits(logits) / cfg.temperature
    if 0 < cfg.top_k < x.shape[-1]:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]  # (..., 1)
        x = x.masked_fill(x < kth, -torch.inf)
    if cfg.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # (..., V) mass of strictly better tokens
        drop = mass_before >= cfg.top_p  # the top token always stays (its mass_before is 0)
        x = x.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -torch.inf)
    return torch.softmax(x, dim=-1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): the distribution a rejected position is resampled from.

    If p <= q everywhere (numerically p == q) nothing can be rejected in exact arithmetic; fall back to p.
    """
    diff = torch.clamp(p - q, min=0.0)
    total = diff.sum(dim=-1, keepdim=True)
    return torch.where(total > 1e-12, diff / total.clamp_min(1e-30), p)


def relaxed(p: torch.Tensor, q: torch.Tensor, w: float) -> torch.Tensor:
    """w·p + (1 − w)·q: what "relaxed verification" checks guesses against instead of p. NOT exact for w < 1.

    Speculative sampling makes the output follow whatever it verifies against, so with w < 1 the output follows
    this mix, not the target: guesses are kept more often (min(1, mix/q) >= 1 − w), and the text drifts toward
    the draft. w = 1 returns p itself, so exact verification is untouched bit for bit.
    """
    if w >= 1.0:
        return p
    return w * p + (1.0 - w) * q


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id from a (V,) distribution (weights, not necessarily summing to 1), by its inverse CDF: the first
    id whose cumulative weight passes u * total, u uniform on [0, 1), summed in float64. An id of weight 0 is never
    drawn. Every sampled token of a race goes through here; torch.multinomial's one draw over a vocabulary costs
    about a draft step, this a small fraction of one."""
    cdf = torch.cumsum(probs.reshape(-1).double(), 0)
    u = torch.rand(1, generator=generator, device=probs.device, dtype=torch.float64)
    i = int(torch.searchsorted(cdf, u * cdf[-1], right=True))
    if i >= cdf.numel():  # u * total rounded up to the total: the last id of positive weight
        i = int(torch.nonzero(probs.reshape(-1) > 0)[-1])
    return i


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one block of gamma drafted tokens."""

    n: int  # accepted count: the first n proposals stand
    correction: int  # resampled at position n (n < gamma) or the bonus token (n == gamma)
    p_x: tuple[float, ...]  # p_i(x_i)
    q_x: tuple[float, ...]  # q_i(x_i)
    accept_prob: tuple[float, ...]  # min(1, p_i(x_i) / q_i(x_i))
    r: tuple[float, ...]  # the draws; NaN when greedy


def verify_greedy(drafted: torch.Tensor, target_logits: torch.Tensor, argmax=greedy) -> Verdict:
    """Greedy verification: accept while x_i equals the target's argmax. drafted (gamma,), logits (gamma+1, V);
    argmax: `greedy` or a run's faster way to the same ids (TargetRun.argmax)."""
    gamma = drafted.shape[0]
    best = argmax(target_logits)  # (gamma+1,)
    match = (best[:gamma] == drafted).tolist()
    n = match.index(False) if False in match else gamma
    ones = tuple(1.0 if m else 0.0 for m in match)
    return Verdict(n, int(best[n]), ones, (1.0,) * gamma, ones, (float("nan"),) * gamma)


def verify_sampled(drafted: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator) -> Verdict:
    """Speculative sampling. drafted (gamma,), q (gamma, V) the draft's probs, p (gamma+1, V) the target's."""
    gamma = drafted.shape[0]
    idx = torch.arange(gamma, device=p.device)
    p_x = p[idx, drafted]  # (gamma,)
    q_x = q[idx, drafted]  # (gamma,)  > 0: the draft sampled these from q
    ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(1e-30), torch.where(p_x > 0, torch.inf, 0.0))
    accept_prob = ratio.clamp(max=1.0)
    # float32 whatever the process-wide default dtype (transformers changes it while another thread builds a model)
    r = torch.rand(gamma, generator=generator, device=p.device, dtype=torch.float32)  # every position: one stream
    accepted = (r < accept_prob).tolist()
    n = accepted.index(False) if False in accepted else gamma
    dist = residual(p[n], q[n]) if n < gamma else p[gamma]
    return Verdict(
        n,
        sample(dist, generator),
        tuple(p_x.tolist()),
        tuple(q_x.tolist()),
        tuple(accept_prob.tolist()),
        tuple(r.tolist()),
    )


@dataclass(frozen=True)
class TreeVerdict:
    """The walk over a token tree: the accepted path (node indices, root first) and what each node met."""

    path: tuple[int, ...]
    correction: int  # drawn where the walk stopped: from what is left of p, or the bonus at a leaf
    accept_prob: tuple[float, ...]  # per node, as tested (NaN: never tested)
    r: tuple[float, ...]  # per node (NaN: never tested, or greedy)
    status: tuple[str, ...]  # per node: "kept" | "rejected" | ""

    @property
    def n(self) -> int:
        return len(self.path)


def children_of(parents: tuple[int, ...] | list[int]) -> list[list[int]]:
    """children[u + 1]: the nodes whose parent is u (u = -1 the root), in proposal order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, par in enumerate(parents):
        kids[par + 1].append(i)
    return kids


def verify_tree_greedy(
    drafted: torch.Tensor, parents: tuple[int, ...], target_logits: torch.Tensor, argmax=greedy
) -> TreeVerdict:
    """Greedy verification of a tree: from the root, descend into the child equal to the target's argmax; where
    none is, the argmax is the correction. drafted (N,), target_logits (N + 1, V): row 0 the root, row i + 1 node i;
    argmax as verify_greedy's."""
    N = drafted.shape[0]
    best = argmax(target_logits).tolist()  # (N + 1,)
    tokens, kids = drafted.tolist(), children_of(parents)
    acc, status, path, u = [math.nan] * N, [""] * N, [], -1
    while True:
        want, nxt = best[u + 1], None
        for c in kids[u + 1]:  # in order; at T = 0 every child but the argmax is turned down
            kept = tokens[c] == want
            acc[c], status[c] = float(kept), "kept" if kept else "rejected"
            if kept:
                nxt = c
                break
        if nxt is None:
            return TreeVerdict(tuple(path), want, tuple(acc), (math.nan,) * N, tuple(status))
        path.append(nxt)
        u = nxt


def drawn_without(q: torch.Tensor, tried: list[int]) -> torch.Tensor:
    """q (V,) with the tokens of the siblings drawn before removed, renormalised: what a child drawn from q without
    replacement was drawn from (a point mass is unchanged)."""
    if not tried:
        return q
    Q = q.clone()
    Q[tried] = 0.0
    return Q / Q.sum().clamp_min(1e-30)


def residual_after(p: torch.Tensor, q: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """What is left of p (V,) at a tree node whose children `tokens` were all turned down, in order (q (k, V): the
    row each was drawn from): the distribution the walk draws its correction from (verify_tree_sampled)."""
    P = p
    for j in range(len(tokens)):
        P = residual(P, drawn_without(q[j], tokens[:j]))
    return P


def verify_tree_sampled(
    drafted: torch.Tensor, parents: tuple[int, ...], q: torch.Tensor, p: torch.Tensor, generator: torch.Generator
) -> TreeVerdict:
    """Recursive rejection sampling over a tree (SpecInfer; Chen et al. 2023 for one child), exact for p.

    drafted (N,); q (N, V): node i was drawn from q[i] with its earlier siblings' tokens removed (renormalised):
    siblings sampled without replacement share their parent's row, a deterministic guess is a point mass
    (one-hot row); p (N + 1, V) the target's probabilities, row 0 the root, row i + 1 node i.
    At each node its children are tried in order: child x is kept with probability min(1, P(x) / Q(x)); on a
    rejection P <- norm(max(0, P - Q)) and the next child is tried against it; when none is kept the correction
    is drawn from P. A kept leaf gives the bonus token from p at the leaf. One draw r per tested child, in order.
    """
    N = drafted.shape[0]
    tokens, kids = drafted.tolist(), children_of(parents)
    acc, rs, status, path, u = [math.nan] * N, [math.nan] * N, [""] * N, [], -1
    while True:
        P, nxt, tried = p[u + 1], None, []
        for c in kids[u + 1]:
            x = tokens[c]
            Q = drawn_without(q[c], tried)  # a no-op on a point mass
            P_x, Q_x = float(P[x]), float(Q[x])
            a = min(1.0, P_x / Q_x) if Q_x > 0 else (1.0 if P_x > 0 else 0.0)
            r = float(torch.rand(1, generator=generator, device=p.device, dtype=torch.float32))
            acc[c], rs[c] = a, r
            if r < a:
                status[c], nxt = "kept", c
                break
            status[c] = "rejected"
            P = residual(P, Q)
            tried.append(x)
        if nxt is None:
            return TreeVerdict(tuple(path), sample(P, generator), tuple(acc), tuple(rs), tuple(status))
        path.append(nxt)
        u = nxt
