"""The benchmark's table: one row per (temperature, configuration) cell from the timed runs of bench.measure.

Speedups are medians of paired per-prompt ratios (runs made seconds apart on the same prompt); acceptance, alpha,
tokens per call and c are read from the pooled tally.Tally of each cell's runs; the theoretical speedup is
theory.expected_speedup, and where measured falls short of it the row says where the time went.
"""

from __future__ import annotations

import math

import pandas as pd

from specviz.engine.tally import Tally
from specviz.theory import expected_speedup

SHARED = ("ar", "hf_assist", "hf_lookup", "hf_ar")  # run once per prompt, whatever the configuration
SHORTFALL = 0.85  # measured below 85% of theory: say where the time went


def pool(rows: pd.DataFrame) -> Tally:
    """The Tally of every run of ours among `rows` (rows of `run_row`), pooled."""
    names = [k for k in Tally().counts() if k in rows.columns]
    return sum((Tally.from_counts(dict(zip(names, r))) for r in rows[names].itertuples(index=False)), Tally())


def _ratios(a: pd.DataFrame, b: pd.DataFrame) -> pd.Series:
    """Tokens/s of runs `a` over runs `b` in the same interleaved slot, indexed by (repeat, prompt)."""
    if a.empty or b.empty:
        return pd.Series(dtype=float)
    x = a.set_index(["repeat", "prompt"])["tokens_per_s"]
    y = b.set_index(["repeat", "prompt"])["tokens_per_s"]
    return (x / y).dropna()


def _paired(a: pd.DataFrame, b: pd.DataFrame) -> float:
    """Median over prompts and repeats of tokens/s of runs `a` over runs `b` in the same interleaved slot."""
    return float(_ratios(a, b).median())


def _spread(spec: pd.DataFrame, ar: pd.DataFrame) -> dict:
    """How the paired per-prompt speedups spread around their median: the lowest (and its prompt), the quartiles and
    the highest. Why: on a CPU whose memory a neighbour shares, one prompt's ratio moves visibly between two runs
    seconds apart, so a median alone hides what a visitor's
    single race may show, and the slowest prompt is the one a claim of "never slower" rests on."""
    r = _ratios(spec, ar)
    if r.empty:
        nan = float("nan")
        return {"speedup_lowest": nan, "speedup_lowest_prompt": -1, "speedup_q1": nan, "speedup_q3": nan,
                "speedup_highest": nan}  # fmt: skip
    return {
        "speedup_lowest": float(r.min()),
        "speedup_lowest_prompt": int(r.idxmin()[1]),  # (repeat, prompt): the prompt's index in the run's list
        "speedup_q1": float(r.quantile(0.25)),
        "speedup_q3": float(r.quantile(0.75)),
        "speedup_highest": float(r.max()),
    }


def _identical(runs: list[pd.DataFrame], ar: pd.DataFrame) -> tuple[bool | None, list[str]]:
    """Greedy cells: does every method give the same tokens as ar on every prompt? Returns (ok, differences)."""
    if ar.empty or ar["temperature"].iloc[0] != 0:
        return None, []
    ref = {(r.repeat, r.prompt): tuple(r.tokens) for r in ar.itertuples()}
    diffs = []
    for frame in runs:
        for r in frame.itertuples():
            toks, want = tuple(r.tokens), ref.get((r.repeat, r.prompt))
            if want is not None and toks != want:
                at = next((k for k, (x, y) in enumerate(zip(toks, want)) if x != y), min(len(toks), len(want)))
                diffs.append(f"prompt {r.prompt} repeat {r.repeat}: {r.method} differs from ar at new token {at}")
    return not diffs, diffs


def _where_time_goes(spec: pd.DataFrame, run: Tally, plain: Tally, gamma: int, c: float) -> dict:
    """Shares of spec's decode time (prefill excluded) and what one verify call cost in plain steps."""
    decode = float((spec["seconds"] - spec["prefill_s"]).sum())
    step = plain.step_s
    draft, verify, rounds = run.draft_s, run.verify_s, run.rounds
    return {
        "draft_share": draft / decode if decode > 0 else float("nan"),
        "verify_share": verify / decode if decode > 0 else float("nan"),
        "other_share": max(decode - draft - verify, 0.0) / decode if decode > 0 else float("nan"),
        "prefill_share": float(spec["prefill_s"].sum() / spec["seconds"].sum()),
        "verify_cost": verify / rounds / step if rounds and step > 0 else float("nan"),  # theory assumes 1
        "draft_per_call": draft / rounds / step if rounds and step > 0 else float("nan"),  # drafting per round, steps
        "draft_cost": draft / rounds / (gamma * c * step) if rounds and c > 0 and step > 0 else float("nan"),
    }


def _note(r: dict) -> str:
    if not r["measured_over_theory"] < SHORTFALL:
        return ""
    return (
        f"{1 - r['measured_over_theory']:.0%} below theory: decode time is draft {r['draft_share']:.0%}, "
        f"verify {r['verify_share']:.0%}, sampling/bookkeeping {r['other_share']:.0%}; one verify call of "
        f"{r['gamma'] + 1} tokens costs {r['verify_cost']:.2f} single-token target steps (theory: 1); "
        f"prefill is {r['prefill_share']:.0%} of spec wall time"
    )


def summarise_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (temperature, configuration) cell from the rows of `measure`."""
    table = []
    for temperature, at_t in runs.groupby("temperature", sort=True):
        shared = {m: at_t[at_t["method"] == m] for m in SHARED}
        ar = shared["ar"]
        plain = pool(ar)
        ar_dec = ar["new_tokens"].sum() / (ar["seconds"] - ar["prefill_s"]).sum()
        for label, cell in at_t[at_t["config"] != ""].groupby("config", sort=False):
            spec, hf_spec = cell[cell["method"] == "spec"], cell[cell["method"] == "hf_spec"]
            first = spec.iloc[0]
            run = pool(spec)  # every count and the acceptance, alpha, tokens per call and c read from it
            a, c = run.alpha, run.c(plain)  # per-token acceptance: what the formula assumes
            spec_dec = spec["new_tokens"].sum() / (spec["seconds"] - spec["prefill_s"]).sum()
            constant = first["policy"] == "constant"
            gamma = int(first["gamma"]) if first["gamma"] != "auto" else first["gamma"]
            theory = expected_speedup(a, gamma, c) if constant and math.isfinite(c) else float("nan")
            peers = pd.concat([shared["hf_assist"], shared["hf_lookup"]])
            best_peer = peers.groupby(["repeat", "prompt"], as_index=False)["tokens_per_s"].max()
            # each method against plain decoding on its own forward: ours (maybe lean.py's) against ar,
            # transformers' against its own generate; the two forwards may part on a float32 near-tie
            ok, diffs = _identical([spec], ar)
            ok_hf, diffs_hf = _identical([hf_spec, shared["hf_assist"], shared["hf_lookup"]], shared["hf_ar"])
            ok, diffs = (ok if ok_hf is None else ok_hf if ok is None else ok and ok_hf), diffs + diffs_hf
            agree = _identical([shared["hf_ar"]], ar)[0] if len(shared["hf_ar"]) else None
            row = {
                "temperature": temperature,
                "config": label,
                "drafter": first["drafter"],
                "gamma": gamma,
                "policy": "auto" if gamma == "auto" else first["policy"],
                "tree": str(first.get("tree", "off") or "off"),
                "prompts": spec["prompt"].nunique(),
                "repeats": spec["repeat"].nunique(),
                "ar_tok_s": float(ar["tokens_per_s"].median()),
                "spec_tok_s": float(spec["tokens_per_s"].median()),
                **{
                    f"{m}_tok_s": float(shared[m]["tokens_per_s"].median()) if len(shared[m]) else float("nan")
                    for m in SHARED[1:]
                },
                "hf_spec_tok_s": float(hf_spec["tokens_per_s"].median()) if len(hf_spec) else float("nan"),
                "speedup_vs_ar": _paired(spec, ar),
                **_spread(spec, ar),
                "speedup_vs_hf": _paired(spec, hf_spec),
                "speedup_vs_best_peer": _paired(spec, best_peer),  # the faster of hf_assist and hf_lookup
                "ar_vs_hf_ar": _paired(ar, shared["hf_ar"]),
                "hf_assist_vs_ar": _paired(shared["hf_assist"], ar),
                "hf_lookup_vs_ar": _paired(shared["hf_lookup"], ar),
                "acceptance": run.acceptance_rate,
                "alpha": a,
                "tokens_per_call": run.tokens_per_call,
                "drafted_per_call": run.drafted_per_call,
                "tree_share": run.tree_rounds / run.rounds if run.rounds else float("nan"),  # rounds that branched
                "c": c,
                "decode_speedup": float(spec_dec / ar_dec),
                "theory": theory,
                "measured_over_theory": float(spec_dec / ar_dec / theory) if theory > 0 else float("nan"),
                **_where_time_goes(spec, run, plain, gamma if constant else 1, c),
                "identical": ok,
                "differences": "; ".join(diffs),
                "forwards_agree": agree,  # ar's tokens == transformers' generate's (both plain, greedy)
                "verify": first["verify"],  # a served target: greedy | exact | approximate: top-20
                "ar_request_share": float(ar["request_s"].sum() / ar["seconds"].sum()),
                "spec_request_share": float(spec["request_s"].sum() / spec["seconds"].sum()),
            }
            row["note"] = _note(row) if constant and row["tree"] == "off" else ""
            table.append(row)
    table = pd.DataFrame(table)
    return _beside_best_chain(table, runs) if len(table) else table


def _beside_best_chain(table: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Tree rows beside the best chain of their temperature (the fastest chain configuration, same draft, same
    prompts): paired speedup, tokens per call, and in the note why, from the measured verify cost per call."""
    table = table.copy()
    table["best_chain"], table["vs_best_chain"], table["tokens_per_call_vs_best_chain"] = "", math.nan, math.nan
    for t, cell in table.groupby("temperature"):
        chains = cell[cell["tree"] == "off"]
        if chains.empty:
            continue
        best = chains.loc[chains["speedup_vs_ar"].idxmax()]
        at_t = runs[(runs["temperature"] == t) & (runs["method"] == "spec")]
        best_runs = at_t[at_t["config"] == best["config"]]
        for i, row in cell[cell["tree"] != "off"].iterrows():
            ratio = _paired(at_t[at_t["config"] == row["config"]], best_runs)
            tpc = row["tokens_per_call"] / best["tokens_per_call"]
            table.loc[i, ["best_chain", "vs_best_chain", "tokens_per_call_vs_best_chain"]] = [
                best["config"],
                ratio,
                tpc,
            ]
            extra = row["drafted_per_call"] - best["drafted_per_call"]  # positions more than the chain's per verify
            per_node = (row["verify_cost"] - best["verify_cost"]) / extra if abs(extra) >= 0.5 else math.nan
            table.loc[i, "note"] = (
                f"{row['tokens_per_call']:.2f} tokens per call, {tpc - 1:+.0%} against the best chain "
                f"({best['config']}: {best['tokens_per_call']:.2f}); a verify of {row['drafted_per_call'] + 1:.1f} "
                f"positions costs {row['verify_cost']:.2f} plain steps (the chain's of "
                f"{best['drafted_per_call'] + 1:.1f}: {best['verify_cost']:.2f}"
                + (f", {per_node:+.3f} a node" if math.isfinite(per_node) else "")
                + f") and drafting {row['draft_per_call']:.2f} (the chain's: {best['draft_per_call']:.2f}), "
                f"so it runs {ratio:.2f}x the chain; {row['tree_share']:.0%} of its rounds branched"
            )
    return table
