"""The linear layers alone: specviz's kernel over every weight of the built-in target (each decoder layer's four
products and the output layer, in a forward pass's order, so the weights come from memory as in a step) for a
call of 1..8 tokens, in one-token products. Beside `cpu_costs.py` (the whole forward), it says how much of a
verify's growth is the products' and how much the rest of the forward's.

    python scripts/product_costs.py                    # medians of 9 passes per token count, interleaved
    python scripts/product_costs.py --quantize 4bit    # the target loaded by bitsandbytes: NF4 (or 8bit: int8)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specviz import native  # noqa: E402
from specviz.config import BUILTIN_TARGET  # noqa: E402
from specviz.machine import machine_info  # noqa: E402
from specviz.models import load_model  # noqa: E402


def main(passes: int = 9, tokens: int = 8) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quantize", choices=["4bit", "8bit"], default=None)
    quantize = ap.parse_args().quantize
    if native.library() is None:
        raise SystemExit(f"the kernel is not available here: {native.why_not()}")
    lean = load_model(BUILTIN_TARGET, device="cpu", quantize=quantize).lean
    weights = [w for (_, qkv, o, _, gu, down) in lean.layers for w in (qkv, o, gu, down)] + [lean.head]
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
    info = machine_info()
    print(
        f"{info['cpu']} ({info['cpu_id']}; {info['cpu_vector']}) · kernel {native.isa()}, {torch.get_num_threads()} threads"
        f" · {lean.engine}"
    )
    print(
        f"products of one token: {one * 1e3:.1f} ms ({sum(w.numel() * w.element_size() for w in weights) / 1e6:.0f} MB)"
    )
    print("tokens  " + " ".join(f"{m:5d}" for m in times))
    print("steps   " + " ".join(f"{statistics.median(t) / one:5.2f}" for t in times.values()))


if __name__ == "__main__":
    main()
