"""The served target against llama-cpp-python's real server (the second engine, specviz/backends/served/llamacpp.py): its CPU
build in .venv-llamacpp serving the built-in target's own GGUF file, started once per session by the
`llamacpp_target` fixture (conftest.py, tests/llamacpp_server.py)."""

from __future__ import annotations

import json

import pytest
import torch

import specviz
from specviz.__main__ import main
from specviz.backends.served import connect as served
from specviz.backends.served.llamacpp import ENGINE, pieces, scorable, text_of_ids
from specviz.bench.inputs import load_prompts
from specviz.config import SamplingConfig, SpecvizError

pytestmark = [pytest.mark.real, pytest.mark.llamacpp]

N = 16


def _engine_greedy(url: str, ids: list[int], n: int) -> tuple[list[str], str, str]:
    """The server's own greedy continuation in one request, no specviz in the way: (each generated token's text,
    the text, why it stopped). Sampling fields explicit: its defaults (repeat_penalty 1.1) would change p."""
    p = served.connect(url)
    body = {
        "model": p.model,
        "prompt": text_of_ids(p, ids),
        "max_tokens": n,
        "temperature": 0.0,
        "repeat_penalty": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "logprobs": 1,
    }
    choice = p.client.post("/v1/completions", body)["choices"][0]
    return choice["logprobs"]["tokens"], choice["text"], choice["finish_reason"]


def _as_engine_writes(p, token_ids) -> tuple[list[str], bool]:
    """(the text of each token as the server writes it, whether the reply ended with the end of turn): the server
    leaves its end-of-turn token out of what it returns."""
    ids = list(token_ids)
    ended = bool(ids) and ids[-1] in p.eos
    text_of, _ = pieces(p.tokenizer)
    return [text_of[i] for i in ids[: len(ids) - ended]], ended


@pytest.fixture(scope="module")
def held_out():
    """Two held-out prompts (the bench's everyday and code sets; never trained on)."""
    return [load_prompts("everyday", 1)[0], load_prompts("code", 1)[0]]


def test_connect_finds_llamacpp_and_checks_its_tokenizer(llamacpp_target, tiny_pair):
    url, _ = llamacpp_target
    assert served.connect(url).engine == ENGINE
    with pytest.raises(SpecvizError, match="splits text differently from the server's model"):
        served.connect(url, tokenizer=tiny_pair[0])


def test_greedy_through_llamacpp_is_the_engine_s_own_greedy_output(llamacpp_target, held_out):
    """The plain lane and the spec lane at gamma 1, 3, 6 and auto (two per held-out prompt: each verify request
    echoes the whole prompt, which this server scores in Python at ~0.1 s a token on a busy CPU) give the server's
    own greedy continuation token for token."""
    url, _ = llamacpp_target
    p = served.connect(url)
    for prompt, gammas in zip(held_out, ((1, 6), (3, "auto"))):
        ids = specviz.api.encode_prompt(p, prompt)
        engine, text, finish = _engine_greedy(url, ids, N)
        plain = specviz.generate(prompt, target=url, mode="ar", max_new_tokens=N)
        assert plain.text == text
        assert _as_engine_writes(p, plain.token_ids) == (engine, finish == "stop"), prompt
        for gamma in gammas:  # every gamma runs ServedRun.verify, as against vLLM (test_vllm.py)
            policy = "auto" if gamma == "auto" else "constant"
            sp = specviz.generate(
                prompt, target=url, gamma=gamma, gamma_policy=policy, drafter="model", max_new_tokens=N
            )
            assert list(sp.token_ids) == list(plain.token_ids), (prompt, gamma)
            assert sp.stats["verify"] == "greedy" and sp.stats["requests"] == sp.stats["rounds"]
            assert sp.stats["accepted"] > 0  # guesses were kept: blocks were verified, not only single steps


def test_sampling_is_refused_for_the_spec_lane_and_the_plain_lane_samples(llamacpp_target):
    url, _ = llamacpp_target
    with pytest.raises(SpecvizError, match="verifies greedy decoding exactly but not sampling; use temperature 0"):
        specviz.generate("What is AI?", target=url, temperature=0.7, max_new_tokens=4)
    a, b = (
        specviz.generate("Name a colour.", target=url, mode="ar", temperature=1.0, seed=s, max_new_tokens=6)
        for s in (1, 1)
    )
    assert a.token_ids and a.token_ids == b.token_ids  # the engine's own sample, seeded from the run's generator
    assert specviz.generate("Hi", target=url, mode="ar", max_new_tokens=2).token_ids  # and it keeps working


def test_a_text_that_reads_back_as_other_tokens_gets_one_sentence(llamacpp_target):
    """Token ids no tokenizer writes ("Hel" + "lo" for "Hello"): a text interface cannot score them as they are."""
    url, _ = llamacpp_target
    p = served.connect(url)
    tok = p.tokenizer
    prompt = specviz.api.encode_prompt(p, "Say hello.")
    split = tok("Hel", add_special_tokens=False)["input_ids"] + tok("lo", add_special_tokens=False)["input_ids"]
    assert tok(tok.decode(split), add_special_tokens=False)["input_ids"] != split
    run = served.open_served_run(p)
    run.prefill(torch.tensor(prompt))
    with pytest.raises(
        SpecvizError,
        match=r"read the text back as other tokens \(\[.Hello., . there.\] where specviz sent \[.Hel., .lo.\]\)",
    ):
        run.feed(torch.tensor(prompt[-1:] + split))


def test_the_cli_races_and_the_pair_check_measures_through_llamacpp(llamacpp_target, capsys, held_out):
    url, _ = llamacpp_target
    assert main(["generate", held_out[0], "--target", url, "--compare", "--max-new-tokens", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ar"]["text"] == out["spec"]["text"] and out["spec"]["stats"]["served"] == url
    assert out["engine_spec"] is None  # llama-cpp-python's server has no /metrics
    r = specviz.check_pair(url, prompts=["What is AI?"], max_new_tokens=8)
    assert r.served == url and r.engine_step_s > 0 and r.acceptance.tested > 0


def test_a_guess_its_echo_leaves_out_is_judged_against_the_engine_s_own_token(llamacpp_target):
    """The server's echo has no entry for the beginning-of-text token (SmolLM2's <|im_start|>, which lookup copies
    from the prompt): guesses are scored up to it, and there the engine's own greedy token is the correction."""
    url, _ = llamacpp_target
    p = served.connect(url)
    prompt = specviz.api.encode_prompt(p, "Say hello.")
    greedy = list(specviz.generate("Say hello.", target=url, mode="ar", max_new_tokens=3).token_ids)
    bos = p.tokenizer.bos_token_id
    assert bos not in greedy and scorable(p.tokenizer, prompt, [greedy[0], bos, greedy[2]]) == 1
    run = served.open_served_run(p)
    run.prefill(torch.tensor(prompt))
    v, logits = run.verify(prompt[-1:], [greedy[0], bos, greedy[2]], None, SamplingConfig(), torch.Generator())
    assert (v.n, v.correction) == (1, greedy[1]) and logits.shape == (4, p.vocab_size)
    assert int(logits[0].argmax()) == greedy[0] and run.length == len(prompt) + 3  # the engine rolls back from here
