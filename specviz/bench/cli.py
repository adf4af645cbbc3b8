"""The `bench` subcommand (python -m specviz bench): load the pair, run the grid, print the table and write files.

The harness is bench.py, the table bench_summary.py, the figures bench_plots.py; this module reads the arguments,
prints, and writes the CSV, JSON and plots a user asked for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from specviz.api import encode_prompt
from specviz.backends.local import opening_note
from specviz.bench.inputs import grid, load_prompts, parse_configs, parse_grid, parse_trees
from specviz.bench.machine import machine_info
from specviz.bench.measure import draft_ranks, measure, ranks_line
from specviz.bench.plots import write_plots
from specviz.bench.summary import summarise_runs
from specviz.engine.costs import read_bandwidth
from specviz.models.loaded import LoadedModel
from specviz.models.translate import needs_translation
from specviz.request import RunRequest

SHOW = {
    "temperature": "T",
    "config": "configuration",
    "ar_tok_s": "ar tok/s",
    "spec_tok_s": "spec tok/s",
    "hf_spec_tok_s": "hf_spec tok/s",
    "speedup_vs_ar": "spec/ar",
    "speedup_vs_hf": "spec/hf_spec",
    "speedup_vs_best_peer": "spec/best hf",
    "ar_vs_hf_ar": "ar/hf_ar",
    "acceptance": "accepted/drafted",
    "alpha": "alpha",
    "tokens_per_call": "tok/call",
    "drafted_per_call": "nodes/call",
    "verify_cost": "verify/step",
    "vs_best_chain": "vs best chain",
    "c": "c",
    "theory": "theory",
    "measured_over_theory": "meas/theory",
    "identical": "identical",
}
SHOW_SERVED = {
    "verify": "served verify",
    "ar_request_share": "ar in requests",
    "spec_request_share": "spec in requests",
}


def format_table(table: pd.DataFrame) -> str:
    show = {**SHOW, **SHOW_SERVED} if (table["verify"] != "").any() else SHOW  # a served target's row
    shown = table[list(show)].rename(columns=show).copy()
    shown["identical"] = shown["identical"].map({True: "yes", False: "NO", None: "n/a (sampled)"})
    return shown.to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="n/a")


def _ranks_of(
    target: LoadedModel, draft: LoadedModel | None, prompts: Sequence[str], runs: pd.DataFrame
) -> dict | None:
    """The draft's rank histogram on the plain greedy replies of this run (None without a draft of the target's
    tokenizer or a greedy plain run)."""
    ar = runs[(runs["method"] == "ar") & (runs["temperature"] == 0) & (runs["repeat"] == 0)].sort_values("prompt")
    if draft is None or ar.empty or needs_translation(target, draft):
        return None
    ids = [encode_prompt(target, prompts[i]) for i in ar["prompt"]]
    return draft_ranks(target, draft, ids, [list(t) for t in ar["tokens"]])


def spread_lines(table: pd.DataFrame, prompts: Sequence[str]) -> list[str]:
    """A line per cell run on more than one prompt: its per-prompt spec/ar from the lowest (which prompt) through
    the quartiles to the highest."""
    lines = []
    for _, r in table[table["prompts"] > 1].iterrows():
        if not r["speedup_lowest"] > 0:
            continue
        i = int(r["speedup_lowest_prompt"])
        slowest = " ".join(prompts[i].split()) if 0 <= i < len(prompts) else "?"
        slowest = slowest if len(slowest) <= 48 else slowest[:47] + "…"
        lines.append(
            f"  T={r['temperature']:g} {r['config']}: spec/ar per prompt {r['speedup_lowest']:.2f}x (prompt {i}, "
            f"{slowest!r}) · quartiles {r['speedup_q1']:.2f}x-{r['speedup_q3']:.2f}x · highest "
            f"{r['speedup_highest']:.2f}x"
        )
    return lines


def _why(facts: dict) -> str:
    """What follows the thread count: ': <why>' where specviz set it (cpus.fit_threads), else nothing."""
    why = facts.get("threads_why", "torch's default")
    return "" if why == "torch's default" else f": {why}"


RESULT_ROWS = (  # the table's columns a result file keeps (bench.summary's names: one definition of each)
    "temperature", "config", "prompts", "ar_tok_s", "spec_tok_s", "speedup_vs_ar", "speedup_vs_best_peer",
    "hf_assist_vs_ar", "hf_lookup_vs_ar", "acceptance", "alpha", "tokens_per_call", "verify_cost", "c",
    "speedup_lowest", "speedup_q1", "speedup_q3", "speedup_highest", "identical",
)  # fmt: skip


def _commit() -> str:
    """The checkout's commit (short), with "+changes" where its tracked files differ from it; "unknown" outside git."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(here), "diff", "--quiet", "HEAD"], capture_output=True)
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty.returncode == 1 else "")


def write_result(folder: str, facts: dict, records: list[dict]) -> Path:
    """One result file in `folder` (benchmarks/results/ in the repository): the command, commit, date, machine and
    the table's rows, which benchmarks/make_performance.py turns into docs/performance.md's tables."""
    now = datetime.now(timezone.utc)
    result = {
        "schema": 1,
        "command": facts["command"],
        "commit": _commit(),
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "source": "python -m specviz bench --results",
        "machine": {
            k: facts.get(k) for k in ("cpu", "cpu_id", "cpu_vector", "usable_cpus", "gpu", "torch", "load_avg_1min")
        },
        "pair": {k: facts.get(k) for k in ("target", "draft", "dtypes", "backend")},
        "set": {
            "prompts": facts["prompts"],
            "n_prompts": facts["n_prompts"],
            "max_new_tokens": facts["max_new_tokens"],
        },
        "memory_gb_s": facts.get("memory_gb_s"),
        "rows": [{k: r.get(k) for k in RESULT_ROWS} for r in records],
    }
    slug = "-".join(str(facts.get("cpu_id", "cpu")).lower().split())
    path = Path(folder) / f"{now:%Y%m%d-%H%M%S}-{slug}-{facts['prompts'].replace('/', '_')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def base_request(args) -> RunRequest:
    """The options every run of the bench shares, from its arguments: the ones given, RunRequest's for the rest (the
    grid's configurations then set drafter, gamma, policy and tree)."""
    given = {
        k: getattr(args, k, None)
        for k in ("target", "draft", "device", "dtype", "quantize", "tokenizer", "max_new_tokens", "seed")
    }
    return RunRequest.of({k: v for k, v in given.items() if v is not None}, "bench")


def main(args) -> dict:
    """The `bench` subcommand; prints the table (unless --json) and returns what --json prints."""
    from specviz.api import load_for
    from specviz.backends.served.connect import is_url
    from specviz.models.loaded import pair_backend, pair_dtypes

    prompts = load_prompts(args.prompts, args.limit)
    gammas = parse_grid(args.gammas, lambda v: "auto" if v.strip() == "auto" else int(v), "gammas")
    temperatures = parse_grid(args.temperatures, float, "temperatures")
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    trees = parse_trees(getattr(args, "trees", "off"))
    configs = parse_configs(args.configs) if getattr(args, "configs", None) else grid(gammas, drafters, policies, trees)
    request = base_request(args)
    # both models, whatever the configurations (the peers need the draft); a served target: p scores on its server,
    # both lanes through the same endpoint, and no transformers peers
    p, q = load_for(request.replace(drafter="model"))
    served = is_url(args.target)
    hf = not args.no_hf and not served
    local_cpu = not served and p.device.type == "cpu"  # whose memory streams the target's weights
    memory = [read_bandwidth()] if local_cpu else []
    runs = measure(p, q, prompts, configs, temperatures, args.repeats, request=request, hf=hf, progress=True)
    memory += [read_bandwidth()] if local_cpu else []
    table = summarise_runs(runs)
    ranks = _ranks_of(p, q, prompts, runs) if any(c.tree != "off" for c in configs) else None
    facts = machine_info()
    facts.update(
        target=p.name,
        draft=q.name,
        dtypes=pair_dtypes(p, q),
        backend=pair_backend(p, q),
        opening=opening_note(p),
        prompts=args.prompts,
        n_prompts=len(prompts),
        max_new_tokens=request.max_new_tokens,
        command="python -m specviz " + " ".join(sys.argv[1:]),
        memory_gb_s=[round(b, 1) for b in memory],  # read-only bandwidth before and after the run
    )
    if any(c.drafter.endswith("head") for c in configs):  # the head's own path (head_native.py's choice)
        from specviz.models.head import head_backend

        facts["backend"] += f"; head: {head_backend(p, request.head)}"
    warnings = [f"GREEDY OUTPUTS DIFFER: {d}" for d in table.loc[table["identical"] == False, "differences"]]  # noqa: E712
    warnings += [f"{m}: {n}" for m, n in runs.attrs.get("notes", {}).items()]
    files = []
    if args.csv:
        table.to_csv(args.csv, index=False)
        files.append(args.csv)
    if args.plots:
        plot_files, plot_note = write_plots(table, args.plots)
        files += plot_files
        if plot_note:
            warnings.append(plot_note)
    records = json.loads(table.to_json(orient="records"))
    if getattr(args, "results", None):
        files.append(str(write_result(args.results, facts, records)))
    out = {"machine": facts, "table": records, "warnings": warnings, "files": files, "ranks": ranks}
    if args.json_out:
        run_rows = json.loads(runs.drop(columns=["tokens"]).to_json(orient="records"))
        Path(args.json_out).write_text(json.dumps({**out, "runs": run_rows}, indent=2))
        files.append(args.json_out)
    if not args.json:
        print(
            f"{p.name} + {q.name} ({facts['dtypes']}) · {len(prompts)} prompts from {args.prompts} · "
            f"{request.max_new_tokens} new tokens"
        )
        print(
            f"{facts['cpu']} ({facts['cpu_id']}; {facts['cpu_vector']}) · GPU {facts['gpu']} · torch {facts['torch']} "
            f"({facts['torch_threads']} thread{'s' * (facts['torch_threads'] != 1)}{_why(facts)}) · "
            f"transformers {facts['transformers']}"
            + (" · memory read {:.0f} GB/s before the run, {:.0f} after".format(*memory) if memory else "")
        )
        print(f"On this CPU: {facts['backend']}")
        print(f"Prompts: {facts['opening']} (transformers' peers encode every token)")
        print(format_table(table))
        peers = table.groupby("temperature")[["hf_assist_vs_ar", "hf_lookup_vs_ar"]].median()
        for t, r in peers.dropna(how="all").iterrows():  # none with --no-hf
            print(
                f"  T={t:g}: transformers assisted (defaults) {r['hf_assist_vs_ar']:.2f}x plain, "
                f"transformers prompt lookup {r['hf_lookup_vs_ar']:.2f}x plain"
            )
        for line in spread_lines(table, prompts):
            print(line)
        for _, r in table[table["note"] != ""].iterrows():
            print(f"  T={r['temperature']:g} {r['config']}: {r['note']}")
        if ranks:
            print(f"  Ranks: {ranks_line(ranks)}")
        for w in warnings:
            print(("!" * 8 + " " if "DIFFER" in w else "note: ") + w, file=sys.stderr)
        for f in files:
            print(f"wrote {f}")
    return out
