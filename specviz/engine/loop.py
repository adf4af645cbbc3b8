"""The decoding loops: speculative (draft q proposes, target p verifies) and plain autoregressive.

Both are generators of `events`; both keep one KV cache per model and never re-encode the sequence.
The target's cache holds every token of the text but the last, which is fed first on its next call; a
drafter keeps its own state (drafters.py). The speculative loop reads as the paper does: 1. draft,
2. verify, 3. accept / resample, 4. roll back and update. Notation: p target, q draft, gamma (k) the
proposals of a round, n accepted count, r draw. A round whose proposal is a token tree (`_tree_round`) verifies
every node in one tree-masked call, walks the tree from the root (sampling.verify_tree_*) and keeps only the
accepted path in the target's cache; a chain's round is `_chain_round`. The step-through's candidates of each
round are detail.py's; what a run needs before its first round (drafter, policies, their calibration) is
setup.py's. The target runs through backends.TargetRun (`open_run`), whatever runs it: where the run says it
`decides` (a served target, which sends only some of p), steps 2-3 are its own; elsewhere p comes back and the rule
here decides.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import torch

from specviz.backends import TargetRun, eos_ids, keep_opening, open_run
from specviz.config import SpecConfig, SpecvizError
from specviz.drafters.model import DraftContext, Drafter, Proposal, translation_of
from specviz.drafters.policies import GammaPolicy, TreePolicy, chain_outcome
from specviz.engine.detail import chain_candidates, tree_candidates
from specviz.engine.setup import make_run
from specviz.engine.tally import Tally
from specviz.events import Done, Event, Round, Start, Step, TreeRound
from specviz.models.loaded import LoadedModel
from specviz.sampling import (
    relaxed,
    sample,
    to_probs,
    verify_greedy,
    verify_sampled,
    verify_tree_greedy,
    verify_tree_sampled,
)


class _Clock:
    """Seconds of this run's own compute; stopped while the consumer holds an event (see `race`)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.total = 0.0
        self._t = time.perf_counter()

    def lap(self) -> float:
        """Seconds since the last lap (synchronising the GPU so the time is real)."""
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        dt, self._t = now - self._t, now
        self.total += dt
        return dt

    def resume(self) -> None:
        self._t = time.perf_counter()


def _check_prompt(prompt_ids: list[int]) -> None:
    if not prompt_ids:
        raise SpecvizError("The prompt is empty; type something for the model to continue.")


def cut(tokens: list[int], eos: frozenset[int], budget: int) -> list[int]:
    """What a round may emit of `tokens`: up to and including the first EOS, and at most `budget` tokens."""
    for i, t in enumerate(tokens[:budget]):
        if t in eos:
            return tokens[: i + 1]
    return tokens[:budget]


def run_over(out: list[int], eos: frozenset[int], max_new_tokens: int) -> str | None:
    """The stop rule, one definition for every loop and the step-through: "eos" once an EOS token was emitted,
    "length" once the budget is spent, else None."""
    if out and out[-1] in eos:
        return "eos"
    return "length" if len(out) >= max_new_tokens else None


@torch.inference_mode()
def autoregressive_decode(target: LoadedModel, prompt_ids: list[int], cfg: SpecConfig) -> Iterator[Event]:
    """Plain decoding of the target p, one forward call per token, with the same sampler and cache path."""
    _check_prompt(prompt_ids)
    s, eos, dev = cfg.sampling, eos_ids(target), target.device
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)
    setup_s = keep_opening(target, target.vocab_size)  # once per process, off the clock (as the spec run's)
    clock = _Clock(dev)
    p_run = open_run(target, target.vocab_size)
    prompt = torch.tensor(prompt_ids, device=dev)
    p_run.prefill(prompt)
    start = Start(
        mode="ar",
        prompt_ids=tuple(prompt_ids),
        gamma=0,
        temperature=s.temperature,
        prefill_s=clock.lap(),
        calibration_s=setup_s,
        verify=p_run.verify_note(s, plain=True),
    )
    tally = Tally().add(start)
    yield start
    clock.resume()
    pending, out = prompt[-1:], []
    while (finish := run_over(out, eos, cfg.max_new_tokens)) is None:
        if p_run.decides:  # a served target: its engine's own greedy token or sample, one request
            token, p_x = p_run.next_token(pending.tolist(), s, gen)
        elif s.greedy:
            logits = p_run.feed(pending)[-1]  # (V,)
            token, p_x = int(p_run.argmax(logits)), 1.0
        else:
            probs = to_probs(p_run.feed(pending)[-1], s)  # (V,)
            token = sample(probs, gen)
            p_x = float(probs[token])
        dt = clock.lap()
        out.append(token)
        step = Step(index=len(out) - 1, token=token, p=p_x, forward_s=dt, elapsed_s=clock.total)
        tally.add(step)
        yield step
        clock.resume()
        pending = torch.tensor([token], device=dev)
    stats = {"mode": "ar", **tally.stats(), **p_run.run_stats(s, plain=True)}
    yield Done(token_ids=tuple(out), finish_reason=finish, stats=stats)


@dataclasses.dataclass(frozen=True)
class _SpecRun:
    """One speculative run's parts, set up once (`_open_spec`) and read by every round."""

    cfg: SpecConfig
    eos: frozenset[int]
    V: int  # the target's vocabulary: every p and q row is this wide
    device: torch.device
    p_run: TargetRun  # the target's cache, or its server (backends.base)
    drafter: Drafter
    policy: GammaPolicy
    tree: TreePolicy | None
    gen: torch.Generator  # the one seeded generator: the drafter's samples, then the verify's r's, then the resample
    clock: _Clock


@torch.inference_mode()
def speculative_decode(
    target: LoadedModel,
    draft: LoadedModel | None,
    prompt_ids: list[int],
    cfg: SpecConfig,
    drafter: Drafter | None = None,
) -> Iterator[Event]:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1); each round yields 1..k+1 tokens.

    Guesses come from `drafter` (default: the one cfg.drafter names, over `draft`), as many per round as
    cfg.gamma_policy allows. One seeded generator draws, in order: the drafter's samples, then the r's of
    the verify, then the resample.
    """
    _check_prompt(prompt_ids)
    run, start = _open_spec(target, draft, prompt_ids, cfg, drafter)
    tally = Tally().add(start)  # the run's counts: Done.stats is read from it (tally.py)
    yield start
    run.clock.resume()

    seq, out, index = list(prompt_ids), [], 0
    while (finish := run_over(out, run.eos, cfg.max_new_tokens)) is None:
        rd = _round(run, seq, index, budget=cfg.max_new_tokens - len(out))
        out.extend(rd.tokens)
        tally.add(rd)
        yield rd
        run.clock.resume()
        index += 1

    stats = {"mode": "spec", **tally.stats(), **run.p_run.run_stats(cfg.sampling)}
    yield Done(token_ids=tuple(out), finish_reason=finish, stats=stats)


def _open_spec(
    target: LoadedModel, draft: LoadedModel | None, prompt_ids: list[int], cfg: SpecConfig, drafter: Drafter | None
) -> tuple[_SpecRun, Start]:
    """Set a speculative run up: its drafter and policies (make_run), the seeded generator, the target's cache
    with the prompt in it, the drafter begun; and its Start event (prefill_s read off the run's clock)."""
    s, eos, dev, V = cfg.sampling, eos_ids(target), target.device, target.vocab_size
    drafter, policy, tree, calibration_s = make_run(target, draft, prompt_ids, cfg, drafter)
    calibration_s += keep_opening(target, V) + (keep_opening(draft, V) if draft is not None else 0.0)
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)
    clock = _Clock(dev)
    p_run = open_run(target, V)
    prompt_h = p_run.prefill(torch.tensor(prompt_ids, device=dev), hidden=drafter.wants_hidden)
    if tree is not None and not p_run.supports_trees:
        raise SpecvizError(
            f"Token trees need a model with a plain KV cache; {target.name} has another kind: use tree off."
        )
    drafter.begin(list(prompt_ids), prompt_h)
    start = Start(mode="spec", prompt_ids=tuple(prompt_ids), gamma=cfg.gamma, temperature=s.temperature,
                  prefill_s=clock.lap(), drafter=drafter.name, gamma_policy=policy.name,
                  calibration_s=calibration_s, translation=translation_of(drafter, s),
                  tree=tree.name if tree is not None else "", verify=p_run.verify_note(s))  # fmt: skip
    run = _SpecRun(
        cfg=cfg, eos=eos, V=V, device=dev, p_run=p_run, drafter=drafter, policy=policy, tree=tree, gen=gen, clock=clock
    )
    return run, start


def _round(run: _SpecRun, seq: list[int], index: int, budget: int) -> Round:
    """One round: 1. draft, then 2-4 for a chain (`_chain_round`) or a token tree (`_tree_round`); its tokens cut
    at EOS or the `budget` of tokens left and added to `seq`, its elapsed_s and draft calls set."""
    s, cfg, draft_calls = run.cfg.sampling, run.cfg, run.drafter.calls
    # 1. draft: the drafter proposes k tokens (k may be 0, never past the budget) and the q each came from
    need_q = not s.greedy or bool(cfg.detail)
    ctx = DraftContext(
        s, run.gen, run.V, run.device, run.policy, budget, need_q=need_q, tree=run.tree, argmax=run.p_run.argmax
    )
    prop = run.drafter.propose(seq, ctx)
    draft_s = run.clock.lap()
    if prop.is_tree:
        rd, shown = _tree_round(run, seq, prop, index, draft_s)
    else:
        rd, shown = _chain_round(run, seq, prop, index, draft_s), None
    tokens = cut(list(rd.tokens), run.eos, budget)  # a cut correction: not emitted
    seq.extend(tokens)
    run.clock.lap()
    calls = run.drafter.calls - draft_calls
    rd = dataclasses.replace(rd, tokens=tuple(tokens), elapsed_s=run.clock.total, draft_calls=calls)
    if shown is not None:  # a greedy tree's p(x) at each node's parent: only the page reads it, so off the clock
        p_node = tuple(_p_at_parents(run.p_run, None, shown, prop.parents, prop.tokens))
        rd = dataclasses.replace(rd, tree=dataclasses.replace(rd.tree, p=p_node))
    return rd


def _chain_round(run: _SpecRun, seq: list[int], prop: Proposal, index: int, draft_s: float) -> Round:
    """Verify a chain of k guesses in one target call, accept / resample, roll back; the Round (its tokens not yet
    cut at EOS or the budget, its elapsed_s not yet set)."""
    p_run, drafter, policy, clock = run.p_run, run.drafter, run.policy, run.clock
    s, gen, cfg = run.cfg.sampling, run.gen, run.cfg
    x, k = prop.tokens, int(prop.tokens.numel())  # (k,)
    # 2. verify: p scores every proposal, plus one position for the bonus, in ONE forward call
    fed = torch.tensor(seq[-1:], device=run.device)
    v, hidden = None, None
    if p_run.decides:  # 2-3 in one request: a served target's engine scores, its numbers decide (backends/served)
        v, p_logits = p_run.verify(seq[-1:], x.tolist(), prop.q if k and not s.greedy else None, s, gen)
    elif drafter.wants_hidden:
        p_logits, hidden = p_run.feed(torch.cat([fed, x]), hidden=True)
    else:
        p_logits = p_run.feed(torch.cat([fed, x]))  # (k+1, V)

    # 3. accept / resample (k = 0: a plain target step)
    if v is None and s.greedy:
        v = verify_greedy(x, p_logits, p_run.argmax)
    elif v is None:
        q = prop.q if k else p_logits.new_zeros(0, run.V)  # (k, V): exactly what the drafter drew from
        p_probs = to_probs(p_logits, s)  # (k+1, V)
        if cfg.relaxed_w < 1.0:  # the lossy teaching switch: guessed positions checked against w·p + (1-w)·q
            p_probs[:k] = relaxed(p_probs[:k], q, cfg.relaxed_w)
        v = verify_sampled(x, q, p_probs, gen)
    verify_s = clock.lap()
    x_ids, n = x.tolist(), v.n
    kind = "plain" if k == 0 else "bonus" if n == k else "resampled"

    # 4. roll back the target's cache to the accepted prefix; tell the drafter and the policy
    p_run.rollback(p_run.length - (k - n))
    drafter.update(n, v.correction, hidden[: n + 1] if hidden is not None else None)
    policy.update(prop.key or drafter.name, k, n, draft_s, verify_s)
    cands = chain_candidates(prop, p_logits, s, cfg.detail) if cfg.detail else ()
    return Round(index=index, drafted=tuple(x_ids), q=v.q_x, p=v.p_x, accept_prob=v.accept_prob, r=v.r, n=n,
                 correction=v.correction, kind=kind, tokens=tuple(x_ids[:n] + [v.correction]), draft_s=draft_s,
                 verify_s=verify_s, elapsed_s=0.0, candidates=cands,
                 sources=prop.sources, planned=prop.planned, stop=prop.stop, origins=prop.origins)  # fmt: skip


def _tree_round(run: _SpecRun, seq: list[int], prop: Proposal, index: int, draft_s: float):
    """Verify a token tree in one target call, walk it, keep the accepted path in the cache; the Round (its
    tokens not yet cut at EOS or the budget, its elapsed_s not yet set), and at T = 0 the verify's scores (N + 1, V),
    from which `_round` reads the tree's p(x) at T = 1 once the round's clock has stopped (else None: p is filled).
    Greedy decoding never reads those p: plain decoding's steps show p = 1 and a chain's rounds their verdicts, so
    they are the page's work, not the models' (a small share of a tree round)."""
    p_run, drafter, policy, tree, clock = run.p_run, run.drafter, run.policy, run.tree, run.clock
    s, gen, cfg = run.cfg.sampling, run.gen, run.cfg
    x, N = prop.tokens, int(prop.tokens.numel())  # (N,)
    # 2. verify: the text's last token (the root) and every node after the cache, each seeing its ancestors only
    base = p_run.length  # the root's row
    rows = [base - 1] + [base if par < 0 else base + 1 + par for par in prop.parents]
    fed = torch.cat([torch.tensor(seq[-1:], device=x.device), x])
    if drafter.wants_hidden:
        p_logits, hidden = p_run.feed_tree(fed, rows, hidden=True)
    else:
        p_logits, hidden = p_run.feed_tree(fed, rows), None  # (N + 1, V): row 0 the root, row i + 1 node i
    # 3. the walk: descend into a kept child at each node; stop at a leaf (bonus) or where every child is turned down
    if s.greedy:
        v = verify_tree_greedy(x, prop.parents, p_logits, p_run.argmax)
        p_probs = None
    else:
        p_probs = to_probs(p_logits, s)  # (N + 1, V)
        v = verify_tree_sampled(x, prop.parents, prop.q, p_probs, gen)
    verify_s = clock.lap()
    # 4. keep the root and the accepted path in the target's cache; tell the drafter and the policies
    path = list(v.path)
    p_run.keep_path(base, [base] + [base + 1 + i for i in path])
    drafter.update(v.n, v.correction, hidden[[0] + [1 + i for i in path]] if hidden is not None else None)
    stop_node = path[-1] if path else -1
    tried = [i for i, par in enumerate(prop.parents) if par == stop_node]  # children of where the walk stopped
    line = path + tried[:1]  # the walked line: the accepted path, then the first child turned down there
    policy.update(prop.key or drafter.name, *chain_outcome(prop.parents, prop.ranks, path), draft_s, verify_s)
    tree.update(prop.said, prop.ranks, prop.parents, path, [st == "kept" for st in v.status])
    ids = x.tolist()
    p_node = (
        _p_at_parents(p_run, p_probs, p_logits, prop.parents, x) if p_probs is not None else ()
    )  # greedy: `_round`'s
    q_node = prop.q[torch.arange(N), x].tolist() if prop.q is not None else list(prop.said) or [1.0] * N
    tr = TreeRound(tokens=tuple(ids), parents=prop.parents, ranks=prop.ranks, sources=prop.sources,
                   p=tuple(p_node), q=tuple(q_node), accept_prob=v.accept_prob, r=v.r, status=v.status,
                   path=v.path)  # fmt: skip
    greedy_mode = s.greedy
    cands = tree_candidates(prop, line, v.n, p_logits, s, cfg.detail) if cfg.detail else ()
    rd = Round(index=index, drafted=tuple(ids[i] for i in line),
               q=tuple(1.0 if greedy_mode else q_node[i] for i in line),
               p=tuple(v.accept_prob[i] if greedy_mode else p_node[i] for i in line),
               accept_prob=tuple(v.accept_prob[i] for i in line), r=tuple(v.r[i] for i in line), n=v.n,
               correction=v.correction, kind="resampled" if tried else "bonus",
               tokens=tuple(ids[i] for i in path) + (v.correction,), draft_s=draft_s, verify_s=verify_s,
               elapsed_s=0.0, candidates=cands, sources=tuple(prop.sources[i] for i in line), planned=prop.planned,
               stop=prop.stop, tree=tr)  # fmt: skip
    return rd, (p_logits if p_probs is None else None)


def _p_at_parents(p_run: TargetRun, p_probs, p_logits: torch.Tensor, parents: tuple[int, ...], x: torch.Tensor):
    """Each tree node's p(x) at its parent: from the verify's probabilities where it sampled, else (greedy) p at T = 1
    on the parents' rows only (a softmax of every row of the verify, every round, was most of that work), by the
    run's fastest way (TargetRun.probs_at)."""
    if p_probs is not None:
        return p_probs[[par + 1 for par in parents], x].tolist()
    return p_run.probs_at(p_logits, [par + 1 for par in parents], x.tolist())


def race(*runs: Iterator[Event], names: tuple[str, ...] | None = None) -> Iterator[tuple[str, Event]]:
    """Interleave runs (lanes) in one worker, always advancing the one that is behind on its own compute clock.

    Each run's clock stops while the others compute, so the merged stream is what machines racing from the
    same start would show, without the runs slowing each other down. Lanes are named by `names`; two runs
    default to ("ar", "spec"), more to ("ar", "spec", "spec2", ...).
    """
    names = names or ("ar", "spec", *(f"spec{i}" for i in range(2, len(runs))))[: len(runs)]
    if len(names) != len(runs) or len(set(names)) != len(names):
        raise ValueError("race() needs one distinct name per run.")
    live = dict(zip(names, runs))
    clock = dict.fromkeys(names, 0.0)
    while live:
        side = min(live, key=lambda k: clock[k])
        try:
            ev = next(live[side])
        except StopIteration:
            del live[side]
            continue
        clock[side] = getattr(ev, "elapsed_s", clock[side] + getattr(ev, "prefill_s", 0.0))
        yield side, ev
