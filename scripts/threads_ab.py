"""Two thread counts for the models' calls, interleaved in one process (the measurements behind specviz/host/cpus.py):
run it inside the CPU quota it is about (e.g. a cgroup allowed one CPU on a 2-core machine), or with
--neighbour: a second program keeping one CPU busy the whole time (busy) or a share of every 10 ms (0.35). A way is a number of threads, fixed,
or `auto`: torch's count less the CPUs other programs keep busy (cpus.threads), with the share of native calls
it ran on fewer threads.

For each prompt of each set, each count (their order alternating from prompt to prompt) runs plain decoding and
the configuration, every run timed by the wall clock around it after an untimed warm-up. The thread count never
changes the numbers (each output computed whole by one thread), so both ways must write the same tokens; greedy
output must equal plain decoding's in every run. Prints per set and count the median per-prompt speedup and the
tokens per second of each lane.

    python scripts/threads_ab.py [--threads 2,1] [--sets everyday,stories,code] [--limit 12]
    python scripts/threads_ab.py --threads 2,auto --neighbour busy
    python scripts/threads_ab.py --threads 2,1 --neighbour 0.35     # a neighbour busy 3.5 ms of every 10
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import ab
from specviz.host import cpus  # noqa: E402


def main() -> None:
    ap = ab.parser(__doc__)
    ap.add_argument("--threads", default="2,1", help="the two ways: thread counts or auto, e.g. 2,1 or 2,auto")
    ap.add_argument(
        "--neighbour",
        default="none",
        help="busy: a busy loop beside it; a fraction, e.g. 0.35: busy that share of every 10 ms",
    )
    args = ap.parse_args()
    ways = tuple(args.threads.split(","))
    base, config, p, q = ab.load(args)
    m = ab.print_machine()
    print(f"CPU quota: {cpus.cpu_quota()} CPUs; usable: {cpus.usable_cpus()}; the fit: {cpus.fit_threads()}")
    most = torch.get_num_threads()
    used: collections.Counter = collections.Counter()
    chosen = cpus.threads

    def counted() -> int:
        n = chosen()
        used[n] += cpus._most is not None
        return n

    cpus.threads = counted  # the native calls look it up on the module at each call

    def use(way: str) -> None:
        ab.thread_way(way, most)

    duty = 1.0 if args.neighbour == "busy" else 0.0 if args.neighbour == "none" else float(args.neighbour)
    with ab.busy_neighbour(duty):
        results = ab.both_lanes(p, q, args, base.replace(mode="ar").spec, config.request(base).spec, ways, use)
    ab.per_set(results, args.sets, ways, ab.lanes, config.label)
    if "auto" in ways:
        print("auto's native calls by thread count:", dict(sorted(used.items())))
    differ, prompts = ab.differing_prompts(results)
    print(f"prompts where the two counts wrote other tokens: {differ} of {prompts}")
    ab.finish(results, args.json_out, machine=m, quota=cpus.cpu_quota())


if __name__ == "__main__":
    main()
