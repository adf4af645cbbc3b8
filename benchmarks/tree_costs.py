"""What a token tree costs on this CPU beside a chain, for the built-in pair: the target's call over 8 positions fed
as a chain, as a tree (a 4-D mask, `CachedModel.feed_tree`) and as a chain through that masked path; and the
draft's call over 1..6 sibling nodes right after a target step, as a tree's reads find its weights (cold).

    python benchmarks/tree_costs.py [--reps 15]

Prints medians in ms and in units of the target's one-token step (target) or of the draft's one-node call (draft).
A call of several nodes is what a tree grown a level at a time would pay per level (EAGLE-2's expansion), where
the best-first growth of drafters.py pays one call per node it reads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.backends.local import CachedModel  # noqa: E402
from specviz.bench.machine import machine_info  # noqa: E402
from specviz.models.loaded import load_pair  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    p, q = load_pair(device="cpu")
    info = machine_info()
    print(f"{info['cpu']} ({info['cpu_id']}; {info['cpu_vector']}) · {torch.get_num_threads()} threads")
    tr, dr = CachedModel(p, p.vocab_size), CachedModel(q, p.vocab_size)
    prompt = torch.randint(100, 5000, (30,), generator=torch.Generator().manual_seed(0))
    tr.prefill(prompt)
    dr.prefill(prompt)
    tb, db = tr.length, dr.length
    ids = torch.randint(100, 5000, (8,), generator=torch.Generator().manual_seed(1))
    tree = [tb - 1, tb, tb, tb, tb + 1, tb + 1, tb + 4, tb + 6]  # a root's line with branches, 8 positions
    chain = [tb - 1 + i for i in range(8)]
    target = {
        "one-token step": lambda: tr.feed(ids[:1]),
        "8 positions, a chain": lambda: tr.feed(ids),
        "8 positions, a tree": lambda: tr.feed_tree(ids, tree),
        "8 positions, a chain as a tree": lambda: tr.feed_tree(ids, chain),
    }
    nodes = (1, 2, 3, 4, 6)
    t_times: dict[str, list[float]] = {k: [] for k in target}
    d_times: dict[int, list[float]] = {m: [] for m in nodes}
    for rep in range(args.reps + 1):  # the first one warms up
        for name, call in target.items():
            t0 = time.perf_counter()
            call()
            if rep:
                t_times[name].append(time.perf_counter() - t0)
            tr.rollback(tb)
        for m in nodes:
            tr.feed(ids[:1])  # a target step: the draft's weights leave the caches, as in a round
            tr.rollback(tb)
            x = ids[:m]
            t0 = time.perf_counter()
            dr.feed(x, last_only=True) if m == 1 else dr.feed_tree(x, [db - 1] * m)  # m siblings
            if rep:
                d_times[m].append(time.perf_counter() - t0)
            dr.rollback(db)
    step = statistics.median(t_times["one-token step"])
    for name, v in t_times.items():
        print(f"target, {name:32s} {statistics.median(v) * 1e3:6.2f} ms  {statistics.median(v) / step:5.2f} steps")
    one = statistics.median(d_times[1])
    for m, v in d_times.items():
        print(f"draft, {m} node{'s' if m > 1 else ' '} after a target step    {statistics.median(v) * 1e3:6.3f} ms"
              f"  {statistics.median(v) / one:5.2f} one-node calls")  # fmt: skip


if __name__ == "__main__":
    main()
