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

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import ab, sampling
from specviz.api import encode_prompt, load_for  # noqa: E402
from specviz.backends.served import run as served_run  # noqa: E402
from specviz.bench.inputs import parse_configs  # noqa: E402
from specviz.drafters import base as drafters_base
from specviz.drafters import model as drafters
from specviz.engine import loop as engine
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


def main() -> None:
    ap = ab.parser(__doc__)
    ap.add_argument("--compare", choices=["draw", "rows"], default="draw")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.set_defaults(limit=8)
    args = ap.parse_args()
    ways = tuple(DRAWS) if args.compare == "draw" else ROWS
    (config,) = parse_configs(args.config)
    base = RunRequest(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    req = config.request(base)
    p, q = load_for(req)
    ab.print_machine()
    warm = encode_prompt(p, ab.WARM_PROMPT)
    for way in ways:
        use(way, q)
        ab.timed(engine.autoregressive_decode, p, warm, base.replace(mode="ar").spec)
        ab.timed(engine.speculative_decode, p, q, warm, req.spec)
    results = []
    for name, i, ids, order in ab.prompts(p, args.sets, args.limit, ways):
        for way in order:
            use(way, q)
            seeded = base.replace(seed=1000 + i)
            plain = ab.timed(engine.autoregressive_decode, p, ids, seeded.replace(mode="ar").spec)
            spec = ab.timed(engine.speculative_decode, p, q, ids, config.request(seeded).spec)
            st, step = spec.stats, plain.seconds / len(plain.tokens)
            results.append(dict(set=name, prompt=i, way=way, speedup=plain.seconds / spec.seconds, plain_tps=1 / step,
                                c=(st["draft_s"] / max(st["draft_calls"], 1)) / step))  # fmt: skip
    use(ways[-1], q)

    def describe(rows: list[dict]) -> str:
        return (
            f"{ab.speedup(rows)}, plain {statistics.median(r['plain_tps'] for r in rows):.1f} tok/s, "
            f"c {statistics.median(r['c'] for r in rows):.3f}"
        )

    ab.per_set(results, args.sets, ways, describe, f"T={args.temperature:g}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"runs": results}, indent=1))


if __name__ == "__main__":
    main()
