"""The draft's forward for a pair on the lean forward: int8 weights where this machine runs a round's draft step
faster with them (lean.LeanLlama.int8), and int8 activations too where those run it faster still
(lean_panels.with_act8); the rows a draft never proposes are already left out of its output layer
(LeanLlama.skip_rows)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from specviz.native import linear as kernels
from specviz.native import panels as lean_panels

if TYPE_CHECKING:
    from specviz.native.forward import LeanLlama

INT8_MIN_BYTES = 4 << 20  # a draft with fewer bytes of weights stays in the CPU's caches between rounds anyway
# int8 is kept where its cold step takes under this share of the float one: it guesses as the float draft does
# (the same alpha either way), so any gain beyond the timing's noise is one; a stricter share kept float weights
# in some processes where int8 was faster in all
INT8_PAYS = 0.95


# int8 activations are kept where the int8 draft's cold step takes under this share of its time without them: they
# move a product by about 0.5 %, a guess rarely (tests/test_lean.py)
ACT8_PAYS = 0.95


def act8_mode() -> str:
    """SPECVIZ_DRAFT_ACT8: "auto" (default: an int8 draft's products take int8 activations too where timing says
    that pays), "1" (wherever the draft runs int8 weights), "0"."""
    return kernels.switch("SPECVIZ_DRAFT_ACT8")


def int8_mode() -> str:
    """SPECVIZ_DRAFT_INT8: "auto" (default: int8 weights for the draft where timing says they pay), "1", "0"."""
    return kernels.switch("SPECVIZ_DRAFT_INT8")


def draft_forward(target: LeanLlama | None, draft: LeanLlama) -> LeanLlama:
    """The draft's forward for this pair: its int8 variant where that is forced, or (auto) where a draft step
    right after a target step, the way a round reads them, is faster with it on this machine (INT8_PAYS). A draft's
    weights only shape the guesses; the output stays the target's."""
    how = int8_mode()
    if how == "0" or draft.lib is None:
        return draft
    if how == "1":
        return _act8(target, draft.int8())
    key = id(target)
    if key not in draft.int8_pays:
        pays = False
        if target is not None and draft.weight_bytes >= INT8_MIN_BYTES:
            i8 = draft.int8()
            small = _variants(i8)  # by rows and in panels, where its layout is still to be chosen
            act8 = _act8_to_time(i8)  # int8 activations too: the int8 draft's fastest form, weighed in the same draw
            times = _judged_steps(target, [draft, *small, *act8], INT8_PAYS)
            pays = min(times[1:]) < INT8_PAYS * times[0]
            if len(small) == 2:  # the int8 weights' layout by the same steps, before anyone runs them; once:
                if pays:  # another pairing must not switch it under a run
                    lean_panels.use(i8, times[2] < lean_panels.PANELS_MARGIN * times[1], small[1].packed)
                i8.layout_timed_cold = True
            if act8:  # built again in _act8, after the layout: this copy was for timing
                i8.act8_pays = times[-1] < ACT8_PAYS * min(times[1:-1])
        draft.int8_pays[key] = pays
    return _act8(target, draft.int8()) if draft.int8_pays[key] else draft


def _act8(target: LeanLlama | None, fwd: LeanLlama) -> LeanLlama:
    """The int8 forward fwd, or its copy taking int8 activations (lean_panels.with_act8) where that is forced or
    (auto) where its one-token step right after a target step is faster (ACT8_PAYS); timed once per int8 forward
    (another pairing must not switch it under a run), and not for a draft too small to matter (INT8_MIN_BYTES)."""
    how = act8_mode()
    if how == "0" or not lean_panels.can8(fwd):
        return fwd
    if how == "auto" and fwd.act8_pays is None:
        if target is None or fwd.weight_bytes < INT8_MIN_BYTES:
            return fwd
        fwd.act8 = fwd.act8 or lean_panels.with_act8(fwd)
        times = _judged_steps(target, [fwd, fwd.act8], ACT8_PAYS)
        fwd.act8_pays = times[1] < ACT8_PAYS * times[0]
    if how == "1" or fwd.act8_pays:
        fwd.act8 = fwd.act8 or lean_panels.with_act8(fwd)
        return fwd.act8
    return fwd


def _act8_to_time(fwd: LeanLlama) -> list[LeanLlama]:
    """[the int8 forward fwd with int8 activations] where auto will weigh them (ACT8_PAYS) and they can run, else [].
    Timed beside the float and int8 forms: where int8 weights alone come no faster than float16 (a CPU without
    AVX-512 converts int8 slowly), the integer products can still be, and the draft's c is then the lower."""
    if act8_mode() != "auto" or fwd.act8_pays is not None or not lean_panels.can8(fwd):
        return []
    return [lean_panels.with_act8(fwd)]


def _judged_steps(target: LeanLlama, drafts: list[LeanLlama], bar: float) -> list[float]:
    """`_cold_steps` of drafts[0] and the ways to weigh against it, drawn again where the best of those lands too
    close to bar (of drafts[0]'s time) to call (lean_panels.judged)."""
    return lean_panels.judged(lambda: _cold_steps(target, drafts), bar)


def _variants(small: LeanLlama) -> list[LeanLlama]:
    """The int8 draft read by rows and in panels, to be timed the way a round runs it (where the layout is timed:
    lean_panels.layout_mode): its few MB stay in the caches when timed back to back, which favours rows, while a round
    reads them after the target's verify has streamed through the caches (cold, panels can win where warm timing
    chooses rows)."""
    if lean_panels.layout_mode() != "auto" or small.layout_timed_cold or not lean_panels.can(small):
        return [small]
    return [lean_panels.copy_with(small, False), lean_panels.copy_with(small, True)]


def _cold_steps(target: LeanLlama, drafts: list[LeanLlama], reps: int = 7) -> list[float]:
    """Seconds of a one-token step of each draft right after a one-token target step (best of reps, the drafts
    interleaved within each repetition, after one warm-up round)."""
    ids = torch.arange(16) % min(m.embed.shape[0] for m in (target, *drafts))  # any tokens both can read
    tc, caches = target.new_cache(), [d.new_cache() for d in drafts]
    target.forward(tc, ids)
    for d, c in zip(drafts, caches):
        d.forward(c, ids)
    best = [float("inf")] * len(drafts)
    for rep in range(reps + 1):
        for i, (d, c) in enumerate(zip(drafts, caches)):
            tc.length, c.length = 16, 16
            target.forward(tc, ids[:1])
            t0 = time.perf_counter()
            d.forward(c, ids[:1], last_only=True)
            if rep:  # the first round warms up
                best[i] = min(best[i], time.perf_counter() - t0)
    return best
