"""What a verify costs in one-token steps under each of the panels' prefetch settings, in one process, interleaved:
the numbers behind lean_panels.PREFETCHES (the settings the load times) on this CPU.

    python benchmarks/prefetch_costs.py                              # none, L1:16, L1:32, L2:64, L2:128, L2:256, L2:512
    python benchmarks/prefetch_costs.py --settings L1:32,L2:128 --reps 30

The built-in target loads as usual (its weights in panels where timing says so; force them with
SPECVIZ_KERNEL_LAYOUT=panels), then every repetition runs calls of 1-6 tokens after the prompt under each setting in
turn (the order reversed every other repetition). A call of n tokens is read against the one-token step of the same
repetition and setting (a one-token call never prefetches, so the steps are alike), and the median over repetitions
printed; the memory's drift falls on all settings alike. Any setting computes the same numbers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROMPT = "Tell me about gravity, the moon and the tides of the sea, and why a day on the moon is so long."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default="none,L1:16,L1:32,L2:64,L2:128,L2:256,L2:512")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=6)
    a = ap.parse_args()
    import torch

    from specviz.bench.machine import machine_info
    from specviz.config import BUILTIN_TARGET
    from specviz.engine.costs import feed_seconds, open_run, read_bandwidth
    from specviz.models.loaded import load_model, pair_backend
    from specviz.native import library as native

    p = load_model(BUILTIN_TARGET, device="cpu")
    chosen = native.panel_prefetch()
    if chosen is None:
        raise SystemExit(f"the kernel is not used here: {native.why_not()}")
    m = machine_info()
    print(f"{m['cpu']} ({m['cpu_id']}; {m['cpu_vector']}); {pair_backend(p, p)}; chosen at load: {chosen}")
    settings = a.settings.split(",")
    sizes = range(1, a.tokens + 1)
    prompt = torch.tensor(p.tokenizer(PROMPT)["input_ids"])
    times = {(s, n): [] for s in settings for n in sizes}
    with torch.inference_mode():
        run = open_run(p, p.vocab_size)
        run.prefill(prompt)
        at = run.length
        block = prompt.repeat(a.tokens // len(prompt) + 1)[: a.tokens]
        for rep in range(a.reps + 1):  # the first repetition warms up
            for s in settings if rep % 2 else settings[::-1]:
                native.panel_prefetch(s)
                for n in sizes:
                    dt = feed_seconds(run, block[:n], at)
                    if rep:
                        times[(s, n)].append(dt)
    native.panel_prefetch(chosen)
    step = statistics.median(t for s in settings for t in times[(s, 1)])
    print(f"one-token step {step * 1e3:.2f} ms (median over settings); cost of 2-{a.tokens} tokens in steps:")
    for s in settings:
        costs = [statistics.median(x / y for x, y in zip(times[(s, n)], times[(s, 1)])) for n in sizes[1:]]
        print(f"{s:>8s}: " + " ".join(f"{c:.3f}" for c in costs))
    print(f"read bandwidth now {read_bandwidth(540 << 20):.1f} GB/s")


if __name__ == "__main__":
    main()
