"""vLLM's per-request speculative counts laid over its reply (backends/served/steps.py): the rounds add up to the
reply's tokens and count the server's own histogram; against the real server in the full tier."""

from __future__ import annotations

import json
import urllib.request

import pytest

from specviz.backends.served.steps import ServerRound, server_rounds, speculative_metrics


def spec(accepted, drafted, k=3):
    hist = [0] * (k + 1)
    for n in accepted:
        hist[n] += 1
    return {"per_step_accepted": accepted, "per_step_drafted": drafted, "acceptance_histogram": hist}


def test_rounds_add_up_to_the_reply_and_count_the_histogram():
    ids = list(range(100, 111))  # 11 tokens: the prefill's, then rounds of 2+1, 0+1, 3+1, 1+1
    run = server_rounds(ids, spec([2, 0, 3, 1], [3, 3, 3, 3]))
    assert run.first == 100 and run.exact
    assert run.rounds == (
        ServerRound((101, 102), 103, 3),
        ServerRound((), 104, 3),
        ServerRound((105, 106, 107), 108, 3),
        ServerRound((109,), 110, 3),
    )
    assert [run.first] + [t for r in run.rounds for t in r.tokens] == ids
    assert run.counted_histogram() == run.histogram == (1, 1, 1, 1)


def test_a_last_round_cut_by_the_limit_and_plain_steps_the_counts_do_not_place():
    cut = server_rounds([1, 2, 3], spec([3], [3]))  # the limit fell inside the last round's kept guesses
    assert cut.rounds == (ServerRound((2, 3), None, 3, 3),) and cut.exact
    assert cut.counted_histogram() == cut.histogram == (0, 0, 0, 1)  # counted as the server counted it
    gaps = server_rounds(list(range(8)), spec([1], [2]))  # one verify step; 5 tokens from steps that drafted nothing
    assert gaps.gaps == 5 and not gaps.exact


def test_no_metrics_and_mismatched_arrays():
    assert speculative_metrics({"choices": []}) is None and speculative_metrics({"metrics": None}) is None
    assert speculative_metrics({"metrics": {"speculative_decoding": {"x": 1}}}) == {"x": 1}
    with pytest.raises(ValueError, match="differ in length"):
        server_rounds([1, 2], {"per_step_accepted": [1], "per_step_drafted": []})


@pytest.mark.vllm
def test_the_real_server_s_counts_add_up_to_its_reply(vllm_target):
    """The session's server runs n-gram drafting with --per-request-spec-decode-metrics detailed (conftest)."""
    url, folder = vllm_target
    prompt = "one two three four five one two three four five one two three four five one two"
    body = {"model": folder, "prompt": prompt, "max_tokens": 32, "temperature": 0, "return_token_ids": True}
    req = urllib.request.Request(url + "/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        reply = json.load(r)
    counts = speculative_metrics(reply)
    assert counts is not None, reply
    ids = reply["choices"][0].get("token_ids")
    assert ids, reply["choices"][0]  # the reply's token ids (return_token_ids)
    run = server_rounds(ids, counts)
    assert run.rounds and run.counted_histogram() == run.histogram
    laid = 1 + sum(len(r.tokens) for r in run.rounds) + run.gaps
    assert laid == len(ids) == reply["usage"]["completion_tokens"]
    assert sum(r.drafted for r in run.rounds) == counts["num_draft_tokens"]


def test_the_lane_draws_the_server_s_rounds_in_the_race_s_colours():
    from conftest import make_tokenizer

    from specviz.ui.vllm_lane import NOTE, lane_html

    tok = make_tokenizer(64, chat=False)
    ids = [10, 11, 12, 13, 14, 15, 16]  # prefill 10; round 1 keeps 2 of 3 and the target adds 13; round 2 all 2 + 16
    run = server_rounds(ids, spec([2, 2], [3, 2]))
    out = lane_html(run, tok)
    assert out.count('class="sv-round ') == 2 and out.count("tok-ar") == 1
    assert out.count("tok-accepted") == 4 and out.count("tok-resampled") == 1 and out.count("tok-bonus") == 1
    assert "turned down guess 3 of 3 (not returned)" in out and html_escape(NOTE) in out
    gappy = lane_html(server_rounds(ids, spec([1], [2])), tok)
    assert "4 tokens came from steps that drafted nothing" in gappy


class _Client:
    """A served target's client that answers /v1/completions with a canned reply and keeps the request."""

    def __init__(self, reply):
        self.reply, self.sent = reply, []

    def post(self, path, body):
        self.sent.append((path, body))
        return self.reply


def _target(reply):
    from types import SimpleNamespace

    from conftest import make_tokenizer

    return SimpleNamespace(client=_Client(reply), model="m", tokenizer=make_tokenizer(64, chat=False))


def test_the_race_s_vllm_pane_draws_the_reply_and_compares_it_with_specviz_s_lane():
    from specviz.request import RunRequest
    from specviz.ui.vllm_lane import engine_pane

    ids = [10, 11, 12, 13, 14, 15, 16]
    reply = {"choices": [{"token_ids": ids}], "metrics": {"speculative_decoding": spec([2, 2], [3, 2])}}
    t = _target(reply)
    greedy = RunRequest(drafter="model", gamma=3, max_new_tokens=7)
    out = engine_pane(t, [1, 2], greedy, tuple(ids))
    assert "7 tokens in 2 verify steps of up to 3 guesses (3.00 tokens a round)" in out
    assert "Its text equals the speculative lane" in out and out.count('class="sv-round ') == 2
    assert out.startswith('<div class="sv-vllm"><h4>vLLM&#x27;s own speculative decoding of this prompt</h4>')
    path, body = t.client.sent[0]
    assert path == "/v1/completions" and body["prompt"] == [1, 2] and body["max_tokens"] == 7
    assert body["temperature"] == 0 and body["return_token_ids"] and "seed" not in body
    assert "parts from the speculative lane&#x27;s at token 3: a near-tie" in engine_pane(t, [1], greedy, (10, 11, 99))
    assert "gamma 3, constant" not in out
    assert "The server drafts up to 3 a round; set gamma to 3, constant" in engine_pane(
        t, [1], greedy.replace(gamma=4), None
    )
    sampled = RunRequest(drafter="model", temperature=0.8, top_p=0.9, seed=5)
    assert "two samples of the same distribution differ" in engine_pane(t, [1], sampled, (10, 99))
    assert {k: t.client.sent[-1][1][k] for k in ("temperature", "top_p", "seed")} == {
        "temperature": 0.8,
        "top_p": 0.9,
        "seed": 5,
    } and "top_k" not in t.client.sent[-1][1]
    # a server without the per-step counts, or whose reply lacks token ids: one sentence in the pane
    assert "--per-request-spec-decode-metrics detailed" in engine_pane(_target({"choices": []}), [1], greedy, None)
    no_ids = {"choices": [{}], "metrics": {"speculative_decoding": spec([1], [3])}}
    assert "carries no token ids" in engine_pane(_target(no_ids), [1], greedy, None)


def html_escape(s: str) -> str:
    import html

    return html.escape(s)


@pytest.mark.vllm
def test_the_lane_of_the_real_server_adds_up_and_says_what_specviz_says_greedily(vllm_target):
    """The server's rounds add up to its reply, count its own histogram, and its greedy text is specviz's (lookup
    drafter, 3 tokens: the session server's n-gram method)."""
    import specviz
    from specviz.api import encode_prompt
    from specviz.backends.served.http import Client
    from specviz.backends.served.steps import reply_rounds
    from specviz.models.loaded import load_model

    url, folder = vllm_target
    prompt = "Write a short poem about the sea. Write a short poem about the sea."
    p = load_model(folder, device="cpu")
    run = reply_rounds(Client(url, 300), folder, encode_prompt(p, prompt), 32)
    ids = [run.first] + [t for r in run.rounds for t in r.tokens]
    assert run.counted_histogram() == run.histogram
    ours = specviz.generate(prompt, target=folder, drafter="lookup", gamma=3, temperature=0, max_new_tokens=32)
    assert len(ids) + run.gaps == len(run.token_ids) and run.token_ids == ours.token_ids  # greedy: the same text
    if run.exact:  # every step drafted: the rounds are the server's own, in order
        assert tuple(ids) == run.token_ids
