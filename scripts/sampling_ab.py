"""Sampled races two ways, interleaved in one process: `--compare draw`, the old draw (torch.multinomial) against
sampling.sample's inverse CDF (the measurement behind `specviz.sampling.sample`); `--compare rows`, a trimmed
draft's guesses drawn over all of the target's ids against over the ids it can propose (`drafters_base.draw`,
`LoadedModel.proposable`). BENCHMARKS.md has both.

For each prompt of each set, at the given temperature and a seed per prompt: plain decoding and the configuration
with one way of drawing, then both with the other (the order alternating from prompt to prompt), every run timed
by the wall clock around it after an untimed warm-up of each way. Prints per set and way the median per-prompt
speedup, plain decoding's tokens per second, and c (draft seconds per draft call over the plain run's seconds per
token).

    python scripts/sampling_ab.py [--compare draw|rows] [--sets everyday,stories,code] [--limit 8] [--temperature 0.8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import drafters, drafters_base, engine, sampling, served_run  # noqa: E402
from specviz.api import encode_prompt, load_for  # noqa: E402
from specviz.bench import timed_events  # noqa: E402
from specviz.bench_inputs import load_prompts, parse_configs  # noqa: E402
from specviz.machine import machine_info  # noqa: E402
from specviz.request import RunRequest  # noqa: E402

MODULES = (sampling, engine, drafters, drafters_base, served_run)  # every module that holds `sample`


def multinomial(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


DRAWS = {"multinomial": multinomial, "inverse CDF": sampling.sample}
ROWS = ("all ids", "its own ids")


def use(way: str, draft=None) -> None:
    """Draw one way (a DRAWS key), or have the draft's guesses drawn over all ids or its own (a ROWS entry)."""
    if way in DRAWS:
        for m in MODULES:
            m.sample = DRAWS[way]
        return
    draft.__dict__.pop("proposable", None)  # its own ids again (a cached property)
    if way == "all ids":
        draft.__dict__["proposable"] = None


def timed(decode, *args) -> tuple[list[int], float, dict]:
    events, seconds = timed_events(decode, *args)
    return list(events[-1].token_ids), seconds, events[-1].stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", choices=["draw", "rows"], default="draw")
    ap.add_argument("--sets", default="everyday,stories,code")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--config", default="lookup+model:auto")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    ways = tuple(DRAWS) if args.compare == "draw" else ROWS
    (config,) = parse_configs(args.config)
    base = RunRequest(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    req = config.request(base)
    p, q = load_for(req)
    m = machine_info()
    print(f"CPU: {m['cpu']} ({m['cpu_id']}; {m['cpu_vector']})", flush=True)
    warm = encode_prompt(p, "Tell me something about the sea.")
    for way in ways:
        use(way, q)
        timed(engine.autoregressive_decode, p, warm, base.replace(mode="ar").spec)
        timed(engine.speculative_decode, p, q, warm, req.spec)
    results = []
    for name in args.sets.split(","):
        for i, prompt in enumerate(load_prompts(name)[: args.limit]):
            ids = encode_prompt(p, prompt)
            for way in ways if i % 2 == 0 else ways[::-1]:
                use(way, q)
                seeded = base.replace(seed=1000 + i)
                plain, ar_s, _ = timed(engine.autoregressive_decode, p, ids, seeded.replace(mode="ar").spec)
                out, s, st = timed(engine.speculative_decode, p, q, ids, config.request(seeded).spec)
                results.append(dict(set=name, prompt=i, way=way, speedup=ar_s / s, plain_tps=len(plain) / ar_s,
                                    c=(st["draft_s"] / max(st["draft_calls"], 1)) / (ar_s / len(plain))))  # fmt: skip
    use(ways[-1], q)
    for name in args.sets.split(","):
        line = [f"{name}, T={args.temperature:g}"]
        for way in ways:
            rows = [r for r in results if r["set"] == name and r["way"] == way]
            line.append(
                f"{way}: {statistics.median(r['speedup'] for r in rows):.2f}x, plain "
                f"{statistics.median(r['plain_tps'] for r in rows):.1f} tok/s, c {statistics.median(r['c'] for r in rows):.3f}"
            )
        print(" | ".join(line), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"runs": results}, indent=1))


if __name__ == "__main__":
    main()
