"""The linear layers alone: specviz's kernel over every weight of the built-in target (each decoder layer's four
products and the output layer, in a forward pass's order, so the weights come from memory as in a step) for a
call of 1..8 tokens, in one-token products. Beside `cpu_costs.py` (the whole forward), it says how much of a
verify's growth is the products' and how much the rest of the forward's.

    python benchmarks/product_costs.py                    # medians of 9 passes per token count, interleaved
    python benchmarks/product_costs.py --quantize 4bit    # the target loaded by bitsandbytes: NF4 (or 8bit: int8)
    python benchmarks/product_costs.py --by-shape         # each layer kind apart (its 30 layers in a row), GB/s too
    python benchmarks/product_costs.py --threads 1        # on one core (the default: torch's thread count)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specviz.bench.machine import machine_info  # noqa: E402
from specviz.config import BUILTIN_TARGET  # noqa: E402
from specviz.models.loaded import load_model  # noqa: E402
from specviz.native import library as native  # noqa: E402


def main(passes: int = 9, tokens: int = 8) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quantize", choices=["4bit", "8bit"], default=None)
    ap.add_argument("--by-shape", action="store_true", help="each kind of layer apart: q/k/v, o, gate/up, down, output")
    ap.add_argument("--threads", type=int, default=0, help="threads for the products (0: torch's default)")
    args = ap.parse_args()
    if native.library() is None:
        raise SystemExit(f"the kernel is not available here: {native.why_not()}")
    if args.threads:
        torch.set_num_threads(args.threads)
    lean = load_model(BUILTIN_TARGET, device="cpu", quantize=args.quantize).lean
    info = machine_info()
    print(
        f"{info['cpu']} ({info['cpu_id']}; {info['cpu_vector']}) · kernel {native.isa()}, {torch.get_num_threads()} threads"
        f" · {lean.engine}"
    )
    if args.by_shape:
        kinds = {"q/k/v": 1, "o": 2, "gate/up": 4, "down": 5}
        groups = {k: [layer[i] for layer in lean.layers] for k, i in kinds.items()} | {"output": [lean.head]}
        for name, ws in groups.items():
            one, rel = _times(lean, ws, passes, tokens)
            mb = sum(w.numel() * w.element_size() for w in ws) / 1e6
            print(f"{name:8s} {tuple(ws[0].shape)!s:14s} {mb:5.0f} MB  one token {one * 1e3:5.2f} ms ({mb / one / 1e3:4.1f}"
                  f" GB/s)  steps for 1..{tokens} tokens: " + " ".join(f"{r:.2f}" for r in rel))  # fmt: skip
        return
    weights = [w for (_, qkv, o, _, gu, down) in lean.layers for w in (qkv, o, gu, down)] + [lean.head]
    one, rel = _times(lean, weights, passes, tokens)
    print(
        f"products of one token: {one * 1e3:.1f} ms ({sum(w.numel() * w.element_size() for w in weights) / 1e6:.0f} MB)"
    )
    print("tokens  " + " ".join(f"{m:5d}" for m in range(1, tokens + 1)))
    print("steps   " + " ".join(f"{r:5.2f}" for r in rel))


def _times(lean, weights: list, passes: int, tokens: int) -> tuple[float, list[float]]:
    """Seconds of one-token products over `weights` in order (median of `passes`, after one warm-up pass), and
    each of 1..tokens tokens' in those units, the token counts interleaved within each pass."""
    scales = [lean.scales.get(w.data_ptr()) for w in weights]  # int8 and NF4 weights have them
    xs = {
        m: [torch.randn(m, w.shape[1] * (2 if w.dtype == torch.uint8 else 1)) for w in weights]
        for m in range(1, tokens + 1)
    }
    times: dict[int, list[float]] = {m: [] for m in xs}
    for rep in range(passes + 1):  # the first pass warms up
        for m, x in xs.items():
            t0 = time.perf_counter()
            for w, sc, xi in zip(weights, scales, x):
                native.few_rows(xi, w, sc)
            if rep:
                times[m].append(time.perf_counter() - t0)
    one = statistics.median(times[1])
    return one, [statistics.median(t) / one for t in times.values()]


if __name__ == "__main__":
    main()
