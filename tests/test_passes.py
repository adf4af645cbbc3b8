"""The AVX2 rows kernels' rows of W per pass (few_rows.c's passes256; native.passes, lean_panels.time_passes,
lean_panels.choose_passes): timed per process because what pays differs by CPU. Any setting computes the same bits,
so decoding stays exact whatever a machine chooses; the choice follows the timings and is made once."""

from __future__ import annotations

import itertools

import pytest
import torch
from two_tokens import chi2_z, exact_two_token_law, two_token_counts

from specviz import generate
from specviz.native import library as native
from specviz.native import linear as kernels
from specviz.native import panels as lean_panels

needs_avx2 = pytest.mark.skipif(native.library() is None, reason="no C compiler or no AVX2 here")
DEFAULTS = {0: (4, 4, 4, 3, 3, 2, 2, 1), 1: (4, 4, 3, 2, 2, 2, 1, 1), 2: (4, 4, 3, 2, 2, 2, 1, 1)}
MOST = (4, 4, 4, 3, 3, 2, 2, 2)  # the registers' limit for 1..8 tokens
PROMPTS = ["hello world", "the cat sat on the mat", "what is 2+2?", "once upon a time"]


@pytest.fixture
def avx2(monkeypatch):
    """The AVX2 kernels in use (on an AVX-512 CPU too), the compiled defaults before and after, nothing timed yet."""
    if native.use_isa("AVX2") != "AVX2":
        native.use_isa(None)
        pytest.skip("this CPU has no AVX2 kernels")
    monkeypatch.setattr(lean_panels, "_passes_timed", {})
    for wtype, rows in DEFAULTS.items():
        native.set_passes(wtype, rows)
    yield
    for wtype, rows in DEFAULTS.items():
        native.set_passes(wtype, rows)
    native.use_isa(None)


def settings(m: int, wtype: int):
    """Every count the kernel takes for a call of m rows, the other sizes at their defaults."""
    d = DEFAULTS[wtype]
    return [d[: m - 1] + (r,) + d[m:] for r in range(1, MOST[m - 1] + 1)]


@needs_avx2
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
@pytest.mark.parametrize("k, n", [(131, 67), (576, 160)])
def test_every_rows_per_pass_gives_the_same_bits(avx2, dtype, k, n):
    """Each output is the same chain of multiply-adds whatever the rows per pass: n not a multiple of any count (the
    leftover rows go one at a time), k not a multiple of a vector (the tail)."""
    assert native.passes(0) == DEFAULTS[0] and native.passes(2) == DEFAULTS[2]
    g = torch.Generator().manual_seed(k)
    if dtype == torch.int8:
        w, scale = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8), torch.rand(n, generator=g)
    else:
        w, scale = torch.randn(n, k, generator=g).to(dtype), None
    wtype = native.WTYPES[dtype]
    x = torch.randn(8, k, generator=g)
    for m in range(1, 9):
        want = native.few_rows(x[:m].contiguous(), w, scale, n)
        torch.testing.assert_close(
            want, (x[:m] @ w.float().t()) * (1 if scale is None else scale), atol=1e-3, rtol=1e-4
        )
        for rows in settings(m, wtype):
            native.set_passes(wtype, rows)
            assert native.passes(wtype) == rows
            assert torch.equal(native.few_rows(x[:m].contiguous(), w, scale, n), want), (m, rows)
        native.set_passes(wtype, DEFAULTS[wtype])


@needs_avx2
def test_the_library_says_its_compiled_counts_and_limits_whatever_is_set(avx2):
    native.set_passes(0, (1,) * 8)
    assert all(native.pass_limits(w) == (DEFAULTS[w], MOST) for w in (0, 1, 2))
    assert native.pass_limits(3) is None  # NF4 keeps fixed counts


@needs_avx2
@pytest.mark.parametrize(
    "rows", [(4, 4, 4, 4, 3, 2, 2, 2), (0, 1, 1, 1, 1, 1, 1, 1), (1, 1, 1), (5, 1, 1, 1, 1, 1, 1, 1)]
)
def test_a_count_out_of_range_is_refused_and_changes_nothing(avx2, rows):
    with pytest.raises(ValueError, match="out of range"):
        native.set_passes(0, rows)
    assert native.passes(0) == DEFAULTS[0]


@needs_avx2
def test_counts_exist_only_where_the_avx2_rows_kernels_run():
    """AVX-512 kernels keep fixed rows per pass: on such a CPU nothing to read (nor to time) until AVX2 is forced."""
    best = native.isa()
    try:
        assert (native.passes(0) is None) is (best == "AVX-512")
        native.use_isa("AVX2")
        assert native.passes(0) is not None and native.passes(3) is None  # NF4 keeps its own
    finally:
        native.use_isa(None)


def fake_clock(monkeypatch, cost):
    """kernels.best_seconds reports cost(m, rows per pass for m) for the pass it is handed (m: the rows of x seen)."""
    seen = {}
    real = native.few_rows
    monkeypatch.setattr(native, "few_rows", lambda x, w, *a: seen.update(m=x.shape[0]) or real(x, w, *a))

    def seconds(fn, reps=5):
        fn()
        m = seen["m"]
        return cost(m, native.passes(0)[m - 1])

    monkeypatch.setattr(kernels, "best_seconds", seconds)


@needs_avx2
def test_time_passes_keeps_another_count_only_where_clearly_faster_every_time(avx2, monkeypatch):
    """2 tokens: 1 row per pass 30 % faster in every round (kept); 3 tokens: 2 rows 40 % faster in two rounds of three,
    a burst (the default stays); 5 tokens: 2 rows 3 % faster (within the margin: the default stays); 7 tokens: 1 row
    faster; a step (1 token): 1 row faster, never timed (the compiled count stays); every other size: the default."""
    rounds = {"n": 0}
    faster = {(1, 1): 0.5, (2, 1): 0.7, (5, 2): 0.97, (7, 1): 0.8}

    def cost(m, r):
        if (m, r) == (3, 2):
            rounds["n"] += 1
            return 0.6 if rounds["n"] != 2 else 1.1
        return faster.get((m, r), 1.0 if r == DEFAULTS[0][m - 1] else 1.2)

    fake_clock(monkeypatch, cost)
    mats = [(torch.randn(48, 32), None)]
    chosen = lean_panels.time_passes(mats, 0)
    assert rounds["n"] == 3
    assert chosen == (4, 1, 4, 3, 3, 2, 1, 1) and native.passes(0) == chosen


@needs_avx2
def test_passes_are_timed_once_per_weight_type_on_a_model_large_enough(avx2, monkeypatch, tiny_pair):
    from specviz.models.loaded import CACHE, load_model

    timed = []
    monkeypatch.setattr(lean_panels, "time_passes", lambda mats, wtype: timed.append((len(mats), wtype)) or (1,) * 8)
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "kernel")
    monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", "rows")
    CACHE.clear()
    fwd = load_model(tiny_pair[0], device="cpu").lean
    assert not fwd.packed and timed == []  # a few kB of weights: they sit in cache, timing them says nothing
    monkeypatch.setattr(lean_panels, "PASSES_MIN_BYTES", 1)
    monkeypatch.setenv("SPECVIZ_KERNEL_PASSES", "default")
    lean_panels.choose_passes(fwd)
    assert timed == []  # turned off
    monkeypatch.delenv("SPECVIZ_KERNEL_PASSES")
    lean_panels.choose_passes(fwd)
    lean_panels.choose_passes(fwd)
    assert timed == [(1, 0)] and lean_panels._passes_timed == {0: (1,) * 8}  # the first weight had the bytes
    CACHE.clear()


@pytest.fixture
def rows_pair(tiny_pair, monkeypatch):
    from specviz import load_pair
    from specviz.models.loaded import CACHE

    def load(pair=tiny_pair):
        monkeypatch.setenv("SPECVIZ_CPU_GEMM", "kernel")
        monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", "rows")
        monkeypatch.setenv("SPECVIZ_DRAFT_INT8", "0")
        CACHE.clear()
        p, q = load_pair(*pair, device="cpu")
        assert p.lean is not None and not p.lean.packed and "llama.c" in p.lean.engine
        return p, q

    yield load
    CACHE.clear()


@needs_avx2
def test_greedy_spec_equals_plain_and_seeded_draws_are_the_same_whatever_the_rows_per_pass(
    avx2, rows_pair, small_vocab_pair
):
    p, q = rows_pair()
    runs = {}
    for rows in [(1,) * 8, MOST]:  # every size one row at a time; every size at its most
        for wtype in (0, 1, 2):
            native.set_passes(wtype, rows)
        for gamma, prompt in itertools.product((1, 4), PROMPTS):
            ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=24)
            assert generate(prompt, target=p, draft=q, gamma=gamma, max_new_tokens=24).token_ids == ar.token_ids
        runs[rows] = [generate(pr, target=p, draft=q, gamma=3, temperature=1.0, seed=7, max_new_tokens=24)
                      for pr in PROMPTS]  # fmt: skip
    a, b = runs.values()
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.stats["accepted"] for r in a] == [r.stats["accepted"] for r in b]
    p, q = rows_pair(small_vocab_pair)
    native.set_passes(0, (1,) * 8)
    ids, N = [1, 5, 6], 3000  # the chi-square test of test_engine.py, one row of W per pass
    counts, _ = two_token_counts(p, q, ids, N, gamma=1)
    assert chi2_z(counts, exact_two_token_law(p, ids), N) < 4.0


def test_the_header_names_counts_that_timing_changed_and_only_those(monkeypatch):
    monkeypatch.setattr(lean_panels, "_passes_timed", {0: DEFAULTS[0], 2: DEFAULTS[2]})
    assert lean_panels.passes_note() == ""
    monkeypatch.setattr(lean_panels, "_passes_timed", {0: (4, 1, 1, 3, 1, 1, 1, 1), 2: (1,) * 8})
    assert lean_panels.passes_note() == "; rows of W per pass 4,1,1,3,1,1,1,1; int8 1,1,1,1,1,1,1,1 (timed)"


@needs_avx2
def test_the_pairs_backend_line_and_the_machine_facts_carry_the_counts(avx2, rows_pair, monkeypatch):
    from specviz.bench.machine import machine_info
    from specviz.models.loaded import pair_backend

    p, q = rows_pair()
    monkeypatch.setattr(lean_panels, "_passes_timed", {0: (4, 1, 1, 3, 1, 1, 1, 1)})
    native.set_passes(0, (4, 1, 1, 3, 1, 1, 1, 1))
    assert pair_backend(p, q).endswith("; rows of W per pass 4,1,1,3,1,1,1,1 (timed)")
    assert machine_info()["kernel_passes"]["float32"] == [4, 1, 1, 3, 1, 1, 1, 1]


# ---- The panels' prefetch (few_rows.c's ahead and ahead_l2; native.panel_prefetch, lean_panels.time_prefetch,
# lean_panels.choose_prefetch): timed per process, since L1:32 made a verify faster on a Zen 5 and slower on a Zen 4.


@pytest.fixture
def prefetch(monkeypatch):
    """The compiled setting before and after, nothing timed yet."""
    if native.library() is None:
        pytest.skip("no C compiler or no AVX2 here")
    monkeypatch.setattr(lean_panels, "_prefetch_timed", [])
    monkeypatch.delenv("SPECVIZ_KERNEL_PREFETCH", raising=False)
    native.panel_prefetch(native.PANEL_PREFETCH)
    yield
    native.panel_prefetch(native.PANEL_PREFETCH)


@pytest.mark.parametrize("isa", ["AVX-512", "AVX2"])
def test_any_prefetch_computes_the_same_bits(prefetch, isa):
    if native.use_isa(isa) != isa:
        native.use_isa(None)
        pytest.skip(f"this CPU has no {isa}")
    torch.manual_seed(3)
    mats = [(native.pack(torch.randn(n, 576).to(dt)), n) for n, dt in ((960, torch.float32), (101, torch.float16))]
    x = torch.randn(native.MAX_ROWS, 576)
    got = {}
    try:
        for setting in (native.PANEL_PREFETCH, "none", "L1:16", "L2:64", "L1:1", "l2:1024"):
            assert native.panel_prefetch(setting) == (setting.upper() if setting != "none" else "none")
            got[setting] = [native.few_rows(x[:m].contiguous(), w, n=n) for w, n in mats for m in (1, 2, 5, 16)]
    finally:
        native.use_isa(None)
    want = got[native.PANEL_PREFETCH]
    assert all(all(torch.equal(a, b) for a, b in zip(g, want)) for g in got.values())


@pytest.mark.parametrize("bad", ["L3:32", "L1:0", "L2:2000", "L1", "fast", ""])
def test_a_prefetch_setting_that_is_not_one_is_refused_in_words_and_auto_ignores_it(prefetch, monkeypatch, bad):
    with pytest.raises(ValueError, match="a panel prefetch is none, L1:ROWS or L2:ROWS"):
        native.panel_prefetch(bad)
    assert native.panel_prefetch() == native.PANEL_PREFETCH
    monkeypatch.setenv("SPECVIZ_KERNEL_PREFETCH", bad)
    assert lean_panels.prefetch_mode() is None  # timed, as auto


@pytest.mark.parametrize(
    "times, chosen",
    [
        ({"L1:32": 1.0, "none": 0.96, "L2:64": 0.99}, "none"),
        ({"L1:32": 1.0, "none": 0.90, "L2:64": 0.85}, "L2:64"),
        ({"L1:32": 1.0, "none": 0.98, "L2:64": 0.975}, "L1:32"),  # within the margin: the compiled one
        ({"L1:32": 0.9, "none": 1.0, "L2:64": 0.95}, "L1:32"),
        ({"L1:32": 1.0, "none": 1.1, "L2:64": 1.05, "L2:128": 0.9, "L2:256": 0.92}, "L2:128"),  # the Zen 4, AVX2
        ({"L1:32": 1.0, "none": 1.04, "L1:16": 0.96, "L2:64": 1.06, "L2:128": 1.05}, "L1:16"),  # the Zen 3
    ],
)
def test_the_compiled_prefetch_stays_unless_another_was_clearly_faster(times, chosen):
    assert lean_panels.prefetch_pays(times) == chosen


@pytest.mark.parametrize(
    "draws, chosen, n",
    [
        ([{"L1:32": 1.0, "none": 0.80, "L2:64": 0.85}], "none", 1),  # clear: one draw
        ([{"L1:32": 1.0, "none": 1.20, "L2:64": 1.30}], "L1:32", 1),
        ([{"L1:32": 1.0, "none": 0.99, "L2:64": 1.1}, {"L1:32": 1.2, "none": 0.8, "L2:64": 1.0}], "none", 2),
        ([{"L1:32": 1.0, "none": 0.95, "L2:64": 1.0}, {"L1:32": 0.8, "none": 1.0, "L2:64": 1.0}], "L1:32", 2),
        # tied twice (a slow spell), then a fast moment
        ([{"L1:32": 1.0, "none": 1.0, "L2:128": 0.99}] * 2 + [{"L1:32": 1.0, "L2:128": 0.8}], "L2:128", 3),
        (
            [{"L1:32": 1.0, "none": 1.0, "L2:128": 0.99}] * lean_panels.PREFETCH_DRAWS,
            "L1:32",
            lean_panels.PREFETCH_DRAWS,
        ),
    ],
)
def test_a_close_prefetch_timing_is_drawn_again_until_clear_or_the_last_draw(monkeypatch, draws, chosen, n):
    """Each draw's times the best of every draw so far; the compiled setting kept where the last is still level (the
    memory's slow spells tie every setting; a moment of fast memory tells them apart)."""
    left = list(draws)
    slower = dict.fromkeys(lean_panels.PREFETCHES, 9.0)  # every candidate timed; those not named here far slower
    monkeypatch.setattr(lean_panels, "time_prefetch", lambda call: {**slower, **left.pop(0)})
    assert lean_panels.judged_prefetch(None) == chosen and len(draws) - len(left) == n


def test_the_prefetch_is_timed_once_per_process_on_a_model_in_panels_large_enough(prefetch, monkeypatch, tiny_pair):
    from specviz.models.loaded import CACHE, load_model

    timed = []
    fake = {**dict.fromkeys(lean_panels.PREFETCHES, 2.0), "L1:32": 1.0, "none": 0.9, "L2:64": 0.5}
    monkeypatch.setattr(lean_panels, "time_prefetch", lambda call: timed.append(call(4)) or fake)
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "kernel")
    monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", "panels")
    CACHE.clear()
    fwd = load_model(tiny_pair[0], device="cpu").lean
    assert fwd.packed and timed == [] and native.panel_prefetch() == "L1:32"  # a few kB of panels: untimed
    assert lean_panels.passes_note() == ""
    monkeypatch.setattr(lean_panels, "PASSES_MIN_BYTES", 1)
    lean_panels.choose_prefetch(fwd)
    lean_panels.choose_prefetch(fwd)
    assert timed == [None] and native.panel_prefetch() == "L2:64"  # once, on a call the model ran
    assert lean_panels.passes_note() == "; panels prefetched into L2 64 rows ahead (timed)"
    monkeypatch.setenv("SPECVIZ_KERNEL_PREFETCH", "none")  # forced: set, never timed
    lean_panels.choose_prefetch(fwd)
    assert native.panel_prefetch() == "none" and timed == [None]
    monkeypatch.setattr(lean_panels, "_prefetch_timed", [])
    assert lean_panels.passes_note() == "; panels not prefetched (SPECVIZ_KERNEL_PREFETCH)"
    CACHE.clear()


def test_time_prefetch_times_every_setting_on_whole_calls_and_leaves_the_setting_as_it_was(prefetch, monkeypatch):
    monkeypatch.setattr(lean_panels, "LAYOUT_REPS", 2)
    native.panel_prefetch("L1:7")
    seen = []
    times = lean_panels.time_prefetch(lambda m: seen.append((m, native.panel_prefetch())))
    assert set(times) == set(lean_panels.PREFETCHES) and all(t > 0 for t in times.values())
    assert set(seen) == {(m, s) for m in (2, 4) for s in lean_panels.PREFETCHES} and native.panel_prefetch() == "L1:7"


@pytest.mark.parametrize("setting", ["none", "L1:16", "L1:32", "L2:64"])
def test_greedy_spec_equals_plain_and_sampling_follows_the_target_whatever_the_prefetch(
    prefetch, monkeypatch, tiny_pair, small_vocab_pair, setting
):
    from specviz import load_pair
    from specviz.models.loaded import CACHE

    monkeypatch.setenv("SPECVIZ_KERNEL_PREFETCH", setting)
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "kernel")
    monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", "panels")
    CACHE.clear()
    p, q = load_pair(*tiny_pair, device="cpu")
    assert p.lean.packed and native.panel_prefetch() == setting
    for gamma, prompt in itertools.product((1, 4), PROMPTS):
        ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=24)
        assert generate(prompt, target=p, draft=q, gamma=gamma, max_new_tokens=24).token_ids == ar.token_ids
    CACHE.clear()
    p, q = load_pair(*small_vocab_pair, device="cpu")
    ids, N = [1, 5, 6], 3000
    counts, _ = two_token_counts(p, q, ids, N, gamma=1)
    assert chi2_z(counts, exact_two_token_law(p, ids), N) < 4.0
    CACHE.clear()
