"""The lean Llama forward (specviz/native/forward.py, csrc/llama.c): the same model as transformers runs, every path exact.

Three forwards can run a Llama model here: llama.c (the default where the few-token kernel is built), the lean
forward in PyTorch ops (another linear path, or a prefill longer than lean.CHUNKED_PREFILL) and transformers' own
(SPECVIZ_FORWARD=transformers, or a model the lean forward does not fit). Each gets greedy equality with plain
decoding, chains and trees, and the chi-square test of the sampled law.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import PREFILLS, blocking_pair, feed_in_calls, long_prefill, make_model
from two_tokens import chi2_z, exact_two_token_law, two_token_counts

from specviz import generate
from specviz.backends.local import CachedModel
from specviz.host import cpus
from specviz.models.loaded import backend, pair_backend, pair_dtypes
from specviz.native import draft as lean_draft
from specviz.native import forward as lean
from specviz.native import library as native
from specviz.native import panels as lean_panels
from specviz.native import tiles as lean_tiles

PROMPTS = ["hello world", "the cat sat on", "one two three four five", "tell me a story"]
TILES = "llama.c, weights as bfloat16 pairs on AMX tiles"  # where the CPU has AMX (lean_panels; skipped elsewhere)
FORWARDS = ["llama.c", "llama.c, weights in panels", "PyTorch ops", "transformers", TILES]
needs_kernel = pytest.mark.skipif(native.library() is None, reason="no C compiler or no AVX2 here")


def _reference(lm, ids):
    """transformers' logits for every position of ids, in one call without a cache."""
    with torch.inference_mode():
        return lm.model(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("forward, prefill", PREFILLS + [("llama.c, weights in panels", "llama.c calls")])
def test_the_lean_forward_computes_the_models_logits_through_prefill_steps_and_verifies(
    pair_with, monkeypatch, forward, prefill
):
    p, q = pair_with(forward)
    long_prefill(monkeypatch, prefill)
    ids = list(range(3, 63)) + [5, 9, 12, 30] * 60  # 300 tokens: past the first cache and RoPE table (256)
    for lm in (p, q):
        run = CachedModel(lm, lm.vocab_size)
        run.prefill(torch.tensor(ids[:40]))  # 39 rows by the prefill path forced; then calls of 1-16 tokens
        got, at = feed_in_calls(run, ids, 39)
        ref = _reference(lm, ids[:at])
        torch.testing.assert_close(got, ref[39:], atol=2e-4, rtol=1e-4)
        run.rollback(30)  # back inside the prefill's rows
        torch.testing.assert_close(run.feed(torch.tensor(ids[30:33])), ref[30:33], atol=2e-4, rtol=1e-4)
        with torch.no_grad():  # the prefill's own logits, every row
            cache = lm.lean.new_cache()
            logits, _ = lm.lean.forward(cache, torch.tensor(ids[:40]))
        torch.testing.assert_close(logits, ref[:40], atol=2e-4, rtol=1e-4)


@needs_kernel
def test_a_prefill_in_llama_c_calls_reads_a_given_mask_row_by_row(pair_with, monkeypatch):
    """A prefill longer than one llama.c call with an additive mask (each call takes its rows of it): the causal
    mask written out gives the bits of no mask; a mask that hides rows 0-9 from every token changes every logit
    after them, as the same prefill under the PyTorch ops does."""
    p, _ = pair_with("llama.c")
    ids = torch.tensor(list(range(3, 43)))  # 40 tokens: three calls
    causal = torch.full((40, 40), -torch.inf).triu_(1)
    hidden = causal.clone()
    hidden[10:, :10] = -torch.inf
    got = {}
    for how in ("llama.c calls", "PyTorch ops"):
        long_prefill(monkeypatch, how)
        for name, mask in (("none", None), ("causal", causal), ("hidden", hidden)):
            got[how, name] = p.lean.forward(p.lean.new_cache(), ids, mask=mask)[0]
    assert torch.equal(got["llama.c calls", "none"], got["llama.c calls", "causal"])
    torch.testing.assert_close(got["llama.c calls", "hidden"], got["PyTorch ops", "hidden"], atol=2e-4, rtol=1e-4)
    assert not torch.allclose(got["llama.c calls", "hidden"][10:], got["llama.c calls", "none"][10:], atol=1e-3)


@needs_kernel
@pytest.mark.parametrize("forward", [*FORWARDS[:2], TILES])
def test_on_llama_c_a_tokens_logits_are_the_same_bits_alone_or_inside_a_verify(pair_with, forward):
    p, _ = pair_with(forward)
    ids = [5, 9, 12, 30, 7, 8] + list(range(40, 56))
    alone, block = CachedModel(p, p.vocab_size), CachedModel(p, p.vocab_size)
    alone.prefill(torch.tensor(ids[:6]))
    block.prefill(torch.tensor(ids[:6]))
    one_by_one = torch.cat([alone.feed(torch.tensor([t])) for t in ids[5:21]])
    assert torch.equal(one_by_one, block.feed(torch.tensor(ids[5:21])))  # bit for bit, 16 tokens in one call


def _read_as(fwd, layout: str) -> None:
    """fwd reads its weights by rows, in panels or on AMX tiles (the test skipped where the CPU has none)."""
    if layout == "tiles" and not native.amx():
        pytest.skip("this CPU (or this process) has no AMX tiles")
    lean_panels.use(fwd, layout != "rows", lean_tiles.tiles(fwd) if layout == "tiles" else None)


def _llama(d: int):
    """The tests' small Llama model with head size d (4 query heads, 2 kv heads) and its lean forward on llama.c."""
    model = make_model(40, seed=d, layers=2, hidden=4 * d)
    fwd = lean.LeanLlama(model, "kernel")
    assert fwd.lib is not None and fwd.d == d
    return model, fwd


@needs_kernel
@pytest.mark.parametrize("d", [12, 72])  # not a multiple of 8 (the plain loops); a 64-float block and 8 more
def test_llama_c_attention_matches_transformers_for_other_head_sizes_and_rows_stay_bit_identical(d):
    model, fwd = _llama(d)
    ids = torch.tensor([(7 * i) % 40 for i in range(61)])  # calls end at rows that are and are not multiples of 4 and 8
    with torch.inference_mode():
        ref = model(ids[None]).logits[0]
    cache, alone, got = fwd.new_cache(), fwd.new_cache(), []
    fwd.forward(cache, ids[:9])
    fwd.forward(alone, ids[:9])
    at = 9
    for n in (1, 3, 8, 5, 16, 2, 7, 1, 9):
        block = fwd.forward(cache, ids[at : at + n])[0]
        got.append(block)
        one_by_one = torch.cat([fwd.forward(alone, ids[at + i : at + i + 1])[0] for i in range(n)])
        assert torch.equal(block, one_by_one), n
        at += n
    torch.testing.assert_close(torch.cat(got), ref[9:at], atol=2e-4, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("d", [8, 72])
def test_on_llama_c_a_tree_nodes_logits_are_the_same_bits_as_its_line_fed_as_a_chain(d):
    """A node sees the cache and its ancestors; the rows between them that it may not see weigh exactly nothing,
    so its logits are those of its line fed after the cache, bit for bit (greedy trees equal plain decoding even
    at a near-tie)."""
    _, fwd = _llama(d)
    ids = torch.tensor([(11 * i) % 40 for i in range(37)])
    nodes = torch.tensor([3, 4, 5, 6, 7, 8])  # 3 and 4 under the cache; 5 under 3; 6 under 4; 7 under 6; 8 under 5
    lines = [[0], [1], [0, 2], [1, 3], [1, 3, 4], [0, 2, 5]]
    tree_cache = fwd.new_cache()
    fwd.forward(tree_cache, ids)
    base, L = tree_cache.length, len(nodes)
    mask = torch.full((L, base + L), -torch.inf)
    mask[:, :base] = 0.0
    for i, line in enumerate(lines):
        mask[i, [base + j for j in line]] = 0.0
    depth = torch.tensor([base + len(line) - 1 for line in lines])
    tree = fwd.forward(tree_cache, nodes, positions=depth, mask=mask)[0]
    for i, line in enumerate(lines):
        chain_cache = fwd.new_cache()
        fwd.forward(chain_cache, ids)
        chain = fwd.forward(chain_cache, nodes[line])[0]
        assert torch.equal(tree[i], chain[-1]), (i, line)


@pytest.fixture
def threads(monkeypatch):
    """Run a test at other thread counts than the suite's one (conftest), restored after it; the count as set,
    never lowered for a busy neighbour (cpus.threads)."""
    monkeypatch.setattr(cpus, "_most", None)
    yield torch.set_num_threads
    torch.set_num_threads(1)


@needs_kernel
@pytest.mark.parametrize("layout", ["rows", "panels", "tiles"])
def test_llama_cs_numbers_are_the_same_bits_at_any_thread_count(layout, threads):
    """cpus.py fits the thread count to a CPU quota: each output is computed whole by one thread, so a step, a
    verify and a tree's masked call give the same bits on 1, 2 or 3 threads."""
    _, fwd = _llama(72)
    _read_as(fwd, layout)
    ids = torch.tensor([(7 * i) % 40 for i in range(23)])
    mask = torch.zeros(3, 23 + 3)  # nodes 0 and 1 under the cache, node 2 under node 0
    mask[:, 23:] = -torch.inf
    mask[0, 23] = mask[1, 24] = mask[2, 23] = mask[2, 25] = 0.0
    outs = {}
    for n in (1, 2, 3):
        threads(n)
        cache = fwd.new_cache()
        got = [fwd.forward(cache, ids[:19])[0], fwd.forward(cache, ids[19:20])[0], fwd.forward(cache, ids[20:23])[0]]
        got.append(fwd.forward(cache, ids[:3], positions=torch.tensor([23, 23, 24]), mask=mask)[0])
        outs[n] = got
    for n in (2, 3):
        assert all(torch.equal(a, b) for a, b in zip(outs[1], outs[n])), n


@needs_kernel
@pytest.mark.parametrize("layout", ["rows", "panels", "tiles"])
def test_llama_cs_numbers_are_the_same_bits_from_any_python_thread(layout, threads):
    """The app loads and computes on threads of its own, so several OpenMP teams share the CPUs and llama.c's steps
    meet at its own spinning barrier: calls from two Python threads, taking turns on 2 and on 3 OpenMP threads
    (more than this machine may have), give the bits one thread's calls give."""
    _, fwd = _llama(72)
    _read_as(fwd, layout)
    ids = torch.tensor([(7 * i) % 40 for i in range(23)])

    def run() -> list[torch.Tensor]:
        cache = fwd.new_cache()
        return [fwd.forward(cache, ids[:19])[0], fwd.forward(cache, ids[19:20])[0], fwd.forward(cache, ids[20:23])[0]]

    threads(1)
    want = run()
    with ThreadPoolExecutor(1) as other:
        for n in (2, 3):
            threads(n)
            for got in (run(), other.submit(run).result(), run(), other.submit(run).result()):
                assert all(torch.equal(a, b) for a, b in zip(want, got)), n


SMALL_TEAM = """
import ctypes, sys
import torch
sys.path[:0] = [{tests!r}, {root!r}]
from conftest import make_model
from specviz.host import cpus
from specviz.native import forward as lean, panels as lean_panels
assert ctypes.CDLL("libgomp.so.1").omp_get_thread_limit() == 1  # every parallel region gets a team of one
cpus._most = None  # the count as set
fwd = lean.LeanLlama(make_model(40, seed=72, layers=2, hidden=288), "kernel")
ids = torch.tensor([(7 * i) % 40 for i in range(23)])
for panels in (False, True):
    lean_panels.use(fwd, panels)
    outs = []
    for n in (1, 3):
        torch.set_num_threads(n)
        cache = fwd.new_cache()
        outs.append([fwd.forward(cache, ids[:19])[0], fwd.forward(cache, ids[19:23])[0]])
    assert all(torch.equal(a, b) for a, b in zip(*outs)), panels
print("same bits")
"""


@needs_kernel
def test_a_team_smaller_than_the_threads_asked_for_still_computes_every_column():
    """llama.c sets out every product's work as one share per thread asked for, and a thread through its own share
    takes what is left of the others': where OpenMP gives fewer threads (OMP_THREAD_LIMIT, a nested region), the
    threads that came compute the missing ones' shares too, and the bits are one thread's."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    code = SMALL_TEAM.format(tests=str(tests), root=str(tests.parent))
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "same bits" in done.stdout, done.stderr[-2000:]


@pytest.mark.full  # minutes on two cores: the full tier
@pytest.mark.parametrize("forward", FORWARDS[:2])
def test_on_two_threads_greedy_spec_equals_plain_and_sampled_runs_draw_what_one_thread_draws(
    pair_with, small_vocab_pair, forward, threads
):
    p, q = pair_with(forward)
    for n in (2, 1):
        threads(n)
        for gamma, prompt in itertools.product((1, 4), PROMPTS):
            ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=24)
            assert generate(prompt, target=p, draft=q, gamma=gamma, max_new_tokens=24).token_ids == ar.token_ids
    runs = {}
    for n in (1, 2):
        threads(n)
        runs[n] = [
            generate(pr, target=p, draft=q, gamma=3, temperature=1.0, seed=7, max_new_tokens=24) for pr in PROMPTS
        ]
    assert [r.token_ids for r in runs[1]] == [r.token_ids for r in runs[2]]
    assert [r.stats["accepted"] for r in runs[1]] == [r.stats["accepted"] for r in runs[2]]
    p, q = pair_with(forward, pair=small_vocab_pair)
    threads(2)
    ids, N = [1, 5, 6], 3000  # the chi-square test of test_engine.py, on two threads
    counts, _ = two_token_counts(p, q, ids, N, gamma=1)
    assert chi2_z(counts, exact_two_token_law(p, ids), N) < 4.0


@pytest.mark.parametrize("forward", FORWARDS[:2])
def test_a_thread_count_that_changes_between_calls_changes_no_token(pair_with, forward, threads, monkeypatch):
    """cpus.threads may give fewer threads from one call to the next (a busy neighbour): greedy speculative
    output still equals plain decoding's, and the same seed draws the same tokens."""
    p, q = pair_with(forward)
    threads(2)
    plain = [generate(pr, target=p, draft=q, mode="ar", max_new_tokens=24).token_ids for pr in PROMPTS]
    sampled = [generate(pr, target=p, draft=q, temperature=1.0, seed=3, max_new_tokens=24).token_ids for pr in PROMPTS]
    calls = itertools.count()
    counts = []
    monkeypatch.setattr(cpus, "threads", lambda: counts.append(1 + next(calls) % 2) or counts[-1])
    assert [generate(pr, target=p, draft=q, gamma=3, max_new_tokens=24).token_ids for pr in PROMPTS] == plain
    assert [
        generate(pr, target=p, draft=q, temperature=1.0, seed=3, max_new_tokens=24).token_ids for pr in PROMPTS
    ] == sampled
    assert counts.count(1) > 20 and counts.count(2) > 20


# every forward; the draft on int8 weights; and on int8 weights and activations (lean_panels.with_act8)
DRAFT_WAYS = [(f, "0", "0") for f in FORWARDS] + [(f, "1", "0") for f in FORWARDS[:2]] + [("llama.c", "1", "1")]


@pytest.mark.parametrize("forward,int8,act8", DRAFT_WAYS)
def test_greedy_spec_equals_greedy_plain_on_every_forward(pair_with, forward, int8, act8):
    p, q = pair_with(forward, half="1", int8=int8, act8=act8)
    assert q.lean is None or q.lean.is_act8 is (act8 == "1")
    rejections = 0
    for gamma, prompt in itertools.product((1, 3, 7), PROMPTS):
        ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=40)
        sp = generate(prompt, target=p, draft=q, mode="spec", gamma=gamma, max_new_tokens=40)
        assert sp.token_ids == ar.token_ids, (gamma, prompt)
        rejections += sp.stats["drafted"] - sp.stats["accepted"]
    assert rejections > 0  # rollbacks were exercised


@pytest.mark.parametrize("forward", FORWARDS)
def test_greedy_trees_equal_greedy_plain_on_every_forward(pair_with, forward):
    p, q = pair_with(forward)
    branched = 0
    for tree, prompt in itertools.product((5, 16), PROMPTS):
        ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=32)
        sp = generate(prompt, target=p, draft=q, gamma=3, tree=tree, max_new_tokens=32)
        assert sp.token_ids == ar.token_ids, (tree, prompt)
        branched += sp.stats["target_calls"]
    assert branched > 0


def test_every_forward_writes_the_same_greedy_text(pair_with):
    """Whichever forward runs, a visitor sees the same tokens (they differ by float32 rounding only)."""
    outs = {}
    for forward in FORWARDS:
        if forward.startswith("llama.c") and native.library() is None or forward == TILES and not native.amx():
            continue
        p, q = pair_with(forward)
        outs[forward] = [generate(pr, target=p, draft=q, max_new_tokens=40).token_ids for pr in PROMPTS]
    assert len(set(map(str, outs.values()))) == 1, outs


@pytest.mark.parametrize("forward,int8,act8", DRAFT_WAYS)
def test_sampled_spec_follows_the_target_distribution_on_every_forward(
    pair_with, small_vocab_pair, forward, int8, act8
):
    """The chi-square test of tests/test_engine.py (first two tokens, vocabulary 8, gamma 1), per forward, and
    with a draft on int8 weights, and on int8 activations too (its q is what it drew from, so the law is the
    target's still)."""
    p, q = pair_with(forward, pair=small_vocab_pair, half="1", int8=int8, act8=act8)
    assert q.lean is None or q.lean.is_act8 is (act8 == "1")
    ids, N = [1, 5, 6], 3000
    counts, _ = two_token_counts(p, q, ids, N, gamma=1)
    assert chi2_z(counts, exact_two_token_law(p, ids), N) < 4.0


def test_models_the_lean_forward_does_not_fit_run_on_transformers_with_the_reason(tiny_pair, monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    base = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    assert lean.why_not(LlamaForCausalLM(LlamaConfig(**base))) is None
    biased = LlamaForCausalLM(LlamaConfig(**base, attention_bias=True))
    assert "biases" in lean.why_not(biased) and lean.build(biased, "torch") is None
    dynamic = LlamaForCausalLM(LlamaConfig(**base, rope_parameters={"rope_type": "dynamic", "factor": 2.0}))
    assert "RoPE" in lean.why_not(dynamic)
    assert "float32 or float16" in lean.why_not(LlamaForCausalLM(LlamaConfig(**base)).to(torch.bfloat16))
    monkeypatch.setenv("SPECVIZ_FORWARD", "transformers")
    assert lean.build(LlamaForCausalLM(LlamaConfig(**base)), "torch") is None


def test_a_model_on_the_lean_forward_still_runs_through_transformers(pair_with):
    """The fused weights are the model's own tensors (views): transformers' forward reads the same numbers and
    nothing is held twice."""
    p, _ = pair_with("PyTorch ops")
    attn = p.model.model.layers[0].self_attn
    fused = p.lean.layers[0][1]
    assert attn.q_proj.weight.data_ptr() == fused.data_ptr()
    assert attn.k_proj.weight.data_ptr() == fused[attn.q_proj.weight.shape[0] :].data_ptr()
    ids = [5, 9, 12, 30, 7]
    plain = dataclasses.replace(p, lean=None)
    for lm in (p, plain):
        run = CachedModel(lm, lm.vocab_size)
        torch.testing.assert_close(run.feed(torch.tensor(ids)), _reference(p, ids), atol=2e-4, rtol=1e-4)
    assert "specviz forward" in pair_backend(p, p) and "transformers forward" in backend(plain)


@needs_kernel
@pytest.mark.parametrize("isa", ["AVX-512", "AVX2"])
@pytest.mark.parametrize("layout", ["rows", "panels"])
def test_int8_weights_compute_the_scaled_product_and_a_row_gets_the_same_bits_in_any_call(isa, layout):
    if native.use_isa(isa) != isa:
        native.use_isa(None)
        pytest.skip(f"this CPU has no {isa}")
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randint(-127, 128, (67, 131), generator=g, dtype=torch.int8)  # K not a multiple of a vector
        scale = torch.rand(67, generator=g) / 100
        x = torch.randn(8, 131, generator=g)
        stored = native.pack(w) if layout == "panels" else w  # 67 columns: the last panel partial
        rows = [native.few_rows(x[m : m + 1].contiguous(), stored, scale, 67) for m in range(8)]
        for M in range(1, 9):
            y = native.few_rows(x[:M].contiguous(), stored, scale, 67)
            torch.testing.assert_close(y, (x[:M] @ w.float().t()) * scale, atol=1e-4, rtol=1e-4)
            assert torch.equal(y, torch.cat(rows[:M]))
    finally:
        native.use_isa(None)


def test_an_int8_draft_guesses_like_its_float_self_and_the_target_keeps_its_weights(pair_with):
    p, q = pair_with("llama.c", int8="1")
    assert q.lean.is_int8 and q.lean is q.lean.int8() and "int8 weights" in backend(q)
    assert "draft int8" in pair_dtypes(p, q) and not p.lean.is_int8
    ids = [5, 9, 12, 30, 7, 8]
    got = CachedModel(q, q.vocab_size).feed(torch.tensor(ids))
    ref = _reference(q, ids)  # transformers' forward on the draft's own float weights
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8  # int8 rounding moves a few near-ties only
    torch.testing.assert_close(torch.softmax(got, -1), torch.softmax(ref, -1), atol=0.05, rtol=0)


@pytest.mark.parametrize(
    "draws,chosen,timed",
    [
        ([(2.2e-3, 1.6e-3)], True, 1),  # clearly faster: one draw
        ([(1.0e-3, 1.1e-3)], False, 1),  # clearly not
        ([(1.0e-3, 0.97e-3), (1.0e-3, 0.60e-3)], True, 2),  # too close to call: a second draw, the best of both
        ([(1.0e-3, 0.97e-3), (0.8e-3, 0.79e-3)], False, 2),
        ([(1.0e-3, 0.86e-3), (0.9e-3, 0.80e-3)], True, 2),  # a Zen 1's share, inside 0.95: int8 (it guesses alike)
        ([(1.0e-3, 0.80e-3)], True, 1),
    ],
)
def test_auto_gives_the_draft_int8_weights_only_where_a_cold_step_is_faster(
    pair_with, monkeypatch, draws, chosen, timed
):
    p, q = pair_with("PyTorch ops")  # any loaded pair: the choice below reads fake timings
    calls = []

    def fake(target, drafts):
        calls.append(len(drafts))
        return list(draws[min(len(calls), len(draws)) - 1])

    monkeypatch.setattr(lean_draft, "_cold_steps", fake)
    monkeypatch.setattr(lean_draft, "INT8_MIN_BYTES", 0)  # the tiny draft's weights would stay in cache: never timed
    monkeypatch.setenv("SPECVIZ_DRAFT_INT8", "auto")
    draft = lean.LeanLlama(q.model, "kernel")
    if draft.lib is None:
        pytest.skip("no C compiler or no AVX2 here")
    assert lean_draft.draft_forward(p.lean, draft).is_int8 is chosen and len(calls) == timed
    assert lean_draft.draft_forward(None, lean.LeanLlama(q.model, "kernel")).is_int8 is False  # no target to time with
    monkeypatch.setattr(lean_draft, "INT8_MIN_BYTES", 4 << 20)
    assert lean_draft.draft_forward(p.lean, lean.LeanLlama(q.model, "kernel")).is_int8 is False  # too small to matter
    monkeypatch.setenv("SPECVIZ_DRAFT_INT8", "0")
    assert lean_draft.draft_forward(p.lean, lean.LeanLlama(q.model, "kernel")).is_int8 is False
    monkeypatch.setenv("SPECVIZ_DRAFT_INT8", "1")
    assert lean_draft.draft_forward(p.lean, lean.LeanLlama(q.model, "kernel")).is_int8 is True


def test_an_int8_activation_draft_guesses_nearly_as_its_int8_self(pair_with):
    """A draft whose products take int8 activations (lean_panels.with_act8) computes other numbers than its int8
    weights alone do, and close ones: its guesses, not the output (greedy and sampled exactness: the two tests above,
    DRAFT_WAYS)."""
    p, q = pair_with("llama.c", int8="1", act8="1")
    assert q.lean.is_act8 and q.lean.is_int8 and "int8 weights and activations" in backend(q)
    assert "draft int8 with int8 activations" in pair_dtypes(p, q) and not p.lean.is_int8
    assert q.lean.packed and all(t.dim() == 4 for t in q.lean.packed.values())  # native.pack8's panels, every weight
    ids = [5, 9, 12, 30, 7, 8, 40, 41, 3, 17]
    got = CachedModel(q, q.vocab_size).feed(torch.tensor(ids))
    plain8 = lean_panels.copy_with(q.lean, False)  # the same int8 weights by rows, float activations
    assert not plain8.is_act8 and plain8.engine == "llama.c, int8 weights" and not plain8.packed
    panels = lean_panels.copy_with(q.lean, True)  # in panels: the float-activation kind
    assert panels.packed and all(t.dim() == 3 for t in panels.packed.values()) and not panels.is_act8
    want = plain8.forward(plain8.new_cache(), torch.tensor(ids))[0]
    assert not torch.equal(got, want)  # another path: integer products
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.8
    torch.testing.assert_close(torch.softmax(got, -1), torch.softmax(want, -1), atol=0.05, rtol=0)


@pytest.mark.parametrize(
    "draws,chosen,timed",
    [
        ([(1.0e-3, 0.80e-3)], True, 1),  # clearly faster: one draw
        ([(1.0e-3, 1.10e-3)], False, 1),  # slower
        ([(1.0e-3, 0.97e-3), (1.0e-3, 0.70e-3)], True, 2),  # too close to call: the best of two draws
        ([(1.0e-3, 0.97e-3), (0.9e-3, 0.96e-3)], False, 2),
    ],
)
def test_auto_gives_an_int8_draft_int8_activations_only_where_its_cold_step_is_faster(
    pair_with, monkeypatch, draws, chosen, timed
):
    p, q = pair_with("llama.c")
    calls = []

    def fake(target, drafts):
        calls.append([d.is_act8 for d in drafts])
        return list(draws[len(calls) - 1])

    monkeypatch.setattr(lean_draft, "_cold_steps", fake)
    monkeypatch.setattr(lean_draft, "INT8_MIN_BYTES", 0)
    monkeypatch.setenv("SPECVIZ_DRAFT_INT8", "1")  # int8 forced: only the activations are timed
    monkeypatch.setenv("SPECVIZ_DRAFT_ACT8", "auto")
    draft = lean.LeanLlama(q.model, "kernel")
    fwd = lean_draft.draft_forward(p.lean, draft)
    assert fwd.is_int8 and fwd.is_act8 is chosen and len(calls) == timed and calls[0] == [False, True]
    assert ("int8 weights and activations" in fwd.engine) is chosen
    assert lean_draft.draft_forward(lean.LeanLlama(p.model, "kernel"), draft) is fwd and len(calls) == timed  # once
    monkeypatch.setenv("SPECVIZ_DRAFT_ACT8", "0")
    assert lean_draft.draft_forward(p.lean, draft) is draft.int8() and not draft.int8().is_act8
    monkeypatch.setenv("SPECVIZ_DRAFT_ACT8", "1")
    assert lean_draft.draft_forward(p.lean, draft).is_act8 and len(calls) == timed
    monkeypatch.setenv("SPECVIZ_DRAFT_ACT8", "auto")
    monkeypatch.setattr(lean_draft, "INT8_MIN_BYTES", 4 << 20)
    small = lean.LeanLlama(q.model, "kernel")  # a tiny draft: never timed, int8 weights alone
    assert not lean_draft.draft_forward(p.lean, small).is_act8 and len(calls) == timed
    monkeypatch.setenv("SPECVIZ_DRAFT_INT8", "0")
    assert not lean_draft.draft_forward(p.lean, lean.LeanLlama(q.model, "kernel")).is_int8  # float: none at all


@pytest.mark.parametrize(
    "int8_s,act8_s,int8,act8",
    [
        (0.99e-3, 0.80e-3, True, True),  # int8 weights alone within 5 % of float, with int8 activations clearly faster
        (0.80e-3, 0.99e-3, True, False),  # int8 weights clearly faster, their activations no help
        (0.99e-3, 0.98e-3, False, False),  # neither form clearly faster: the float draft
    ],
)
def test_auto_weighs_an_int8_drafts_int8_activations_against_the_float_draft_in_one_draw(
    pair_with, monkeypatch, int8_s, act8_s, int8, act8
):
    """The int8 draft's fastest form is weighed against the float draft, not its int8 weights alone first."""
    p, q = pair_with("llama.c")
    calls = []

    def fake(target, drafts):
        calls.append([(d.is_int8, d.is_act8) for d in drafts])
        return [act8_s if d.is_act8 else int8_s if d.is_int8 else 1.0e-3 for d in drafts]

    monkeypatch.setattr(lean_draft, "_cold_steps", fake)
    monkeypatch.setattr(lean_draft, "INT8_MIN_BYTES", 0)
    monkeypatch.setenv("SPECVIZ_DRAFT_INT8", "auto")
    monkeypatch.setenv("SPECVIZ_DRAFT_ACT8", "auto")
    fwd = lean_draft.draft_forward(p.lean, lean.LeanLlama(q.model, "kernel"))
    assert fwd.is_int8 is int8 and bool(fwd.is_act8) is act8
    assert calls[0][0] == (False, False) and calls[0][-1] == (True, True)  # float first, int8 activations last
    assert all(kinds == calls[0] for kinds in calls)  # a second draw (too close to call) times the same forms


@pytest.mark.parametrize(
    "rows_s,panels_s,chosen",
    [
        ((1.0, 1.0), (0.80, 0.85), True),  # clearly faster for a step and a verify
        ((1.0, 1.0), (1.02, 0.85), True),  # a step a little slower, a verify clearly faster (a Zen 5)
        ((1.0, 1.0), (0.84, 1.02), True),  # a step clearly faster, a verify a little slower (a Zen 3's noise)
        ((1.0, 1.2), (0.95, 1.22), True),  # together 2.17 against 2.2: 0.986, inside PANELS_SUM_MARGIN
        ((1.0, 1.0), (0.99, 1.00), False),  # together 0.995: no clear gain for a copy of the weights: rows
        ((1.0, 1.0), (1.07, 0.80), False),  # together faster, but a step clearly slower: rows
        ((1.0, 1.0), (0.80, 1.07), False),  # together faster, but a verify clearly slower: rows
        ((1.0, 1.0), (1.20, 1.20), False),  # slower
        ((1.0, 1.0), (0.93, 1.09), False),  # a faster step, a slower verify (a Zen 1): rows
    ],
)
def test_auto_reads_a_models_weights_in_panels_only_where_a_step_and_a_verify_were_timed_clearly_faster(
    pair_with, monkeypatch, rows_s, panels_s, chosen
):
    p, q = pair_with("llama.c")
    timed = []

    def fake(mats, rows=(1, 4)):
        timed.append(mats)
        return rows_s, panels_s

    monkeypatch.setattr(lean_panels, "time_layouts", fake)
    monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", "auto")
    fwd = lean.LeanLlama(p.model, "kernel")
    assert bool(fwd.packed) is chosen and ("weights in panels" in fwd.engine) is chosen
    together = sum(panels_s) / sum(rows_s)  # within CLOSE of the margin: too close to call, drawn twice
    assert len(timed) == (2 if abs(together - lean_panels.PANELS_SUM_MARGIN) <= lean_panels.CLOSE else 1)
    mats = timed[0]  # timed on this model's own weights: every product, the output layer last
    assert all([w.data_ptr() for w, _, _ in m] == [w.data_ptr() for w, _, _ in mats] for m in timed)
    assert [w.data_ptr() for w, _, _ in mats] == [w.data_ptr() for w in fwd.weights()]
    assert all(torch.equal(packed, native.pack(w)) for w, packed, _ in mats)
    assert fwd.copied_bytes == (fwd.weight_bytes if chosen else 0)  # the panels are a copy, counted
    drawn = len(timed)
    for forced in ("panels", "rows"):  # forced: never timed
        monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", forced)
        assert bool(lean.LeanLlama(p.model, "kernel").packed) is (forced == "panels") and len(timed) == drawn


@pytest.mark.parametrize(
    "draws, chosen",
    [
        ([((1.0, 1.0), (0.99, 1.00)), ((1.0, 1.0), (0.55, 0.80))], True),  # level, then clear: the best of both
        ([((1.0, 1.0), (0.99, 1.00)), ((0.9, 0.9), (1.0, 1.0))], False),  # level, then rows faster: rows
        ([((1.0, 1.0), (0.95, 0.97)), ((1.0, 1.0), (1.2, 1.2))], True),  # 0.96, close: the best of each is panels'
        ([((1.0, 1.0), (0.60, 0.80))], True),  # clear: one draw
        ([((1.0, 1.0), (1.40, 1.40))], False),
    ],
)
def test_a_layout_timed_too_close_to_call_gets_a_second_draw(monkeypatch, draws, chosen):
    """On the Zen 4 without AVX-512 one app load timed both layouts level (0.99, 1.00) and kept the target by rows."""
    left = list(draws)
    monkeypatch.setattr(lean_panels, "time_layouts", lambda mats, rows=(1, 4): left.pop(0))
    monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", "auto")
    assert lean_panels.panels_pay([]) is chosen and left == []


@pytest.mark.parametrize(
    "draws,int8,panels",
    [
        ([(2.2e-3, 1.0e-3, 0.80e-3)], True, True),  # int8 pays; in panels clearly faster
        ([(2.2e-3, 1.0e-3, 0.99e-3)], True, False),  # int8 pays; panels inside the margin: rows
        ([(2.2e-3, 2.1e-3, 1.6e-3)], True, True),  # int8 pays only in panels
        ([(1.0e-3, 1.10e-3, 1.20e-3)], False, False),  # int8 pays in neither layout
    ],
)
def test_an_int8_drafts_layout_is_chosen_by_its_step_right_after_a_target_step(
    pair_with, monkeypatch, draws, int8, panels
):
    """Timed warm a draft's weights stay in the caches; a round reads them after the target's verify: the int8
    draft is timed by rows and in panels against the float draft that way (lean_draft._cold_steps, one call), and
    takes the faster layout, before anyone runs it."""
    p, q = pair_with("llama.c")
    calls = []

    def fake(target, drafts):
        calls.append([(d.is_int8, bool(d.packed)) for d in drafts])
        return list(draws[len(calls) - 1]) if len(calls) <= len(draws) else [2.2e-3, 1.0e-3]

    monkeypatch.setattr(lean_draft, "_cold_steps", fake)
    monkeypatch.setattr(lean_draft, "INT8_MIN_BYTES", 0)
    monkeypatch.setattr(lean_panels, "time_layouts", lambda mats, rows=(1, 4): ((1.0, 1.0), (2.0, 2.0)))  # warm: rows
    monkeypatch.setenv("SPECVIZ_DRAFT_INT8", "auto")
    monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", "auto")
    draft = lean.LeanLlama(q.model, "kernel")
    fwd = lean_draft.draft_forward(p.lean, draft)
    assert calls == [[(False, False), (True, False), (True, True)]]  # the float draft; int8 by rows, in panels
    assert fwd.is_int8 is int8 and bool(fwd.packed) is panels and ("weights in panels" in fwd.engine) is panels
    if int8:  # paired with another target: int8 timed again, its layout not (a run may be using it)
        assert lean_draft.draft_forward(lean.LeanLlama(p.model, "kernel"), draft) is fwd
        assert calls[1] == [(False, False), (True, panels)] and bool(fwd.packed) is panels
    ids = torch.tensor([5, 9, 12, 30, 7])
    both = [lean_panels.copy_with(fwd, on).forward(fwd.new_cache(), ids)[0] for on in (False, True)]
    torch.testing.assert_close(both[0], both[1], atol=1e-5, rtol=1e-5)  # the same draft either way


@pytest.mark.parametrize("forward,int8", [*itertools.product(FORWARDS[:2], "01"), ("PyTorch ops", "0")])
def test_a_draft_computes_only_the_rows_it_may_propose_and_the_output_stays_the_targets(
    pair_with, tiny_pair, small_vocab_pair, tmp_path, forward, int8
):
    """A draft that never proposes most of its rows (the built-in draft: all but 8,000 of 21,513) leaves them out
    of its output layer: the rows it computes hold its full layer's numbers, the others -inf, in a step and in a
    call of several tokens; greedy speculative output equals plain, and sampling follows the target's law."""
    blocked = [r for r in range(64) if r % 4]  # 48 of 64 rows
    p, q = pair_with(forward, pair=blocking_pair(tiny_pair, tmp_path / "d64", blocked), int8=int8)
    assert q.lean.kept.tolist() == list(range(0, 64, 4)) and q.lean.head.shape == (16, q.lean.H)
    params = sum(t.numel() * t.element_size() for t in [*q.model.parameters(), *q.model.buffers()])
    copies = 16 * q.lean.H * 4  # the kept rows in float32; the int8 forward's weights and scales on top
    copies += q.lean.weight_bytes + sum(t.numel() * 4 for t in q.lean.scales.values()) if q.lean.is_int8 else 0
    if "panels" in forward:  # a copy of every weight in panels: the float forward's, and the int8 one's
        assert (
            q.lean.packed and sum(t.numel() * t.element_size() for t in q.lean.packed.values()) == q.lean.weight_bytes
        )
        copies += q.lean.weight_bytes * (5 if q.lean.is_int8 else 1)
    assert q.memory_bytes == params + copies
    full = lean.LeanLlama(q.model, q.lean.path)  # the same draft computing every row
    full = full.int8() if q.lean.is_int8 else full
    ids = torch.tensor([5, 9, 12, 30, 7, 8, 40, 41])
    mine, ref = q.lean.new_cache(), full.new_cache()
    for part in (ids[:5], ids[5:6], ids[6:]):  # a prefill, a step, a call of two
        got, want = q.lean.forward(mine, part)[0], full.forward(ref, part)[0]
        assert got.shape == want.shape == (len(part), 64)
        assert torch.equal(got[:, ::4], want[:, ::4]) and bool(got[:, blocked].eq(-torch.inf).all())
    rejections = 0
    for gamma, prompt in itertools.product((1, 3), PROMPTS):
        ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=32)
        sp = generate(prompt, target=p, draft=q, mode="spec", gamma=gamma, max_new_tokens=32)
        assert sp.token_ids == ar.token_ids, (gamma, prompt)
        rejections += sp.stats["drafted"] - sp.stats["accepted"]
    assert rejections > 0
    p, q = pair_with(forward, pair=blocking_pair(small_vocab_pair, tmp_path / "d8", [1, 4, 6]), int8=int8)
    assert q.lean.kept.tolist() == [0, 2, 3, 5, 7]  # 5 of 8 rows: under SKIP_ROWS_BELOW
    ids, N = [1, 5, 6], 3000
    counts, _ = two_token_counts(p, q, ids, N, gamma=1)
    assert chi2_z(counts, exact_two_token_law(p, ids), N) < 4.0


@pytest.mark.parametrize("forward,int8", [("llama.c", "0"), ("llama.c, weights in panels", "1"), ("PyTorch ops", "0")])
def test_a_drafts_greedy_step_over_the_rows_it_computes_proposes_what_its_whole_vocabulary_would(
    pair_with, tiny_pair, tmp_path, monkeypatch, forward, int8
):
    """next_greedy takes a draft's argmax over the rows its output layer computes and maps it through `kept`, where
    the rows it never proposes used to be scattered in as -inf first (what `feed`'s V-wide row still does): the same
    token at every step; and a speculative run's greedy output is plain decoding's."""
    from specviz import sampling

    blocked = [r for r in range(64) if r % 4]
    p, q = pair_with(forward, pair=blocking_pair(tiny_pair, tmp_path / "d64", blocked), int8=int8)
    assert q.lean.kept is not None
    scatters = []
    monkeypatch.setattr(lean, "scatter_rows", lambda *a: scatters.append(1) or sampling.scatter_rows(*a))
    prompt = torch.tensor([5, 9, 12, 30, 7, 8])
    feed = torch.randint(0, 64, (24,), generator=torch.Generator().manual_seed(0))
    tokens = {}
    for fast in (True, False):
        run, out = CachedModel(q, p.vocab_size), []
        run.prefill(prompt)  # every token but the last
        scatters.clear()
        for x in [prompt[-1:]] + list(feed.view(-1, 1)):  # each step fed a given token: many contexts
            out.append(int(run.next_greedy(x)) if fast else int(sampling.greedy(run.feed(x, last_only=True)[-1])))
        tokens[fast] = out
        assert bool(scatters) is not fast  # the fast way never builds the -inf rows
    assert tokens[True] == tokens[False] and set(tokens[True]) <= set(range(0, 64, 4))
    assert len(set(tokens[True])) > 2  # a real walk through the vocabulary, not one repeated row
    spec = [generate(pr, target=p, draft=q, mode="spec", gamma=3, max_new_tokens=32) for pr in PROMPTS]
    plain = [generate(pr, target=p, draft=q, mode="ar", max_new_tokens=32) for pr in PROMPTS]
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert sum(r.stats["accepted"] for r in spec) > 0


def test_a_draft_that_blocks_rows_grows_trees_over_the_rest(pair_with, tiny_pair, small_vocab_pair, tmp_path):
    """Token trees from such a draft: a read node's probabilities and top candidates come from the rows it may
    propose alone (drafters._Growth.read); greedy trees give plain decoding's tokens and sampled ones the target's
    law."""
    p, q = pair_with("llama.c", pair=blocking_pair(tiny_pair, tmp_path / "d64", [r for r in range(64) if r % 4]))
    assert q.proposable.tolist() == list(range(0, 64, 4))
    every = dataclasses.replace(q)  # the same draft reading all 64 columns (its blocked ones -inf)
    every.__dict__["proposable"] = None
    for prompt in PROMPTS:
        ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=24)
        sp = generate(prompt, target=p, draft=q, mode="spec", gamma=3, tree=5, max_new_tokens=24)
        ref = generate(prompt, target=p, draft=every, mode="spec", gamma=3, tree=5, max_new_tokens=24)
        assert sp.token_ids == ar.token_ids, prompt
        keys = ("drafted", "accepted", "target_calls")  # the same trees grown: the same candidates in each read
        assert [sp.stats[k] for k in keys] == [ref.stats[k] for k in keys] and sp.stats["accepted"] > 0, prompt
    p, q = pair_with("llama.c", pair=blocking_pair(small_vocab_pair, tmp_path / "d8", [1, 4, 6]))
    ids, N = [1, 5, 6], 3000
    counts, _ = two_token_counts(p, q, ids, N, gamma=2, tree=3)
    assert chi2_z(counts, exact_two_token_law(p, ids), N) < 4.0


def test_a_draft_that_blocks_few_rows_keeps_its_output_layer(tiny_pair, tmp_path, pair_with):
    _, q = pair_with("PyTorch ops", pair=blocking_pair(tiny_pair, tmp_path / "few", [0, 1, 2]))
    assert q.lean.kept is None and q.lean.head.shape[0] == 64  # 61 of 64 rows: a copy would save little
