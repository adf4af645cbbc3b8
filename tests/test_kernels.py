"""specviz.native.linear and specviz.native.library: every CPU path for linear layers computes nn.Linear's product, the
few-token kernel gives a row the same bits whatever the call's size, the choice follows the timings, and decoding
is exact on every path the choice can pick."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import make_model
from two_tokens import chi2_z, exact_two_token_law, two_token_counts

import specviz.native.linear as kernels
from specviz import generate
from specviz.models import hub
from specviz.native import forward as lean
from specviz.native import library as native

PATHS = ["torch", "transposed", "kernel"]
PROMPTS = ["hello world", "the cat sat on the mat", "abc", "what is 2+2?", "once upon a time", "x = (1, 2)"]


def isas() -> list[str]:
    """The instruction sets the kernel can run on this CPU: its best and every lower one."""
    best = native.isa()
    return ["AVX-512", "AVX2"] if best == "AVX-512" else [best]


@pytest.fixture
def isa(request):
    native.use_isa(request.param)
    yield request.param
    native.use_isa(None)


def test_the_kernel_builds_and_loads_on_this_machine():
    """The dev setup installs a C compiler, and CI's CPUs have AVX2 at least: a missing kernel here is a bug."""
    assert native.library() is not None, native.why_not()
    assert native.why_not() is None and native.isa() in ("AVX-512", "AVX2")


@pytest.mark.parametrize("isa", isas(), indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("k, n", [(32, 64), (37, 101), (48, 96), (576, 1536), (1536, 5)])
@pytest.mark.parametrize("layout", ["rows", "panels"])
def test_the_kernel_computes_the_product_and_a_row_gets_the_same_bits_in_any_call(isa, dtype, k, n, layout):
    """By rows, and packed in panels of 16 output columns (n not a multiple of 16: the last panel is partial)."""
    torch.manual_seed(0)
    w = torch.randn(n, k).to(dtype)
    x = torch.randn(native.MAX_ROWS, k)
    want = F.linear(x.double(), w.double()).float()
    stored = native.pack(w) if layout == "panels" else w
    assert stored.shape == ((-(-n // 16), k, 16) if layout == "panels" else (n, k))
    alone = [native.few_rows(x[i : i + 1].contiguous(), stored, n=n) for i in range(native.MAX_ROWS)]
    for m in range(1, native.MAX_ROWS + 1):
        got = native.few_rows(x[:m].contiguous(), stored, n=n)
        torch.testing.assert_close(got, want[:m], rtol=1e-4, atol=1e-4 * math.sqrt(k))
        for i in range(m):  # a verify's row i is bit for bit what a one-token step computes
            assert torch.equal(got[i], alone[i][0]), (m, i)


def _act8_reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (M, K) quantised per block of 32 to the nearest integer of x * 127 / max |x| (ties to even), the int8
    products summed exactly per block, each sum times its block's scale, times the column's scale: in float64."""
    m, k = x.shape
    blocks = x.view(m, k // 32, 32)
    top = blocks.abs().amax(-1, keepdim=True)
    xq = torch.where(top > 0, torch.round(blocks * (127 / top)), torch.zeros_like(blocks))
    sums = torch.einsum("mbk,nbk->mnb", xq.double(), q.double().view(q.shape[0], k // 32, 32))  # integers, exact
    return (sums * (top / 127).double().view(m, 1, k // 32)).sum(-1) * scale.double()


@pytest.mark.parametrize("isa", isas(), indirect=True)
@pytest.mark.parametrize("k, n", [(32, 5), (64, 67), (576, 960), (1536, 576)])
def test_the_int8_activation_kernel_does_integer_products_and_a_row_gets_the_same_bits_in_any_call(isa, k, n):
    """native.pack8 (a draft's products against int8 activations, weight type 7): the reference's arithmetic, within
    about 1 % of the float product, and a row's numbers the same alone or among 1-16 rows."""
    from specviz.native.forward import int8_rows

    torch.manual_seed(1)
    q, scale = int8_rows(torch.randn(n, k))
    x = torch.randn(native.MAX_ROWS, k)
    x[3, :32] = 0.0  # a block of zeros: scale 0
    stored = native.pack8(q)
    assert stored.shape == (-(-n // 16), k // 4, 16, 4) and native.wtype_of(stored) == native.ACT8
    alone = [native.few_rows(x[i : i + 1].contiguous(), stored, scale, n) for i in range(native.MAX_ROWS)]
    exact = x @ (q.float() * scale[:, None]).t()
    for m in (1, 2, 5, 8, 9, 16):
        got = native.few_rows(x[:m].contiguous(), stored, scale, n)
        torch.testing.assert_close(got.double(), _act8_reference(x[:m], q, scale), rtol=1e-5, atol=1e-5)
        assert float((got - exact[:m]).norm() / exact[:m].norm()) < 0.01
        for i in range(m):
            assert torch.equal(got[i], alone[i][0]), (m, i)
    assert native.can_pack8(q) and not native.can_pack8(torch.zeros(4, 48, dtype=torch.int8))
    assert not native.can_pack8(q.float())


def test_the_int8_activation_kernel_gives_the_same_bits_on_every_instruction_set():
    """Its integer sums are exact and its float32 chain the same on AVX2 and on AVX-512 (with VNNI where the CPU
    has it): a draft guesses the same whichever runs."""
    from specviz.native.forward import int8_rows

    torch.manual_seed(2)
    q, scale = int8_rows(torch.randn(200, 576))
    x = torch.randn(native.MAX_ROWS, 576) * torch.logspace(-3, 2, 576)  # blocks of very different scales
    stored = native.pack8(q)
    got = {}
    for name in isas():
        native.use_isa(name)
        got[name] = native.few_rows(x, stored, scale, 200)
    native.use_isa(None)
    assert all(torch.equal(g, got["AVX2"]) for g in got.values()), list(got)
    assert float((got["AVX2"] - x @ (q.float() * scale[:, None]).t()).abs().max()) > 0  # not the float product


@pytest.mark.parametrize("k, n", [(64, 5), (576, 101), (1536, 64)])
def test_the_nf4_kernel_multiplies_by_bitsandbytes_weights_and_a_row_gets_the_same_bits_in_any_call(k, n):
    """NF4 (two weights a byte, the first in the high nibble; code[q] * absmax per block of 64), checked against
    bitsandbytes' own dequantisation where it is installed and against the layout written out here."""
    from specviz.quant import nf4_dense

    torch.manual_seed(0)
    code = torch.linspace(-1, 1, 16) ** 3  # any 16 values: the kernel reads the table it is given
    q = torch.randint(0, 16, (n, k))
    absmax = torch.rand(n * k // 64) + 0.5
    dense = code[q] * absmax.repeat_interleave(64).view(n, k)
    packed, scale = ((q[:, 0::2] << 4) | q[:, 1::2]).to(torch.uint8), torch.cat([code, absmax])
    assert torch.equal(nf4_dense(packed, scale), dense)
    x = torch.randn(native.MAX_ROWS, k)
    want = F.linear(x.double(), dense.double()).float()
    alone = [native.few_rows(x[i : i + 1].contiguous(), packed, scale) for i in range(native.MAX_ROWS)]
    for m in range(1, native.MAX_ROWS + 1):
        got = native.few_rows(x[:m].contiguous(), packed, scale)
        torch.testing.assert_close(got, want[:m], rtol=1e-4, atol=1e-4 * math.sqrt(k))
        for i in range(m):
            assert torch.equal(got[i], alone[i][0]), (m, i)
    bnb = pytest.importorskip("bitsandbytes.functional")
    w = torch.randn(n, k)
    packed, state = bnb.quantize_4bit(w, blocksize=64, quant_type="nf4")
    scale = torch.cat([state.code.float(), state.absmax.float()])
    ref = bnb.dequantize_4bit(packed, state)
    assert torch.equal(nf4_dense(packed.view(n, -1), scale), ref)  # the same layout, the same float32 weights
    got, want = native.few_rows(x[:4].contiguous(), packed.view(n, -1), scale), F.linear(x[:4].double(), ref.double())
    torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-4 * math.sqrt(k))


def _pair(bias: bool, dtype=torch.float32, shape=(48, 96)):
    torch.manual_seed(0)
    plain = torch.nn.Linear(*shape, bias=bias).to(dtype)
    fast = torch.nn.Linear(*shape, bias=bias).to(dtype)
    fast.load_state_dict(plain.state_dict())
    return plain, fast


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 48), (1, 2, 48), (1, 5, 48), (3, 48), (2, 7, 48), (1, 9, 48), (1, 70, 48)])
def test_every_path_computes_the_same_product_for_any_number_of_rows(monkeypatch, path, bias, shape):
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", path)
    plain, fast = _pair(bias)
    assert kernels.use_fast_linear(torch.nn.Sequential(fast)) == path
    x = torch.randn(*shape)
    with torch.inference_mode():
        want, got = plain(x), fast(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_float16_layer_on_the_kernel_keeps_its_dtype(monkeypatch):
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "kernel")
    plain, fast = _pair(True, torch.float16)
    assert kernels.use_fast_linear(fast) == "kernel"
    x = torch.randn(1, 3, 48, dtype=torch.float16)
    with torch.inference_mode():
        got = fast(x)
    assert got.dtype == torch.float16
    torch.testing.assert_close(
        got.float(), F.linear(x.float(), plain.weight.float(), plain.bias.float()), rtol=2e-3, atol=2e-3
    )


def test_the_kernel_serves_one_to_sixteen_rows_and_pytorch_the_rest(monkeypatch):
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "kernel")
    _, fast = _pair(False)
    kernels.use_fast_linear(fast)
    calls = []
    real = native.few_rows
    monkeypatch.setattr(native, "few_rows", lambda x, w: calls.append(x.shape[0]) or real(x, w))
    with torch.inference_mode():
        for rows in (1, 4, 8, 9, 16, 17, 40):
            fast(torch.randn(1, rows, 48))
    assert calls == [1, 4, 8, 9, 16]


def test_training_keeps_autograd(monkeypatch):
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "kernel")
    _, fast = _pair(False)
    kernels.use_fast_linear(fast)
    fast(torch.randn(2, 48)).sum().backward()  # the kernel has no gradient: a trainable call must skip it
    assert fast.weight.grad is not None


def test_left_alone_for_other_dtypes_subclasses_and_when_turned_off(monkeypatch):
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "kernel")
    _, half = _pair(False, torch.bfloat16)
    assert kernels.use_fast_linear(half) == "torch" and "forward" not in half.__dict__

    class Quantised(torch.nn.Linear):  # bitsandbytes' layers subclass nn.Linear
        pass

    q = torch.nn.Sequential(Quantised(4, 4))
    assert kernels.use_fast_linear(q) == "torch" and "forward" not in q[0].__dict__
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "0")
    lin = torch.nn.Linear(4, 4)
    assert kernels.use_fast_linear(lin) == "torch" and "forward" not in lin.__dict__


@pytest.mark.parametrize("fastest", PATHS)
def test_auto_takes_the_path_timed_fastest_here(monkeypatch, fastest):
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "auto")
    monkeypatch.setattr(kernels, "_CHOSEN", {})
    # staged timings (one row, four rows): the fastest in sum wins, whatever it costs for one row alone
    staged = {p: [1.0, 3.0] for p in PATHS} | {fastest: [1.2, 1.3]}
    seen = []
    monkeypatch.setattr(kernels, "time_paths", lambda layers, paths: seen.append(paths) or staged)
    _, layer = _pair(False)
    assert kernels.use_fast_linear(torch.nn.Sequential(layer)) == fastest
    assert kernels.use_fast_linear(torch.nn.Sequential(_pair(False)[1])) == fastest
    # timed once per set of shapes, then remembered; twice where the kernel lost the first draw
    assert seen == [PATHS] * (1 if fastest == "kernel" else 2)


def test_a_kernel_that_loses_a_draw_gets_a_second_and_each_path_keeps_its_best(monkeypatch):
    """A burst beside the load (chromium starting on the same 2 cores) once made a process take the transposed
    product for the whole session; a second draw, each path the best of both, keeps the kernel unless it loses
    again."""
    if "kernel" not in kernels.candidates(torch.float32):
        pytest.skip("no kernel here")
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "auto")
    burst = {"torch": [1.0, 1.5], "transposed": [1.0, 1.0], "kernel": [3.0, 3.0]}  # the kernel's runs hit
    calm = {"torch": [2.0, 3.0], "transposed": [2.0, 2.0], "kernel": [0.6, 0.6]}
    for draws, chosen in [([burst, calm], "kernel"), ([burst, burst], "transposed"), ([calm, burst], "kernel")]:
        monkeypatch.setattr(kernels, "_CHOSEN", {})
        left = list(draws)
        monkeypatch.setattr(kernels, "time_paths", lambda layers, paths, left=left: left.pop(0))
        assert kernels.use_fast_linear(torch.nn.Sequential(_pair(False)[1])) == chosen
        assert len(left) == (1 if draws[0] is calm else 0)  # a kernel that won its first draw is not timed again


@pytest.mark.parametrize("kernel_sum,chosen", [(2.7, "kernel"), (3.2, "torch")])
def test_auto_keeps_the_kernel_within_the_margin_of_the_fastest_path(monkeypatch, kernel_sum, chosen):
    if "kernel" not in kernels.candidates(torch.float32):
        pytest.skip("no kernel here")
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "auto")
    monkeypatch.setattr(kernels, "_CHOSEN", {})
    # torch 2.5 in sum; the kernel 8% slower (a busy machine's noise: kept) or 28% slower (clearly: not kept)
    staged = {"torch": [1.0, 1.5], "transposed": [1.5, 3.0], "kernel": [1.0, kernel_sum - 1.0]}
    monkeypatch.setattr(kernels, "time_paths", lambda layers, paths: staged)
    assert kernels.use_fast_linear(torch.nn.Sequential(_pair(False)[1])) == chosen


@pytest.mark.parametrize("forward", ["auto", "transformers"])
def test_a_llama_the_lean_forward_runs_keeps_the_kernel_at_a_wider_margin(monkeypatch, forward):
    """Products timed one by one from Python overstate the kernel's cost where it also brings llama.c's forward (a
    Zen 3 took PyTorch's path in 1 process of 19, its step 3 times slower): a Llama keeps the kernel at 1.7 times
    PyTorch's time there, a module the lean forward does not run (or SPECVIZ_FORWARD=transformers) does not."""
    if "kernel" not in kernels.candidates(torch.float32):
        pytest.skip("no kernel here")
    monkeypatch.setenv("SPECVIZ_CPU_GEMM", "auto")
    monkeypatch.setenv("SPECVIZ_FORWARD", forward)
    monkeypatch.setattr(kernels, "_CHOSEN", {})
    staged = {"torch": [1.0, 1.5], "transposed": [1.5, 3.0], "kernel": [1.7, 2.55]}  # 1.7 times torch's sum
    monkeypatch.setattr(kernels, "time_paths", lambda layers, paths: staged)
    llama = make_model(64, seed=0)
    assert lean.why_not(llama) is None  # the lean forward fits it
    assert kernels.use_fast_linear(llama, hub.kernel_margin(llama)) == ("kernel" if forward == "auto" else "torch")
    assert kernels.path_of(llama) == ("kernel" if forward == "auto" else "torch")
    other = torch.nn.Sequential(_pair(False)[1])
    other.config = llama.config  # a Llama's config on another kind of module: no llama.c forward to bring
    assert hub.kernel_margin(other) == kernels.KERNEL_MARGIN
    assert kernels.use_fast_linear(other, hub.kernel_margin(other)) == "torch"
    staged["kernel"] = [2.1, 3.2]  # over twice PyTorch's: not kept even where it brings llama.c's forward
    monkeypatch.setattr(kernels, "_CHOSEN", {})
    assert kernels.use_fast_linear(make_model(64, seed=1), hub.kernel_margin(llama)) == "torch"


def test_without_a_compiler_the_kernel_is_off_with_a_reason_and_auto_keeps_pytorch(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIZ_HOME", str(tmp_path))  # no built library to fall back on
    monkeypatch.setenv("CC", "/nonexistent/cc")
    native.library.cache_clear()
    try:
        assert native.library() is None
        assert "compiler" in native.why_not()
        assert kernels.candidates(torch.float32) == ["torch", "transposed"]
        monkeypatch.setenv("SPECVIZ_CPU_GEMM", "kernel")  # forced but impossible here: PyTorch's own path
        assert kernels.use_fast_linear(_pair(False)[1]) == "torch"
        monkeypatch.setenv("CC", "false")  # a compiler that fails
        native.library.cache_clear()
        assert native.library() is None and "build failed" in native.why_not()
    finally:
        monkeypatch.undo()
        native.library.cache_clear()
    assert native.library() is not None


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


@pytest.mark.parametrize("bf16", [True, False])
def test_on_a_gpu_the_target_keeps_float32_and_only_the_draft_takes_half(monkeypatch, bf16):
    """A verify of several tokens in bfloat16 rounds apart from one-token steps (argmax parted at 0.6 % of positions
    on an H200), so a target loaded without a dtype is float32 on every device; the draft, whose dtype changes only
    the guesses, takes the GPU's half dtype."""
    from specviz.models.loaded import _resolve_dtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert _resolve_dtype(None) == _resolve_dtype("auto") == torch.float32  # on any device
    assert kernels.draft_dtype(torch.device("cuda")) == (torch.bfloat16 if bf16 else torch.float16)
    assert kernels.draft_dtype(torch.device("mps")) == torch.float16
    assert _resolve_dtype("bfloat16") == torch.bfloat16  # an explicit dtype wins


def test_timings_keep_their_dtypes_while_another_thread_builds_a_float16_model(monkeypatch):
    """transformers sets the process-wide default dtype while it builds a model, and the app builds the float16
    draft on one thread while the target's layers are timed on another: the timings must not take that dtype
    (a float16 input for a float32 layer raised "expected m1 and m2 to have the same dtype" at startup)."""
    layer = torch.nn.Linear(48, 96, bias=False)  # float32, made before the default changes
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)  # as during another thread's float16 build
    try:
        times = kernels.time_paths([layer], kernels.candidates(torch.float32))  # raised RuntimeError before
        plain, half = kernels._time_halves(rows=256, cols=64)
    finally:
        torch.set_default_dtype(old)
    assert set(times) == set(kernels.candidates(torch.float32)) and plain > 0 and half > 0


@pytest.fixture
def pair_on(tiny_pair, monkeypatch):
    """load_pair with the linear path forced, loaded afresh (the model cache does not key on the path)."""
    from specviz import load_pair
    from specviz.models.loaded import CACHE, pair_backend

    def load(path: str, half: str = "0", pair=tiny_pair):
        monkeypatch.setenv("SPECVIZ_CPU_GEMM", path)
        monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", half)
        CACHE.clear()
        p, q = load_pair(*pair, device="cpu")
        assert ("specviz kernel" in pair_backend(p, q)) is (path == "kernel")
        return p, q

    yield load
    CACHE.clear()


@pytest.mark.parametrize("path", PATHS)
def test_greedy_spec_equals_greedy_plain_on_every_path(pair_on, path):
    p, q = pair_on(path, half="1")
    rejections = 0
    for gamma, prompt in itertools.product((1, 3, 7), PROMPTS):
        ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=40)
        sp = generate(prompt, target=p, draft=q, mode="spec", gamma=gamma, max_new_tokens=40)
        assert sp.token_ids == ar.token_ids, (gamma, prompt)
        rejections += sp.stats["drafted"] - sp.stats["accepted"]
    assert rejections > 0


def test_every_path_writes_the_same_greedy_text(pair_on):
    """Whatever this CPU picks, a visitor sees the same tokens (the paths differ by float32 rounding only)."""
    outs = {}
    for path in PATHS:
        p, q = pair_on(path)
        outs[path] = [generate(pr, target=p, draft=q, gamma="auto", max_new_tokens=40).token_ids for pr in PROMPTS]
    assert outs["kernel"] == outs["torch"] == outs["transposed"]


def test_sampled_spec_on_the_kernel_follows_the_target_distribution(pair_on, small_vocab_pair):
    """The chi-square test of the engine's sampled law (tests/test_engine.py), both models on the kernel."""
    p, q = pair_on("kernel", half="1", pair=small_vocab_pair)
    ids, N = [1, 5, 6], 3000
    counts, _ = two_token_counts(p, q, ids, N, gamma=1)
    assert chi2_z(counts, exact_two_token_law(p, ids), N) < 4.0
