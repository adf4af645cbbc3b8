"""The chi-square test of sampled speculative output on its first two tokens, shared by the test files that run it
(test_drafters, test_lean, test_kernels, test_cuda ...): the target's exact law of those two tokens, their counts over seeded
runs, and the statistic."""

from __future__ import annotations

import math

import torch
from conftest import engine_config

from specviz.backends.served.target import eos_ids
from specviz.engine.loop import speculative_decode
from specviz.events import Round


def exact_two_token_law(m, ids):
    """The exact law of a model's first two tokens after ids: V*V pairs, then V one-token (EOS) endings; computed on
    the model's device, returned on the CPU."""
    V, dev = m.vocab_size, m.model.device
    with torch.no_grad():
        p1 = torch.softmax(m.model(torch.tensor([ids], device=dev)).logits[0, -1].float(), -1).cpu()
        nxt = torch.tensor([ids + [a] for a in range(V)], device=dev)
        p2 = torch.softmax(m.model(nxt).logits[:, -1].float(), -1).cpu()  # (V, V)
    eos = eos_ids(m)
    exact = (p1[:, None] * p2).flatten()
    for a in eos:  # after EOS nothing follows: its mass sits on (eos, -)
        exact.view(V, V)[a] = 0
    return torch.cat([exact, torch.tensor([float(p1[a]) if a in eos else 0.0 for a in range(V)])])


def two_token_counts(p, q, ids, n_runs: int, **cfg_kw):
    """Counts of the first two tokens of speculative runs over n_runs seeds, and the drafters that proposed."""
    V = p.vocab_size
    counts = torch.zeros(V * V + V)
    sources = set()
    for seed in range(n_runs):
        cfg = engine_config(max_new_tokens=2, seed=seed, temperature=1.0, **cfg_kw)
        events = list(speculative_decode(p, q, ids, cfg))
        sources.update(s for e in events if isinstance(e, Round) for s in e.sources)
        t = events[-1].token_ids
        counts[V * V + t[0] if len(t) == 1 else t[0] * V + t[1]] += 1
    return counts, sources


def chi2_z(counts, law, n):
    keep = law * n >= 5
    chi2 = float((((counts[keep] - n * law[keep]) ** 2) / (n * law[keep])).sum())
    dof = int(keep.sum()) - 1
    return (chi2 - dof) / math.sqrt(2 * dof)  # normal approximation
