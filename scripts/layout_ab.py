"""llama.c reading the weights by rows against packed in panels (lean_panels), both models of the pair, interleaved
in one process (the measurement behind the panels; BENCHMARKS.md).

For each prompt of each set, each way (their order alternating from prompt to prompt) runs plain decoding and the
configuration, every run timed by the wall clock around it after an untimed warm-up; switching ways switches the
target's and the draft's layout (both packed once, up front) and drops the kept openings, which each way encodes again
off its clocks. Prints per set and way the median per-prompt speedup and the tokens per second of each lane; greedy
output must equal plain decoding's in every run. The two ways' outputs may differ where the target's top two logits
tie within float32 rounding (the layouts sum in different orders); the script counts such prompts.

    python scripts/layout_ab.py [--sets everyday,stories,code] [--limit 12] [--config lookup+model:auto]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import ab
from specviz.backends import local as runtime  # noqa: E402
from specviz.native import panels as lean_panels

WAYS = ("rows", "panels")


def main() -> None:
    args = ab.parser(__doc__).parse_args()
    base, config, p, q = ab.load(args)
    m = ab.print_machine()
    fwds = [lm.lean for lm in (p, q) if lm is not None and lm.lean is not None and lean_panels.can(lm.lean)]
    packs = [lean_panels.packs(f) for f in fwds]
    print("forwards:", [f.engine for f in fwds], flush=True)

    def use(way: str) -> None:  # both forwards read their weights this way; openings encoded anew
        for f, packed in zip(fwds, packs):
            lean_panels.use(f, way == "panels", packed)
        runtime.forget_openings()

    results = ab.both_lanes(p, q, args, base.replace(mode="ar").spec, config.request(base).spec, WAYS, use)
    ab.per_set(results, args.sets, WAYS, ab.lanes, config.label)
    differ, prompts = ab.differing_prompts(results)
    print(f"prompts where the two ways wrote other tokens: {differ} of {prompts}")
    ab.finish(results, args.json_out, machine=m)


if __name__ == "__main__":
    main()
