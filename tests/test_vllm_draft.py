"""vLLM's real CPU server running the deploy card's draft model: the built-in draft exported with the target's full
vocabulary (`specviz export-draft`), 3 speculative tokens, each reply carrying its verify steps. Started for this
module only (the session's server, conftest.vllm_target, runs the n-gram method). The race's vLLM lane and
benchmarks/check_vs_vllm.py read those steps; here they must add up to the reply, count the server's own histogram
and /metrics, and write specviz's greedy text."""

from __future__ import annotations

import json
import re

import pytest
from test_check_vs_vllm import _bench

from specviz.request import RunRequest

pytestmark = [pytest.mark.real, pytest.mark.vllm]

K, N = 3, 24
PROMPTS = ["Tell me about gravity.", "Write a short poem about the sea."]


@pytest.fixture(scope="module")
def vllm_draft_target(tmp_path_factory):
    """(url, target folder): vLLM serving the built-in target with the exported built-in draft, k = 3."""
    from vllm_server import VLLMServer

    from specviz.models.builtin import ensure_target
    from specviz.models.export import export_draft

    folder = str(ensure_target())
    draft = export_draft(tmp_path_factory.mktemp("export") / "draft")
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": K}
    log = tmp_path_factory.mktemp("vllm-draft") / "server.log"
    server = VLLMServer(
        folder, log, "--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"
    )
    try:
        server.wait()
        yield server.url, folder
    finally:
        server.stop()


def test_the_race_s_vllm_lane_draws_the_server_s_rounds_beside_specviz_s(vllm_draft_target):
    """The race against the served target: specviz's lane drafts with the built-in draft at k = 3, the vLLM lane is
    the server's own speculative decoding with the exported draft at k = 3; greedy, the two write the same text, and
    the lane's rounds hold every token of the reply."""
    from specviz.backends.served.connect import connect
    from specviz.backends.served.steps import reply_rounds
    from specviz.limits import Limits
    from specviz.ui.common import UIContext
    from specviz.ui.race_run import race_stream

    url, folder = vllm_draft_target
    ctx = UIContext(limits=Limits(max_new_tokens=64), device="cpu")
    ctx.default_target = url
    req = RunRequest(drafter="model", gamma=K, gamma_policy="constant", tree="off", max_new_tokens=N)
    final = list(race_stream(ctx, PROMPTS[0], {"spec": req}))[-1]
    message, lane = final[5], final[-1]
    assert "sv-error" not in message and "vLLM&#x27;s own speculative decoding" in lane
    assert "Its text equals the speculative lane&#x27;s, token for token." in lane
    steps = int(re.search(r"in (\d+) verify steps of up to 3 guesses", lane).group(1))
    assert lane.count('class="sv-round ') == steps > 0

    # the same request's counts, read directly: the rounds add up to the reply and count the server's histogram
    from specviz.api import encode_prompt

    target = connect(url)
    run = reply_rounds(target.client, target.model, encode_prompt(target, PROMPTS[0]), N)
    assert run.exact  # a draft model drafts every step: each token has its place
    assert 1 + sum(len(r.tokens) for r in run.rounds) == len(run.token_ids) == N
    assert run.counted_histogram() == run.histogram and all(r.drafted == K for r in run.rounds[:-1])
    spans = re.findall(r'class="tok (tok-\w+)"', lane)
    assert len(spans) == len(run.token_ids)  # the lane draws every token once: the prefill's, kept, the target's
    assert spans.count("tok-accepted") == sum(r.accepted for r in run.rounds)


def test_the_comparison_reads_the_draft_model_s_counters(vllm_draft_target):
    """benchmarks/check_vs_vllm.py's pieces on the draft-model server: each reply's verify steps add up to what
    /metrics counted, and vLLM writes specviz's greedy text with the same draft at the same k."""
    url, folder = vllm_draft_target
    bench = _bench()
    engine = bench.vllm_side(url, folder, bench.prompt_ids(PROMPTS), N, K)
    ours = bench.specviz_side(PROMPTS, K, "model", N)
    assert engine.rounds > 0 and bench.replies_agree(engine)
    assert engine.tokens_per_round == pytest.approx(1 + sum(engine.per_position))
    assert engine.outputs == ours.outputs
