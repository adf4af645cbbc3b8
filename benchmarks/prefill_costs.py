"""A prompt's prefill on the built-in target, each way the lean forward can run one longer than a call of 16 tokens:
llama.c in calls of up to 16 tokens, or PyTorch's batched products (which dequantise int8 and NF4 weights for the
call). Says up to which length the calls are faster on this machine, the figure native.forward.CHUNKED_PREFILL holds per
weight type.

    python benchmarks/prefill_costs.py [--quantize 4bit|8bit] [--lengths 24,48,96,192,384] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specviz.bench.machine import machine_info  # noqa: E402
from specviz.config import BUILTIN_TARGET  # noqa: E402
from specviz.models.loaded import load_model  # noqa: E402
from specviz.native import library as native

WAYS = {"llama.c calls": 10**6, "PyTorch ops": 0}  # the forward's chunked_up_to, each way


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quantize", choices=["4bit", "8bit"], default=None)
    ap.add_argument("--lengths", default="24,48,96,192,384")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if native.library() is None:
        raise SystemExit(f"llama.c is not available here: {native.why_not()}")
    m = load_model(BUILTIN_TARGET, device="cpu", quantize=args.quantize).lean
    lengths = [int(n) for n in args.lengths.split(",")]
    times: dict[tuple[int, str], list[float]] = {}
    g = torch.Generator().manual_seed(0)
    for rep in range(args.reps + 1):  # the first repetition warms up; the ways alternate within each
        for n in lengths:
            ids = torch.randint(100, 20000, (n,), generator=g)
            for way, limit in WAYS.items():
                t0 = time.perf_counter()
                m.forward(m.new_cache(), ids, last_only=True, chunked_up_to=limit)
                if rep:
                    times[(n, way)] = times.get((n, way), []) + [time.perf_counter() - t0]
    info = machine_info()
    print(
        f"{info['cpu']} ({info['cpu_id']}; {info['cpu_vector']}) · torch {info['torch']}, {info['torch_threads']} threads"
    )
    print(f"{m.engine} · medians of {args.reps}, the two ways alternating")
    print(f"{'tokens':>6} {'llama.c calls':>14} {'PyTorch ops':>12}  faster")
    for n in lengths:
        c, t = (1e3 * statistics.median(times[(n, w)]) for w in WAYS)
        print(f"{n:>6} {c:>11.0f} ms {t:>9.0f} ms  {'llama.c calls' if c < t else 'PyTorch ops'}")


if __name__ == "__main__":
    main()
