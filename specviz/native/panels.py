"""How llama.c reads a model's weights: as they are stored, row by row, or packed in panels of 16 output columns
(native.pack; few_rows.c's panel kernels: no horizontal sums, one stream per panel), whichever runs this model's
products faster here (panels_pay). A draft's choice is made again by its step right after a target step
(lean_draft). The same numbers for a token whatever the call's length, in either layout; the two layouts' numbers
differ by float32 rounding, so a target's layout is fixed when its forward is built (plain and speculative decoding
then compute the same bits); a draft's may change once, when it is paired, and its numbers only shape guesses. By rows
on AVX2, how many rows of W a pass reads for each call size is timed once per process (choose_passes), and in panels
how a call of 2+ tokens prefetches its weights (choose_prefetch): any count or distance gives the same bits. The
timings behind these choices are below (time_layouts, time_passes, time_prefetch), each choice drawn again while too
close to call (judged)."""

from __future__ import annotations

import copy
import os

import torch

from specviz.native import library as native
from specviz.native import linear as kernels
from specviz.native import tiles as lean_tiles

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
    of float32's bytes, and a panel copy would hold its weights twice.
    On a CPU with AMX tiles, a float32 model of TILES_MIN_BYTES or more is then timed on tiles (native.tile) against
    the layout chosen, and kept there where they pay (second_pays): tiles keep a step about as fast as panels and
    make a tree's long verify cheaper, where the float products are compute-bound."""
    if not can(fwd):
        return fwd.point()
    if layout_mode() == "tiles" and lean_tiles.can_tile(fwd):
        return use(fwd, True, lean_tiles.tiles(fwd))
    if fwd.quantised and layout_mode() == "auto":
        use(fwd, False)
        return choose_passes(fwd)
    packed = packs(fwd)
    mats = [(w, packed[w.data_ptr()], fwd.scales.get(w.data_ptr())) for w in fwd.weights()]
    use(fwd, panels_pay(mats), packed)
    del packed, mats
    if not fwd.packed:
        choose_passes(fwd)
    else:
        choose_prefetch(fwd)
    if layout_mode() == "auto" and lean_tiles.can_tile(fwd) and fwd.weight_bytes >= TILES_MIN_BYTES:
        tiled = lean_tiles.tiles(fwd)  # against the layout just chosen (and its prefetch), in whole calls
        if second_pays(
            lambda: [t for ts in lean_tiles.time_calls([fwd, with_tiles(fwd, tiled)], LAYOUT_REPS) for t in ts]
        ):
            use(fwd, True, tiled)


_prefetch_timed: list[str] = []  # the panels' prefetch this process chose by timing (one at most)


def choose_prefetch(fwd) -> None:
    """How the panel kernels prefetch in calls of 2+ tokens, forced by SPECVIZ_KERNEL_PREFETCH or timed once per
    process on the first model in panels large enough to stream from memory (PASSES_MIN_BYTES; its calls of 2 and 4
    tokens, six settings, a few seconds a draw for the built-in target, up to PREFETCH_DRAWS draws while too close
    to call); one setting for every model of the process. Any setting computes
    the same numbers."""
    forced = prefetch_mode()
    if forced is not None:
        native.panel_prefetch(forced)
        return
    if _prefetch_timed or _bytes(fwd.packed) < PASSES_MIN_BYTES:
        return
    _prefetch_timed.append(native.panel_prefetch(judged_prefetch(kernels.verify_call(fwd))))


PASSES_MIN_BYTES = 64 << 20  # timed on this many bytes of a model's weights: they stream from memory, as in a step
_passes_timed: dict[int, tuple[int, ...]] = {}  # weight type -> the counts this process chose


def choose_passes(fwd) -> None:
    """The AVX2 rows kernels' rows of W per pass for fwd's weight type, timed once per process on the first model
    of that type large enough to stream from memory (time_passes; about a second for the built-in target); smaller
    models keep what was chosen (or the defaults). Any counts compute the same numbers."""
    if fwd.wtype in _passes_timed or native.passes(fwd.wtype) is None or not passes_timed():
        return
    mats, size = [], 0
    for w in fwd.weights():
        if size >= PASSES_MIN_BYTES:
            break
        mats.append((w, fwd.scales.get(w.data_ptr())))
        size += w.numel() * w.element_size()
    if size >= PASSES_MIN_BYTES:
        _passes_timed[fwd.wtype] = time_passes(mats, fwd.wtype)


def _bytes(packed: dict[int, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in packed.values())


LAYOUT_NAMES = {False: "weights in panels", True: "weights as bfloat16 pairs on AMX tiles"}  # in engine strings


def use(fwd, on: bool, packed: dict[int, torch.Tensor] | None = None) -> None:
    """Read the weights in panels (on; `packed` where already made) or as stored; then llama.c's call arguments.
    The panels are a copy, counted in copied_bytes: PyTorch's paths (a long prefill) and the transformers model
    keep reading the originals. A copy made by with_act8 goes back to float activations (its panels are of
    another kind)."""
    act8 = fwd.is_act8
    fwd.copied_bytes -= _bytes(fwd.packed)
    if not on or act8:
        fwd.packed = {}
    if on and (packed or not fwd.packed):  # packed given: it replaces what fwd reads now
        fwd.packed = packed or packs(fwd)
    fwd.copied_bytes += _bytes(fwd.packed)
    for kind in LAYOUT_NAMES.values():
        fwd.engine = fwd.engine.replace(f", {kind}", "")
    fwd.engine = fwd.engine.replace("int8 weights and activations", "int8 weights")
    if fwd.packed:
        tiles = any(native.wtype_of(t) == native.TILES for t in fwd.packed.values())
        fwd.engine = fwd.engine.replace("llama.c", f"llama.c, {LAYOUT_NAMES[tiles]}", 1)
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


def with_tiles(fwd, tiled: dict[int, torch.Tensor]):
    """A shallow copy of fwd reading its weights on AMX tiles (lean_tiles.tiles), to time against fwd (the weights shared)."""
    new = copy.copy(fwd)
    use(new, True, tiled)
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


# Panels take a copy of the weights (the model keeps its own for PyTorch's paths), so a target keeps them only where
# a step's and a 4-token verify's passes over its products take this share of rows' time together or less
# (PANELS_SUM_MARGIN) and neither alone takes PANELS_GUARD times rows' or more (panels_pay); an int8 draft, judged by
# its step right after a target step (lean_draft), only where that is PANELS_MARGIN of rows' or less.
PANELS_MARGIN = 0.97
PANELS_SUM_MARGIN = 0.99
PANELS_GUARD = 1.06
# AMX tiles (native.tile) are timed only against a model this large: a smaller one's products run from the caches,
# where the timing says little about a step that streams the weights after a verify (a draft's)
TILES_MIN_BYTES = 64 << 20
LAYOUT_REPS = 4  # time_layouts' and time_calls' repetitions: the best of 4 sheds one burst of other work


def layout_mode() -> str:
    """SPECVIZ_KERNEL_LAYOUT: "auto" (default: time the layouts once per model), "panels", "rows" or "tiles"
    (forced; tiles where the CPU has AMX, lean_tiles.can_tile)."""
    v = os.environ.get("SPECVIZ_KERNEL_LAYOUT", "auto").strip().lower()
    return v if v in ("panels", "rows", "tiles") else "auto"


@torch.inference_mode()
def time_layouts(mats: list[tuple], rows: tuple[int, ...] = (1, 4)) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Seconds of a pass over a model's products by rows and in panels, for each of `rows` tokens (a plain step and
    a typical verify); mats: (weight as stored, the same packed, its scale or None) in the order a forward reads
    them. The layouts alternate within each of LAYOUT_REPS repetitions, so a busy machine slows both alike; the best
    of each."""
    inputs = {m: {w.shape[1]: torch.randn(m, w.shape[1]) for w, _, _ in mats} for m in rows}
    best = [[float("inf")] * len(rows) for _ in (0, 1)]
    for _ in range(LAYOUT_REPS):
        for i in (0, 1):
            for j, m in enumerate(rows):
                t = kernels.best_seconds(
                    lambda i=i, m=m: [
                        native.few_rows(inputs[m][w.shape[1]], (w, p)[i], sc, w.shape[0]) for w, p, sc in mats
                    ],
                    2,
                )
                best[i][j] = min(best[i][j], t)
    return tuple(best[0]), tuple(best[1])


@torch.inference_mode()
def time_passes(mats: list[tuple], wtype: int) -> tuple[int, ...]:
    """Rows of W per pass (native.passes) for each call size of 2..8 tokens on the AVX2 rows kernels, timed over
    these (weight, scale) products (enough of a model's weights to stream from memory, in a forward's order): every
    count up to the most each size takes (native.pass_limits), alternating within each of 3 repetitions; a count
    other than the default is kept only where it beat the default by PASSES_MARGIN in every repetition (one burst of
    other work must not decide a process's counts), the fastest such by its best time. A step's count (1 token)
    stays the compiled one, the best on every CPU met (docs/performance.md). Leaves the chosen counts set."""
    default, most = native.passes(wtype), native.pass_limits(wtype)[1]
    chosen = list(default)
    for m in range(2, 9):
        x = {w.shape[1]: torch.randn(m, w.shape[1]) for w, _ in mats}
        counts = range(1, most[m - 1] + 1)
        times: dict[int, list[float]] = {r: [] for r in counts}
        for _ in range(3):
            for r in counts:
                native.set_passes(wtype, tuple(chosen[: m - 1]) + (r,) + default[m:])
                times[r].append(
                    kernels.best_seconds(
                        lambda x=x: [native.few_rows(x[w.shape[1]], w, sc, w.shape[0]) for w, sc in mats], 1
                    )
                )
        base = times[default[m - 1]]
        wins = [r for r in counts if all(t < PASSES_MARGIN * b for t, b in zip(times[r], base))]
        if wins:
            chosen[m - 1] = min(wins, key=lambda r: min(times[r]))
    native.set_passes(wtype, tuple(chosen))
    return tuple(chosen)


PASSES_MARGIN = 0.95


def prefetch_mode() -> str | None:
    """SPECVIZ_KERNEL_PREFETCH: "auto" (default: timed once per process, `time_prefetch`) or the panels' prefetch
    forced ("none", "L1:32", "L2:64": native.panel_prefetch); a setting it cannot read counts as auto."""
    v = os.environ.get("SPECVIZ_KERNEL_PREFETCH", "auto").strip()
    try:
        native.parse_prefetch(v)
    except ValueError:
        return None
    return v


@torch.inference_mode()
def time_prefetch(call, rows: tuple[int, ...] = (2, 4)) -> dict[str, float]:
    """Seconds of a model's calls of `rows` tokens (call(m) runs one call of m tokens: a verify's whole forward, its
    attention and barriers included), summed over `rows`, for each of PREFETCHES, alternating within each of
    LAYOUT_REPS repetitions (the best of each). Leaves the setting as it found it. Whole calls, not the products:
    the products alone understate the difference (attention and barriers share the memory) enough to keep a losing
    setting."""
    was = native.panel_prefetch()
    best = {s: [float("inf")] * len(rows) for s in PREFETCHES}
    try:
        for _ in range(LAYOUT_REPS):
            for s in PREFETCHES:
                native.panel_prefetch(s)
                for j, m in enumerate(rows):
                    best[s][j] = min(best[s][j], kernels.best_seconds(lambda m=m: call(m), 2))
    finally:
        native.panel_prefetch(was)
    return {s: sum(t) for s, t in best.items()}


def prefetch_pays(times: dict[str, float]) -> str:
    """The setting to keep from `time_prefetch`'s sums: the fastest, where it was PREFETCH_MARGIN faster than the
    compiled one, else the compiled one: a setting that helps on one CPU costs on another, so none is kept on a
    small lead."""
    fastest = min(times, key=times.get)
    return fastest if times[fastest] < PREFETCH_MARGIN * times[native.PANEL_PREFETCH] else native.PANEL_PREFETCH


def judged(draw, bar: float, ratio=None, most: int = 2) -> list[float]:
    """draw() -> [the base's time, the others'...]; while ratio(times) (default: the best of the others over the
    base's time) lands within CLOSE of bar, too close to call (a busy moment may have blurred it), another draw, up
    to `most` in all; each time the best of every draw so far."""
    ratio = ratio or (lambda t: min(t[1:]) / t[0])
    times = draw()
    for _ in range(most - 1):
        if abs(ratio(times) - bar) > CLOSE:
            break
        times = [min(a, b) for a, b in zip(times, draw())]
    return times


CLOSE = 0.1  # for every choice kept by a ratio to a bar: lean_draft's int8 and int8 activations, the panels' layout
# and prefetch


def judged_prefetch(call) -> str:
    """`prefetch_pays` of `time_prefetch(call)`, drawn again while too close to call (`judged`, PREFETCH_DRAWS at
    most). Why more than one: the memory has slow spells in which every setting ties, and a single draw taken in one
    keeps the compiled setting where another is clearly faster in a fast moment."""

    def draw() -> list[float]:
        times = time_prefetch(call)
        return [times[s] for s in PREFETCHES]

    return prefetch_pays(dict(zip(PREFETCHES, judged(draw, PREFETCH_MARGIN, most=PREFETCH_DRAWS))))


PREFETCHES = (native.PANEL_PREFETCH, "none", "L1:16", "L2:64", "L2:128", "L2:256")  # the compiled one first: judged's
# base. Each of the others was the fastest for a verify of 2-5 tokens on some CPU met (benchmarks/prefetch_costs.py
# compares them, interleaved in one process), so each stays a candidate.
PREFETCH_MARGIN = 0.97
PREFETCH_DRAWS = 4  # a few seconds each for the built-in target


def passes_timed() -> bool:
    """SPECVIZ_KERNEL_PASSES: "auto" (default: the rows kernels' rows of W per pass timed once per process, on AVX2)
    or "default" (the compiled defaults, for comparing)."""
    return os.environ.get("SPECVIZ_KERNEL_PASSES", "auto").strip().lower() != "default"


def panels_pay(mats: list[tuple]) -> bool:
    """Whether this model's weights go to llama.c packed in panels: forced by SPECVIZ_KERNEL_LAYOUT, or timed on
    its own weights (`time_layouts`; under a second for the built-in target) and kept where a step and a 4-token
    verify take clearly less time together than by rows (PANELS_SUM_MARGIN) and neither is clearly slower alone
    (PANELS_GUARD). Why both: a layout can make a step faster and a verify slower, and the race (a verify and a
    step per round) then runs slower; and judged by the two together, the noise of one size weighs half, where a rule
    on each alone flipped between fresh processes. Where the two together land within CLOSE of the margin, a second
    draw (`judged`), so one slow moment of the memory does not decide a load."""
    how = layout_mode()
    if how != "auto":
        return how == "panels"
    return second_pays(lambda: [t for ts in time_layouts(mats) for t in ts])


def second_pays(draw) -> bool:
    """Whether a second layout runs a step and a 4-token verify together clearly faster than the first
    (PANELS_SUM_MARGIN) and neither clearly slower alone (PANELS_GUARD), drawn again where too close to call
    (`judged`); draw() -> [the first's step, its verify, the second's step, its verify] in seconds. Panels against
    rows by the products (panels_pay), AMX tiles against the layout so chosen by whole calls (choose)."""

    def together(t: list[float]) -> float:  # the second's time over the first's, the step and the verify summed
        return (t[2] + t[3]) / (t[0] + t[1])

    step_a, verify_a, step_b, verify_b = times = judged(draw, PANELS_SUM_MARGIN, together)
    alone = max(step_b / step_a, verify_b / verify_a)
    return together(times) < PANELS_SUM_MARGIN and alone < PANELS_GUARD
