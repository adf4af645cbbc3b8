"""AMX tiles for llama.c (few_rows.c weight type 8): which forwards can read their weights that way, the weights so
packed, and whole calls timed to choose between layouts (lean_panels.choose keeps tiles where they pay)."""

from __future__ import annotations

import torch

from specviz.native import library as native
from specviz.native import linear as kernels

# fwd below is a lean.LeanLlama (not imported: lean imports lean_panels, which imports this module)


def can_tile(fwd) -> bool:
    """Whether llama.c can read every weight of this float32 forward on AMX tiles (native.tile)."""
    return fwd.lib is not None and all(native.can_tile(w) for w in fwd.weights())


def tiles(fwd) -> dict[int, torch.Tensor]:
    """Every weight of fwd as two bfloat16 parts for AMX tiles (native.tile), by the address of the weight as stored."""
    return {w.data_ptr(): native.tile(w) for w in fwd.weights()}


@torch.inference_mode()
def time_calls(fwds: list, reps: int, rows: tuple[int, ...] = (1, 4)) -> list[tuple[float, ...]]:
    """Seconds of whole calls of `rows` tokens after 16 in the cache (a plain step and a typical verify: attention
    and barriers included; kernels.verify_call) for each forward, alternating within each of `reps` repetitions; the
    best of each. For AMX tiles against panels whole calls, not the products alone: the products, one parallel
    region each, can rank tiles behind panels where a forward's calls rank them ahead."""
    calls = [kernels.verify_call(f) for f in fwds]
    best = [[float("inf")] * len(rows) for _ in fwds]
    for _ in range(reps):
        for i, call in enumerate(calls):
            for j, m in enumerate(rows):
                best[i][j] = min(best[i][j], kernels.best_seconds(lambda call=call, m=m: call(m), 2))
    return [tuple(b) for b in best]
