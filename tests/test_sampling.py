"""The acceptance math on hand-built distributions: deterministic cases, numerics and the output law."""

import math

import pytest
import torch

from specviz.config import TOP_P_MIN, SamplingConfig, SpecvizError
from specviz.sampling import clean_logits, greedy, residual, sample, to_probs, verify_greedy, verify_sampled

T1 = SamplingConfig(temperature=1.0)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def onehot_logits(ids, V=6):
    x = torch.full((len(ids), V), -10.0)
    x[torch.arange(len(ids)), torch.tensor(ids)] = 10.0
    return x


def test_greedy_all_accepted_gives_bonus():
    v = verify_greedy(torch.tensor([1, 2, 3]), onehot_logits([1, 2, 3, 4]))
    assert (v.n, v.correction) == (3, 4)


def test_greedy_first_rejected_gives_target_argmax():
    v = verify_greedy(torch.tensor([5, 2, 3]), onehot_logits([1, 2, 3, 4]))
    assert (v.n, v.correction) == (0, 1)
    assert v.accept_prob == (0.0, 1.0, 1.0)


def test_sampled_accepts_when_p_covers_q():
    # p = q exactly: min(1, p/q) = 1 everywhere, so everything is accepted and the bonus comes from p[gamma]
    p = torch.tensor([[0.5, 0.5, 0, 0], [0.2, 0.8, 0, 0], [0, 0, 0, 1.0]])
    q = p[:2].clone()
    v = verify_sampled(torch.tensor([0, 1]), q, p, gen())
    assert v.n == 2 and v.correction == 3 and v.accept_prob == (1.0, 1.0)


def test_sampled_rejects_token_target_never_makes_and_resamples_from_residual():
    p = torch.tensor([[0.0, 0.3, 0.7], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[0.9, 0.1, 0.0]])
    for seed in range(20):
        v = verify_sampled(torch.tensor([0]), q, p, gen(seed))
        assert v.n == 0 and v.accept_prob == (0.0,)
        # residual = norm(max(0, p - q)) = norm([0, 0.2, 0.7]): token 0 is impossible
        assert v.correction in (1, 2)


def test_residual_values_and_zero_sum_fallback():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.3, 0.5])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    # p == q: max(0, p - q) sums to zero; the fallback is p itself, a proper distribution
    r = residual(p, p.clone())
    assert torch.allclose(r, p) and math.isclose(float(r.sum()), 1.0, rel_tol=1e-6)


def test_q_zero_on_drafted_token_is_accepted_not_nan():
    # a trimmed draft can give q(x) = 0; min(1, p/q) must be 1 (not NaN) when p(x) > 0, and 0 when p(x) = 0
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[0.0, 1.0]])
    v = verify_sampled(torch.tensor([0]), q, p, gen())
    assert v.accept_prob == (1.0,) and v.n == 1
    p2 = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    v2 = verify_sampled(torch.tensor([0]), q, p2, gen())
    assert v2.accept_prob == (0.0,) and v2.n == 0 and v2.correction == 1


def test_nan_and_inf_logits():
    x = torch.tensor([[float("nan"), 1.0, 2.0], [0.0, float("inf"), float("inf")]])
    probs = to_probs(x, T1)
    assert torch.isfinite(probs).all()
    assert probs[0, 0] == 0.0  # NaN is never chosen
    assert torch.allclose(probs[1], torch.tensor([0.0, 0.5, 0.5]))  # +inf tokens share the mass
    with pytest.raises(SpecvizError, match="NaN or infinite"):
        clean_logits(torch.tensor([[float("nan"), float("-inf")]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_greedy_is_the_argmax_of_the_cleaned_scores_whatever_nan_or_inf_they_hold(dtype):
    nan, inf = float("nan"), float("inf")
    rows = [
        [0.5, 2.0, 1.0, 2.0],
        [nan, 1.0, 3.0, 2.0],
        [1.0, nan, nan, 0.0],
        [0.0, inf, 5.0, inf],
        [-inf, nan, 2.0, inf],
    ]
    for row in rows + [list(r) for r in torch.randn(20, 4, generator=gen()) * 30]:
        x = torch.tensor([row]).to(dtype)
        assert torch.equal(greedy(x), clean_logits(x).argmax(dim=-1)), row
        assert torch.equal(greedy(x[0]), clean_logits(x[0]).argmax(dim=-1)), row
    x = torch.tensor(rows).to(dtype)
    assert torch.equal(greedy(x), clean_logits(x).argmax(dim=-1))
    with pytest.raises(SpecvizError, match="NaN or infinite"):
        greedy(torch.tensor([[1.0, 2.0], [nan, -inf]]))


def test_greedys_native_argmax_gives_the_cleaned_argmax_on_long_rows_with_ties_nan_and_inf():
    """A run's fast greedy (backends.local.fast_greedy: float32 scores through native.first_max, csrc/greedy.c, 32
    scores a block): at every row length around its blocks, with ties, NaN and +-inf anywhere, in a view whose rows
    are strided, the answer is the cleaned argmax's, as sampling.greedy's (the definition, in PyTorch), and a row
    with nothing above -inf is refused as PyTorch's way refuses it."""
    from specviz.backends.local import fast_greedy
    from specviz.native import library as native

    if native.library() is None:
        pytest.skip("no C compiler or no AVX2 here")
    rng, nan, inf = gen(3), float("nan"), float("inf")
    for trial in range(1200):
        n = int(torch.randint(1, 100, (1,), generator=rng)) if trial < 1100 else 49152
        x = torch.randint(-3, 4, (4, n + 5), generator=rng).float()[:, 2 : 2 + n]  # ties; rows strided
        for special in (nan, inf, -inf):
            x[torch.rand(x.shape, generator=rng) < 0.15 * float(torch.rand(1, generator=rng))] = special
        x[0, :] = torch.where(torch.rand(n, generator=rng) < 0.5, nan, -inf)  # nothing above -inf
        assert native.first_max(x) is not None  # the native way ran
        assert native.first_max(x)[0] == -1
        for rows in (x[1:2], x[2:3], x[3:], x[1:]):  # a short row may hold nothing above -inf too: both refuse it
            cleaned = _argmax_or_refusal(lambda r: clean_logits(r).argmax(-1), rows)
            assert _argmax_or_refusal(fast_greedy, rows) == cleaned
            assert _argmax_or_refusal(greedy, rows) == cleaned  # PyTorch's way: the same answers
        with pytest.raises(SpecvizError, match="NaN or infinite"):
            fast_greedy(x)


def test_native_probs_at_reads_softmax_entries_as_to_probs_does_with_nan_and_inf():
    """native.probs_at (csrc/llama.c: a greedy tree round's p(x) at each node's parent) gives to_probs' numbers at
    T = 1 for the chosen entries of rows of every length around its 8-lane blocks, with NaN (read as -inf) and +inf
    (its row's mass shared among them) anywhere and a row repeated; it declines a chosen row with nothing above -inf
    and more than 64 entries, so the caller's PyTorch way answers there. Two float32 softmaxes of a row differ in
    their last bits (x - max rounded to float32 alone moves a probability by up to |x - max| * 6e-8), hence rel 2e-5."""
    from specviz.native import library as native

    if native.library() is None:
        pytest.skip("no C compiler or no AVX2 here")
    rng, nan, inf = gen(5), float("nan"), float("inf")
    for trial in range(300):
        n = int(torch.randint(1, 70, (1,), generator=rng)) if trial < 280 else 49152
        x = torch.randn(5, n, generator=rng) * float(torch.rand(1, generator=rng) * 20)
        for special in (nan, -inf):
            x[torch.rand(x.shape, generator=rng) < 0.1] = special
        x[1, 0] = 0.0  # row 1 keeps a score above -inf whatever was drawn
        if trial % 5 == 0:  # a row with +inf entries
            x[2, torch.randint(0, n, (2,), generator=rng)] = inf
        rows = [r for r in (0, 1, 2, 3, 4, 1) if torch.isfinite(x[r]).any() or (x[r] == inf).any()]
        if not rows:
            continue
        cols = torch.randint(0, n, (len(rows),), generator=rng).tolist()
        got = native.probs_at(x, rows, cols)
        want = to_probs(x[rows], SamplingConfig(1.0))[range(len(rows)), cols].tolist()
        assert got == pytest.approx(want, rel=2e-5, abs=1e-30)
    x = torch.randn(3, 100, generator=rng)
    x[1] = -inf
    x[1, 5] = nan
    assert native.probs_at(x, [0, 1], [3, 4]) is None  # nothing above -inf in row 1
    assert native.probs_at(x, [0] * 65, [3] * 65) is None  # more than a call reads
    assert native.probs_at(x[:, ::2], [0], [3]) is None  # not rows of contiguous scores
    assert native.probs_at(x, [0], [100]) is None and native.probs_at(x, [3], [0]) is None  # out of range


def test_a_tree_reads_top_probabilities_are_to_probs_and_a_stable_sort_with_ties_nan_and_inf():
    """csrc/chain.c's top_probs (a draft's tree read's last step: its n likeliest rows at T = 1) gives, for rows of
    every length around its 8-lane blocks with ties, NaN (read as -inf), -inf and +inf (the first n of them share the
    row's mass), to_probs' n largest probabilities in a stable sort's order (the lower row first among equals), -1 and
    0.0 past the rows above 0; a row with nothing above -inf is refused (-2), as is n above 16 (-1)."""
    import ctypes

    from specviz.native import library as native

    lib = native.library()
    if lib is None:
        pytest.skip("no C compiler or no AVX2 here")
    rng, nan, inf = gen(6), float("nan"), float("inf")

    def read(x: torch.Tensor, n: int):
        rows, probs = (ctypes.c_long * 16)(), (ctypes.c_float * 16)()
        made = lib.top_probs(x.data_ptr(), x.numel(), n, rows, probs)
        return made, list(rows[:n]), list(probs[:n])

    for trial in range(400):
        V = int(torch.randint(1, 60, (1,), generator=rng)) if trial < 380 else 8000
        x = (torch.randn(V, generator=rng) * float(torch.rand(1, generator=rng) * 30)).round(decimals=1)  # ties
        for special, share in ((nan, 0.1), (-inf, 0.1), (inf, 0.03 if trial % 4 == 0 else 0.0)):
            x[torch.rand(V, generator=rng) < share] = special
        n = int(torch.randint(0, 17, (1,), generator=rng))
        made, rows, probs = read(x, n)
        if not (x > -inf).any():
            assert made == -2
            continue
        p = to_probs(x[None], SamplingConfig(1.0))[0]
        order = sorted(range(V), key=lambda j: (-float(p[j]), j))[:n]  # a stable sort: the lower row first
        live = [j for j in order if float(p[j]) > 0.0]
        assert made == 0 and rows == live + [-1] * (n - len(live)), (trial, rows, order)
        assert probs == pytest.approx([float(p[j]) for j in live] + [0.0] * (n - len(live)), rel=2e-5, abs=1e-30)
    assert read(torch.full((20,), -inf), 4)[0] == -2 and read(torch.full((9,), nan), 4)[0] == -2
    assert read(torch.zeros(20), 17)[0] == -1


def _argmax_or_refusal(argmax, rows):
    try:
        return argmax(rows).tolist()
    except SpecvizError:
        return "refused"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_are_computed_in_float32(dtype):
    x = (torch.randn(3, 50, generator=gen()) * 30).to(dtype)
    probs = to_probs(x, SamplingConfig(temperature=0.7, top_k=10, top_p=0.9))
    assert probs.dtype == torch.float32
    assert torch.allclose(probs.sum(-1), torch.ones(3), atol=1e-6)


def test_top_k_and_top_p_filter_the_same_way_for_any_input():
    x = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    assert torch.count_nonzero(to_probs(x, SamplingConfig(1.0, top_k=2))) == 2
    # top_p 0.7: 0.5 alone is short of 0.7, 0.5 + 0.25 reaches it: two tokens stay
    assert to_probs(x, SamplingConfig(1.0, top_p=0.7)).tolist()[0][2:] == [0.0, 0.0]
    # the top token always survives, however small top_p is
    assert to_probs(x, SamplingConfig(1.0, top_p=TOP_P_MIN)).tolist()[0] == [1.0, 0.0, 0.0, 0.0]


def test_greedy_probs_are_one_hot():
    x = torch.tensor([[0.1, 3.0, 2.9]])
    assert to_probs(x, SamplingConfig(0.0)).tolist() == [[0.0, 1.0, 0.0]]


def test_a_sample_follows_its_weights_and_never_draws_a_zero(monkeypatch):
    """sample() by inverse CDF: 30,000 draws from unnormalised weights with zeros among them (chi-square), a
    V of 49,152 with one id of weight, and u * total rounded up to the total (the last id of positive weight)."""
    w = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 2.5, 1e-3, 0.0])
    g, n = gen(5), 30_000
    counts = torch.bincount(torch.tensor([sample(w, g) for _ in range(n)]), minlength=len(w)).float()
    assert counts[w == 0].sum() == 0
    law, keep = w / w.sum(), w > 0
    chi2 = float(((counts[keep] - n * law[keep]) ** 2 / (n * law[keep])).sum())
    assert chi2 < 30.0  # 4 degrees of freedom (5 ids of weight, the 1e-3 one expected 4 times): p < 1e-5
    one = torch.zeros(49_152)
    one[40_000] = 0.25
    assert {sample(one, g) for _ in range(50)} == {40_000}
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(1, dtype=torch.float64))
    assert sample(torch.tensor([0.2, 0.8, 0.0, 0.0]), g) == 1


def test_one_block_output_follows_p_not_q():
    """Draw x ~ q, verify against p, many times: the first emitted token must follow p exactly (TV < 0.01)."""
    torch.manual_seed(0)
    V = 5
    p = torch.softmax(torch.randn(2, V) * 2, -1)
    q = torch.softmax(torch.randn(1, V) * 2, -1)
    g = gen(123)
    N = 40_000
    counts = torch.zeros(V)
    drafted = torch.multinomial(q[0], N, replacement=True, generator=g)
    for x in drafted.tolist():
        v = verify_sampled(torch.tensor([x]), q, p, g)
        counts[x if v.n == 1 else v.correction] += 1
    emp = counts / N
    tv_p = 0.5 * float((emp - p[0]).abs().sum())
    tv_q = 0.5 * float((emp - q[0]).abs().sum())
    assert tv_p < 0.01, (emp, p[0])
    assert tv_q > 0.1  # the check has power: the draft's own law is far from what came out


def test_the_uniform_draws_stay_float32_while_another_thread_builds_a_float16_model():
    """transformers sets the process-wide default dtype while it builds a model (the app loads models on other
    threads than the one that decodes): the accept/reject draws must not become float16 then."""
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(5, 11, generator=g), -1)
    q = torch.softmax(torch.randn(4, 11, generator=g), -1)
    x = torch.tensor([1, 2, 3, 4])
    want = verify_sampled(x, q, p, torch.Generator().manual_seed(7))
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        got = verify_sampled(x, q, p, torch.Generator().manual_seed(7))
    finally:
        torch.set_default_dtype(old)
    assert got.r == want.r and (got.n, got.correction) == (want.n, want.correction)
