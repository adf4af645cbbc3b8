"""What a busy neighbour does to PyTorch's own ops (the reason torch's thread count follows cpus.threads): the
row-wise softmax of a sampled round's probabilities (k + 1 rows over the built-in target's 49,152 tokens), timed on
1 and 2 threads, with nothing beside it and beside a busy loop that keeps a CPU busy a share of every 10 ms.

    python scripts/neighbour_ops.py [--rows 4] [--duties 0,0.5,1]

Prints, per neighbour, the microseconds a call (median of 5 blocks of 400 calls, after a warm-up) on each count.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specviz import ab  # noqa: E402
from specviz.host.machine import machine_info  # noqa: E402


def per_call_us(x: torch.Tensor, threads: int) -> float:
    torch.set_num_threads(threads)
    for _ in range(50):
        torch.softmax(x, -1)
    blocks = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(400):
            torch.softmax(x, -1)
        blocks.append((time.perf_counter() - start) / 400 * 1e6)
    return statistics.median(blocks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--duties", default="0,0.5,1", help="the neighbour's busy share of every 10 ms (0: none)")
    args = ap.parse_args()
    m = machine_info()
    print(f"CPU: {m['cpu']} ({m['cpu_id']}; {m['cpu_vector']})")
    x = torch.randn(args.rows, 49152)
    for duty in (float(d) for d in args.duties.split(",")):
        with ab.busy_neighbour(duty):
            time.sleep(0.5)
            times = {n: per_call_us(x, n) for n in (2, 1)}
        print(
            f"neighbour busy {duty:.0%}: softmax of {args.rows} x 49,152 "
            + ", ".join(f"{n} thread{'s' if n > 1 else ''} {us:.0f} us" for n, us in times.items())
        )


if __name__ == "__main__":
    main()
