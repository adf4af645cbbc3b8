"""What a verify costs on this CPU, path by path, against the memory-bound limit: the numbers behind kernels.py's
choice and the per-CPU tables in BENCHMARKS.md.

    python scripts/cpu_costs.py                 # the built-in pair, every linear-layer path, 1-8 tokens
    python scripts/cpu_costs.py --tokens 5 --paths torch,kernel,kernel:transformers

A path is a linear-layer path (SPECVIZ_CPU_GEMM: torch, transposed, kernel), run by the lean forward where the
model fits (specviz/native/forward.py: llama.c with the kernel, PyTorch ops otherwise); ":transformers" runs it through
transformers' own forward instead (SPECVIZ_FORWARD=transformers); "@rows", "@panels" or "@tiles" (AMX) forces how
llama.c reads the weights (SPECVIZ_KERNEL_LAYOUT; otherwise timed, lean_panels.py), e.g. `--paths kernel@rows,kernel@panels`.
For each path (forced, in a fresh process each, interleaved over --rounds) it prints the target's
one-token step in ms, the cost of a call of 2..N tokens in one-token steps of the same path, and the draft's step
and c (draft step / target step) in float32 and float16. The limit: the target's weights in bytes over the
bandwidth of one pass that only reads them (a sum over a buffer as large as the weights), i.e. the fastest a step
can be here; a verify of a few tokens reads the same bytes, so at the limit it costs one step. Beside it, the
arithmetic: a token's multiply-adds (one per weight) at the float32 rate torch's own product reaches on operands in
cache with the same threads; a call of n tokens can cost no less than the larger of the two (reads and arithmetic
overlapped whole), and a kernel that overlaps none of them pays their sum. Both are printed in steps of the path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROMPT = "Tell me about gravity, the moon and the tides of the sea, and why a day on the moon is so long."


def one(path: str, tokens: int) -> dict:
    """In this process: the target's forward times over 1..tokens and the draft's one-token step on `path`."""
    path_only, _, layout = path.partition("@")
    gemm, _, forward = path_only.partition(":")
    os.environ["SPECVIZ_KERNEL_LAYOUT"] = layout or "auto"
    os.environ["SPECVIZ_CPU_GEMM"] = gemm
    os.environ["SPECVIZ_FORWARD"] = forward or "auto"

    from specviz.config import BUILTIN_DRAFT, BUILTIN_TARGET
    from specviz.engine.costs import forward_times, read_bandwidth
    from specviz.models.loaded import load_model, pair_backend

    p = load_model(BUILTIN_TARGET, device="cpu")
    ids = p.tokenizer(PROMPT)["input_ids"]
    t = forward_times(p, ids, tokens, reps=9)
    out = {"path": path, "step_ms": t[0] * 1e3, "cost": [x / t[0] for x in t]}
    for dtype in ("float32", "float16"):
        q = load_model(BUILTIN_DRAFT, device="cpu", dtype=dtype)
        d = forward_times(q, ids, 1, reps=15, vocab_size=p.vocab_size)[0]
        out[f"draft_{dtype}_ms"], out[f"c_{dtype}"] = d * 1e3, d / t[0]
    out["backend"] = pair_backend(p, q)
    out["weights_mb"] = sum(x.numel() * x.element_size() for x in p.model.parameters()) / 1e6
    out["bandwidth_gb_s"] = read_bandwidth(int(out["weights_mb"] * 1e6), reps=7)
    out["limit_ms"] = out["weights_mb"] / out["bandwidth_gb_s"]
    out["gflop_s"] = product_rate()
    macs = sum(x.numel() for x in p.model.parameters() if x.dim() == 2)  # the embedding is the tied output layer
    out["token_arith_ms"] = 2 * macs / out["gflop_s"] / 1e6
    return out


def product_rate(reps: int = 50) -> float:
    """GFLOP/s of torch's float32 product on operands that stay in cache (64 x 512 by 512 x 512, 1.5 MB), the best
    of `reps`: about the most arithmetic these cores do in float32 with the process's threads."""
    import torch

    from specviz.native.linear import best_seconds

    a, b = torch.randn(64, 512), torch.randn(512, 512)
    return 2 * 64 * 512 * 512 / best_seconds(lambda: a @ b, reps) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", default="torch,transposed,kernel,torch:transformers,kernel:transformers")
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="each path this many times, interleaved; medians shown")
    ap.add_argument("--json-out", default="")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # internal: measure one path in this process
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.tokens)))
        return
    from specviz.bench.machine import machine_info

    paths = [x.strip() for x in a.paths.split(",") if x.strip()]
    runs: dict[str, list[dict]] = {x: [] for x in paths}
    for _ in range(a.rounds):
        for path in paths:
            cmd = [sys.executable, __file__, "--one", path, "--tokens", str(a.tokens)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[path].append(json.loads(done.stdout.strip().splitlines()[-1]))
    m = machine_info()
    print(f"{m['cpu']} ({m['cpu_id']}; {m['cpu_vector']}) · torch {m['torch']}, {m['torch_threads']} threads")
    first = runs[paths[0]][0]
    print(
        f"target weights {first['weights_mb']:.0f} MB; read-only bandwidth {first['bandwidth_gb_s']:.1f} GB/s "
        f"-> memory-bound limit {first['limit_ms']:.1f} ms a step; float32 products {first['gflop_s']:.0f} GFLOP/s "
        f"in cache -> a token's arithmetic {first['token_arith_ms']:.2f} ms"
    )
    head = " ".join(f"{n:>5d}" for n in range(2, a.tokens + 1))
    print(f"{'path':20s} {'step ms':>8s} | cost of n tokens in steps: {head} | draft ms f32/f16, c f32/f16")
    lim, ar = first["limit_ms"], first["token_arith_ms"]
    for name, f in (("max(reads, arith.)", max), ("reads + arith.", lambda m, x: m + x)):
        bound = [f(lim, n * ar) / lim for n in range(2, a.tokens + 1)]  # in steps at the limit
        print(f"{name:20s} {lim:8.1f} | {' ' * 27}{' '.join(f'{c:5.2f}' for c in bound)} | (in steps of the limit)")
    for path, rs in runs.items():
        med = lambda k, rs=rs: statistics.median(r[k] for r in rs)  # noqa: E731
        cost = [statistics.median(r["cost"][i] for r in rs) for i in range(a.tokens)]
        print(
            f"{path:20s} {med('step_ms'):8.1f} | {' ' * 27}{' '.join(f'{c:5.2f}' for c in cost[1:])} | "
            f"{med('draft_float32_ms'):.2f}/{med('draft_float16_ms'):.2f}, "
            f"{med('c_float32'):.3f}/{med('c_float16'):.3f}   ({rs[0]['backend']})"
        )
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"machine": m, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
