"""What fresh loads choose on this machine: the built-in target's layout (rows or panels) and the panels' prefetch,
each load in a process of its own, with every draw the choice saw and what the choice is worth in that process.

    python scripts/load_choices.py               # 6 loads
    python scripts/load_choices.py --loads 10

Each child wraps lean_panels.time_layouts and lean_panels.time_prefetch (the choices themselves run unchanged),
loads the target as every path does (models.load_model) and prints one line: the layout's draws (panels' time over
rows', a step and a 4-token call), the prefetch's draws (each setting's time over the compiled one's), the choices,
then the median of 2- and 4-token calls under the compiled prefetch and under the chosen one, interleaved after the
load (what the choice was worth in that process, a minute of this machine's memory later).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child() -> None:
    import torch

    from specviz.config import BUILTIN_TARGET
    from specviz.models.loaded import load_model
    from specviz.native import library as native
    from specviz.native import panels as lean_panels

    seen: dict[str, list] = {"layout": [], "prefetch": []}
    time_layouts, time_prefetch = lean_panels.time_layouts, lean_panels.time_prefetch

    def layouts(mats, rows=(1, 4)):
        (step_r, verify_r), (step_p, verify_p) = out = time_layouts(mats, rows)
        if sum(w.numel() * w.element_size() for w, _, _ in mats) >= lean_panels.PASSES_MIN_BYTES:  # the target's
            seen["layout"].append([round(step_p / step_r, 3), round(verify_p / verify_r, 3)])
        return out

    def prefetch(call, rows=(2, 4)):
        out = time_prefetch(call, rows)
        seen["prefetch"].append({s: round(t / out[native.PANEL_PREFETCH], 3) for s, t in out.items()})
        return out

    lean_panels.time_layouts, lean_panels.time_prefetch = layouts, prefetch
    fwd = load_model(BUILTIN_TARGET, device="cpu").lean
    chosen = native.panel_prefetch()
    worth = {}
    if fwd is not None and fwd.packed:
        cache, ids = fwd.new_cache(), torch.arange(40) % 1000
        fwd.forward(cache, ids[:32])
        settings = list(dict.fromkeys([native.PANEL_PREFETCH, chosen]))
        times = {(s, m): [] for s in settings for m in (2, 4)}
        with torch.inference_mode():
            for _ in range(15):
                for s in settings:
                    native.panel_prefetch(s)
                    for m in (2, 4):
                        cache.length = 32
                        t0 = time.perf_counter()
                        fwd.forward(cache, ids[32 : 32 + m])
                        times[s, m].append(time.perf_counter() - t0)
        native.panel_prefetch(chosen)
        worth = {f"{s} {m}": round(statistics.median(v) * 1e3, 2) for (s, m), v in times.items()}
    layout = "panels" if fwd is not None and fwd.packed else "rows"
    compiled = native.PANEL_PREFETCH
    print(json.dumps({"layout": layout, "prefetch": chosen, "compiled": compiled, "seen": seen, "median ms": worth}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", type=int, default=6)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child()
    from specviz.host.machine import machine_info

    facts = machine_info()
    print(f"{facts['cpu']} ({facts['cpu_id']}; {facts['cpu_vector']})")
    for i in range(args.loads):
        out = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, cwd=ROOT)
        lines = out.stdout.strip().splitlines()
        if out.returncode or not lines:
            print(f"load {i + 1}: the child failed\n{out.stderr[-2000:]}")
            continue
        r = json.loads(lines[-1])
        layout = " ".join(f"{s}/{v}" for s, v in r["seen"]["layout"])
        best = [min((t, s) for s, t in d.items() if s != r["compiled"]) for d in r["seen"]["prefetch"]]
        draws = " ".join(f"{s} {t}" for t, s in best)
        print(
            f"load {i + 1}: {r['layout']} (panels/rows, step/verify: {layout}); prefetch {r['prefetch']} after "
            f"{len(best)} draw(s) (the best other setting each: {draws}); median ms after: {r['median ms']}"
        )


if __name__ == "__main__":
    main()
