"""The benchmark harness: python -m specviz bench.

For one pair (target p, draft q), a prompt set, temperatures and a list of speculative configurations
(drafter x gamma x gamma policy x token tree), it runs in ONE process, interleaved per prompt after a warm-up run: for each
prompt, every method once, back to back:
  ar         plain autoregressive decoding of p with our engine (engine.autoregressive_decode)
  spec       our speculative decoding, once per configuration (engine.speculative_decode)
  hf_spec    transformers' assisted generation with the same constant gamma (model drafter, constant policy only)
  hf_assist  transformers' assisted generation at its own defaults (20 tokens, confidence 0.4): what a user gets
  hf_lookup  transformers' prompt lookup (prompt_lookup_num_tokens=10, its default n-gram size 2)
  hf_ar      transformers' plain p.model.generate, the reference for our `ar`
Every method is timed the same way: wall clock around one call, prompt already tokenised, prefill included
(ours copies the chat template's opening, encoded once per process: runtime.keep_opening; transformers' generate
encodes every prompt token).
Each speedup is a ratio of runs made seconds apart on the same prompt, under the same load.

Per cell it reports tokens/s (median over prompts and repeats), speedups (median of the paired per-prompt
ratios), the acceptance rate (accepted / drafted), the per-token acceptance alpha (accepted / proposals the
target ruled on), tokens per target call, the cost ratio c, the theoretical speedup
(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) and, where measured falls >15% short of it, where the time went.
At temperature 0 every method must give the plain output of its own forward token for token (spec = ar; hf_spec,
hf_assist and hf_lookup = hf_ar); a difference is flagged loudly. ar and hf_ar may run different forwards (lean.py
beside transformers'), which can part on a float32 near-tie: `forwards_agree` says whether they did.

The grid and prompt sets are bench_inputs.py, transformers' peers bench_peers.py, the table bench_summary.py, the
figures bench_plots.py, the subcommand bench_cli.py and the machine's facts machine.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import pandas as pd
import torch

from specviz.api import encode_prompt
from specviz.bench.inputs import Config, grid
from specviz.bench.peers import (
    HF_ASSIST_CONFIDENCE,
    HF_ASSIST_TOKENS,
    HF_LOOKUP_TOKENS,
    assist_kwargs,
    hf_assistant,
    hf_generate,
)
from specviz.bench.summary import summarise_runs
from specviz.config import SpecvizError
from specviz.engine.loop import autoregressive_decode, speculative_decode
from specviz.engine.tally import Tally
from specviz.events import Done
from specviz.models.loaded import LoadedModel
from specviz.request import RunRequest

log = logging.getLogger("specviz")

METHODS = ("ar", "spec", "hf_spec", "hf_assist", "hf_lookup", "hf_ar")
WARMUP_TOKENS = 8


# --- one timed run per method ---------------------------------------------------------------------


def run_row(events: list, seconds: float) -> dict:
    """One run of our engine as a row of `measure`: its tokens, the wall clock around the call, its Tally's
    counts (pooled again by `pool`) and, for a served target, its requests, their seconds and how it decided."""
    done = events[-1]
    assert isinstance(done, Done)
    return {
        "tokens": list(done.token_ids),
        "seconds": seconds,
        **Tally.of(events).counts(),
        "requests": done.stats.get("requests", 0),
        "request_s": done.stats.get("request_s", float("nan")),  # nan / "" for a local target
        "verify": done.stats.get("verify", ""),
    }


def timed_events(decode, *args) -> tuple[list, float]:
    """Every event of `decode(*args)` (a run of our engine) and the wall clock around the whole call: how the bench
    times each of its runs, and the A/B scripts theirs."""
    t0 = time.perf_counter()
    events = list(decode(*args))
    seconds = time.perf_counter() - t0
    assert isinstance(events[-1], Done)
    return events, seconds


def _ours(events_fn) -> dict:
    return run_row(*timed_events(events_fn))


def _shared_runners(target: LoadedModel, draft: LoadedModel | None, hf: bool) -> tuple[dict, dict]:
    """The methods run once per prompt: ar and transformers' peers."""
    notes = {}
    runners = {"ar": lambda ids, cfg: _ours(lambda: autoregressive_decode(target, ids, cfg))}
    if not hf:
        return runners, notes
    if draft is not None:
        try:
            default = hf_assistant(draft, target, HF_ASSIST_TOKENS)
            default.generation_config.assistant_confidence_threshold = HF_ASSIST_CONFIDENCE
            assist = assist_kwargs(target, draft, default)
            runners["hf_assist"] = lambda ids, cfg: hf_generate(target, ids, cfg, **assist)
        except SpecvizError as e:
            notes["hf_assist"] = f"n/a: {e}"
    runners["hf_lookup"] = lambda ids, cfg: hf_generate(target, ids, cfg, prompt_lookup_num_tokens=HF_LOOKUP_TOKENS)
    runners["hf_ar"] = lambda ids, cfg: hf_generate(target, ids, cfg)
    return runners, notes


def _config_runners(target: LoadedModel, draft: LoadedModel | None, hf: bool, configs: Sequence[Config]):
    """(config, method, run) for each configuration: ours, and transformers' at the same constant gamma."""
    out, notes = [], {}
    for c in configs:
        out.append((c, "spec", lambda ids, cfg: _ours(lambda: speculative_decode(target, draft, ids, cfg))))
        chain = c.tree == "off"
        if (
            hf
            and draft is not None
            and c.drafter == "model"
            and c.policy == "constant"
            and chain
            and "hf_spec" not in notes
        ):
            try:
                view = hf_assistant(draft, target, int(c.gamma))
            except SpecvizError as e:
                notes["hf_spec"] = f"n/a: {e}"
                continue
            kw = dict(
                **assist_kwargs(target, draft, view),
                num_assistant_tokens=int(c.gamma),
                num_assistant_tokens_schedule="constant",
            )
            out.append((c, "hf_spec", lambda ids, cfg, kw=kw: hf_generate(target, ids, cfg, **kw)))
    return out, notes


def row(temperature: float, c: Config | None, repeat: int, prompt: int, method: str, r: dict) -> dict:
    """One row of `measure`: the cell it belongs to and one timed run `r` (`run_row`, or a peer's tokens and
    seconds); tokens_per_s is over the wall clock around the call, the same for every method."""
    n = len(r["tokens"])
    return {
        "temperature": temperature,
        "config": c.label if c else "",
        "drafter": c and c.drafter,
        "gamma": c and c.gamma,
        "policy": c and c.policy,
        "tree": c.tree if c else "",
        "repeat": repeat,
        "prompt": prompt,
        "method": method,
        "new_tokens": n,
        "tokens_per_s": n / r["seconds"] if r["seconds"] > 0 else float("nan"),
        **r,
    }


def measure(
    target: LoadedModel,
    draft: LoadedModel | None,
    prompts: Sequence[str],
    configs: Sequence[Config],
    temperatures: Sequence[float],
    repeats: int = 1,
    *,
    request: RunRequest | None = None,
    hf: bool = True,
    progress: bool = False,
) -> pd.DataFrame:
    """Every timed run: one row per (temperature, repeat, prompt, method[, configuration]). See `summarise_runs`.

    request: the options every run shares (max_new_tokens, top_k, top_p, seed, raw; default RunRequest()'s); each
    configuration sets the drafter, gamma, policy and tree, the grid the temperature, and each prompt its seed."""
    from tqdm.auto import tqdm

    base = request or RunRequest()
    for c in configs:  # validates every value before anything runs
        c.request(base)
    for t in temperatures:
        base.replace(temperature=t)
    if repeats < 1:
        raise SpecvizError("--repeats must be at least 1.")
    if not prompts or not configs:
        raise SpecvizError("There are no prompts or no configurations to run.")
    encoded = [encode_prompt(target, p, base.raw) for p in prompts]
    shared, notes = _shared_runners(target, draft, hf)
    per_config, more = _config_runners(target, draft, hf, configs)
    notes.update(more)
    for note in notes.values():
        log.warning("a transformers peer is skipped: %s", note)

    warm = base.replace(max_new_tokens=min(WARMUP_TOKENS, base.max_new_tokens), temperature=0.0)
    for run in shared.values():  # first calls pay for lazy initialisation (and auto's cost calibration): untimed
        run(encoded[0], warm.replace(mode="ar").spec)
    for c, _, run in per_config:
        run(encoded[0], c.request(warm).spec)

    rows = []
    bar = tqdm(total=len(temperatures) * repeats * len(prompts), desc="bench", unit="prompt", disable=not progress)
    with bar:
        for temperature in temperatures:
            for rep in range(repeats):
                for i, ids in enumerate(encoded):
                    at = base.replace(temperature=temperature, seed=base.seed + 1000 * rep + i)
                    slot = [(None, m, r) for m, r in shared.items()] + per_config
                    for c, method, run in slot:
                        cfg = c.request(at).spec if c else at.replace(mode="ar").spec
                        rows.append(row(temperature, c, rep, i, method, run(ids, cfg)))
                    bar.update(1)
    runs = pd.DataFrame(rows)
    runs.attrs["notes"] = notes
    return runs


RANK_TOP = 4  # the rank histogram's ranks 1 .. RANK_TOP, then "beyond" (drafters.TREE_CHILDREN branches at most)


@torch.inference_mode()
def draft_ranks(
    target: LoadedModel,
    draft: LoadedModel,
    prompt_ids: Sequence[list[int]],
    replies: Sequence[Sequence[int]],
    top: int = RANK_TOP,
) -> dict:
    """The draft's rank histogram on the target's greedy replies: how often the target's token is the draft's 1st,
    2nd ... choice (ties count against it), teacher-forced: one draft call reads a prompt and the reply the
    target wrote, as a greedy round's draft always continues text the target wrote. It decides which trees are
    worth growing: a runner-up pays only where the target's token is often the draft's 2nd or 3rd choice.
    Returns {"tokens": n, "shares": [rank 1, ..., rank top, beyond]}."""
    from specviz.backends.local import CachedModel

    counts = [0] * (top + 1)
    for ids, reply in zip(prompt_ids, replies):
        if not reply:
            continue
        run = CachedModel(draft, target.vocab_size)
        run.prefill(torch.tensor(ids, device=draft.device))
        logits = run.feed(torch.tensor([*ids[-1:], *reply[:-1]], device=draft.device))  # (R, V): row j -> reply[j]
        want = logits.gather(1, torch.tensor(list(reply), device=logits.device)[:, None])  # (R, 1)
        for r in (logits > want).sum(1).tolist():
            counts[min(r, top)] += 1
    total = sum(counts)
    return {"tokens": total, "shares": [c / total if total else float("nan") for c in counts]}


def ranks_line(ranks: dict) -> str:
    """The rank histogram in one sentence."""
    nth = ("1st", "2nd", "3rd", *(f"{i}th" for i in range(4, len(ranks["shares"]))))
    shares = ", ".join(f"{n} {s:.0%}" for n, s in zip(nth, ranks["shares"][:-1]))
    return (
        f"the target's greedy token is the draft's {shares}, beyond {ranks['shares'][-1]:.0%} "
        f"({ranks['tokens']} tokens of the plain replies, teacher-forced)"
    )


def run_bench(
    target: LoadedModel,
    draft: LoadedModel | None,
    prompts: Sequence[str],
    gammas: Sequence,
    temperatures: Sequence[float],
    max_new_tokens: int | None = None,
    repeats: int = 1,
    *,
    drafters: Sequence[str] = ("model",),
    policies: Sequence[str] = ("constant",),
    trees: Sequence = ("off",),
    hf: bool = True,
    progress: bool = False,
    **options,
) -> pd.DataFrame:
    """Run the grid and return the per-cell table. options: a run's options every run shares (top_k, top_p, seed,
    raw; request.RunRequest's, as is max_new_tokens, whose default is RunRequest's); hf, progress as in `measure`.

    Cells: every drafter x gamma (a number or "auto") x policy. Columns: temperature, config, drafter, gamma,
    policy, prompts, repeats, {ar,spec,hf_spec,hf_assist,hf_lookup,hf_ar}_tok_s, speedup_vs_ar, speedup_vs_hf,
    speedup_vs_best_peer, speedup_lowest, speedup_lowest_prompt, speedup_q1, speedup_q3, speedup_highest (the
    per-prompt spec/ar around its median), ar_vs_hf_ar, acceptance, alpha, tokens_per_call, drafted_per_call, c,
    decode_speedup, theory, measured_over_theory, draft_share, verify_share, other_share, prefill_share,
    verify_cost, draft_per_call, draft_cost, identical, differences, note, tree, best_chain, vs_best_chain,
    tokens_per_call_vs_best_chain (tree rows beside the fastest chain of their temperature).
    """
    configs = grid(gammas, drafters, policies, trees)
    if max_new_tokens is not None:
        options["max_new_tokens"] = max_new_tokens
    request = RunRequest.of(options, "run_bench")
    runs = measure(target, draft, prompts, configs, temperatures, repeats, request=request, hf=hf, progress=progress)
    table = summarise_runs(runs)
    for d in table.loc[table["identical"] == False, "differences"]:  # noqa: E712  (None means not greedy)
        log.warning("GREEDY OUTPUTS DIFFER: %s", d)
    return table
