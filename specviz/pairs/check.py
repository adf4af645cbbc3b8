"""The pair check: can this draft q serve this target p, and is it worth it?

Three questions, in order: do the two tokenizers give every token id the same meaning (if not, stop:
the draft's proposals would be nonsense to the target); what does a draft step cost relative to a target
step (c); how often does the target accept the draft's greedy proposals (alpha, written `a` here as in
the formula). From a and c the expected speedup for each block size gamma follows (Leviathan et al. 2023,
Theorem 3.8): (1 - a^(gamma+1)) / ((1 - a)(gamma c + 1)). That formula lives in theory.py; a and c are read from
the decoding runs' tally.Tally (measured in the decode loops, as the benchmark and the sweep measure them). The
prediction the verdict and the recommended gamma rest on prices a round of each gamma from the rounds the acceptance
runs paid, against the plain steps beside them (pairs.measure.RoundCosts), with the tokens a round yields from the
acceptance measured per draft position (Acceptance.alphas: a first guess is kept less often than a later one whose
predecessor was), and the report gives what those runs gained, measured, beside it.

The measurements are pairs/measure.py, the findings in sentences pairs/verdict.py, the report pairs/report.py and
the tokenizer comparison translate.compare_tokenizers; this module runs the check.
"""

from __future__ import annotations

import time

import torch

from specviz.backends import limits_of
from specviz.backends.served.connect import ServedTarget, engine_step_s, is_url, load_served_pair
from specviz.config import CHECK_DRAFTERS, GAMMA_MAX, TREE_DRAFTERS, SpecvizError
from specviz.engine.costs import forward_times
from specviz.engine.tally import with_prefill
from specviz.models.loaded import LoadedModel, load_pair, pair_dtypes, vocab_gap
from specviz.models.translate import compare_tokenizers, needs_translation
from specviz.pairs.deploy import with_card
from specviz.pairs.measure import CHECK_GAMMA, RoundCosts, acceptance_by_kind, measure_trees
from specviz.pairs.report import PairReport
from specviz.pairs.verdict import tokenizer_findings, translation_findings, tree_advice, worth_verdict
from specviz.request import RunRequest
from specviz.theory import expected_speedup, expected_speedup_measured, speedup_table  # noqa: F401  (expected_speedup: re-exported)

SAMPLE_PROMPTS: dict[str, tuple[str, ...]] = {  # a user's prompts differ: acceptance is measured per kind
    "chat": ("Tell me about gravity.", "What is the capital of France, and why is it famous?"),
    "story": ("Write a short story about a lighthouse keeper.", "Write a short poem about the sea."),
    "code": ("def fibonacci(n):", "Write a Python function that checks whether a word is a palindrome."),
    "summarise": (
        "Summarise this text: The town library will open on Sundays from May. It will also lend board games, "
        "and children under twelve can join a reading club that meets every Saturday morning.",
        "Summarise this text in one sentence: Glaciers form where more snow falls in winter than melts in summer. "
        "Over many years the snow is pressed into ice, which slowly flows downhill under its own weight.",
    ),
}
MEASURED_GAMMAS = range(1, 9)  # the verify cost is measured for blocks of 2 .. 9 tokens


def check_pair(
    target: str | LoadedModel | None = None,
    draft: str | LoadedModel | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    max_new_tokens: int = 32,
    prompts: list[str] | tuple[str, ...] | dict[str, tuple[str, ...]] | None = None,
    timeout_s: float | None = None,
    drafter: str = "model",
    quantize: str | None = None,
    tokenizer: str | None = None,
) -> PairReport:
    """Load p and q, compare their tokenizers, then (if they match) measure c and a; see PairReport.

    target/draft: a hub id, a folder, a LoadedModel, or None for the built-in pair; target may be a served
    target's address or ServedTarget (served.py; tokenizer: its tokenizer, default the server's model name).
    drafter: where the guesses come from (model, lookup, lookup+model); lookup alone costs no draft calls (c = 0).
    prompts: texts for the acceptance run, formatted as `generate` would: a list, or a dict kind -> texts
    (default: SAMPLE_PROMPTS, two each of chat, story, code and summarise; a is also given per kind).
    timeout_s: a cap on the measuring, from the call on (loading included); past it, one SpecvizError.
    quantize: "4bit" (NF4) or "8bit" (int8) loads the target with bitsandbytes (the draft stays as it is).
    """
    from specviz.api import encode_prompt

    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    cfg = RunRequest(
        drafter=drafter, gamma=CHECK_GAMMA, tree="off", max_new_tokens=max_new_tokens
    ).spec  # validates them up front
    if drafter not in CHECK_DRAFTERS:
        raise SpecvizError(f"The pair check measures the {', '.join(CHECK_DRAFTERS)} drafters, not {drafter!r}.")
    if prompts is None:
        prompts = SAMPLE_PROMPTS
    if isinstance(prompts, str):
        prompts = (prompts,)
    kinds = {k: tuple(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {"given": tuple(prompts)}
    texts = [x for v in kinds.values() for x in v]
    if not texts or not all(isinstance(x, str) and x.strip() for x in texts):
        raise SpecvizError("prompts must be a list of non-empty texts.")
    if is_url(target) or isinstance(target, ServedTarget):
        p, q = load_served_pair(target, draft, tokenizer=tokenizer, device=device, dtype=dtype)
    else:
        p, q = load_pair(target, draft, device=device, dtype=dtype, quantize=quantize, check_vocab=False)

    t = compare_tokenizers(p.tokenizer, q.tokenizer)
    translated, extra = needs_translation(p, q), {}
    if translated:  # another tokenizer: the guesses go through text (translate.py); refused only if that cannot work
        bad, warnings, extra = translation_findings(p, q, t)
    else:
        gap = vocab_gap(p, q)
        if gap:  # what load_pair refuses for every other path
            raise SpecvizError(gap)
        bad, warnings = tokenizer_findings(t)
    base = dict(
        target=p.name,
        draft=q.name,
        tokenizer=t,
        device=str(p.device),
        dtype=pair_dtypes(p, q),
        target_params=p.n_params,
        draft_params=q.n_params,
        target_memory_bytes=p.memory_bytes,
        draft_memory_bytes=q.memory_bytes,
        target_precision=p.precision,
        draft_precision=q.precision,
        target_vocab_rows=p.vocab_size,
        draft_vocab_rows=q.vocab_size,
        draft_trimmed=q.vocab_map is not None,
        warnings=tuple(warnings),
        **extra,
    )
    if bad:  # nothing to measure: the target cannot read the draft's proposals
        return PairReport(verdict="incompatible", reasons=tuple(bad), **base)

    ids = {k: [encode_prompt(p, x) for x in v] for k, v in kinds.items()}
    first = next(iter(ids.values()))[0]
    times = forward_times(p, first, max(MEASURED_GAMMAS) + 1, reps=3)  # one call over 1 .. 9 tokens
    step = times[0]
    acc, plain_runs = acceptance_by_kind(p, q, ids, cfg.max_new_tokens, deadline, drafter)
    c = acc.tally.c(plain_runs)  # the one c (tally.py): lookup alone makes no draft call, so c = 0
    p_s, q_s = plain_runs.step_s, acc.tally.draft_call_s
    # The prediction prices a round of each gamma from the rounds the acceptance runs paid (RoundCosts), against
    # the plain steps beside them; its parts are shown in target forward steps
    rc = RoundCosts.of(acc, plain_runs, times)
    verify = tuple(rc.verify_at(times[g]) / step for g in MEASURED_GAMMAS)  # (v_1 .. v_8): a verify as the loop pays it
    draft_cost, overhead, plain = rc.guess_s / step, rc.rest_s / step, rc.plain_s / step
    speedups = speedup_table(acc.a, c, range(1, GAMMA_MAX + 1))
    measured = tuple(
        expected_speedup_measured(acc.alphas(g), draft_cost, v, overhead, plain)
        for g, v in zip(MEASURED_GAMMAS, verify)
    )
    checked = acc.tally.decode_tokens_per_s / plain_runs.decode_tokens_per_s  # what the acceptance runs gained
    best_gamma = max(range(len(measured)), key=measured.__getitem__) + 1
    best = measured[best_gamma - 1]
    whole_run = with_prefill(best, plain_runs, acc.tally)
    verdict, reasons = worth_verdict(acc.a, c, best_gamma, best, translated)
    if translated:
        base["translate_cost"] = acc.translate_s / max(acc.rounds, 1) / step
    trees, advice = (), ""
    # a served target takes chains only, and a draft with another tokenizer proposes chains only (its guesses are
    # re-tokenised text, one line of it)
    if drafter in TREE_DRAFTERS and limits_of(p).tree_verify and not translated:
        few = [v[0] for v in ids.values()]  # the first prompt of each kind: trees cost the check a little time only
        trees = measure_trees(p, q, few, cfg.max_new_tokens, times, plain, deadline, drafter)
        advice = tree_advice(trees, best, best_gamma, acc.tokens_per_round(best_gamma))
        if verdict == "compatible":
            reasons.append(advice)
    served = {}
    if not limits_of(p).runs_here:  # a served target: its engine's own step, without a round trip
        e_step = engine_step_s(p, first)
        e_speedups = speedup_table(acc.a, q_s / e_step, MEASURED_GAMMAS)
        e_best = max(range(len(e_speedups)), key=e_speedups.__getitem__)
        served = dict(
            served=p.url,
            engine_step_s=e_step,
            engine_speedup=e_speedups[e_best],
            engine_best_gamma=MEASURED_GAMMAS[e_best],
        )
    return with_card(
        PairReport(
            **served,
            verdict=verdict,
            reasons=tuple(reasons),
            drafter=drafter,
            target_step_s=p_s,
            draft_step_s=q_s,
            c=c,
            acceptance=acc,
            prompts=len(texts),
            max_new_tokens=cfg.max_new_tokens,
            speedups=speedups,
            verify_costs=verify,
            draft_cost=draft_cost,
            round_overhead=overhead,
            plain_cost=plain,
            speedups_measured=measured,
            measured_speedup=checked,
            best_gamma=best_gamma,
            best_speedup=best,
            prefill_speedup=whole_run,
            trees=trees,
            tree_advice=advice,
            **base,
        )
    )
