"""Two thread counts for the models' calls, interleaved in one process (the measurement behind specviz/cpus.py):
run it inside the CPU quota it is about, e.g. a cgroup allowed one CPU on a 2-core machine.

For each prompt of each set, each count (their order alternating from prompt to prompt) runs plain decoding and
the configuration, every run timed by the wall clock around it after an untimed warm-up. The thread count never
changes the numbers (each output computed whole by one thread), so both ways must write the same tokens; greedy
output must equal plain decoding's in every run. Prints per set and count the median per-prompt speedup and the
tokens per second of each lane.

    python scripts/threads_ab.py [--threads 2,1] [--sets everyday,stories,code] [--limit 12]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import ab, cpus  # noqa: E402


def main() -> None:
    ap = ab.parser(__doc__)
    ap.add_argument("--threads", default="2,1", help="the two thread counts, e.g. 2,1")
    args = ap.parse_args()
    ways = tuple(args.threads.split(","))
    base, config, p, q = ab.load(args)
    m = ab.print_machine()
    print(f"CPU quota: {cpus.cpu_quota()} CPUs; usable: {cpus.usable_cpus()}; the fit: {cpus.fit_threads()}")

    def use(way: str) -> None:
        torch.set_num_threads(int(way))

    results = ab.both_lanes(p, q, args, base.replace(mode="ar").spec, config.request(base).spec, ways, use)
    ab.per_set(results, args.sets, ways, ab.lanes, config.label)
    differ, prompts = ab.differing_prompts(results)
    print(f"prompts where the two counts wrote other tokens: {differ} of {prompts}")
    ab.finish(results, args.json_out, machine=m, quota=cpus.cpu_quota())


if __name__ == "__main__":
    main()
