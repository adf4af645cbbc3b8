"""The chat template's opening kept (runtime.keep_opening) against every prompt encoded whole, interleaved in one
process (the measurement behind the opening's rows being copied; BENCHMARKS.md).

For each prompt of each set, each way (their order alternating from prompt to prompt) runs plain decoding and the
configuration, every run timed by the wall clock around it after an untimed warm-up; "whole" runs with
SPECVIZ_KEEP_OPENING=0, so every prefill encodes every token (switching ways drops the kept openings, and each way's
runs encode the opening again off their clocks, as a process's first run does). Prints per set and way the median per-prompt
speedup, the median prefill of each lane and the tokens per second of each; greedy output must equal plain
decoding's in every run, and the two ways' outputs each other's.

    python scripts/opening_ab.py [--sets everyday,stories,code] [--limit 12] [--config lookup+model:auto]
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import ab
from specviz.backends import local as runtime  # noqa: E402

WAYS = ("whole", "kept")


def main() -> None:
    args = ab.parser(__doc__).parse_args()
    base, config, p, q = ab.load(args)
    m = ab.print_machine()
    print("openings:", [f"{lm.name}: {len(runtime.template_opening(lm))} tokens" for lm in (p, q) if lm], flush=True)

    def use(way: str) -> None:  # the next prefill of each model keeps its opening (anew), or keeps none
        os.environ["SPECVIZ_KEEP_OPENING"] = "1" if way == "kept" else "0"
        runtime.forget_openings()

    def describe(rows: list[dict]) -> str:
        prefill = [1000 * statistics.median(r[k] for r in rows) for k in ("ar_prefill", "spec_prefill")]
        return f"{ab.lanes(rows)}, prefill plain / spec {prefill[0]:.0f} / {prefill[1]:.0f} ms"

    results = ab.both_lanes(p, q, args, base.replace(mode="ar").spec, config.request(base).spec, WAYS, use)
    ab.per_set(results, args.sets, WAYS, describe, config.label)
    print("the two ways wrote the same tokens on every prompt:", ab.differing_prompts(results)[0] == 0)
    ab.finish(results, args.json_out, machine=m)


if __name__ == "__main__":
    main()
