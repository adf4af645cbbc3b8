"""The decoding loops: speculative (draft q proposes, target p verifies) and plain autoregressive.

Both are generators of `events`; both keep one KV cache per model and never re-encode the sequence.
The target's cache holds every token of the text but the last, which is fed first on its next call; a
drafter keeps its own state (drafters.py). The speculative loop reads as the paper does: 1. draft,
2. verify, 3. accept / resample, 4. roll back and update. Notation: p target, q draft, gamma (k) the
proposals of a round, n accepted count, r draw. A round whose proposal is a token tree (`_tree_round`) verifies
every node in one tree-masked call, walks the tree from the root (sampling.verify_tree_*) and keeps only the
accepted path in the target's cache; chains take the unchanged path.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import torch

from .config import TREE_AUTO_MAX, SamplingConfig, SpecConfig, SpecvizError
from .costs import calibration, head_calibration
from .drafters import DraftContext, Drafter, LookupDrafter, Proposal, make_drafter, translation_of
from .events import Candidates, Done, Event, Round, Start, Step, TreeRound
from .head import head_for
from .models import CachedModel, LoadedModel
from .policies import TreePolicy, make_policy
from .sampling import (
    greedy,
    relaxed,
    residual,
    residual_after,
    sample,
    to_probs,
    verify_greedy,
    verify_sampled,
    verify_tree_greedy,
    verify_tree_sampled,
)
from .served import ServedRun, ServedTarget, open_run
from .tally import Tally
from .translate import draft_ids


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


def eos_ids(lm: LoadedModel | ServedTarget) -> frozenset[int]:
    if isinstance(lm, ServedTarget):  # read from its tokenizer's config when it connected
        return lm.eos
    ids = set()
    for src in (getattr(lm.model, "generation_config", None), lm.model.config, lm.tokenizer):
        e = getattr(src, "eos_token_id", None)
        ids.update(e if isinstance(e, (list, tuple)) else [e] if e is not None else [])
    return frozenset(int(i) for i in ids)


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
    clock = _Clock(dev)
    p_run = open_run(target, target.vocab_size)
    prompt = torch.tensor(prompt_ids, device=dev)
    p_run.prefill(prompt)
    start = Start(mode="ar", prompt_ids=tuple(prompt_ids), gamma=0, temperature=s.temperature,
                  prefill_s=clock.lap(), verify=_served_note(target, s, plain=True))  # fmt: skip
    tally = Tally().add(start)
    yield start
    clock.resume()
    pending, out = prompt[-1:], []
    while (finish := run_over(out, eos, cfg.max_new_tokens)) is None:
        if isinstance(p_run, ServedRun):  # the engine's own greedy token or sample, one request
            token, p_x = p_run.next_token(pending.tolist(), s, gen)
        elif s.greedy:
            logits = p_run.feed(pending)[-1]  # (V,)
            token, p_x = int(greedy(logits)), 1.0
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
    stats = {"mode": "ar", **tally.stats(), **_served_stats(p_run, s, plain=True)}
    yield Done(token_ids=tuple(out), finish_reason=finish, stats=stats)


def _candidates(p: torch.Tensor, q: torch.Tensor, k: int, left: dict | None = None) -> tuple[Candidates, ...]:
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


def make_run(
    target: LoadedModel, draft: LoadedModel | None, prompt_ids: list[int], cfg: SpecConfig, drafter: Drafter | None
):
    """The drafter and gamma policy of one run (auto measures the verify costs once per model first).

    Returns (drafter, gamma policy, tree policy or None, seconds spent measuring now).
    """
    V = target.vocab_size
    if isinstance(target, ServedTarget):
        _check_served(cfg)
    lookup = dict(prompt_lookup_num_tokens=cfg.prompt_lookup_num_tokens,
                  max_matching_ngram_size=cfg.max_matching_ngram_size)  # fmt: skip
    head = head_for(target, cfg.head) if drafter is None and cfg.drafter.endswith("head") else None
    drafter = drafter or make_drafter(cfg.drafter, draft, V, head=head, target=target, **lookup)
    verify_s, step_s, spent, paid = [], 0.0, 0.0, "model"
    tree_auto = cfg.tree == "auto"
    if cfg.gamma_policy == "auto" or tree_auto:
        verify_s, spent = calibration(target, prompt_ids, max(cfg.gamma, TREE_AUTO_MAX if tree_auto else 0) + 1)
        if head is not None:  # one head step, for its cost
            (step_s,), spent_q = head_calibration(head)
            spent, paid = spent + spent_q, "head"
        elif draft is not None and not isinstance(drafter, LookupDrafter):  # a draft model's step, for its cost
            (step_s,), spent_q = calibration(draft, draft_ids(target, draft, prompt_ids), 1, vocab_size=V)
            spent += spent_q
    policy = make_policy(cfg.gamma_policy, cfg.gamma, cfg.confidence, verify_s[: cfg.gamma + 1], step_s, paid)
    tree = None
    if cfg.tree != "off":
        tree = TreePolicy(None if tree_auto else cfg.tree, TREE_AUTO_MAX if tree_auto else cfg.tree, verify_s, step_s)
    return drafter, policy, tree, spent


def _detail(prop: Proposal, p_logits: torch.Tensor, s: SamplingConfig, k: int) -> tuple[Candidates, ...]:
    """Top candidates of p and q at each proposed position and the bonus one (the step-through view)."""
    s_view = s if not s.greedy else SamplingConfig(1.0, s.top_k, s.top_p)  # greedy: show the T=1 shapes
    V = p_logits.shape[-1]
    if prop.q_logits:
        q_rows = to_probs(torch.stack(prop.q_logits), s_view)  # (k, V)
    else:  # a deterministic drafter: point masses
        q_rows = torch.nn.functional.one_hot(prop.tokens, V).float()
    q_full = torch.cat([q_rows, q_rows.new_zeros(1, V)])  # (k+1, V): the bonus position has no draft
    return _candidates(to_probs(p_logits, s_view), q_full, k)


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
    s, eos, dev, V = cfg.sampling, eos_ids(target), target.device, target.vocab_size
    drafter, policy, tree, calibration_s = make_run(target, draft, prompt_ids, cfg, drafter)
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
                  tree=tree.name if tree is not None else "", verify=_served_note(target, s))  # fmt: skip
    tally = Tally().add(start)  # the run's counts: Done.stats is read from it (tally.py)
    yield start
    clock.resume()

    seq, out = list(prompt_ids), []
    index, draft_calls = 0, drafter.calls
    while (finish := run_over(out, eos, cfg.max_new_tokens)) is None:
        # 1. draft: the drafter proposes k tokens (k may be 0, never past the budget) and the q each came from
        budget = cfg.max_new_tokens - len(out)
        ctx = DraftContext(s, gen, V, dev, policy, budget, need_q=not s.greedy or bool(cfg.detail), tree=tree)
        prop = drafter.propose(seq, ctx)
        x, k = prop.tokens, int(prop.tokens.numel())  # (k,)
        draft_s = clock.lap()
        if prop.is_tree:  # 2-4 for a token tree: one verify call for every node, a walk from the root
            rd = _tree_round(p_run, seq, prop, s, gen, drafter, policy, tree, cfg, index, draft_s, clock)
            tokens = cut(list(rd.tokens), eos, cfg.max_new_tokens - len(out))
            seq.extend(tokens)
            out.extend(tokens)
            clock.lap()
            rd = dataclasses.replace(rd, tokens=tuple(tokens), elapsed_s=clock.total,
                                     draft_calls=drafter.calls - draft_calls)  # fmt: skip
            draft_calls = drafter.calls
            tally.add(rd)
            yield rd
            clock.resume()
            index += 1
            continue

        # 2. verify: p scores every proposal, plus one position for the bonus, in ONE forward call
        fed = torch.tensor(seq[-1:], device=dev)
        v, hidden = None, None
        if isinstance(p_run, ServedRun):  # 2-3 in one request: the engine scores, its numbers decide (served.py)
            v, p_logits = p_run.verify(seq[-1:], x.tolist(), prop.q if k and not s.greedy else None, s, gen)
        elif drafter.wants_hidden:
            p_logits, hidden = p_run.feed(torch.cat([fed, x]), hidden=True)
        else:
            p_logits = p_run.feed(torch.cat([fed, x]))  # (k+1, V)

        # 3. accept / resample (k = 0: a plain target step)
        if v is None and s.greedy:
            v = verify_greedy(x, p_logits)
        elif v is None:
            q = prop.q if k else p_logits.new_zeros(0, V)  # (k, V): exactly what the drafter drew from
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
        tokens = cut(x_ids[:n] + [v.correction], eos, cfg.max_new_tokens - len(out))  # a cut correction: not emitted
        seq.extend(tokens)
        out.extend(tokens)
        cands = _detail(prop, p_logits, s, cfg.detail) if cfg.detail else ()
        clock.lap()
        rd = Round(index=index, drafted=tuple(x_ids), q=v.q_x, p=v.p_x, accept_prob=v.accept_prob, r=v.r, n=n,
                   correction=v.correction, kind=kind, tokens=tuple(tokens), draft_s=draft_s, verify_s=verify_s,
                   elapsed_s=clock.total, draft_calls=drafter.calls - draft_calls, candidates=cands,
                   sources=prop.sources, planned=prop.planned, stop=prop.stop, origins=prop.origins)  # fmt: skip
        draft_calls = drafter.calls
        tally.add(rd)
        yield rd
        clock.resume()
        index += 1

    stats = {"mode": "spec", **tally.stats(), **_served_stats(p_run, s)}
    yield Done(token_ids=tuple(out), finish_reason=finish, stats=stats)


def _tree_round(p_run: CachedModel, seq: list[int], prop: Proposal, s: SamplingConfig, gen: torch.Generator,
                drafter: Drafter, policy, tree: TreePolicy, cfg: SpecConfig, index: int, draft_s: float,
                clock: _Clock) -> Round:  # fmt: skip
    """Verify a token tree in one target call, walk it, keep the accepted path in the cache; the Round (its
    tokens not yet cut at EOS or the budget, its elapsed_s not yet set)."""
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
        v = verify_tree_greedy(x, prop.parents, p_logits)
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
    policy.update(prop.key or drafter.name, len(line), v.n, draft_s, verify_s)
    tree.update(prop.said, prop.ranks, prop.parents, path, [st == "kept" for st in v.status])
    ids = x.tolist()
    view = p_probs if p_probs is not None else to_probs(p_logits, SamplingConfig(1.0))  # p at T = 1 when greedy
    p_node = view[[par + 1 for par in prop.parents], x].tolist()  # (N,) p(x) at each node's parent
    q_node = prop.q[torch.arange(N), x].tolist() if prop.q is not None else [1.0] * N
    tr = TreeRound(tokens=tuple(ids), parents=prop.parents, ranks=prop.ranks, sources=prop.sources,
                   p=tuple(p_node), q=tuple(q_node), accept_prob=v.accept_prob, r=v.r, status=v.status,
                   path=v.path)  # fmt: skip
    greedy_mode = s.greedy
    cands = _tree_detail(prop, line, v.n, p_logits, s, cfg.detail) if cfg.detail else ()
    return Round(index=index, drafted=tuple(ids[i] for i in line),
                 q=tuple(1.0 if greedy_mode else q_node[i] for i in line),
                 p=tuple(v.accept_prob[i] if greedy_mode else p_node[i] for i in line),
                 accept_prob=tuple(v.accept_prob[i] for i in line), r=tuple(v.r[i] for i in line), n=v.n,
                 correction=v.correction, kind="resampled" if tried else "bonus",
                 tokens=tuple(ids[i] for i in path) + (v.correction,), draft_s=draft_s, verify_s=verify_s,
                 elapsed_s=0.0, candidates=cands, sources=tuple(prop.sources[i] for i in line), planned=prop.planned,
                 stop=prop.stop, tree=tr)  # fmt: skip


def _tree_detail(prop: Proposal, line: list[int], n: int, p_logits: torch.Tensor, s: SamplingConfig, k: int):
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
    return _candidates(p, q, k, left)


def _served_mode(target: ServedTarget, s: SamplingConfig, plain: bool) -> str:
    """How a served target decides under s: "greedy", "exact", "approximate: top-20" (served.verify_mode), or for
    the plain lane at T > 0 "engine sample" (the engine samples from its own p: exact at any temperature)."""
    return "engine sample" if plain and not s.greedy else target.verify_mode(s)


def _served_note(target, s: SamplingConfig, plain: bool = False) -> str:
    """Start.verify: "served " + _served_mode for a served target; "" for a local one."""
    return f"served {_served_mode(target, s, plain)}" if isinstance(target, ServedTarget) else ""


def _served_stats(p_run, s: SamplingConfig, plain: bool = False) -> dict:
    """A served run's requests and their seconds, and how it decided; nothing for a local run."""
    return {**p_run.stats, "verify": _served_mode(p_run.t, s, plain)} if isinstance(p_run, ServedRun) else {}


def _check_served(cfg: SpecConfig) -> None:
    if cfg.drafter.endswith("head"):
        raise SpecvizError(
            "The head drafters read the target's hidden states, which a served target does not send; "
            "use model, lookup or lookup+model."
        )
    if cfg.relaxed_w < 1.0:
        raise SpecvizError(
            "Relaxed verification needs all of p at every position, which a served target does not send."
        )
    if cfg.tree != "off":
        raise SpecvizError(
            "Token trees need a tree-masked verify, which a served target's API does not offer; use chains."
        )


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
