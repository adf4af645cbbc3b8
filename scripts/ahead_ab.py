"""The panel kernels' prefetch (few_rows.c, native.panel_ahead) on against off, interleaved in one process in the
decode loop: the measurement behind lean_panels.choose_ahead.

The pair is loaded as the app loads it (with SPECVIZ_KERNEL_AHEAD=32, so the load's own timing does not pick one);
for each prompt of each set plain decoding runs once (a one-token step never prefetches), then the configuration
with the prefetch at the compiled distance and with none (their order alternating from prompt to prompt), every run
timed by the wall clock around it after an untimed warm-up. Prints per set and way the median per-prompt speedup,
tokens per target call and guesses per round; greedy output must equal plain decoding's in every run.

    python scripts/ahead_ab.py [--config lookup+model:auto] [--sets everyday,stories,code] [--limit 12]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["SPECVIZ_KERNEL_AHEAD"] = "32"  # before specviz loads anything: no timed choice at load
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import ab, native  # noqa: E402

WAYS = ("ahead32", "ahead0")


def main() -> None:
    ap = ab.parser(__doc__)
    ap.set_defaults(config="lookup+model:auto")
    args = ap.parse_args()
    base, config, p, q = ab.load(args)
    m = ab.print_machine()
    print("forwards:", p.lean.engine, "|", q.lean.engine, flush=True)

    def use(way: str) -> None:
        native.panel_ahead(int(way.removeprefix("ahead")))

    results = ab.spec_ways(p, q, args, base.replace(mode="ar").spec, config.request(base).spec, WAYS, use)
    ab.per_set(results, args.sets, WAYS, ab.guesses, config.label)
    ab.finish(results, args.json_out, machine=m)


if __name__ == "__main__":
    main()
