"""Does the pair check predict what the benchmark measures? Run both on the same prompts and compare.

1. `check_pair` measures alpha on its sample prompts (chat, story, code, summarise), the cost ratio c and the
   verify cost of k + 1 tokens on this machine, and predicts the speedup at every gamma; it recommends one.
2. `run_bench` then decodes the same prompts plainly and speculatively at that gamma (model drafter, constant
   gamma, greedy, interleaved per prompt after a warm-up) and measures the speedup.

    python benchmarks/predict_vs_bench.py                  # the built-in pair
    python benchmarks/predict_vs_bench.py --target T --draft D --max-new-tokens 64
    python benchmarks/predict_vs_bench.py --quantize 4bit  # the target loaded by bitsandbytes (NF4; 8bit: int8)

Prints one JSON object: predicted and measured speedup and tokens per target call, and their ratios; and the
check's own measured speedup at the gamma its acceptance runs used, beside its prediction there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> dict:
    from specviz import check_pair, load_pair
    from specviz.bench.measure import run_bench
    from specviz.pairs.check import SAMPLE_PROMPTS
    from specviz.pairs.measure import CHECK_GAMMA
    from specviz.theory import expected_tokens

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default=None)
    ap.add_argument("--quantize", choices=["4bit", "8bit"], default=None)
    args = ap.parse_args(argv)

    p, q = load_pair(args.target, args.draft, device=args.device, quantize=args.quantize)
    prompts = [x for v in SAMPLE_PROMPTS.values() for x in v]
    rep = check_pair(p, q, max_new_tokens=args.max_new_tokens)
    g = rep.best_gamma
    table = run_bench(p, q, prompts, [g], [0.0], max_new_tokens=args.max_new_tokens, hf=False)
    row = table.iloc[0]
    out = {
        "target": p.name,
        "draft": q.name,
        "quantize": args.quantize,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "alpha_check": rep.a,
        "alpha_interval": [rep.acceptance.low, rep.acceptance.high],
        "alpha_bench": float(row["alpha"]),
        "c": rep.c,
        "gamma": g,
        "predicted_speedup": rep.best_speedup,
        "predicted_speedup_with_prefill": rep.prefill_speedup,
        "measured_speedup": float(row["speedup_vs_ar"]),  # the bench times a run with its prefill
        "predicted_tokens_per_call": expected_tokens(rep.a, g),
        "measured_tokens_per_call": float(row["tokens_per_call"]),
        "identical": bool(row["identical"]),
        # the check's own runs at its gamma against the plain runs beside them, and its prediction there
        "check_gamma": CHECK_GAMMA,
        "check_measured_speedup": rep.measured_speedup,
        "check_predicted_speedup": rep.speedups_measured[CHECK_GAMMA - 1],
    }
    out["speedup_ratio"] = out["predicted_speedup"] / out["measured_speedup"]
    out["speedup_with_prefill_ratio"] = out["predicted_speedup_with_prefill"] / out["measured_speedup"]
    out["tokens_per_call_ratio"] = out["predicted_tokens_per_call"] / out["measured_tokens_per_call"]
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
