"""Plain decoding's speed in the app's ways of running it, in one process: alone on the main thread (as the bench
runs it), alone on the app's compute thread, raced against the page's default lane on the main thread, and raced
on the compute thread (as the app's /race runs it, without the server).

    python benchmarks/race_threads.py                  # 3 everyday and 3 story prompts, twice, 64 new tokens

The pair loads as the app loads it (ui.common.default_context().pair(): in the background, the draft after the
target). Alone, a run's tokens/s is over the wall clock around it; raced, over the plain lane's own clock (its
last event's elapsed_s), as the page reports it. Where the four agree, what a visitor's race shows differs from the
bench's only by what the server and the machine do around it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="everyday,stories")
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    from specviz.bench.inputs import load_prompts
    from specviz.bench.machine import machine_info
    from specviz.engine.loop import autoregressive_decode, race, speculative_decode
    from specviz.host import compute
    from specviz.models.loaded import pair_backend
    from specviz.request import RunRequest
    from specviz.ui.common import default_context
    from specviz.ui.inputs import prepare

    ctx = default_context()
    p, q = ctx.pair()
    m = machine_info()
    print(f"{m['cpu']} ({m['cpu_id']}; {m['cpu_vector']}); {pair_backend(p, q)}")
    page = RunRequest()
    plain = page.replace(mode="ar").spec
    prompts = [x for s in a.sets.split(",") for x in load_prompts(s.strip(), a.limit)]

    def alone(ids):
        t0 = time.perf_counter()
        events = list(autoregressive_decode(p, ids, plain))
        return len(events[-1].token_ids) / (time.perf_counter() - t0)

    def raced(ids, way):
        lanes = {"ar": [], "spec": []}
        for side, ev in way(race(autoregressive_decode(p, ids, plain), speculative_decode(p, q, ids, page.spec))):
            lanes[side].append(ev)
        clock = [e.elapsed_s for e in lanes["ar"] if hasattr(e, "elapsed_s")][-1]
        return len(lanes["ar"][-1].token_ids) / clock

    ways = {
        "alone, main thread": alone,
        "alone, compute thread": lambda ids: compute.call(alone, ids),
        "raced, main thread": lambda ids: raced(ids, lambda g: g),
        "raced, compute thread": lambda ids: raced(ids, compute.iterate),
    }
    rates = {k: [] for k in ways}
    for _ in range(a.rounds):
        for prompt in prompts:
            ids = prepare(ctx, prompt, page)[2]
            for k, fn in ways.items():
                rates[k].append(fn(ids))
    for k, v in rates.items():
        print(f"{k:>22s}: plain decoding {statistics.median(v):.1f} tokens/s (median of {len(v)} runs)")


if __name__ == "__main__":
    main()
