"""The lossy switch: relaxed verification against w·p + (1 − w)·q. At w = 1 it is exact speculative sampling;
below 1 guesses are kept more often and the output provably stops following p (a chi-square test says so)."""

import math

import pytest
import torch
from conftest import engine_config

from specviz import SamplingConfig, SpecvizError, generate, load_pair
from specviz.engine.loop import speculative_decode
from specviz.recording.record import to_json
from specviz.request import RunRequest
from specviz.sampling import relaxed
from specviz.teach.compute import first_tokens, position_probs, sample_check, speculative_draws, total_variation

N = 20_000


def chi_square_z(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Goodness of fit of `counts` to `law`, as a z-score (normal approximation); above ~4 the fit fails."""
    n = float(counts.sum())
    keep = law * n >= 5
    chi2 = float((((counts[keep] - n * law[keep]) ** 2) / (n * law[keep])).sum())
    dof = int(keep.sum()) - 1
    return (chi2 - dof) / math.sqrt(2 * dof)


@pytest.fixture(scope="module")
def pq(small_vocab_pair):
    p, q = load_pair(*small_vocab_pair, device="cpu")
    ids = p.tokenizer("abc")["input_ids"]
    p1, q1 = position_probs(p, q, ids, SamplingConfig(1.0))
    assert total_variation(p1, q1) > 0.15  # the draft really differs, so a lossy rule can be caught
    return p, q, ids, p1, q1


def test_relaxed_mix_is_p_at_one_and_q_at_zero():
    p = torch.softmax(torch.randn(3, 7), -1)
    q = torch.softmax(torch.randn(3, 7), -1)
    assert relaxed(p, q, 1.0) is p  # bit for bit: exact verification is untouched
    assert torch.allclose(relaxed(p, q, 0.0), q)
    m = relaxed(p, q, 0.25)
    assert torch.allclose(m, 0.25 * p + 0.75 * q) and torch.allclose(m.sum(-1), torch.ones(3))


@pytest.mark.parametrize("w", [-0.1, 1.5, float("nan"), "half"])
def test_relaxed_w_outside_0_1_is_one_sentence(w):
    with pytest.raises(SpecvizError, match="relaxed_w"):
        RunRequest(drafter="model", gamma=3, tree="off", relaxed_w=w, allow_lossy=True)


def test_the_api_refuses_lossy_verification_unless_asked():
    with pytest.raises(SpecvizError, match="allow_lossy=True"):
        generate("hello", relaxed_w=0.5)  # refused before any model is loaded


def test_engine_at_w_one_is_exact_verification(loaded_pair):
    p, q = loaded_pair
    ids = p.tokenizer("the cat sat")["input_ids"]
    s = SamplingConfig(1.0)
    exact = [to_json(e) for e in speculative_decode(p, q, ids, engine_config(max_new_tokens=24, seed=4, sampling=s))]
    at_one = [
        to_json(e)
        for e in speculative_decode(
            p, q, ids, engine_config(max_new_tokens=24, seed=4, sampling=s, relaxed_w=1.0, allow_lossy=True)
        )
    ]
    lossy = [
        to_json(e)
        for e in speculative_decode(p, q, ids, engine_config(max_new_tokens=24, seed=4, sampling=s, relaxed_w=0.2))
    ]
    assert untimed(at_one) == untimed(exact)
    assert untimed(lossy) != untimed(exact)


def untimed(value):
    """Events as data without their timings (which differ from run to run)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not k.endswith("_s")}
    return [untimed(v) for v in value] if isinstance(value, list) else value


def test_below_one_the_output_fails_the_chi_square_test_against_p(pq):
    p, q, ids, p1, q1 = pq
    gen = torch.Generator().manual_seed(0)
    exact = torch.bincount(speculative_draws(p1, q1, N, gen), minlength=p1.numel()).float()
    lossy = torch.bincount(speculative_draws(p1, q1, N, gen, relaxed_w=0.3), minlength=p1.numel()).float()
    assert chi_square_z(exact, p1) < 4.0  # w = 1: the output follows p
    assert chi_square_z(lossy, p1) > 20.0  # w = 0.3: it does not; the test demonstrates the loss
    assert chi_square_z(lossy, relaxed(p1, q1, 0.3)) < 4.0  # it follows the mix it was verified against
    # the vectorised draws are the engine's rule: real engine runs give the replayed tokens, seed by seed
    seeds = range(12)

    def cfg(k):
        return RunRequest(
            drafter="model",
            gamma=1,
            tree="off",
            max_new_tokens=1,
            seed=k,
            relaxed_w=0.3,
            allow_lossy=True,
            temperature=1.0,
        ).spec

    engine = [list(speculative_decode(p, q, ids, cfg(k)))[-1].token_ids[0] for k in seeds]
    assert first_tokens(p1, q1, seeds, relaxed_w=0.3) == engine


def test_sample_check_shows_higher_acceptance_and_the_drift(pq):
    p, q, ids, p1, q1 = pq
    exact = sample_check(p, q, ids, SamplingConfig(1.0), draws=2000, real_runs=2, seed0=3)
    lossy = sample_check(p, q, ids, SamplingConfig(1.0), draws=2000, real_runs=2, seed0=3, relaxed_w=0.3)
    assert lossy.acceptance > exact.acceptance == pytest.approx(exact.exact_acceptance)
    assert lossy.tv_p > 2 * exact.tv_p and lossy.tv_p > 3 * lossy.tv_noise
    assert lossy.real_agree == 2 and lossy.relaxed_w == 0.3
