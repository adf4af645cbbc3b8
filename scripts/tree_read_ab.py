"""A token tree's reads at T = 0, in torch against one native call each (CachedModel.tree_read, csrc/chain.c's
llama_tree_read), interleaved in one process (BENCHMARKS.md).

For each prompt of each set plain decoding runs once and the configuration each way (their order alternating from
prompt to prompt), every run timed by the wall clock around it after an untimed warm-up. Prints per set and way the
median per-prompt speedup, tokens per target call and guesses per round, then per way the milliseconds a round
spent drafting; greedy output must equal plain decoding's in every run. Use a fixed tree: tree=auto prices a
node by the read it timed once per process, the native one.

    python scripts/tree_read_ab.py [--sets everyday,stories] [--limit 10] [--config model:3:tree=4]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import ab
from specviz.backends import local as runtime  # noqa: E402

WAYS = ("torch", "native")


def main() -> None:
    ap = ab.parser(__doc__)
    ap.set_defaults(sets="everyday,stories", limit=10, config="model:3:tree=4")
    args = ap.parse_args()
    base, config, p, q = ab.load(args)
    m = ab.print_machine()
    native, timed, way_now = runtime.CachedModel.tree_read, ab.timed, ["native"]
    drafting: dict[str, list[float]] = {w: [] for w in WAYS}  # seconds a round spent drafting, per way

    def timed_rounds(decode, *a) -> ab.Run:
        run = timed(decode, *a)
        if run.rounds:
            drafting[way_now[0]].extend(r.draft_s for r in run.rounds)
        return run

    def use(way: str) -> None:
        way_now[0] = way
        runtime.CachedModel.tree_read = native if way == "native" else (lambda *a: None)

    ab.timed = timed_rounds
    results = ab.spec_ways(p, q, args, base.replace(mode="ar").spec, config.request(base).spec, WAYS, use)
    ab.per_set(results, args.sets, WAYS, ab.guesses, config.label)
    for way in WAYS:
        print(f"{way}: drafting {1e3 * statistics.mean(drafting[way]):.2f} ms a round ({len(drafting[way])} rounds)")
    ratio = [n["speedup"] / t["speedup"] for t, n in zip(results[0::2], results[1::2])]  # rows come in prompt pairs
    flipped = [r if results[2 * i]["way"] == "torch" else 1 / r for i, r in enumerate(ratio)]
    print(f"native / torch, median per prompt: {statistics.median(flipped):.3f}")
    ab.finish(results, args.json_out, machine=m, config=args.config)


if __name__ == "__main__":
    main()
