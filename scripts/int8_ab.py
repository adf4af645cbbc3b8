"""The draft's lean forward on float weights against int8 weights (lean.LeanLlama.int8), interleaved in one
process in the decode loop (the measurement behind lean_draft.draft_forward's bar for int8).

The pair is loaded with SPECVIZ_DRAFT_INT8=0 (the draft's float forward, as the load chose its dtype), its int8
variant made from it; for each prompt of each set plain decoding runs once, then the configuration with each
draft forward (their order alternating from prompt to prompt), every run timed by the wall clock around it after
an untimed warm-up. Prints per set and way the median per-prompt speedup, tokens per target call and guesses per
round; greedy output must equal plain decoding's in every run. Use a constant gamma (model:3): auto's price of a
draft step is calibrated once per pair, for one of the two.

    python scripts/int8_ab.py [--config model:3] [--sets everyday,stories,code] [--limit 12] [--int8-layout rows]
    python scripts/int8_ab.py --act8         # int8 weights against int8 weights and activations (lean_panels.with_act8)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["SPECVIZ_DRAFT_INT8"] = "0"  # before specviz loads anything: the draft's float forward
os.environ["SPECVIZ_DRAFT_ACT8"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import ab
from specviz.native import panels as lean_panels  # noqa: E402

WAYS = ("float", "int8")


def main() -> None:
    ap = ab.parser(__doc__)
    ap.set_defaults(config="model:3")
    ap.add_argument(
        "--int8-layout", choices=("panels", "rows"), default="panels", help="how llama.c reads the int8 weights"
    )
    ap.add_argument("--act8", action="store_true", help="int8 weights against int8 weights and int8 activations")
    args = ap.parse_args()
    base, config, p, q = ab.load(args)
    m = ab.print_machine()
    lean = {"float": q.lean, "int8": q.lean.int8()}
    if lean_panels.can(lean["int8"]):
        lean_panels.use(lean["int8"], args.int8_layout == "panels")
    ways = WAYS
    if args.act8:
        ways, lean = ("int8", "act8"), {"int8": lean["int8"], "act8": lean_panels.with_act8(lean["int8"])}
    print("draft forwards:", {w: f.engine for w, f in lean.items()}, flush=True)

    def use(way: str) -> None:
        object.__setattr__(q, "lean", lean[way])  # each run's CachedModel reads it when made

    results = ab.spec_ways(p, q, args, base.replace(mode="ar").spec, config.request(base).spec, ways, use)
    ab.per_set(results, args.sets, ways, ab.guesses, config.label)
    ab.finish(results, args.json_out, machine=m)


if __name__ == "__main__":
    main()
