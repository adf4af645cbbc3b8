"""How llama.c reads a model's weights: as they are stored, row by row, or packed in panels of 16 output columns
(native.pack; few_rows.c's panel kernels: no horizontal sums, one stream per panel), whichever runs this model's
products faster here (kernels.panels_pay). A draft's choice is made again by its step right after a target step
(lean_draft). The same numbers for a token whatever the call's length, in either layout; the two layouts' numbers
differ by float32 rounding, so a target's layout is fixed when its forward is built (plain and speculative decoding
then compute the same bits); a draft's may change once, when it is paired, and its numbers only shape guesses. By rows
on AVX2, how many rows of W a pass reads for each call size is timed once per process (choose_passes), and in panels
how a call of 2+ tokens prefetches its weights (choose_prefetch): any count or distance gives the same bits."""

from __future__ import annotations

import copy

import torch

from . import kernels, native

# fwd below is a lean.LeanLlama (not imported: lean imports this module)


def can(fwd) -> bool:
    """Whether llama.c can read every weight of this forward in panels."""
    return fwd.lib is not None and all(native.can_pack(w) for w in fwd.weights())


def packs(fwd) -> dict[int, torch.Tensor]:
    """Every weight of fwd in panels, by the address of the weight as stored: its own where it reads panels."""
    return fwd.packed or {w.data_ptr(): native.pack(w) for w in fwd.weights()}


def choose(fwd) -> None:
    """Panels where they run this forward's products faster here (timed on its own weights), else rows (with the
    rows of W per pass timed, where this is the process's first such model: `choose_passes`). A target bitsandbytes
    quantised keeps its rows unless SPECVIZ_KERNEL_LAYOUT forces panels: it was loaded in 8 bits to hold a quarter
    of float32's bytes, and a panel copy would hold its weights twice (an 8-bit built-in target 440 MB, not 270)."""
    if not can(fwd):
        return fwd.point()
    if fwd.quantised and kernels.layout_mode() == "auto":
        use(fwd, False)
        return choose_passes(fwd)
    packed = packs(fwd)
    mats = [(w, packed[w.data_ptr()], fwd.scales.get(w.data_ptr())) for w in fwd.weights()]
    use(fwd, kernels.panels_pay(mats), packed)
    if not fwd.packed:
        choose_passes(fwd)
    else:
        choose_prefetch(fwd)


_prefetch_timed: list[str] = []  # the panels' prefetch this process chose by timing (one at most)


def choose_prefetch(fwd) -> None:
    """How the panel kernels prefetch in calls of 2+ tokens, forced by SPECVIZ_KERNEL_PREFETCH or timed once per
    process on the first model in panels large enough to stream from memory (PASSES_MIN_BYTES; its calls of 2 and 4
    tokens, five settings, about 2 s for the built-in target on a 2-core Zen 4); one setting for every model of the
    process. Any setting computes the same numbers."""
    forced = kernels.prefetch_mode()
    if forced is not None:
        native.panel_prefetch(forced)
        return
    if _prefetch_timed or _bytes(fwd.packed) < PASSES_MIN_BYTES:
        return
    cache, ids = fwd.new_cache(), torch.arange(24) % fwd.embed.shape[0]
    fwd.forward(cache, ids[:16])

    def call(m: int) -> None:  # a verify of m tokens after 16 in the cache
        cache.length = 16
        fwd.forward(cache, ids[16 : 16 + m])

    _prefetch_timed.append(native.panel_prefetch(kernels.judged_prefetch(call)))


PASSES_MIN_BYTES = 64 << 20  # timed on this many bytes of a model's weights: they stream from memory, as in a step
_passes_timed: dict[int, tuple[int, ...]] = {}  # weight type -> the counts this process chose


def choose_passes(fwd) -> None:
    """The AVX2 rows kernels' rows of W per pass for fwd's weight type, timed once per process on the first model
    of that type large enough to stream from memory (kernels.time_passes; 0.7 s for the built-in target on a 2-core
    Zen 1); smaller models keep what was chosen (or the defaults). Any counts compute the same numbers."""
    if fwd.wtype in _passes_timed or native.passes(fwd.wtype) is None or not kernels.passes_timed():
        return
    mats, size = [], 0
    for w in fwd.weights():
        if size >= PASSES_MIN_BYTES:
            break
        mats.append((w, fwd.scales.get(w.data_ptr())))
        size += w.numel() * w.element_size()
    if size >= PASSES_MIN_BYTES:
        _passes_timed[fwd.wtype] = kernels.time_passes(mats, fwd.wtype)


def _bytes(packed: dict[int, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in packed.values())


def use(fwd, on: bool, packed: dict[int, torch.Tensor] | None = None) -> None:
    """Read the weights in panels (on; `packed` where already made) or as stored; then llama.c's call arguments.
    The panels are a copy, counted in copied_bytes: PyTorch's paths (a long prefill) and the transformers model
    keep reading the originals. A copy made by with_act8 goes back to float activations (its panels are of
    another kind)."""
    act8 = fwd.is_act8
    fwd.copied_bytes -= _bytes(fwd.packed)
    if not on or act8:
        fwd.packed = {}
    if on and not fwd.packed:
        fwd.packed = packed or packs(fwd)
    fwd.copied_bytes += _bytes(fwd.packed)
    fwd.engine = fwd.engine.replace(", weights in panels", "").replace("int8 weights and activations", "int8 weights")
    if fwd.packed:
        fwd.engine = fwd.engine.replace("llama.c", "llama.c, weights in panels", 1)
    fwd.point()


def can8(fwd) -> bool:
    """Whether llama.c can run this int8 forward's products against int8 activations (native.pack8: every weight
    int8, the shared width a multiple of 32)."""
    return fwd.lib is not None and fwd.is_int8 and all(native.can_pack8(w) for w in fwd.weights())


def with_act8(fwd):
    """A shallow copy of an int8 forward (a draft's) whose products take their activations in int8 too: every
    weight in few_rows.c's panels of 4-byte groups (native.pack8), each product's input quantised in blocks of 32,
    multiplied in integers. Its numbers are not the float path's (within about 0.5 % of a product): for guesses only,
    chosen by lean_draft where a round's draft step is faster this way. The int8 weights and their panels stay
    (the copy shares them); the new panels are counted in copied_bytes."""
    new = copy.copy(fwd)
    new.packed = {w.data_ptr(): native.pack8(w) for w in fwd.weights()}
    new.copied_bytes = fwd.copied_bytes + _bytes(new.packed)
    new.act8, new.act8_pays = None, None
    new.engine = fwd.engine.replace(", weights in panels", "").replace("int8 weights", "int8 weights and activations")
    new.point()
    return new


def copy_with(fwd, on: bool):
    """A shallow copy of fwd reading its weights the given way (for timing both; the weights and panels shared)."""
    new = copy.copy(fwd)
    use(new, on, None if fwd.is_act8 else fwd.packed or None)
    return new


def passes_note() -> str:
    """ "; rows of W per pass 4,1,1,3,1,1,1,1 (timed)" where this process's timing changed the defaults for a weight
    type (its name first where that is not float32), and "; panels prefetched into L2 64 rows ahead (timed)"
    where the panels' prefetch is not the compiled one: for headers, benches and recordings (models.pair_backend)."""
    names = {0: "", 1: "float16 ", 2: "int8 "}
    changed = [
        f"{names[t]}{','.join(map(str, r))}" for t, r in sorted(_passes_timed.items()) if r != native.pass_limits(t)[0]
    ]
    notes = [f"rows of W per pass {'; '.join(changed)} (timed)"] if changed else []
    prefetch = native.panel_prefetch() if native.loaded() else None
    if prefetch is not None and prefetch != native.PANEL_PREFETCH:
        how = "timed" if _prefetch_timed else "SPECVIZ_KERNEL_PREFETCH"
        level, _, rows = prefetch.partition(":")
        notes.append(
            f"panels not prefetched ({how})"
            if prefetch == "none"
            else f"panels prefetched into {level} {rows} rows ahead ({how})"
        )
    return "".join(f"; {n}" for n in notes)
