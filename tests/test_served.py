"""A served target through vLLM's protocol, against tests/protocol_server.py (real HTTP on 127.0.0.1, a tiny model
behind it; NOT the real engine, which tests/test_vllm.py runs): exactness, the labels, every failure as a sentence,
the operator's allow-list and the metrics panel's parser."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from conftest import engine_config
from protocol_server import ProtocolServer
from server_process import free_port

import specviz
from specviz.backends.served import connect as served
from specviz.backends.served import run as served_run
from specviz.config import SpecvizError
from specviz.engine.loop import autoregressive_decode, eos_ids, speculative_decode
from specviz.events import Round, Start
from specviz.limits import Limits
from specviz.request import RunRequest


@pytest.fixture(scope="module")
def server(tiny_pair):
    s = ProtocolServer(tiny_pair[0])
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _fresh(request):
    served.forget_connections()  # every test checks its own connection
    srv = request.getfixturevalue("server") if "server" in request.fixturenames else None
    if srv is not None:
        srv.fault = None
    yield
    if srv is not None:
        srv.fault = None


PROMPTS = ["the cat sat on the mat", "hello world, hello", "numbers 1 2 3 4"]


@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 6, "auto"])
def test_greedy_through_the_server_equals_the_local_target_and_the_plain_lane(server, tiny_pair, gamma):
    """The engine's top-1 decides: speculative output == plain output through the server == the target run here."""
    target, draft = tiny_pair
    rejections = 0
    for prompt in PROMPTS:
        local = specviz.generate(prompt, target=target, mode="ar", max_new_tokens=24, raw=True, device="cpu")
        plain = specviz.generate(prompt, target=server.url, mode="ar", max_new_tokens=24, raw=True, device="cpu")
        for drafter in ("model", "lookup+model"):
            sp = specviz.generate(
                prompt,
                target=server.url,
                draft=draft,
                gamma=gamma,
                drafter=drafter,
                max_new_tokens=24,
                raw=True,
                device="cpu",
            )
            assert sp.token_ids == plain.token_ids == local.token_ids, (prompt, drafter)
            assert sp.stats["verify"] == "greedy" and sp.stats["requests"] >= sp.stats["rounds"]
            rejections += sp.stats["drafted"] - sp.stats["accepted"]
        assert plain.stats["requests"] == plain.stats["target_calls"] == 24
    assert rejections > 0  # the corrections were exercised, not only bonuses


def _two_token_law(model_dir, ids):
    """p of the first two tokens after ids, exactly, from the model here (V*V outcomes, EOS ends early)."""
    from specviz import load_model

    p = load_model(model_dir, device="cpu")
    V = p.vocab_size
    with torch.no_grad():
        p1 = torch.softmax(p.model(torch.tensor([ids])).logits[0, -1].float(), -1)
        nxt = torch.tensor([ids + [a] for a in range(V)])
        p2 = torch.softmax(p.model(nxt).logits[:, -1].float(), -1)  # (V, V)
    law = (p1[:, None] * p2).flatten()
    eos = eos_ids(p)
    for a in eos:
        law.view(V, V)[a] = 0
    return torch.cat([law, torch.tensor([float(p1[a]) if a in eos else 0.0 for a in range(V)])]), V


@pytest.mark.parametrize("residual", ["engine samples", "whole distribution"])
def test_sampled_at_t1_through_the_server_follows_the_target(small_vocab_pair, monkeypatch, residual):
    """T = 1 is exact: r < p(x)/q(x) with p from the prompt logprobs, the residual drawn from the engine's own
    samples (or, when none is kept, from all of p at that one position). Chi-square over the first two tokens."""
    srv = ProtocolServer(small_vocab_pair[0])
    try:
        if residual == "whole distribution":
            monkeypatch.setattr(served_run, "RESIDUAL_REQUESTS", 0)
        p, q = served.load_served_pair(srv.url, small_vocab_pair[1], device="cpu")
        ids = [1, 5, 6]
        law, V = _two_token_law(small_vocab_pair[0], ids)
        N = 1200
        counts = torch.zeros(V * V + V)
        resampled = 0
        for seed in range(N):
            cfg = RunRequest(drafter="model", gamma=1, tree="off", max_new_tokens=2, seed=seed, temperature=1.0).spec
            events = list(speculative_decode(p, q, ids, cfg))
            assert events[0].verify == "served exact" and events[-1].stats["verify"] == "exact"
            resampled += sum(ev.kind == "resampled" for ev in events if isinstance(ev, Round))
            t = events[-1].token_ids
            counts[V * V + t[0] if len(t) == 1 else t[0] * V + t[1]] += 1
        assert resampled > N // 10  # the residual path ran often
        keep = law * N >= 5
        chi2 = float((((counts[keep] - N * law[keep]) ** 2) / (N * law[keep])).sum())
        dof = int(keep.sum()) - 1
        assert (chi2 - dof) / math.sqrt(2 * dof) < 4.0, (chi2, dof)
        assert 0.5 * float((counts / N - law).abs().sum()) < 0.1
    finally:
        srv.close()


def test_plain_lane_at_t1_is_the_engine_s_own_sample(small_vocab_pair):
    srv = ProtocolServer(small_vocab_pair[0])
    try:
        p, _ = served.load_served_pair(srv.url, need_draft=False, device="cpu")
        ids = [1, 5, 6]
        law, V = _two_token_law(small_vocab_pair[0], ids)
        N = 800
        counts = torch.zeros(V * V + V)
        for seed in range(N):
            cfg = engine_config(max_new_tokens=2, seed=seed, temperature=1.0)
            t = list(autoregressive_decode(p, ids, cfg))[-1].token_ids
            counts[V * V + t[0] if len(t) == 1 else t[0] * V + t[1]] += 1
        keep = law * N >= 5
        chi2 = float((((counts[keep] - N * law[keep]) ** 2) / (N * law[keep])).sum())
        dof = int(keep.sum()) - 1
        assert (chi2 - dof) / math.sqrt(2 * dof) < 4.0, (chi2, dof)
    finally:
        srv.close()


def test_other_temperatures_are_labelled_approximate_and_the_same_seed_repeats(server, tiny_pair):
    kw = dict(
        target=server.url,
        draft=tiny_pair[1],
        temperature=0.7,
        seed=5,
        max_new_tokens=16,
        raw=True,
        device="cpu",
        gamma=3,
        drafter="model",
        gamma_policy="constant",
    )
    events = list(specviz.stream("the cat", **kw))
    assert isinstance(events[0], Start) and events[0].verify == "served approximate: top-20"
    assert events[-1].stats["verify"] == "approximate: top-20"
    again = specviz.generate("the cat", **kw)
    assert again.token_ids == events[-1].token_ids
    top = specviz.generate("the cat", **{**kw, "temperature": 1.0, "top_k": 5})
    assert top.stats["verify"] == "approximate: top-20"


def test_requests_and_their_time_are_counted(server, tiny_pair):
    r = specviz.generate(
        "the cat",
        target=server.url,
        draft=tiny_pair[1],
        max_new_tokens=12,
        raw=True,
        device="cpu",
        gamma=3,
        drafter="model",
        gamma_policy="constant",
    )
    assert r.stats["requests"] == r.stats["target_calls"] == r.stats["rounds"]
    assert 0 < r.stats["request_s"] <= r.stats["wall_s"]
    assert r.stats["served"] == served.base_url(server.url)


# --- failures: one sentence each, and the program goes on -------------------------------------------------


def _one_sentence(err: SpecvizError) -> str:
    text = str(err)
    assert text.endswith(".") and "\n" not in text and "Traceback" not in text, text
    return text


def test_a_server_that_is_not_there(tiny_pair):
    with pytest.raises(SpecvizError) as e:
        specviz.generate("hi", target=f"http://127.0.0.1:{free_port()}/v1", draft=tiny_pair[1], device="cpu")
    assert "cannot be reached (connection refused)" in _one_sentence(e.value)


@pytest.mark.parametrize(
    "fault, words",
    [
        ("500", "answered 500 to /v1/models: The engine fell over"),
        ("redirect", "answered with a redirect, which specviz does not follow"),
        ("not_json", "a reply that is not JSON"),
        ("tokenize_differs", "splits text differently from the server's model"),
        ("no_prompt_logprobs", "sent no prompt logprobs"),
        ("no_token_ids", "without the generated token's id"),
    ],
)
def test_each_broken_server_gives_one_sentence(server, tiny_pair, fault, words):
    server.fault = fault
    with pytest.raises(SpecvizError) as e:
        specviz.generate("hi", target=server.url, draft=tiny_pair[1], device="cpu", raw=True)
    assert words in _one_sentence(e.value)
    server.fault = None  # the same process connects once the server is mended
    assert specviz.generate("hi", target=server.url, draft=tiny_pair[1], device="cpu", raw=True, max_new_tokens=4)


def test_a_server_that_breaks_mid_run_stops_the_run_with_a_sentence(server, tiny_pair):
    events = specviz.stream(
        "the cat",
        target=server.url,
        draft=tiny_pair[1],
        device="cpu",
        raw=True,
        max_new_tokens=30,
        gamma=2,
        drafter="model",
        gamma_policy="constant",
    )
    next(events)
    next(events)
    server.fault = "500"
    with pytest.raises(SpecvizError) as e:
        list(events)
    assert "answered 500 to /v1/completions" in _one_sentence(e.value)


def test_a_slow_server_times_out(server):
    server.fault, server.slow_s = "slow", 1.5
    with pytest.raises(SpecvizError) as e:
        served.connect(server.url, timeout_s=0.5)
    assert "did not answer within 0.5 seconds" in _one_sentence(e.value)


def test_a_tokenizer_that_is_not_here_or_disagrees(server, small_vocab_pair, tmp_path):
    with pytest.raises(SpecvizError) as e:
        served.connect(server.url, tokenizer=str(tmp_path / "nothing"))
    assert "is not available here" in _one_sentence(e.value)
    with pytest.raises(SpecvizError) as e:  # a tokenizer of another vocabulary splits the probe otherwise
        served.connect(server.url, tokenizer=small_vocab_pair[0])
    assert "splits text differently" in _one_sentence(e.value)


def test_head_drafters_and_relaxed_verification_are_refused(server, tiny_pair):
    with pytest.raises(SpecvizError, match="hidden states"):
        specviz.generate("hi", target=server.url, drafter="lookup+head", device="cpu")
    with pytest.raises(SpecvizError, match="all of p"):
        specviz.generate("hi", target=server.url, draft=tiny_pair[1], relaxed_w=0.5, allow_lossy=True, device="cpu")


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1/v1", "http://", "http://user:pw@127.0.0.1:8000/v1", "http://127.0.0.1:99999999/v1"]
)
def test_malformed_addresses(url):
    with pytest.raises(SpecvizError):
        served.base_url(url)


def test_only_the_operator_s_urls_reach_the_network(server, monkeypatch):
    assert served.base_url("http://127.0.0.1:8000") == served.base_url("http://127.0.0.1:8000/v1/")
    with pytest.raises(SpecvizError, match="does not allow served targets"):
        Limits().check_model(server.url)
    limits = Limits(target_urls=(server.url,))
    assert limits.check_model(server.url + "/") == served.base_url(server.url)
    before = server.requests
    for other in ("http://127.0.0.2:80/v1", server.url.replace("/v1", "/v2"), "http://169.254.169.254/latest"):
        with pytest.raises(SpecvizError, match="does not allow that server"):
            limits.check_model(other)
    assert server.requests == before  # refused before any request


def test_the_page_s_pair_check_field_takes_an_allowed_url(server, tiny_pair, monkeypatch):
    from specviz.ui.common import UIContext

    folders = (str(Path(tiny_pair[1]).parent),)
    ctx = UIContext(limits=Limits(target_urls=(server.url,), model_dirs=folders), device="cpu")
    p, q = ctx.pair(server.url, tiny_pair[1])
    assert isinstance(p, served.ServedTarget) and p.url == served.base_url(server.url)
    with pytest.raises(SpecvizError, match="does not allow"):
        UIContext(limits=Limits(), device="cpu").pair(server.url, tiny_pair[1])


# --- the engine's own speculative decoding, from /metrics -------------------------------------------------

# Written here after vLLM's metric names (v1/spec_decode/metrics.py): prometheus_client adds "_total" to counters
SPEC_METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 120.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 66.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 32.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 22.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 12.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_the_engine_s_spec_decode_counters_become_acceptance_per_position():
    spec = served.parse_spec_metrics(SPEC_METRICS)
    assert spec.drafts == 40 and spec.draft_tokens == 120 and spec.accepted == 66
    assert spec.acceptance_per_pos == (0.8, 0.55, 0.3)
    assert spec.mean_accepted_length == pytest.approx(1 + 66 / 40)
    assert served.parse_spec_metrics("vllm:num_requests_running 0.0\n") is None


def test_engine_spec_reads_the_server_s_metrics(server):
    server.metrics = SPEC_METRICS
    p = served.connect(server.url)
    assert served.engine_spec(p).acceptance_per_pos == (0.8, 0.55, 0.3)
    server.metrics = "vllm:num_requests_running 0.0\n"
    assert served.engine_spec(p) is None


def test_the_app_s_race_runs_against_a_served_target(server, tiny_pair):
    """The page's race handler with the operator's SPECVIZ_TARGET a served target: both lanes through the server,
    the same text, and the served label and share of time in requests under each pane."""
    from specviz.request import RunRequest
    from specviz.ui.common import UIContext
    from specviz.ui.race_run import race_stream

    ctx = UIContext(limits=Limits(max_prompt_tokens=40, max_new_tokens=64), device="cpu")
    ctx.default_target, ctx.default_draft = server.url, tiny_pair[1]
    server.metrics = SPEC_METRICS
    outputs = list(race_stream(ctx, "the cat", {"spec": RunRequest(drafter="model", gamma=3, max_new_tokens=20)}))
    prompt_html, ar, spec, ar_stats, spec_stats, message = outputs[-1][:6]
    assert "sv-error" not in message and 'data-state="done"' in spec
    for stats in (ar_stats, spec_stats):
        assert "<b>greedy</b><span>served target</span>" in stats and "of the time in requests" in stats
    words = re.findall(r'class="tok tok-ar[^>]*>(.*?)</span>', ar)
    spec_words = re.findall(r'class="tok tok-(?:accepted|resampled|bonus)[^>]*>(.*?)</span>', spec)
    assert words and words == spec_words
    assert "acceptance by position 0.80, 0.55, 0.30, mean accepted length 2.65 over 40 drafts" in message
    assert "this draft&#x27;s alpha_k by position" in message
    sampled = list(
        race_stream(ctx, "the cat", {"spec": RunRequest(drafter="model", gamma=3, temperature=0.7, max_new_tokens=12)})
    )[-1]
    assert "<b>approximate: top-20</b><span>served target</span>" in sampled[4]
    assert "<b>engine sample</b><span>served target</span>" in sampled[3]


def test_the_pair_check_measures_a_served_target(server, tiny_pair):
    """Alpha with its interval, the request and verify costs through the server, the expected speedup here and
    the one the engine would get drafting itself; in the CLI's report and the page's."""
    from specviz.pairs.check import check_pair
    from specviz.ui.pair import report_html

    r = check_pair(server.url, tiny_pair[1], device="cpu", max_new_tokens=12, prompts=["the cat", "a b c"])
    assert r.served == served.base_url(server.url) and r.verdict in ("compatible", "not worth it")
    assert 0 <= r.acceptance.low <= r.a <= r.acceptance.high <= 1 and r.acceptance.tested > 0
    assert r.target_step_s > 0 and r.engine_step_s > 0 and len(r.verify_costs) == 8
    assert r.engine_speedup > 0 and 1 <= r.engine_best_gamma <= 8 and r.best_speedup > 0
    assert "the engine drafting with it itself" in r.report()
    assert "If the engine drafted with it itself" in report_html(r)


def test_the_bench_has_a_served_target_row(server, tiny_pair):
    """Speedup over plain decoding through the same server, with the share of each lane's time in requests."""
    from specviz.bench.cli import format_table
    from specviz.bench.measure import run_bench

    p, q = served.load_served_pair(server.url, tiny_pair[1], device="cpu")
    table = run_bench(p, q, ["the cat sat", "hello hello"], [2, "auto"], [0.0], max_new_tokens=10, hf=False, raw=True)
    assert list(table["verify"]) == ["greedy", "greedy"] and table["identical"].all()
    assert ((0 < table["ar_request_share"]) & (table["ar_request_share"] <= 1)).all()
    assert ((0 < table["spec_request_share"]) & (table["spec_request_share"] <= 1)).all()
    assert (table["speedup_vs_ar"] > 0).all()
    text = format_table(table)
    assert "served verify" in text and "spec in requests" in text


def test_both_kinds_of_run_offer_what_the_engine_calls_and_say_what_they_cannot(server, tiny_pair):
    """backends.TargetRun is the engine's one seam: a run here and a served run each have every call it names; the
    served one decides with its own numbers, has no tree-masked verify and says so in one sentence, and the two
    kinds' Limits are what the run setup refuses by."""
    from specviz.backends import DecidingRun, TargetRun, limits_of, open_run
    from specviz.models.loaded import load_model

    p = load_model(tiny_pair[0], device="cpu")
    t = served.connect(server.url, tiny_pair[0])
    members = [n for n in vars(TargetRun) if not n.startswith("_")] + list(TargetRun.__annotations__)
    here, there = open_run(p, p.vocab_size), open_run(t, t.vocab_size)
    for run in (here, there):
        missing = [n for n in members if not hasattr(run, n)]
        assert missing == [] and isinstance(run, TargetRun)
    assert isinstance(there, DecidingRun) and not isinstance(here, DecidingRun)  # verify / next_token: the server's
    assert (here.decides, here.supports_trees) == (False, True)
    assert (there.decides, there.supports_trees) == (True, False)
    with pytest.raises(SpecvizError, match="tree-masked verify"):
        there.feed_tree(torch.tensor([1, 2]), [-1, 0])
    assert limits_of(p).tree_verify and limits_of(p).runs_here and limits_of(p).hidden_states
    assert not (limits_of(t).tree_verify or limits_of(t).runs_here or limits_of(t).hidden_states)
    with pytest.raises(SpecvizError, match="a served target does not send"):
        specviz.generate("hi", target=server.url, draft=tiny_pair[1], drafter="head", device="cpu")
    logits = torch.randn(3, p.vocab_size)
    assert here.argmax(logits).tolist() == there.argmax(logits).tolist() == logits.argmax(-1).tolist()
    assert here.probs_at(logits, [0, 2], [5, 7]) == pytest.approx(there.probs_at(logits, [0, 2], [5, 7]), rel=2e-5)
