"""benchmarks/check_vs_vllm.py's pieces against vLLM's real CPU server of the test session (n-gram, 3 tokens, n-grams
of 1-3: the card of a lookup check with gamma 3): the same prompts sent as token ids, the server's counters read
around them, specviz's lookup drafter beside it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Tell me about gravity.", "Write a short poem about the sea. Write a short poem about the sea."]


def _bench():
    spec = importlib.util.spec_from_file_location("check_vs_vllm", ROOT / "benchmarks" / "check_vs_vllm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.vllm
def test_the_comparison_reads_vllm_s_counters_beside_specviz_s_rounds(vllm_target):
    url, folder = vllm_target
    bench = _bench()
    k, n = 3, 24
    engine = bench.vllm_side(url, folder, bench.prompt_ids(PROMPTS), n, k)
    ours = bench.specviz_side(PROMPTS, k, "lookup", n)
    assert engine.rounds > 0 and ours.rounds > 0
    for side in (engine, ours):  # the counters agree with each other: 1 + accepted / drafts = 1 + sum of shares
        assert len(side.per_position) == k
        assert all(1 >= a >= b >= 0 for a, b in zip(side.per_position, side.per_position[1:])), side
        assert side.tokens_per_round == pytest.approx(1 + sum(side.per_position))
    assert engine.outputs == ours.outputs  # greedy: the same text from vLLM and from specviz
    assert bench.replies_agree(engine)  # each reply's verify steps add up to what /metrics counted
    iid = bench.iid(0.5, k)
    assert iid.per_position == [0.5, 0.25, 0.125] and iid.tokens_per_round == pytest.approx(1.875)
