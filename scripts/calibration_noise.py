"""How steady auto's verify-cost calibration is, and what the loop itself pays (BENCHMARKS.md, 27 Nov 2026).

1. --draws draws, in one process, of the target's cost of a call over 1 .. 9 tokens, read three ways from the
   same timings: the median of the first 2 calls per size (the calibration until 27 Nov 2026), the median of 6,
   and `costs.relative_times` over 6 made `costs.monotone` (the calibration since). Prints each way's mean curve
   and its spread between draws, in one-token calls.
2. With --loop N: the model drafter at constant gamma 1 .. 7 on N held-out prompts, twice, and plain decoding of
   the same prompts; prints what a verify of each number of guesses cost in the loop (Round.verify_s over the
   median plain step).

    python scripts/calibration_noise.py [--draws 8] [--loop 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.api import encode_prompt, load_for  # noqa: E402
from specviz.bench.inputs import load_prompts  # noqa: E402
from specviz.engine import costs  # noqa: E402
from specviz.engine.loop import autoregressive_decode, speculative_decode  # noqa: E402
from specviz.events import Round, Step  # noqa: E402
from specviz.host.machine import machine_info  # noqa: E402
from specviz.request import RunRequest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIZES = 9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--loop", type=int, default=0, help="held-out prompts for the loop's own verify costs (0: none)")
    args = ap.parse_args()
    req = RunRequest(max_new_tokens=48, drafter="model", gamma=3)
    p, q = load_for(req)
    m = machine_info()
    print(f"CPU: {m['cpu']} ({m['cpu_id']}; {m['cpu_vector']})", flush=True)
    ids = encode_prompt(p, "Tell me something about the sea.")
    ways = {
        "median of 2": lambda s: [statistics.median(x[:2]) for x in s],
        "median of 6": lambda s: [statistics.median(x) for x in s],
        "relative, 6, monotone": lambda s: costs.monotone(costs.relative_times(s)),
    }
    curves: dict[str, list[list[float]]] = {w: [] for w in ways}
    for _ in range(args.draws):
        samples = costs.forward_samples(p, ids, SIZES, costs.CALIBRATION_REPS)
        for way, read in ways.items():
            c = read(samples)
            curves[way].append([t / c[0] for t in c])
    print("tokens:".ljust(32) + " ".join(f"{n:>5}" for n in range(2, SIZES + 1)))
    for way, cs in curves.items():
        mean = [statistics.mean(c[i] for c in cs) for i in range(1, SIZES)]
        sd = [statistics.pstdev(c[i] for c in cs) for i in range(1, SIZES)]
        print(f"{way}, mean".ljust(32) + " ".join(f"{x:5.3f}" for x in mean))
        print(f"{way}, spread".ljust(32) + " ".join(f"{x:5.3f}" for x in sd), flush=True)
    if not args.loop:
        return
    prompts = load_prompts(str(ROOT / "assets" / "prompts" / "heldout.txt"))[: args.loop]
    verify: dict[int, list[float]] = {g: [] for g in range(1, 8)}
    steps: list[float] = []
    for _ in range(2):
        for prompt in prompts:
            ids = encode_prompt(p, prompt)
            steps += [e.forward_s for e in autoregressive_decode(p, ids, req.replace(mode="ar").spec)
                      if isinstance(e, Step) and e.index > 0]  # fmt: skip
            for g in verify:
                for e in speculative_decode(p, q, ids, req.replace(gamma=g).spec):
                    if isinstance(e, Round) and len(e.drafted) == g:
                        verify[g].append(e.verify_s)
    step = statistics.median(steps)
    print(f"the loop: plain step {1000 * step:.1f} ms; a verify of 1 .. 7 guesses, in steps: "
          + " ".join(f"{statistics.median(v) / step:.3f}" for v in verify.values()))  # fmt: skip


if __name__ == "__main__":
    main()
