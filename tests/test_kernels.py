"""specviz.kernels: the few-token CPU path for linear layers computes the same product as nn.Linear."""

from __future__ import annotations

import pytest
import torch

import specviz.kernels as kernels
from specviz.kernels import MAX_ROWS, use_small_batch_gemm


@pytest.fixture(autouse=True)
def forced_on(monkeypatch):
    """The product tests need the path on, whatever this CPU prefers (the choice itself is tested below)."""
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "1")


def _pair(bias: bool, dtype=torch.float32):
    torch.manual_seed(0)
    plain = torch.nn.Linear(48, 96, bias=bias).to(dtype)
    fast = torch.nn.Linear(48, 96, bias=bias).to(dtype)
    fast.load_state_dict(plain.state_dict())
    return plain, fast


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 48), (1, 2, 48), (1, 5, 48), (3, 48), (2, 7, 48), (1, MAX_ROWS + 3, 48)])
def test_same_product_for_any_number_of_rows(bias, shape):
    plain, fast = _pair(bias)
    assert use_small_batch_gemm(fast) == 1
    x = torch.randn(*shape)
    with torch.inference_mode():
        want, got = plain(x), fast(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_used_for_a_few_rows_and_not_for_one(monkeypatch):
    _, fast = _pair(False)
    use_small_batch_gemm(fast)
    calls = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda *a: calls.append(1) or real_mm(*a))
    fast(torch.randn(1, 1, 48))
    assert calls == []  # one token: F.linear, which is fast already
    fast(torch.randn(1, 4, 48))
    assert calls == [1]


def test_left_alone_for_other_dtypes_subclasses_and_when_turned_off(monkeypatch):
    _, half = _pair(False, torch.bfloat16)
    assert use_small_batch_gemm(half) == 0

    class Quantised(torch.nn.Linear):  # bitsandbytes' layers subclass nn.Linear
        pass

    assert use_small_batch_gemm(torch.nn.Sequential(Quantised(4, 4))) == 0
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "0")
    assert use_small_batch_gemm(torch.nn.Linear(4, 4)) == 0


def test_models_loaded_by_specviz_use_it(tiny_pair):
    from specviz.models import CACHE, load_model

    CACHE.clear()  # loaded now, with the path forced on
    m = load_model(tiny_pair[0], device="cpu")
    lin = [mod for mod in m.model.modules() if type(mod) is torch.nn.Linear]
    assert lin and all("_linear" in getattr(mod.forward, "__name__", "") for mod in lin)
    CACHE.clear()


@pytest.mark.parametrize("faster", [True, False])
def test_auto_uses_the_path_only_where_it_is_faster_here(monkeypatch, faster):
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "auto")
    monkeypatch.setattr(kernels, "_FASTER", {})
    # staged timings: the transposed product takes a quarter (or four times) the time of F.linear
    monkeypatch.setattr(kernels, "_time_both", lambda layer, x: (1.0, 0.25 if faster else 4.0))
    _, layer = _pair(False)
    assert (use_small_batch_gemm(torch.nn.Sequential(layer)) == 1) is faster
    assert kernels._FASTER[(96, 48)] is faster  # decided once per weight shape, then remembered


@pytest.mark.parametrize("faster", [True, False])
def test_a_draft_takes_float16_on_the_cpu_only_where_it_was_timed_faster(monkeypatch, faster):
    monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", "auto")
    kernels.half_is_faster.cache_clear()
    monkeypatch.setattr(kernels, "_time_halves", lambda: (1.0, 0.25 if faster else 0.9))
    want = torch.float16 if faster else None
    assert kernels.draft_dtype(torch.device("cpu")) == want
    assert kernels.draft_dtype(torch.device("meta")) is None  # other devices: the draft takes p's dtype
    monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", "0")
    assert kernels.draft_dtype(torch.device("cpu")) is None
    monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", "1")
    assert kernels.draft_dtype(torch.device("cpu")) == torch.float16
    kernels.half_is_faster.cache_clear()


def test_timings_keep_their_dtypes_while_another_thread_builds_a_float16_model(monkeypatch):
    """transformers sets the process-wide default dtype while it builds a model, and the app builds the float16
    draft on one thread while the target's layers are timed on another: the timings must not take that dtype
    (a float16 input for a float32 layer raised "expected m1 and m2 to have the same dtype" at startup)."""
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "auto")
    monkeypatch.setattr(kernels, "_FASTER", {})
    layer = torch.nn.Linear(48, 96, bias=False)  # float32, made before the default changes
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)  # as during another thread's float16 build
    try:
        kernels.transposed_is_faster(layer)  # raised RuntimeError before
        plain, half = kernels._time_halves(rows=256, cols=64)
    finally:
        torch.set_default_dtype(old)
    assert (96, 48) in kernels._FASTER and plain > 0 and half > 0
