"""A change to the C sources against a git revision's, in one process: the built-in pair's calls of a few tokens on
the revision's library and on the working tree's, interleaved, after a check that both give the same bits.

    python scripts/kernel_ab.py                      # the working tree's specviz/native/csrc against HEAD's
    python scripts/kernel_ab.py --base 673db0f --reps 40 --sizes 1,2,4

Both libraries are built with the kernel's own compiler and flags (specviz/native/library.py); the models load once, on
the working tree's library, and the base library gets its settings (instruction set, the panels' prefetch, the
rows kernels' passes) before every lean forward in the process is pointed at one library or the other, alternately.
Each size's logits must be equal on both (a change to how the threads share work must not change a number). Prints
each size's median ms on each and the median of the paired ratios (new / base): the memory's drift from second to
second falls on both alike. Timing only: nothing is written.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = "Tell me about gravity, the moon and the tides of the sea, and why a day on the moon is so long."
FUNCTIONS = (
    "few_rows",
    "llama_forward",
    "llama_chain",
    "first_max",
    "few_rows_use_isa",
    "few_rows_panel_ahead",
    "few_rows_passes",
)


def base_library(rev: str, folder: Path, new: ctypes.CDLL) -> ctypes.CDLL:
    """The kernel library built from the C sources at `rev`, its functions typed as the working tree's, set alike."""
    from specviz.native import library as native

    sources = []
    for src in native.SOURCES:
        rel = src.relative_to(ROOT).as_posix()
        text = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, capture_output=True, text=True)
        if text.returncode != 0:
            raise SystemExit(f"{rel} is not in {rev}: {text.stderr.strip()}")
        (folder / src.name).write_text(text.stdout)
        sources.append(folder / src.name)
    out = folder / "base.so"
    native._build(native._compiler(), out, tuple(sources))
    old = ctypes.CDLL(str(out))
    for fn in FUNCTIONS:
        getattr(old, fn).argtypes, getattr(old, fn).restype = getattr(new, fn).argtypes, getattr(new, fn).restype
    old.few_rows_use_isa(new.few_rows_use_isa(-1))
    old.few_rows_panel_ahead(new.few_rows_panel_ahead(-1, 0), new.few_rows_panel_level())
    for wtype in range(3):
        passes = (ctypes.c_int * 9)()
        new.few_rows_passes(wtype, None, passes)
        old.few_rows_passes(wtype, passes, None)
    return old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="the git revision whose specviz/native/csrc is the base")
    ap.add_argument("--sizes", default="1,2,3,4,5,6", help="the target's call sizes (the draft's: 1 and 2)")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    import torch

    from specviz.config import BUILTIN_DRAFT, BUILTIN_TARGET
    from specviz.engine.costs import feed_seconds, open_run, read_bandwidth
    from specviz.host.machine import machine_info
    from specviz.models.loaded import load_model, pair_backend
    from specviz.native import library as native
    from specviz.native.forward import LeanLlama

    new = native.library()
    if new is None:
        raise SystemExit(f"the kernel is not used here: {native.why_not()}")
    p = load_model(BUILTIN_TARGET, device="cpu")
    q = load_model(BUILTIN_DRAFT, device="cpu")
    with tempfile.TemporaryDirectory(prefix="specviz-ab-") as tmp:
        old = base_library(a.base, Path(tmp), new)
        leans = [o for o in gc.get_objects() if isinstance(o, LeanLlama) and o.lib is not None]

        def use(lib) -> None:
            for o in leans:
                o.lib = lib

        m = machine_info()
        print(f"{m['cpu']} ({m['cpu_id']}; {m['cpu_vector']}); {pair_backend(p, q)}")
        print(f"base: specviz/native/csrc at {a.base}; new: the working tree's; {len(leans)} lean forwards switched")
        prompt = torch.tensor(p.tokenizer(PROMPT)["input_ids"])
        sizes = [int(s) for s in a.sizes.split(",")]
        with torch.inference_mode():
            for name, lm, lengths in (("target", p, sizes), ("draft", q, [1, 2])):
                run = open_run(lm, p.vocab_size)
                run.prefill(prompt)
                at = run.length
                block = prompt.repeat(max(lengths) // len(prompt) + 1)[: max(lengths)]
                for s in lengths:
                    got = []
                    for lib in (old, new):
                        use(lib)
                        got.append(run.feed(block[:s]).clone())
                        run.rollback(at)
                    if not torch.equal(*got):
                        raise SystemExit(f"the {name}'s logits over {s} tokens differ between the two libraries")
                times = {(k, s): [] for k in (0, 1) for s in lengths}
                for rep in range(a.reps + 1):  # the first repetition warms up
                    for k in (0, 1) if rep % 2 else (1, 0):
                        use((old, new)[k])
                        for s in lengths:
                            dt = feed_seconds(run, block[:s], at)
                            if rep:
                                times[(k, s)].append(dt)
                for s in lengths:
                    b, n = times[(0, s)], times[(1, s)]
                    ratio = statistics.median(y / x for x, y in zip(b, n))
                    print(
                        f"{name} {s} tokens: base {statistics.median(b) * 1e3:.2f} ms, new "
                        f"{statistics.median(n) * 1e3:.2f} ms, new / base {ratio:.3f} (bits equal)"
                    )
        use(new)
    print(f"read bandwidth now {read_bandwidth(540 << 20):.1f} GB/s")


if __name__ == "__main__":
    main()
