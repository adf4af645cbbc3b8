"""Where a llama.c forward's time goes, step by step: each thread's time computing a step and waiting at the barrier
after it, for the built-in target's calls of a few tokens on this CPU.

    python benchmarks/forward_steps.py                  # calls of 1, 2, 4 and 6 tokens, 40 each, twice
    python benchmarks/forward_steps.py --sizes 1,4 --calls 60

It compiles a copy of the C sources in a temporary folder with a cycle counter (rdtsc) around every wait at
llama.c's barrier (`meet`), loads that copy instead of the kernel (same code otherwise), and prints for each call size
the mean over threads, per layer, of the microseconds spent computing each step (from leaving one wait to entering
the next) and waiting after it; the final norm counts under "norm", the output layer (no wait after it) nowhere. The
counter's rate is taken against perf_counter. The sizes take turns, call by call, so the memory's drift from second
to second falls on all of them alike. The
sources change under it: the script stops with one sentence where the text it instruments has moved.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = ["norm", "qkv", "rope", "attention", "o", "residual+norm", "gate/up", "silu", "down", "residual"]
PROMPT = "Tell me about gravity, the moon and the tides of the sea, and why a day on the moon is so long."

# (text in llama.c, what replaces it): counters per thread and per wait position within a layer
EDITS = [
    (
        "static void meet(meet_t* b, int nt) {\n    if (nt < 2) return;",
        "#include <x86intrin.h>\nunsigned long long steps_compute[2][10], steps_wait[2][10];\n"
        "static __thread int kpos;\nstatic __thread unsigned long long left;\n"
        "static void clock_out(int me, unsigned long long t0) {\n"
        "    if (me > 1) return;\n    unsigned long long e = __rdtsc();\n"
        "    steps_wait[me][kpos % 10] += e - t0;\n    kpos++;\n    left = e;\n}\n"
        "static void meet(meet_t* b, int nt) {\n    if (nt < 2) return;\n"
        "    unsigned long long t0 = __rdtsc();\n    int me = omp_get_thread_num();\n"
        "    if (me < 2) steps_compute[me][kpos % 10] += t0 - left;",
    ),
    (
        "        atomic_store_explicit(&b->round, round + 1, memory_order_release);\n        return;",
        "        atomic_store_explicit(&b->round, round + 1, memory_order_release);\n        clock_out(me, t0);\n"
        "        return;",
    ),
    ("        else sched_yield();\n    }\n}", "        else sched_yield();\n    }\n    clock_out(me, t0);\n}"),
    (
        "        int t = omp_get_thread_num(), nt = omp_get_num_threads();",
        "        int t = omp_get_thread_num(), nt = omp_get_num_threads();\n        kpos = 0;\n        left = __rdtsc();",
    ),
]


def instrumented_sources(folder: Path) -> tuple[Path, ...]:
    from specviz.native import library as native

    out = []
    for src in native.SOURCES:
        text = src.read_text()
        if src.name == "llama.c":
            for old, new in EDITS:
                if text.count(old) != 1:
                    raise SystemExit(f"llama.c has changed where this script counts cycles (looked for {old[:40]!r})")
                text = text.replace(old, new)
        (folder / src.name).write_text(text)
        out.append(folder / src.name)
    return tuple(out)


def tsc_per_us(lib) -> float:
    t0, c0 = time.perf_counter(), lib.steps_rdtsc()
    time.sleep(0.2)
    return (lib.steps_rdtsc() - c0) / (time.perf_counter() - t0) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,2,4,6")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--prefetch", default="", help='the panels\' prefetch, e.g. "none", "L1:32", "L2:64" (default: timed)'
    )
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]

    import torch

    from specviz.bench.machine import machine_info
    from specviz.config import BUILTIN_TARGET
    from specviz.engine.costs import feed_seconds, open_run, read_bandwidth
    from specviz.models.loaded import load_model, pair_backend
    from specviz.native import library as native

    folder = Path(tempfile.mkdtemp(prefix="specviz-steps-"))
    try:
        sources = instrumented_sources(folder)
        (folder / "tsc.c").write_text(
            "#include <x86intrin.h>\nunsigned long long steps_rdtsc(void) { return __rdtsc(); }\n"
        )
        native.build_from((*sources, folder / "tsc.c"))
        lib = native.library()
        if lib is None:
            raise SystemExit(f"the kernel could not be built: {native.why_not()}")
        lib.steps_rdtsc.restype = ctypes.c_ulonglong
        compute = ((ctypes.c_ulonglong * 10) * 2).in_dll(lib, "steps_compute")
        wait = ((ctypes.c_ulonglong * 10) * 2).in_dll(lib, "steps_wait")
        p = load_model(BUILTIN_TARGET, device="cpu")
        if a.prefetch:
            native.panel_prefetch(a.prefetch)
        rate = tsc_per_us(lib)
        layers = p.model.config.num_hidden_layers
        m = machine_info()
        print(f"{m['cpu']} ({m['cpu_id']}; {m['cpu_vector']}); {pair_backend(p, p)}")
        print(f"time stamp counter: {rate:.0f} per microsecond; panels' prefetch {native.panel_prefetch()}")
        prompt = torch.tensor(p.tokenizer(PROMPT)["input_ids"])
        with torch.inference_mode():
            run = open_run(p, p.vocab_size)
            run.prefill(prompt)
            base = run.length
            block = prompt.repeat(max(sizes) // len(prompt) + 1)[: max(sizes)]
            for r in range(a.rounds):
                sums = {size: [[0] * 10, [0] * 10, 0.0] for size in sizes}  # compute, wait (both threads), seconds
                for _ in range(a.calls):  # the sizes interleaved: the memory's drift falls on all of them alike
                    for size in sizes:
                        for t in range(2):
                            for j in range(10):
                                compute[t][j] = wait[t][j] = 0
                        sums[size][2] += feed_seconds(run, block[:size], base)
                        for j in range(10):
                            sums[size][0][j] += compute[0][j] + compute[1][j]
                            sums[size][1][j] += wait[0][j] + wait[1][j]
                print(f"round {r + 1}: microseconds a layer, computing + waiting after (mean of 2 threads)")
                print(f"{'tokens':>6s} {'ms a call':>9s} " + " ".join(f"{s:>15s}" for s in STEPS))
                per = a.calls * layers * rate * 2
                for size in sizes:
                    c, w, seconds = sums[size]
                    cells = [f"{c[j] / per:.1f}+{w[j] / per:.1f}" for j in range(10)]
                    print(f"{size:6d} {seconds / a.calls * 1e3:9.2f} " + " ".join(f"{x:>15s}" for x in cells))
                    products, waits = sum(c[j] for j in (1, 4, 6, 8)) / per, sum(w[j] for j in (1, 4, 6, 8)) / per
                    rest, rest_waits = sum(c) / per - products, sum(w) / per - waits
                    print(
                        f"{'':16s} four products {products:.1f} + {waits:.1f}, the other steps {rest:.1f} + {rest_waits:.1f}"
                    )
        print(f"read bandwidth now {read_bandwidth(540 << 20):.1f} GB/s")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
