"""Why the app runs its models on one thread (specviz/host/compute.py): the target's forward time over 1..5 tokens,
measured on the thread that loaded it, then on a second thread while the first is still alive, then on the first
again, then in a fresh process as the app runs it: loaded by a short-lived thread, run on the compute thread.

    python benchmarks/thread_costs.py             # the built-in target
    python benchmarks/thread_costs.py --target DIR --tokens 5

Prints one line per measurement: milliseconds per call for 1, 2, ... tokens (median of 5, after a warm-up).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROMPT = "Tell me about gravity, the moon and the tides of the sea."


def measure(target: str | None, tokens: int, where: str) -> None:
    from specviz.config import BUILTIN_TARGET
    from specviz.engine.costs import forward_times
    from specviz.host import compute
    from specviz.models.loaded import load_model

    if where == "compute":  # as the app does: a short-lived thread loads (its OpenMP team ends with it)
        box = []
        loader = threading.Thread(target=lambda: box.append(load_model(target or BUILTIN_TARGET)))
        loader.start()
        loader.join()
        p = box[0]
    else:
        p = load_model(target or BUILTIN_TARGET)
    ids = p.tokenizer(PROMPT)["input_ids"]

    def show(label: str) -> None:
        times = forward_times(p, ids, tokens, reps=5)
        print(f"{label:<44} " + "  ".join(f"{t * 1e3:6.1f}" for t in times), flush=True)

    if where == "compute":  # a fresh process in which only the compute thread runs the model
        compute.call(show, "app's compute thread (fresh process)")
        return
    show("main thread (loaded the model)")
    other = threading.Thread(target=show, args=("a second thread, the main one still alive",))
    other.start()
    other.join()
    show("main thread again")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="default: the built-in target")
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--where", default="threads", choices=["threads", "compute"], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    print(f"ms per forward call over {', '.join(map(str, range(1, a.tokens + 1)))} tokens")
    measure(a.target, a.tokens, a.where)
    if a.where == "threads":
        cmd = [sys.executable, __file__, "--where", "compute", "--tokens", str(a.tokens)]
        out = subprocess.run(cmd + (["--target", a.target] if a.target else []), capture_output=True, text=True)
        print(out.stdout.splitlines()[-1] if out.returncode == 0 else out.stderr[-500:])


if __name__ == "__main__":
    main()
