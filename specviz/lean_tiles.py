"""AMX tiles for llama.c (few_rows.c weight type 8): which forwards can read their weights that way, the weights so
packed, and whole calls timed to choose between layouts (lean_panels.choose keeps tiles where they pay)."""

from __future__ import annotations

import torch

from . import kernels, native

LAYOUT_REPS = 4  # as lean_panels' timings: the forwards alternate within each repetition

# fwd below is a lean.LeanLlama (not imported: lean imports lean_panels, which imports this module)


def can_tile(fwd) -> bool:
    """Whether llama.c can read every weight of this float32 forward on AMX tiles (native.tile)."""
    return fwd.lib is not None and all(native.can_tile(w) for w in fwd.weights())


def tiles(fwd) -> dict[int, torch.Tensor]:
    """Every weight of fwd as two bfloat16 parts for AMX tiles (native.tile), by the address of the weight as stored."""
    return {w.data_ptr(): native.tile(w) for w in fwd.weights()}


@torch.inference_mode()
def time_calls(fwds: list, rows: tuple[int, ...] = (1, 4)) -> list[tuple[float, ...]]:
    """Seconds of whole calls of `rows` tokens after 16 in the cache (a plain step and a typical verify: attention
    and barriers included) for each forward, alternating within each of LAYOUT_REPS repetitions; the best of each.
    For AMX tiles against panels: on the Xeon of 5 Dec 2026 the products alone, one parallel region each, read tiles
    1-2 % slower at 1 and 4 tokens, where a forward's calls ran them 3 % faster at 1 and 10 % at 4."""
    ids = torch.arange(16 + max(rows)) % min(f.embed.shape[0] for f in fwds)
    caches = [f.new_cache() for f in fwds]
    for f, c in zip(fwds, caches):
        f.forward(c, ids[:16])
    best = [[float("inf")] * len(rows) for _ in fwds]

    def call(f, c, m: int) -> None:
        c.length = 16
        f.forward(c, ids[16 : 16 + m])

    for _ in range(LAYOUT_REPS):
        for i, (f, c) in enumerate(zip(fwds, caches)):
            for j, m in enumerate(rows):
                best[i][j] = min(best[i][j], kernels.best_seconds(lambda f=f, c=c, m=m: call(f, c, m), 2))
    return [tuple(b) for b in best]
