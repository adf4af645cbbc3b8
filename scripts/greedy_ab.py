"""Greedy decoding's Python around the models' calls, before and after: PyTorch's argmax against native.first_max
(csrc/greedy.c), and a lean draft's greedy step over every row of its vocabulary (the rows it never proposes
scattered in as -inf) against over the rows its output layer computes (sampling.FAST_GREEDY), interleaved in one
process (BENCHMARKS.md).

For each prompt of each set, each way (their order alternating from prompt to prompt) runs plain decoding and the
configuration, every run timed by the wall clock around it after an untimed warm-up. Prints per set and way the
median per-prompt speedup and the tokens per second of each lane, then per way the milliseconds a plain step and a
speculative round spent outside the two models' llama.c calls (the Python this is about: the machine's memory
bandwidth, which moves the calls themselves by tens of per cent from second to second here, stays out of it);
greedy output must be the same tokens both ways (the same logits, the same argmax) and equal to plain decoding's
in every run.

    python scripts/greedy_ab.py [--sets everyday,stories,code] [--limit 12] [--config lookup+model:auto]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import ab, sampling
from specviz.native import forward as lean  # noqa: E402

WAYS = ("torch", "native")


def main() -> None:
    args = ab.parser(__doc__).parse_args()
    base, config, p, q = ab.load(args)
    m = ab.print_machine()

    inside, native, timed = [0.0], lean.LeanLlama._native, ab.timed
    outside: dict[tuple[str, str], list[float]] = {}  # (way, lane) -> [seconds outside the calls, steps or rounds]

    def counted(self, *a):  # every llama.c call of either model, timed
        t = time.perf_counter()
        try:
            return native(self, *a)
        finally:
            inside[0] += time.perf_counter() - t

    def timed_apart(decode, *a) -> ab.Run:  # ab.timed, and what the run spent outside those calls
        inside[0] = 0.0
        run = timed(decode, *a)
        lane = "spec" if run.rounds else "plain"
        o = outside.setdefault(("native" if sampling.FAST_GREEDY else "torch", lane), [0.0, 0])
        o[0] += run.seconds - inside[0]
        o[1] += len(run.rounds) or len(run.tokens)
        return run

    lean.LeanLlama._native, ab.timed = counted, timed_apart

    def use(way: str) -> None:
        sampling.FAST_GREEDY = way == "native"

    results = ab.both_lanes(p, q, args, base.replace(mode="ar").spec, config.request(base).spec, WAYS, use)
    ab.per_set(results, args.sets, WAYS, ab.lanes, config.label)
    for way in WAYS:
        (ps, steps), (ss, rounds) = outside[(way, "plain")], outside[(way, "spec")]
        print(
            f"{way}: outside the models' calls {1e3 * ps / steps:.3f} ms a plain step, {1e3 * ss / rounds:.3f} ms a round"
        )
    differ, prompts = ab.differing_prompts(results)
    print(f"prompts where the two ways wrote other tokens: {differ} of {prompts}")
    ab.finish(results, args.json_out, machine=m)


if __name__ == "__main__":
    main()
