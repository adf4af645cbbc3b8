"""The decoding loops: speculative (draft q proposes, target p verifies) and plain autoregressive.

Both are generators of `events`; both keep one KV cache per model and never re-encode the sequence.
Cache invariant: each model's cache holds every token of the sequence except its `pending` ones, which
are fed first on its next call. Notation: p target, q draft, gamma block size, n accepted count, r draw.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from transformers import DynamicCache

from .config import SpecConfig, SpecvizError
from .events import Candidates, Done, Event, Round, Start, Step
from .models import LoadedModel
from .sampling import greedy, relaxed, residual, sample, to_probs, verify_greedy, verify_sampled


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


class _Runner:
    """A causal LM with its KV cache; returns logits in the target's vocabulary (`vocab_size` wide)."""

    def __init__(self, lm: LoadedModel, vocab_size: int):
        self.lm, self.V = lm, vocab_size
        self.cache = DynamicCache(config=lm.model.config)
        self.length = 0  # tokens in the cache
        self.calls = 0

    def feed(self, ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """ids (L,) long on the model's device -> logits (L or 1, V); the cache grows by L."""
        return self._target_space(self._forward(ids, last_only))

    def next_greedy(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed ids (L,) and return the argmax next token as a (1,) target id.

        Greedy drafting needs no distribution: the argmax is taken in the model's own (maybe trimmed)
        vocabulary and mapped, so the V-wide logits are never built. Same token as greedy(feed(...)[-1]).
        """
        logits = self._forward(ids, last_only=True)[-1]  # (Vm,)
        if self.lm.vocab_map is not None:
            return self.lm.vocab_map[greedy(logits)].view(1)
        return greedy(logits[: self.V]).view(1)  # a padded head: the extra rows never count

    def _forward(self, ids: torch.Tensor, last_only: bool) -> torch.Tensor:
        """ids (L,) -> logits (L or 1, Vm) in the model's own vocabulary; the cache grows by L."""
        x = ids.view(1, -1)
        if self.lm.input_map is not None:  # a trimmed draft: target ids -> its own rows (unknown -> row 0)
            x = self.lm.input_map[x.clamp(max=self.lm.input_map.numel() - 1)]
        out = self.lm.model(
            input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=1 if last_only else 0
        )
        self.length += x.shape[1]
        self.calls += 1
        if self.lm.blocked_rows is not None:  # a draft's catch-all rows: q(x) = 0 there
            return out.logits[0].index_fill_(-1, self.lm.blocked_rows, -torch.inf)
        return out.logits[0]

    def _target_space(self, logits: torch.Tensor) -> torch.Tensor:
        """(L, Vm) -> (L, V): scatter a trimmed vocabulary, pad a smaller one with -inf, cut padding rows."""
        if self.lm.vocab_map is not None:
            full = logits.new_full((logits.shape[0], self.V), -torch.inf)
            return full.index_copy_(1, self.lm.vocab_map, logits)
        vm = logits.shape[-1]
        if vm > self.V:
            return logits[:, : self.V]
        if vm < self.V:
            return torch.nn.functional.pad(logits, (0, self.V - vm), value=-torch.inf)
        return logits

    def rollback(self, keep: int) -> None:
        if keep < self.length:
            self.cache.crop(keep - self.length)  # transformers 5: a negative count of tokens to remove
            self.length = keep


def eos_ids(lm: LoadedModel) -> frozenset[int]:
    ids = set()
    for src in (getattr(lm.model, "generation_config", None), lm.model.config, lm.tokenizer):
        e = getattr(src, "eos_token_id", None)
        ids.update(e if isinstance(e, (list, tuple)) else [e] if e is not None else [])
    return frozenset(int(i) for i in ids)


def _check_prompt(prompt_ids: list[int]) -> None:
    if not prompt_ids:
        raise SpecvizError("The prompt is empty; type something for the model to continue.")


def _cut(tokens: list[int], eos: frozenset[int], budget: int) -> tuple[list[int], bool]:
    """Tokens up to and including the first EOS, at most `budget`; and whether EOS ended it."""
    for i, t in enumerate(tokens[:budget]):
        if t in eos:
            return tokens[: i + 1], True
    return tokens[:budget], False


def _stats(
    mode: str, new: int, calls: int, draft_calls: int, drafted: int, accepted: int, extra: dict, wall: float
) -> dict:
    return {
        "mode": mode,
        "new_tokens": new,
        "target_calls": calls,
        "draft_calls": draft_calls,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "tokens_per_target_call": new / calls if calls else 0.0,
        "wall_s": wall,
        "tokens_per_s": new / wall if wall > 0 else 0.0,
        **extra,
    }


def _prefill(runner: _Runner, prompt: torch.Tensor) -> None:
    if prompt.numel() > 1:
        runner.feed(prompt[:-1], last_only=True)
        runner.calls -= 1  # the prompt pass is not a decoding call


@torch.inference_mode()
def autoregressive_decode(target: LoadedModel, prompt_ids: list[int], cfg: SpecConfig) -> Iterator[Event]:
    """Plain decoding of the target p, one forward call per token, with the same sampler and cache path."""
    _check_prompt(prompt_ids)
    s, eos, dev = cfg.sampling, eos_ids(target), target.device
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)
    clock = _Clock(dev)
    p_run = _Runner(target, target.vocab_size)
    prompt = torch.tensor(prompt_ids, device=dev)
    _prefill(p_run, prompt)
    prefill_s = clock.lap()
    yield Start("ar", tuple(prompt_ids), 0, s.temperature, prefill_s)
    clock.resume()
    pending, out, finish = prompt[-1:], [], "length"
    while len(out) < cfg.max_new_tokens:
        logits = p_run.feed(pending)[-1]  # (V,)
        if s.greedy:
            token, p_x = int(greedy(logits)), 1.0
        else:
            probs = to_probs(logits, s)
            token = sample(probs, gen)
            p_x = float(probs[token])
        dt = clock.lap()
        out.append(token)
        yield Step(len(out) - 1, token, p_x, dt, clock.total)
        clock.resume()
        if token in eos:
            finish = "eos"
            break
        pending = torch.tensor([token], device=dev)
    wall = clock.total
    yield Done(tuple(out), finish, _stats("ar", len(out), p_run.calls, 0, 0, 0, {"prefill_s": prefill_s}, wall))


def _candidates(p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[Candidates, ...]:
    """Top-k of p and of q at each position, for the step-through view. p, q (G, V) probabilities."""
    res = []
    for p_i, q_i in zip(p, q):
        ids = torch.unique(torch.cat([torch.topk(p_i, k).indices, torch.topk(q_i, k).indices]))
        ids = ids[torch.argsort(p_i[ids], descending=True)]
        res_i = residual(p_i, q_i)
        res.append(
            Candidates(
                tuple(ids.tolist()), tuple(p_i[ids].tolist()), tuple(q_i[ids].tolist()), tuple(res_i[ids].tolist())
            )
        )
    return tuple(res)


@torch.inference_mode()
def speculative_decode(
    target: LoadedModel, draft: LoadedModel, prompt_ids: list[int], cfg: SpecConfig
) -> Iterator[Event]:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1); each round yields 1..gamma+1 tokens."""
    _check_prompt(prompt_ids)
    s, eos, dev = cfg.sampling, eos_ids(target), target.device
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)
    clock = _Clock(dev)
    V = target.vocab_size
    p_run, q_run = _Runner(target, V), _Runner(draft, V)
    prompt = torch.tensor(prompt_ids, device=dev)
    _prefill(p_run, prompt)
    _prefill(q_run, prompt.to(draft.device))
    prefill_s = clock.lap()
    yield Start("spec", tuple(prompt_ids), cfg.gamma, s.temperature, prefill_s)
    clock.resume()

    p_pending, q_pending = prompt[-1:], prompt[-1:]
    out: list[int] = []
    counts = {"drafted": 0, "accepted": 0, "resampled": 0, "bonus": 0, "draft_s": 0.0, "verify_s": 0.0}
    finish, index = "length", 0
    while len(out) < cfg.max_new_tokens:
        gamma = min(cfg.gamma, cfg.max_new_tokens - len(out))  # no point drafting past the budget

        # 1. draft: q proposes gamma tokens, one cached call each
        q_base = q_run.length + len(q_pending)  # the draft's cache length once its pending tokens are in
        drafted, q_logits, x = [], [], q_pending.to(draft.device)
        for _ in range(gamma):
            if s.greedy and not cfg.detail:  # q's logits are not needed: argmax in q's own vocabulary
                x = q_run.next_greedy(x)
            else:
                logits = q_run.feed(x, last_only=True)[-1].to(dev)  # (V,)
                x = greedy(logits).view(1) if s.greedy else torch.multinomial(to_probs(logits, s), 1, generator=gen)
                q_logits.append(logits)
            drafted.append(x)
        drafted_t = torch.cat(drafted).to(dev)  # (gamma,)
        draft_s = clock.lap()

        # 2. verify: p scores every proposal, plus one position for the bonus, in ONE forward call
        p_logits = p_run.feed(torch.cat([p_pending, drafted_t]))[-(gamma + 1) :]  # (gamma+1, V)

        # 3. accept / resample
        if s.greedy:
            v = verify_greedy(drafted_t, p_logits)
        else:
            q_probs = to_probs(torch.stack(q_logits), s)  # (gamma, V): exactly what the draft sampled from
            p_probs = to_probs(p_logits, s)  # (gamma+1, V)
            if cfg.relaxed_w < 1.0:  # the lossy teaching switch: guessed positions checked against w·p + (1-w)·q
                p_probs[:gamma] = relaxed(p_probs[:gamma], q_probs, cfg.relaxed_w)
            v = verify_sampled(drafted_t, q_probs, p_probs, gen)
        verify_s = clock.lap()
        x_ids = drafted_t.tolist()
        n, kind = v.n, "bonus" if v.n == gamma else "resampled"

        # 4. roll back caches to the accepted prefix; the correction token is pending for both models
        p_run.rollback(p_run.length - (gamma - n))
        if n < gamma:
            q_run.rollback(q_base + n)
            q_pending = torch.tensor([v.correction], device=dev)
        else:  # the draft never fed its last proposal: it is pending along with the bonus token
            q_pending = torch.tensor([x_ids[-1], v.correction], device=dev)
        p_pending = torch.tensor([v.correction], device=dev)

        tokens, hit_eos = _cut(x_ids[:n] + [v.correction], eos, cfg.max_new_tokens - len(out))
        out.extend(tokens)
        counts["drafted"] += gamma
        counts["accepted"] += n
        counts[kind] += 1 if len(tokens) == n + 1 else 0  # a correction cut off by EOS/max is not emitted
        counts["draft_s"] += draft_s
        counts["verify_s"] += verify_s
        cands = ()
        if cfg.detail:
            s_view = s if not s.greedy else type(s)(1.0, s.top_k, s.top_p)  # greedy: show the T=1 shapes
            q_full = to_probs(torch.stack(q_logits + [q_logits[-1]]), s_view)  # the last row has no draft
            q_full[-1] = 0.0  # the bonus position: the draft proposed nothing there
            cands = _candidates(to_probs(p_logits, s_view), q_full, cfg.detail)
        clock.lap()
        yield Round(
            index,
            tuple(x_ids),
            v.q_x,
            v.p_x,
            v.accept_prob,
            v.r,
            n,
            v.correction,
            kind,
            tuple(tokens),
            draft_s,
            verify_s,
            clock.total,
            cands,
        )
        clock.resume()
        index += 1
        if hit_eos:
            finish = "eos"
            break

    extra = {"rounds": index, "prefill_s": prefill_s, **counts}
    stats = _stats(
        "spec", len(out), p_run.calls, q_run.calls, counts["drafted"], counts["accepted"], extra, clock.total
    )
    yield Done(tuple(out), finish, stats)


def race(ar: Iterator[Event], spec: Iterator[Event]) -> Iterator[tuple[str, Event]]:
    """Interleave two runs in one worker, always advancing the one that is behind on its own compute clock.

    Each run's clock stops while the other computes, so the merged stream is what two machines racing
    from the same start would show, without the two runs slowing each other down.
    """
    live = {"ar": ar, "spec": spec}
    clock = {"ar": 0.0, "spec": 0.0}
    while live:
        side = min(live, key=lambda k: clock[k])
        try:
            ev = next(live[side])
        except StopIteration:
            del live[side]
            continue
        clock[side] = getattr(ev, "elapsed_s", clock[side] + getattr(ev, "prefill_s", 0.0))
        yield side, ev
