"""Auto's price of a chain of guesses, the old way against the new, interleaved in one process (the measurement
behind `costs.draft_step_calibration`'s two numbers; BENCHMARKS.md).

Old: every draft step priced as a round's first one, timed right after a target call (its weights come back from
memory). New: the first step so, each further one as timed right after the first (its weights in cache). For
each prompt of each set, plain decoding once and the configuration each way (their order alternating from prompt
to prompt), every run timed by the wall clock around it after an untimed warm-up. Prints the two prices, and per
set the median per-prompt speedup, tokens per target call and the mean guesses per round each way; greedy output
must equal plain decoding's in every run.

    python scripts/pricing_ab.py [--sets everyday,stories,code] [--limit 12] [--config lookup+model:auto]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

import specviz.engine.setup as run_setup  # noqa: E402
from specviz import ab  # noqa: E402

WAYS = ("alike", "first+next")


def main() -> None:
    args = ab.parser(__doc__).parse_args()
    base, config, p, q = ab.load(args)
    m = ab.print_machine()
    real, way_now, seen = run_setup.draft_step_calibration, ["alike"], []

    def priced(*a):  # the old way: the first step's price for every step
        (first, then), spent = real(*a)
        seen.append((first, then))
        return ([first, first] if way_now[0] == "alike" else [first, then]), spent

    run_setup.draft_step_calibration = priced

    def use(way: str) -> None:
        way_now[0] = way

    results = ab.spec_ways(p, q, args, base.replace(mode="ar").spec, config.request(base).spec, WAYS, use)
    print(f"draft step: first {seen[0][0] * 1e3:.2f} ms, next {seen[0][1] * 1e3:.2f} ms (timed once for the pair)")
    ab.per_set(results, args.sets, WAYS, ab.guesses, config.label)
    ab.finish(results, args.json_out, machine=m, prices=seen[0])


if __name__ == "__main__":
    main()
