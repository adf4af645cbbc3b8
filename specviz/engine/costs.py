"""What a forward call costs on this machine: the target over 1, 2, ... tokens, and one draft step.

`forward_times` is the measurement behind the step-through's verify-cost chart, the pair check's prediction
and the auto gamma policy. `calibration` memoises, per loaded model, what the auto policy needs; like loading
a model, it is paid once per process and is not part of any run's time (the run's Start event says how long
it took when it ran).
"""

from __future__ import annotations

import statistics
import time
import weakref

import torch

from specviz.backends import limits_of, open_run
from specviz.config import SamplingConfig
from specviz.models.loaded import LoadedModel
from specviz.native.linear import best_seconds


def forward_times(
    lm: LoadedModel, prompt_ids: list[int], max_tokens: int, reps: int = 5, vocab_size: int | None = None
) -> list[float]:
    """Median seconds of one forward pass over 1, 2, ... max_tokens new tokens, after the prompt is cached.

    This is the verify pass's shape: a cache holding the text so far, and a block of new tokens.
    The sizes are interleaved within each repetition so a busy machine slows all of them alike.
    """
    return [statistics.median(s) for s in forward_samples(lm, prompt_ids, max_tokens, reps, vocab_size)]


def read_bandwidth(nbytes: int = 512 << 20, reps: int = 5) -> float:
    """GB/s of one pass that only reads `nbytes` of memory (a sum over a float32 buffer that large, the best of `reps`
    after one untimed): the fastest a step can stream a model's weights at this moment, so a step's time over it is
    the memory-bound limit (scripts/cpu_costs.py). The bench prints it before and after a run: on a VM it moves with
    the neighbours, and with it every ratio (a verify's extra tokens are arithmetic, which slow memory hides and fast
    memory shows), so a speedup is read beside the bandwidth it was measured at."""
    big = torch.ones(nbytes // 4)
    return nbytes / 1e9 / best_seconds(big.sum, reps)


def relative_times(samples: list[list[float]]) -> list[float]:
    """Seconds per size from `forward_samples`, read against the one-token call of the same repetition: the median
    over repetitions of size / one-token, times the one-token call's median. What the bandwidth a VM gets does
    from second to second falls on a repetition's sizes alike and cancels, so the ratios spread less between draws
    than plain medians of the same calls do."""
    one = samples[0]
    return [statistics.median(t / o for t, o in zip(s, one)) * statistics.median(one) for s in samples]


@torch.inference_mode()
def forward_samples(
    lm: LoadedModel, prompt_ids: list[int], max_tokens: int, reps: int = 5, vocab_size: int | None = None
) -> list[list[float]]:
    """`reps` timings of a forward pass over each of 1 .. max_tokens new tokens (the sizes interleaved in each
    repetition, after one untimed repetition): samples[size - 1][rep]."""
    run = open_run(lm, vocab_size or lm.vocab_size)  # a trimmed-vocabulary draft needs the target's size; a served
    # target times its requests (each one a verify's: the text, the block, prompt logprobs)
    prompt = torch.tensor(prompt_ids, device=lm.device)
    run.prefill(prompt)
    base = run.length
    block = prompt.repeat(max_tokens // len(prompt_ids) + 1)[:max_tokens]  # (max_tokens,) any real tokens
    samples: list[list[float]] = [[] for _ in range(max_tokens)]
    for rep in range(reps + 1):  # the first repetition warms up
        for size in range(1, max_tokens + 1):
            dt = feed_seconds(run, block[:size], base, lm.device)
            if rep:
                samples[size - 1].append(dt)
    return samples


def feed_seconds(run, tokens: torch.Tensor, at: int, device: torch.device | None = None) -> float:
    """Seconds of one call feeding `tokens` to `run` (an open run holding `at` tokens), then rolled back to `at`:
    a verify's shape, timed as forward_samples and the A/B scripts time it (a GPU's queue waited for)."""
    if device is not None:
        _sync(device)
    t0 = time.perf_counter()
    run.feed(tokens)
    if device is not None:
        _sync(device)
    dt = time.perf_counter() - t0
    run.rollback(at)
    return dt


_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its times; freed with the model

CALIBRATION_REPS = 6  # interleaved calls per size: with fewer, auto's k follows the timing's noise


def monotone(times: list[float]) -> list[float]:
    """The closest non-decreasing curve to `times` (least squares: pool adjacent violators). A call over more
    tokens never costs less than one over fewer; a measured dip is noise, and so is the spike before it."""
    blocks: list[list[float]] = []  # [sum, count] of pooled neighbours
    for t in times:
        blocks.append([t, 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


@torch.inference_mode()
def draft_step_calibration(
    target, draft: LoadedModel, target_ids: list[int], draft_ids: list[int], vocab_size: int, greedy: bool = False
) -> tuple[list[float], float]:
    """([median seconds of a draft step right after a one-token target call, of the step after that], seconds spent
    now), once per (draft, target): the way a round pays for its first guess, after the verify has streamed the
    target's weights through the caches, and for each further one, with the draft's weights back in cache (the
    first costs clearly more than the later ones). A served target's calls run elsewhere: its draft's steps are timed back
    to back, both numbers alike. greedy: the steps a greedy round takes (`next_greedy`, or a lean draft's chain of
    one: no V-wide logits; the chain's later steps pay no Python, so the second number is a little high), else a
    sampled round's (a lean draft's sampled chain of one, or `feed`)."""
    if not limits_of(target).runs_here:
        (step,), spent = calibration(draft, draft_ids, 1, vocab_size=vocab_size)
        return [step, step], spent
    memo = _COLD_MEMO.setdefault(draft.model, weakref.WeakKeyDictionary()).setdefault(target.model, {})
    if greedy in memo:
        return memo[greedy], 0.0
    t0 = time.perf_counter()
    p_run, q_run = open_run(target, vocab_size), open_run(draft, vocab_size or draft.vocab_size)
    p_run.prefill(torch.tensor(target_ids, device=target.device))
    q_run.prefill(torch.tensor(draft_ids, device=draft.device))
    p_last, q_last = (
        torch.tensor(ids[-1:], device=lm.device) for ids, lm in ((target_ids, target), (draft_ids, draft))
    )
    p_base, q_base = p_run.length, q_run.length
    first, then = [], []

    draws = torch.Generator().manual_seed(0)

    def step() -> None:
        if greedy:
            if q_run.greedy_chain(q_last, 1) is None:
                q_run.next_greedy(q_last)
        elif q_run.sampled_chain(q_last, 1, 1.0, draws) is None:
            q_run.feed(q_last, last_only=True)

    for rep in range(CALIBRATION_REPS + 1):  # the first repetition warms up
        p_run.feed(p_last)  # what a round's verify does to the caches, untimed
        p_run.rollback(p_base)
        for times in (first, then):
            _sync(draft.device)
            t = time.perf_counter()
            step()
            _sync(draft.device)
            if rep:
                times.append(time.perf_counter() - t)
        q_run.rollback(q_base)
    memo[greedy] = [statistics.median(first), statistics.median(then)]
    return memo[greedy], time.perf_counter() - t0


def _sync(device: torch.device) -> None:
    """Wait for a GPU's queued work before reading the clock (a CPU's calls return when done)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


_COLD_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # draft -> {target: {greedy: [seconds]}}


@torch.inference_mode()
def tree_read_calibration(lm: LoadedModel, prompt_ids: list[int], vocab_size: int, greedy: bool = False, reps: int = 5):
    """([median seconds of one node read by a tree's draft], seconds spent now), once per loaded model and kind of
    read.

    A node read is what each draft call of a token tree costs (drafters.ModelDrafter._propose_tree): one cached
    call over one token that sees its ancestors only, the node's distribution and its top children. At T = 0
    (`greedy`) it is one native call where the draft has one (CachedModel.tree_read), else `feed_tree` and the
    distribution in torch; a chain's greedy step skips the mask and the distribution, so it costs less.
    """
    from specviz.drafters.model import TREE_CHILDREN
    from specviz.sampling import to_probs

    memo = _TREE_MEMO.setdefault(lm.model, {})
    if greedy in memo:
        return memo[greedy], 0.0
    t0 = time.perf_counter()
    run = open_run(lm, vocab_size)
    prompt = torch.tensor(prompt_ids, device=lm.device)
    run.prefill(prompt)
    if not run.supports_trees:  # its drafter proposes chains only
        memo[greedy] = [0.0]
        return memo[greedy], time.perf_counter() - t0
    base, s, times = run.length, SamplingConfig(1.0), []
    for _ in range(reps + 1):  # the first one warms up
        t = time.perf_counter()
        if not greedy or run.tree_read(prompt[-1:], base - 1, TREE_CHILDREN) is None:
            row = run.feed_tree(prompt[-1:], [base - 1])[-1]
            torch.topk(to_probs(row, s), min(TREE_CHILDREN, vocab_size))
        _sync(lm.device)
        times.append(time.perf_counter() - t)
        run.rollback(base)
    memo[greedy] = [statistics.median(times[1:])]
    return memo[greedy], time.perf_counter() - t0


_TREE_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {greedy: [its node read's seconds]}


@torch.inference_mode()
def head_calibration(head, reps: int = 5):
    """([seconds of one head step after a 32-pair prefill], seconds spent now), once per loaded head."""
    from specviz.models.head import HeadCache

    known = _MEMO.get(head)
    if known is not None:
        return known, 0.0
    t0 = time.perf_counter()
    dev, H = head.embed.device, head.cfg["hidden"]
    fast = getattr(head, "native", None)  # its forward by llama.c (head_native.py), where that runs here
    cache = fast.new_cache() if fast is not None else HeadCache()
    feats = torch.zeros(1, 33, H, device=dev, dtype=head.embed.dtype)
    toks = head.target_ids[:33].view(1, -1)

    def step(a: int, b: int) -> torch.Tensor:  # pairs a .. b - 1 -> the last one's logits over the head's rows
        pos = torch.arange(a + 1, b + 1, device=dev)
        if fast is not None:
            return fast.step(cache, toks[0, a:b], feats[0, a:b], pos)[1]
        return head.logits(head(toks[:, a:b], feats[:, a:b], pos, cache))

    step(0, 32)
    times = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        step(32, 33).argmax(-1)
        _sync(dev)
        times.append(time.perf_counter() - t)
        if fast is not None:
            cache.length = 32
        else:
            cache.crop(32)
    _MEMO[head] = [statistics.median(times[1:])]
    return _MEMO[head], time.perf_counter() - t0


def calibration(lm: LoadedModel, prompt_ids: list[int], max_tokens: int, vocab_size: int | None = None):
    """Seconds of a call over 1 .. max_tokens tokens for the auto policies: CALIBRATION_REPS repetitions read
    `relative_times` and made `monotone`, measured once per loaded model and reused.

    Returns (times, seconds spent measuring now: 0 when they were already known).
    """
    key = lm.model if isinstance(lm, LoadedModel) else lm  # a served target: itself
    known = _MEMO.get(key)
    if known is not None and len(known) >= max_tokens:
        return known[:max_tokens], 0.0
    t0 = time.perf_counter()
    times = monotone(relative_times(forward_samples(lm, prompt_ids, max_tokens, CALIBRATION_REPS, vocab_size)))
    _MEMO[key] = times
    return times, time.perf_counter() - t0
