"""The panel kernels' prefetch settings (few_rows.c, native.panel_prefetch) interleaved in one process in the
decode loop: the measurement behind lean_panels.choose_prefetch.

The pair is loaded as the app loads it (with SPECVIZ_KERNEL_PREFETCH set to the first way, so the load's own timing
does not pick one); for each prompt of each set plain decoding runs once (a one-token step never prefetches), then
the configuration with each setting (their order alternating from prompt to prompt), every run timed by the wall
clock around it after an untimed warm-up. Prints per set and way the median per-prompt speedup, tokens per target
call and guesses per round; greedy output must equal plain decoding's in every run. Use a constant gamma (model:3):
auto's price of a call is calibrated once, at load, under one setting.

    python scripts/prefetch_ab.py [--ways L1:32,none] [--config model:3] [--sets everyday,stories,code] [--limit 12]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder


def main() -> None:
    from specviz import ab
    from specviz.native import library as native

    ap = ab.parser(__doc__)
    ap.set_defaults(config="model:3")
    ap.add_argument("--ways", default="none,L2:64", help="two settings: none, L1:ROWS, L2:ROWS")
    args = ap.parse_args()
    ways = tuple(args.ways.split(","))
    if len(ways) != 2:
        ap.error("--ways takes two settings")
    for w in ways:
        native.parse_prefetch(w)
    os.environ["SPECVIZ_KERNEL_PREFETCH"] = ways[0]  # before the pair loads: no timed choice at load
    base, config, p, q = ab.load(args)
    m = ab.print_machine()
    print("forwards:", p.lean.engine, "|", q.lean.engine, flush=True)
    results = ab.spec_ways(
        p, q, args, base.replace(mode="ar").spec, config.request(base).spec, ways, native.panel_prefetch
    )
    ab.per_set(results, args.sets, ways, ab.guesses, config.label)
    ab.finish(results, args.json_out, machine=m)


if __name__ == "__main__":
    main()
