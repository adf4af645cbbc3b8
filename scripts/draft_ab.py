"""Two drafts for the same target, interleaved in one process: which one races faster here (the measurement
behind the built-in draft's proposable rows, `specviz/training/draft_rows.py`; BENCHMARKS.md).

For each prompt of each set: plain decoding, then the configuration once with each draft (their order
alternating from prompt to prompt), every run timed by the wall clock around it, after an untimed warm-up of
each; each draft's pair is calibrated by auto as the app does (its own draft-step cost). Prints per set the
median per-prompt speedup, tokens per target call, alpha and c (draft seconds per draft call over the plain
run's seconds per token) each way; greedy output must equal plain decoding's in every run.

    python scripts/draft_ab.py --a assets/draft --b out/other-draft [--sets everyday,stories,code] [--limit 12]
    python scripts/draft_ab.py --heads --a out/head-before --b assets/head --config lookup+head:auto   # two heads
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.api import encode_prompt, load_for  # noqa: E402
from specviz.bench import timed_events  # noqa: E402
from specviz.bench_inputs import load_prompts, parse_configs  # noqa: E402
from specviz.engine import autoregressive_decode, speculative_decode  # noqa: E402
from specviz.head import head_backend, head_for  # noqa: E402
from specviz.machine import machine_info  # noqa: E402
from specviz.request import RunRequest  # noqa: E402


def timed(decode, *args) -> tuple[list[int], float, dict]:
    events, seconds = timed_events(decode, *args)
    return list(events[-1].token_ids), seconds, events[-1].stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="a draft folder (a head's with --heads)")
    ap.add_argument("--b", required=True, help="another draft folder (a head's with --heads)")
    ap.add_argument("--heads", action="store_true", help="--a and --b are draft heads (for the head drafters)")
    ap.add_argument("--sets", default="everyday,stories,code")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--config", default="lookup+model:auto")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    (config,) = parse_configs(args.config)
    reqs = {
        w: config.request(RunRequest(max_new_tokens=args.max_new_tokens, **{"head" if args.heads else "draft": d}))
        for w, d in [("a", args.a), ("b", args.b)]
    }
    pairs = {w: load_for(r) for w, r in reqs.items()}
    p = pairs["a"][0]
    m = machine_info()
    print(f"CPU: {m['cpu']} ({m['cpu_id']}; {m['cpu_vector']})", flush=True)
    for w, (_, q) in pairs.items():
        if args.heads:
            h = head_for(p, reqs[w].head)
            print(f"{w}: {reqs[w].head}: {head_backend(p, reqs[w].head)}, {h.target_ids.numel():,} output rows")
            continue
        print(f"{w}: {reqs[w].draft}: {q.lean.engine if q.lean else 'transformers'}, "
              f"{q.lean.head.shape[0] if q.lean else q.vocab_size:,} output rows computed", flush=True)  # fmt: skip
    ar_cfg = reqs["a"].replace(mode="ar").spec
    warm = encode_prompt(p, "Tell me something about the sea.")
    timed(autoregressive_decode, p, warm, ar_cfg)
    for w, (pw, q) in pairs.items():
        timed(speculative_decode, pw, q, warm, reqs[w].spec)
    results = []
    for name in args.sets.split(","):
        for i, prompt in enumerate(load_prompts(name)[: args.limit]):
            ids = encode_prompt(p, prompt)
            plain, ar_s, _ = timed(autoregressive_decode, p, ids, ar_cfg)
            for w in ("a", "b") if i % 2 == 0 else ("b", "a"):
                out, s, st = timed(speculative_decode, *pairs[w], ids, reqs[w].spec)
                results.append(dict(set=name, prompt=i, way=w, same=out == plain, speedup=ar_s / s, tokens=len(out),
                                    calls=st["target_calls"], alpha=st["alpha"],
                                    c=(st["draft_s"] / max(st["draft_calls"], 1)) / (ar_s / len(plain))))  # fmt: skip
    for name in args.sets.split(","):
        line = [name]
        for w in ("a", "b"):
            rows = [r for r in results if r["set"] == name and r["way"] == w]
            line.append(
                f"{w}: {statistics.median(r['speedup'] for r in rows):.2f}x, "
                f"{sum(r['tokens'] for r in rows) / sum(r['calls'] for r in rows):.2f} tokens a call, "
                f"alpha {statistics.mean(r['alpha'] for r in rows):.3f}, c {statistics.median(r['c'] for r in rows):.3f}"
            )
        print(" | ".join(line), flush=True)
    print("greedy output equal to plain decoding in every run:", all(r["same"] for r in results))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"a": args.a, "b": args.b, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
