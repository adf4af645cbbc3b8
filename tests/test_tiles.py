"""AMX tiles (few_rows.c weight type 8): float32 weights as two bfloat16 parts. The products against a float64
reference, and a row's numbers the same bits alone or in a call of up to 16 (what makes a verify's logits those of
one-token steps). Run where the CPU has AMX; skipped elsewhere, as the AVX-512 tests are on a CPU without it."""

import pytest
import torch

from specviz.native import library as native

pytestmark = pytest.mark.skipif(not native.amx(), reason="this CPU (or this process) has no AMX tiles")


@pytest.mark.parametrize("n,k", [(64, 32), (100, 96), (49, 576)])
def test_product_close_to_float64(n, k):
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g) * 0.05
    x = torch.randn(5, k, generator=g)
    y = native.few_rows(x, native.tile(w), None, n)
    ref = (x.double() @ w.double().T).float()
    scale = ref.abs().mean()
    assert y.shape == (5, n)
    assert ((y - ref).abs().max() / scale).item() < 1e-4
    # and far closer than plain bfloat16 weights would be: the lo part is used
    plain = x.bfloat16().float() @ w.bfloat16().float().T
    assert (y - ref).abs().max() < 0.05 * (plain - ref).abs().max()


def test_same_bits_whatever_the_call():
    g = torch.Generator().manual_seed(7)
    w = torch.randn(200, 128, generator=g)  # 200: a partial last panel
    x = torch.randn(16, 128, generator=g)
    packed = native.tile(w)
    whole = native.few_rows(x, packed, None, 200)
    for m in (1, 3, 8, 16):
        part = native.few_rows(x[:m].contiguous(), packed, None, 200)
        assert torch.equal(part, whole[:m])
    alone = torch.stack([native.few_rows(x[i : i + 1].contiguous(), packed, None, 200)[0] for i in range(16)])
    assert torch.equal(alone, whole)


@pytest.mark.parametrize(
    "panels_s, tiles_s, chosen",
    [
        ((1.0, 1.2), (0.97, 1.05), True),  # a step and a verify both faster: tiles
        ((1.0, 1.2), (1.08, 1.0), False),  # together faster, but a step clearly slower: panels stay
        ((1.0, 1.2), (1.0, 1.19), False),  # level: panels stay (the copy is not worth the change)
    ],
)
def test_auto_keeps_a_large_model_on_tiles_only_where_its_calls_were_timed_clearly_faster(
    tiny_pair, monkeypatch, panels_s, tiles_s, chosen
):
    """Timed in whole calls of 1 and 4 tokens (lean_tiles.time_calls) against the layout panels_pay chose; the
    loser's copy is dropped, the winner's counted in copied_bytes and named in the engine string."""
    from transformers import LlamaForCausalLM

    from specviz.native import forward as lean
    from specviz.native import panels as lean_panels
    from specviz.native import tiles as lean_tiles

    model = LlamaForCausalLM.from_pretrained(tiny_pair[0])
    monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", "auto")
    monkeypatch.setattr(lean_panels, "time_layouts", lambda mats, rows=(1, 4): ((1.0, 1.0), (0.5, 0.5)))  # panels
    monkeypatch.setattr(lean_panels, "TILES_MIN_BYTES", 0)  # the tiny model counts as large
    timed = []

    def fake(fwds, reps, rows=(1, 4)):
        timed.append([native.wtype_of(next(iter(f.packed.values()))) for f in fwds])
        return [panels_s, tiles_s]

    monkeypatch.setattr(lean_tiles, "time_calls", fake)
    fwd = lean.LeanLlama(model, "kernel")
    assert timed and all(t == [native.WTYPES[torch.float32] + native.PANELS, native.TILES] for t in timed)
    kinds = {native.wtype_of(t) for t in fwd.packed.values()}
    assert kinds == ({native.TILES} if chosen else {native.WTYPES[torch.float32] + native.PANELS})
    assert ("on AMX tiles" in fwd.engine) is chosen and ("weights in panels" in fwd.engine) is not chosen
    assert fwd.copied_bytes == sum(t.numel() * t.element_size() for t in fwd.packed.values())
    ids = torch.tensor([5, 9, 12, 30, 7])
    with torch.inference_mode():
        ref = model(ids[None]).logits[0]
    torch.testing.assert_close(fwd.forward(fwd.new_cache(), ids)[0], ref, atol=2e-4, rtol=1e-4)


def test_time_calls_times_each_forward_in_whole_calls(tiny_pair):
    from transformers import LlamaForCausalLM

    from specviz.native import forward as lean
    from specviz.native import panels as lean_panels
    from specviz.native import tiles as lean_tiles

    fwd = lean.LeanLlama(LlamaForCausalLM.from_pretrained(tiny_pair[0]), "kernel")
    other = lean_panels.with_tiles(fwd, lean_tiles.tiles(fwd))
    assert {native.wtype_of(t) for t in other.packed.values()} == {native.TILES} and other.packed is not fwd.packed
    times = lean_tiles.time_calls([fwd, other], lean_panels.LAYOUT_REPS, rows=(1, 4))
    assert len(times) == 2 and all(len(t) == 2 and all(0 < s < 1 for s in t) for t in times)


def test_a_product_without_memory_for_its_x_says_so_and_the_next_call_is_whole():
    """A thread that cannot split x for the tiles (realloc failed; few_rows_refuse_split fakes it) leaves NaN in its
    columns: never a model's numbers, so the call fails with the out-of-memory sentence and the next one is whole."""
    from specviz.config import SpecvizError

    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(64, 96, generator=g), torch.randn(4, 96, generator=g)
    packed = native.tile(w)
    whole = native.few_rows(x, packed, None, 64)
    native.library().few_rows_refuse_split(1)
    try:
        with pytest.raises(SpecvizError, match="^Out of memory while running the model"):
            native.few_rows(x, packed, None, 64)
    finally:
        native.library().few_rows_refuse_split(0)
    assert torch.equal(native.few_rows(x, packed, None, 64), whole)


def test_a_forward_on_tiles_without_memory_fails_in_one_sentence_and_the_model_keeps_working(tiny_pair):
    from transformers import LlamaForCausalLM

    from specviz.config import SpecvizError
    from specviz.native import forward as lean
    from specviz.native import panels as lean_panels
    from specviz.native import tiles as lean_tiles

    fwd = lean.LeanLlama(LlamaForCausalLM.from_pretrained(tiny_pair[0]), "kernel")
    fwd = lean_panels.with_tiles(fwd, lean_tiles.tiles(fwd))
    ids = torch.tensor([5, 9, 12, 30, 7])
    ref = fwd.forward(fwd.new_cache(), ids)[0]
    assert torch.isfinite(ref).all()
    native.library().few_rows_refuse_split(1)
    try:
        with pytest.raises(SpecvizError, match="^Out of memory while running the model"):
            fwd.forward(fwd.new_cache(), ids)
    finally:
        native.library().few_rows_refuse_split(0)
    assert torch.equal(fwd.forward(fwd.new_cache(), ids)[0], ref)
