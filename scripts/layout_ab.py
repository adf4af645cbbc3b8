"""llama.c reading the weights by rows against packed in panels (lean_panels), both models of the pair, interleaved
in one process (the measurement behind the panels; BENCHMARKS.md).

For each prompt of each set, each way (their order alternating from prompt to prompt) runs plain decoding and the
configuration, every run timed by the wall clock around it after an untimed warm-up; switching ways switches the
target's and the draft's layout (both packed once, up front) and drops the kept openings, which each way encodes again
off its clocks. Prints per set and way the median per-prompt speedup and the tokens per second of each lane; greedy
output must equal plain decoding's in every run. The two ways' outputs may differ where the target's top two logits
tie within float32 rounding (the layouts sum in different orders); the script counts such prompts.

    python scripts/layout_ab.py [--sets everyday,stories,code] [--limit 12] [--config lookup+model:auto]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import lean_panels, native, runtime  # noqa: E402
from specviz.api import encode_prompt, load_for  # noqa: E402
from specviz.bench import timed_events  # noqa: E402
from specviz.bench_inputs import load_prompts, parse_configs  # noqa: E402
from specviz.engine import autoregressive_decode, speculative_decode  # noqa: E402
from specviz.events import Start  # noqa: E402
from specviz.machine import machine_info  # noqa: E402
from specviz.request import RunRequest  # noqa: E402


def timed(decode, *args) -> tuple[list[int], float, float]:
    """(the tokens, wall seconds of the whole run, its prefill seconds)."""
    events, seconds = timed_events(decode, *args)
    assert isinstance(events[0], Start)
    return list(events[-1].token_ids), seconds, events[0].prefill_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="everyday,stories,code")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--config", default="lookup+model:auto")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    base = RunRequest(max_new_tokens=args.max_new_tokens)
    (config,) = parse_configs(args.config)
    p, q = load_for(config.request(base))
    m = machine_info()
    print(f"CPU: {m['cpu']} ({m['cpu_id']}; {m['cpu_vector']})", flush=True)
    ar_cfg, spec_cfg = base.replace(mode="ar").spec, config.request(base).spec
    fwds = [lm.lean for lm in (p, q) if lm is not None and lm.lean is not None and lean_panels.can(lm.lean)]
    packs = [f.packed or {w.data_ptr(): native.pack(w) for w in f.weights()} for f in fwds]
    print("forwards:", [f.engine for f in fwds], flush=True)

    def use(way: str) -> None:  # both forwards read their weights this way; openings encoded anew
        for f, packed in zip(fwds, packs):
            lean_panels.use(f, way == "panels", packed)
        runtime.forget_openings()

    warm = encode_prompt(p, "Tell me something about the sea.")
    for way in ("rows", "panels"):  # warm-up, untimed
        use(way)
        timed(autoregressive_decode, p, warm, ar_cfg)
        timed(speculative_decode, p, q, warm, spec_cfg)
    results = []
    for name in args.sets.split(","):
        for i, prompt in enumerate(load_prompts(name)[: args.limit]):
            ids = encode_prompt(p, prompt)
            for way in ("rows", "panels") if i % 2 == 0 else ("panels", "rows"):
                use(way)
                plain, ar_s, ar_pre = timed(autoregressive_decode, p, ids, ar_cfg)
                out, s, pre = timed(speculative_decode, p, q, ids, spec_cfg)
                results.append(dict(set=name, prompt=i, way=way, tokens=len(out), prompt_tokens=len(ids),
                                    same=out == plain, out=out, speedup=ar_s / s, ar_s=ar_s, spec_s=s,
                                    ar_prefill=ar_pre, spec_prefill=pre))  # fmt: skip
    for name in args.sets.split(","):
        line = [name, config.label]
        for way in ("rows", "panels"):
            rows = [r for r in results if r["set"] == name and r["way"] == way]
            line.append(
                f"{way}: {statistics.median(r['speedup'] for r in rows):.2f}x, tok/s plain / spec "
                f"{sum(r['tokens'] for r in rows) / sum(r['ar_s'] for r in rows):.1f} / "
                f"{sum(r['tokens'] for r in rows) / sum(r['spec_s'] for r in rows):.1f}"
            )
        print(" | ".join(line), flush=True)
    pairs = {(r["set"], r["prompt"]): [] for r in results}
    for r in results:
        pairs[(r["set"], r["prompt"])].append(r["out"])
    print("greedy output equal to plain decoding in every run:", all(r["same"] for r in results))
    print("prompts where the two ways wrote other tokens:", sum(a != b for a, b in pairs.values()), "of", len(pairs))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": m, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
