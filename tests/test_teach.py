"""The teaching computations: stepping equals the engine, the exactness math is the engine's, timings are sane."""

import dataclasses
import json

import pytest
import torch
from conftest import make_model
from transformers import PreTrainedTokenizerFast

from specviz import Round, SamplingConfig, SpecvizError, generate, load_pair
from specviz.engine.loop import speculative_decode
from specviz.request import RunRequest
from specviz.teach.compute import (
    Stepper,
    StepSettings,
    describe_round,
    first_tokens,
    forward_times,
    greedy_check,
    label,
    position_probs,
    prob,
    sample_check,
    speculative_draws,
    timing_sentence,
    total_variation,
)


def ids_of(lm, text="the cat sat"):
    return lm.tokenizer(text)["input_ids"]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stepping_round_by_round_gives_the_engines_text(loaded_pair, temperature):
    p, q = loaded_pair
    settings = StepSettings("the cat sat", gamma=3, temperature=temperature, seed=5, max_new_tokens=40)
    st = Stepper(p, q, ids_of(p), settings)
    rounds = []
    while (rd := st.advance()) is not None:
        assert isinstance(rd, Round) and len(rd.candidates) == len(rd.drafted) + 1
        rounds.append(rd)
    assert st.done is not None and st.advance() is None  # stays finished
    assert len(rounds) > 3 and st.rounds == rounds
    ref = generate(
        "the cat sat",
        target=p,
        draft=q,
        raw=True,
        gamma=3,
        temperature=temperature,
        seed=5,
        max_new_tokens=40,
        drafter="model",  # the step-through shows the draft model's guesses
    )
    assert tuple(st.output_ids) == ref.token_ids == st.done.token_ids


def test_the_last_round_finishes_the_run_without_another_click(loaded_pair):
    p, q = loaded_pair
    st = Stepper(p, q, ids_of(p), StepSettings("x", gamma=4, max_new_tokens=5))
    while st.advance() is not None and st.done is None:
        pass
    assert st.done is not None and len(st.output_ids) == 5


def test_a_run_ended_by_an_error_says_so_instead_of_crashing(loaded_pair):
    p, q = loaded_pair
    st = Stepper(p, q, ids_of(p), StepSettings("x", gamma=2))
    st.advance()
    st._events.close()  # what an exception inside the engine leaves behind
    with pytest.raises(SpecvizError, match="interrupted"):
        st.advance()


def _round(n, kind, gamma=3, r=0.5, a=0.2):
    return Round(
        0,
        (10, 11, 12)[:gamma],
        (0.5,) * gamma,
        (0.1,) * gamma,
        (a,) * gamma,
        (r,) * gamma,
        n,
        13,
        kind,
        (10, 11, 12, 13)[:n] + (13,),
        0.0,
        0.0,
        0.0,
    )


def test_describe_round_says_what_happened_in_plain_words():
    pieces = [" the", "cat", "\n", "dog"]
    text = describe_round(_round(1, "resampled", r=0.83, a=0.2), pieces, greedy_mode=False)
    assert "kept the first 1 (“␣the”)" in text and "rejected “cat”" in text
    assert "the draw r = 0.83 was not below p/q = 0.20" in text
    assert "The 1 guess after it was thrown away" in text and "max(0, p − q)" in text and "2 tokens" in text
    bonus = describe_round(_round(3, "bonus"), pieces, greedy_mode=False)
    assert "bonus token, “dog”" in bonus and "4 tokens" in bonus and "rejected “" not in bonus
    greedy = describe_round(_round(0, "resampled"), pieces, greedy_mode=True)
    assert "kept none" in greedy and "top choice" in greedy and "r =" not in greedy


def test_label_and_prob_make_tokens_and_tiny_numbers_readable():
    assert label(" a\nb") == "␣a⏎b" and label("") == "∅"
    assert prob(0.25) == "0.250" and prob(3e-9) == "<0.001" and prob(0.0) == "0"


def test_replayed_first_tokens_are_the_engines_bit_for_bit(loaded_pair):
    p, q = loaded_pair
    ids = ids_of(p)
    s = SamplingConfig(1.0)
    p1, q1 = position_probs(p, q, ids, s)
    seeds = range(40)
    engine = [
        next(
            iter(
                _done(
                    speculative_decode(
                        p,
                        q,
                        ids,
                        RunRequest(
                            drafter="model", gamma=1, tree="off", max_new_tokens=1, seed=k, **dataclasses.asdict(s)
                        ).spec,
                    )
                ).token_ids
            )
        )
        for k in seeds
    ]
    assert first_tokens(p1, q1, seeds) == engine
    assert len(set(engine)) > 1  # the seeds really gave different tokens


def _done(events):
    return list(events)[-1]


def test_speculative_draws_follow_p_not_q(small_vocab_pair):
    p, q = load_pair(*small_vocab_pair, device="cpu")
    p1, q1 = position_probs(p, q, ids_of(p, "abc"), SamplingConfig(1.0))
    assert total_variation(p1, q1) > 0.15  # a draft that is really different: the test can fail
    gen = torch.Generator().manual_seed(0)
    freq = torch.bincount(speculative_draws(p1, q1, 40_000, gen), minlength=p1.numel()) / 40_000
    assert total_variation(freq, p1) < 0.015
    assert total_variation(freq, q1) > total_variation(p1, q1) - 0.015
    # the per-seed replay through verify_sampled has the same law
    replay = torch.bincount(torch.tensor(first_tokens(p1, q1, range(3000))), minlength=p1.numel()) / 3000
    assert total_variation(replay, p1) < 0.04


def test_sample_check_reports_distances_and_real_runs_agree(loaded_pair):
    p, q = loaded_pair
    sc = sample_check(p, q, ids_of(p), SamplingConfig(1.0), draws=2000, real_runs=4, seed0=7)
    assert abs(float(sc.freq.sum()) - 1.0) < 1e-5 and sc.draws == 2000
    assert sc.tv_p < sc.tv_q and sc.tv_p < 3 * sc.tv_noise + 0.02
    assert [s for s, _, _ in sc.real] == [7, 8, 9, 10] and sc.real_agree == 4


def test_greedy_check_is_identical(loaded_pair):
    p, q = loaded_pair
    gc = greedy_check(p, q, ids_of(p), gamma=4, max_new_tokens=30)
    assert gc.identical and gc.first_difference is None and len(gc.ar_ids) == 30


def test_greedy_check_points_at_the_first_difference():
    from specviz.teach.compute import GreedyCheck

    assert GreedyCheck((1, 2, 3), (1, 5, 3)).first_difference == 1
    assert GreedyCheck((1, 2), (1, 2, 3)).first_difference == 2


@pytest.fixture(scope="module")
def trimmed_draft(tiny_pair, tmp_path_factory):
    """The tiny draft with its output layer cut to 40 rows, as the built-in draft is (specviz_vocab.json)."""
    path = tmp_path_factory.mktemp("trimmed") / "draft"
    make_model(40, seed=0, layers=1).save_pretrained(path)
    PreTrainedTokenizerFast.from_pretrained(tiny_pair[0]).save_pretrained(path)
    (path / "specviz_vocab.json").write_text(json.dumps({"target_ids": list(range(40))}))
    return str(path)


def test_forward_times_measure_every_block_size_for_target_and_trimmed_draft(tiny_pair, trimmed_draft):
    p, q = load_pair(tiny_pair[0], trimmed_draft, device="cpu")
    ids = ids_of(p)
    times = forward_times(p, ids, 5, reps=2)
    assert len(times) == 5 and all(t > 0 for t in times)
    (t_draft,) = forward_times(q, ids, 1, reps=2, vocab_size=p.vocab_size)
    assert t_draft > 0
    st = Stepper(p, q, ids, StepSettings("x", gamma=2, temperature=1.0, max_new_tokens=6))
    assert st.advance() is not None  # the step view runs a trimmed draft too


def test_timing_sentence_reads_the_curve():
    flat = timing_sentence([0.010, 0.0105, 0.011, 0.0115, 0.012], draft_time=0.002)
    assert "1.2×" in flat and "nearly free" in flat and "c = 0.20" in flat
    cpu = timing_sentence([0.010, 0.011, 0.012, 0.013, 0.016])
    assert "1.6×" in cpu and "much cheaper" in cpu
    steep = timing_sentence([0.010, 0.020, 0.030, 0.040, 0.050])
    assert "gains little" in steep and "5×" in steep
