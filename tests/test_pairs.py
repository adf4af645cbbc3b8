"""The pair check: the speedup formula, the tokenizer comparison, and verdicts on tiny local pairs."""

import json
import math

import pytest
import torch
from conftest import make_model, make_tokenizer, word_tokenizer
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

import specviz.pairs.check as pairs
import specviz.pairs.measure as pairs_measure
from specviz import SpecvizError, check_pair
from specviz.models.loaded import load_pair
from specviz.models.translate import compare_tokenizers
from specviz.pairs.check import expected_speedup, speedup_table

V = 64


def save(path, model, tok) -> str:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def deep_target(draft: LlamaForCausalLM, layers: int) -> LlamaForCausalLM:
    """The draft's function with `layers - 2` extra layers that add nothing (zero output projections).

    So the target computes exactly what the draft computes, only slower: c is well below 1 and, with a
    little noise on the draft's head, acceptance is high but not 1.
    """
    target = make_model(draft.config.vocab_size, seed=0, layers=layers)
    missing, _ = target.load_state_dict(draft.state_dict(), strict=False)
    assert all(".layers." in k for k in missing)
    with torch.no_grad():
        for layer in target.model.layers[draft.config.num_hidden_layers :]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return target.eval()


@pytest.fixture(scope="module")
def fast_pair(tmp_path_factory):
    """(target_dir, draft_dir): a 24-layer target and a 2-layer draft that agrees with it most of the time."""
    root = tmp_path_factory.mktemp("fast")
    draft = make_model(V, seed=0)
    target = deep_target(draft, layers=24)  # c around 0.1: far from the 1.05x line even on a busy machine
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        head = draft.lm_head.weight
        head.add_(0.1 * head.std() * torch.randn(head.shape, generator=g))
    tok = make_tokenizer(V, chat=True)
    return save(root / "target", target, tok), save(root / "draft", draft, tok)


def permuted_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Same tokens and specials as conftest's, but the characters in reverse order: ids mean other tokens."""
    base = make_tokenizer(vocab_size, chat=True)
    vocab = base.get_vocab()
    chars = [t for t, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i >= 5]
    new = {t: i for t, i in vocab.items() if i < 5}
    new.update({t: 5 + k for k, t in enumerate(reversed(chars))})
    fast = word_tokenizer(new)
    fast.chat_template = base.chat_template
    return fast


# --- the formula -----------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [1, 2, 4, 16])
@pytest.mark.parametrize("c", [0.0, 0.05, 0.5, 1.0])
def test_expected_speedup_at_the_extremes(gamma, c):
    assert expected_speedup(0.0, gamma, c) == pytest.approx(1 / (gamma * c + 1))  # one token per round
    assert expected_speedup(1.0, gamma, c) == pytest.approx((gamma + 1) / (gamma * c + 1))  # all accepted
    assert expected_speedup(1 - 1e-12, gamma, c) == pytest.approx((gamma + 1) / (gamma * c + 1))  # no 0/0


def test_expected_speedup_known_value_and_best_gamma():
    assert expected_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))  # 2.4011...
    assert expected_speedup(0.8, 4, 0.1) == pytest.approx(2.401142857)
    table = speedup_table(0.8, 0.1)
    assert len(table) == 16 and table[3] == expected_speedup(0.8, 4, 0.1)
    # by hand: gamma 5 -> 0.737856 / 0.30 = 2.4595, 6 -> 0.790285 / 0.32 = 2.4696, 7 -> 0.832228 / 0.34 = 2.4477
    assert max(range(16), key=table.__getitem__) + 1 == 6
    assert table[5] == pytest.approx(2.4696, abs=1e-4)
    assert speedup_table(0.3, 1.0) == tuple(sorted(speedup_table(0.3, 1.0), reverse=True))  # slow draft: less is more


@pytest.mark.parametrize(
    "a, gamma, c",
    [(1.5, 4, 0.1), (-0.1, 4, 0.1), (float("nan"), 4, 0.1), (0.5, 0, 0.1), (0.5, 2.5, 0.1), (0.5, 4, -1.0)]
    + [(0.5, 4, float("inf")), ("x", 4, 0.1), (0.5, True, 0.1)],
)
def test_expected_speedup_rejects_nonsense(a, gamma, c):
    with pytest.raises(SpecvizError):
        expected_speedup(a, gamma, c)


# --- tokenizers ------------------------------------------------------------------------------------


def test_compare_tokenizers_identical_superset_and_template():
    same = compare_tokenizers(make_tokenizer(V, True), make_tokenizer(V, True))
    assert (same.compared, same.mismatches, same.compatible, same.chat_template_same) == (V, 0, True, True)
    assert same.special_tokens == ()

    bigger = make_tokenizer(V, chat=False)
    bigger.add_tokens(["<extra>"])  # an added token past the end: ids of the smaller one still agree
    t = compare_tokenizers(make_tokenizer(V, True), bigger)
    assert (t.target_size, t.draft_size, t.compared, t.mismatches) == (V, V + 1, V, 0)
    assert t.compatible and not t.chat_template_same and t.target_has_chat_template and not t.draft_has_chat_template

    other = compare_tokenizers(make_tokenizer(V, True), permuted_tokenizer(V))
    assert not other.compatible and other.mismatch_fraction > 0.5
    i, p_tok, q_tok = other.examples[0]
    assert make_tokenizer(V, True).convert_ids_to_tokens(i) == p_tok != q_tok


def test_different_token_ids_with_the_same_strings_are_translated_and_measured(tiny_pair, tmp_path):
    """Other ids for the same tokens: once "incompatible", now the draft's guesses go through text (translate.py)."""
    draft = save(tmp_path / "draft", make_model(V, seed=3), permuted_tokenizer(V))
    rep = check_pair(tiny_pair[0], draft, device="cpu", max_new_tokens=8, prompts=["hello world"])
    assert rep.verdict in ("compatible", "not worth it") and rep.acceptance is not None
    assert not rep.tokenizer.compatible and rep.coverage == 1.0  # every token, under another id
    assert rep.translation.startswith("text:") and "translated through text" in rep.warnings[0]
    json.dumps(rep.to_dict())


def test_a_draft_that_cannot_write_the_target_s_text_is_incompatible_and_nothing_is_measured(
    tiny_pair, tmp_path, monkeypatch
):
    from cross_pair import useless_tokenizer

    draft = save(tmp_path / "draft", make_model(11, seed=3), useless_tokenizer())

    def boom(*a, **k):
        raise AssertionError("an incompatible pair must not be measured")

    monkeypatch.setattr(pairs, "forward_times", boom)
    monkeypatch.setattr(pairs_measure, "measure_acceptance", boom)
    rep = check_pair(tiny_pair[0], draft, device="cpu")
    assert rep.verdict == "incompatible"
    assert "cannot be translated" in rep.reasons[0] and "comes back as" in rep.reasons[0]
    assert rep.c is None and rep.acceptance is None and rep.speedups == () and rep.best_gamma is None
    assert rep.target_params > 0 and rep.draft_memory_bytes > 0  # the cheap facts are still there
    assert "INCOMPATIBLE" in rep.report()
    json.dumps(rep.to_dict())


# --- whole checks ----------------------------------------------------------------------------------


def test_identical_tokenizers_fast_draft_is_compatible_with_numbers(fast_pair):
    rep = check_pair(*fast_pair, device="cpu", max_new_tokens=16)
    assert rep.verdict == "compatible", rep.report()
    t = rep.tokenizer
    assert (t.compared, t.mismatches, t.chat_template_same) == (V, 0, True) and rep.warnings == ()
    assert rep.target_params > 3 * rep.draft_params and 0 < rep.param_ratio < 1
    q_bytes = 2 if rep.dtype == "float32, draft float16" else 4  # float16 where this CPU runs it faster
    assert rep.dtype in ("float32", "float32, draft float16")
    p, q = load_pair(*fast_pair, device="cpu", check_vocab=False)  # the models the check ran (cached)
    for n_params, mem, width, m in (
        (rep.target_params, rep.target_memory_bytes, 4, p),
        (rep.draft_params, rep.draft_memory_bytes, q_bytes, q),
    ):
        copies = m.lean.copied_bytes if m.lean is not None else 0  # e.g. panels where this CPU reads them faster
        held = n_params * width + copies
        assert held <= mem < held + 4096  # the weights, their copies, a few small buffers
    assert 0 < rep.c < 0.8, rep.report()
    assert rep.c == pytest.approx(rep.draft_step_s / rep.target_step_s)
    acc = rep.acceptance
    assert 0.5 < acc.a < 1 and acc.a == acc.accepted / acc.tested  # noisy head: mostly, not always, right
    assert acc.drafted >= acc.tested > acc.accepted > 0 and acc.new_tokens == rep.prompts * 16
    assert acc.low < acc.a < acc.high and {k.kind for k in acc.by_kind} == {"chat", "story", "code", "summarise"}
    assert sum(k.tested for k in acc.by_kind) == acc.tested
    assert rep.speedups == speedup_table(acc.a, rep.c)  # the textbook table: a verify costs one step
    assert len(rep.verify_costs) == len(rep.speedups_measured) == 8 and all(v > 0 for v in rep.verify_costs)
    # the loop's measured costs, in target steps (timings: only their signs and sanity are asserted; a plain step
    # read 0.62-0.69 of an isolated call on a loaded 2-core machine with the few-token kernel)
    assert 0 < rep.draft_cost < 1 and 0 <= rep.round_overhead < 5 and 0 < rep.plain_cost < 5, rep.report()
    assert acc.rounds == sum(acc.block_sizes) and acc.drafted == sum(k * n for k, n in enumerate(acc.block_sizes))
    assert 0 < acc.draft_s < acc.decode_s
    # acceptance per position: every judged guess counted once at its position, every kept one once
    assert sum(acc.position_reached) == acc.tested and sum(acc.position_kept) == acc.accepted
    assert len(acc.position_reached) <= 4 and acc.alphas(2) == acc.alphas(4)[:2] and len(acc.alphas(8)) == 8
    for g, (s, v) in enumerate(zip(rep.speedups_measured, rep.verify_costs), start=1):
        tokens = acc.tokens_per_round(g)  # 1 + the shares of rounds keeping each position
        assert tokens == pytest.approx(1 + sum(acc.kept_shares(g)))
        assert s == pytest.approx(tokens * rep.plain_cost / (g * rep.draft_cost + v + rep.round_overhead))
    assert rep.best_speedup == max(rep.speedups_measured) >= 1.05
    assert "compatible" in rep.reasons[0].lower() or "faster" in rep.reasons[0]

    d = json.loads(json.dumps(rep.to_dict()))
    assert d["verdict"] == "compatible" and d["c"] == rep.c and len(d["speedups"]) == 16
    assert d["speedups_measured"][rep.best_gamma - 1]["speedup"] == rep.best_speedup
    assert d["predicted_rounds"]["tokens_per_round"] == acc.tokens_per_round(rep.best_gamma)
    assert d["predicted_rounds"]["kept_by_position"] == acc.kept_shares(rep.best_gamma)
    text = rep.report()
    assert "COMPATIBLE" in text and f"c = {rep.c:.3f}" in text and f"a = {acc.a:.3f}" in text
    assert f"gamma {rep.best_gamma:2d}" in text and "<- best" in text
    # token trees, measured on the same machine: their tokens per call, nodes, costs and the one-sentence advice
    assert [t.budget for t in rep.trees] == [4, 7]
    for t in rep.trees:
        assert 1 <= t.tokens_per_call <= t.nodes_per_call + 1 <= t.budget + 1 and t.verify_cost > 0
        assert t.speedup == pytest.approx(
            t.tokens_per_call * rep.plain_cost / (t.draft_cost + t.verify_cost + t.overhead)
        )
    best_tree = max(t.speedup for t in rep.trees)
    pays = best_tree >= 1.03 * rep.best_speedup
    assert rep.tree_advice.startswith("Token trees pay" if pays else "Token trees do not pay"), rep.tree_advice
    assert rep.tree_advice in rep.reasons and "tree  7" in text


def test_padded_embedding_with_the_same_tokenizer_is_compatible(fast_pair, tmp_path):
    """Like Qwen2.5 0.5B (151936 rows) vs 1.5B (152064): the output layer is padded, the tokenizer identical."""
    target = LlamaForCausalLM.from_pretrained(fast_pair[0])
    target.resize_token_embeddings(V + 16)
    with torch.no_grad():  # the padding rows are never the answer (as in a trained model)
        target.lm_head.weight[V:] = 0.0
    path = save(tmp_path / "padded", target, make_tokenizer(V, chat=True))
    rep = check_pair(path, fast_pair[1], device="cpu", max_new_tokens=12)
    assert (rep.target_vocab_rows, rep.draft_vocab_rows) == (V + 16, V)
    assert rep.tokenizer.mismatches == 0
    assert rep.verdict == "compatible", rep.report()


def test_trimmed_vocabulary_draft_is_compatible(fast_pair, tmp_path):
    """A draft whose output layer keeps only some target ids (specviz_vocab.json) but shares the tokenizer;
    it also lacks the chat template, which is a warning, not a reason to refuse."""
    full = LlamaForCausalLM.from_pretrained(fast_pair[1])
    keep = list(range(53))  # specials and characters; the filler tokens are dropped
    draft = make_model(len(keep), seed=0)
    sd = full.state_dict()
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"][keep]
    sd["lm_head.weight"] = sd["lm_head.weight"][keep]
    draft.load_state_dict(sd)
    path = save(tmp_path / "trimmed", draft, make_tokenizer(V, chat=False))
    (tmp_path / "trimmed" / "specviz_vocab.json").write_text(json.dumps({"target_ids": keep}))
    rep = check_pair(fast_pair[0], path, device="cpu", max_new_tokens=12)
    assert rep.draft_trimmed and rep.draft_vocab_rows == len(keep)
    assert rep.tokenizer.mismatches == 0 and rep.acceptance.a > 0.5
    assert rep.verdict == "compatible", rep.report()
    assert any("chat template" in w for w in rep.warnings)


def test_slow_draft_with_low_acceptance_is_not_worth_it(tiny_pair, tmp_path):
    # 8 layers 512 wide against 2 layers 32 wide: 150x the weights. With equal widths, 6 layers against 2 read
    # c = 0.33 on a Xeon with AVX512-FP16 (float16 draft in panels: a tiny forward's cost is its fixed part)
    slow = make_model(V, seed=7, layers=8, hidden=512)
    draft = save(tmp_path / "slow", slow, make_tokenizer(V, chat=True))
    rep = check_pair(tiny_pair[0], draft, device="cpu", max_new_tokens=12)
    assert rep.verdict == "not worth it", rep.report()
    assert rep.c > 1.0 and rep.best_speedup < 1.05, rep.report()
    assert any("too slow" in r and f"{rep.c:.2f}" in r for r in rep.reasons)
    if rep.acceptance.a < 0.5:
        assert any("too rarely" in r for r in rep.reasons)
    assert math.isclose(rep.best_speedup, max(rep.speedups_measured))


def test_bad_arguments_and_loading_errors_are_one_sentence(tiny_pair, tmp_path):
    with pytest.raises(SpecvizError, match="max_new_tokens"):
        check_pair("/no/such/target", "/no/such/draft", max_new_tokens=0)  # before any loading
    with pytest.raises(SpecvizError, match="prompts"):
        check_pair(*tiny_pair, prompts=["", "  "])
    with pytest.raises(SpecvizError, match="does not exist"):
        check_pair(str(tmp_path / "missing"), tiny_pair[1], device="cpu")
    with pytest.raises(SpecvizError, match="offline"):
        check_pair(tiny_pair[0], "nobody/no-such-draft", device="cpu")


def test_a_check_past_its_time_limit_stops_with_a_sentence(fast_pair):
    t, d = fast_pair
    with pytest.raises(SpecvizError, match="time limit"):
        check_pair(str(t), str(d), device="cpu", max_new_tokens=8, timeout_s=0)
    assert check_pair(str(t), str(d), device="cpu", max_new_tokens=8, timeout_s=600).verdict  # and the next works


def test_the_interval_covers_the_alpha_the_benchmark_measures(fast_pair):
    """The pair check's 95% interval for alpha, on its own prompts, holds the benchmark's alpha on the same prompts."""
    from specviz import load_pair
    from specviz.bench.measure import run_bench

    p, q = load_pair(*fast_pair, device="cpu")
    prompts = [x for v in pairs.SAMPLE_PROMPTS.values() for x in v]
    rep = check_pair(p, q, max_new_tokens=24)
    table = run_bench(p, q, prompts, [pairs_measure.CHECK_GAMMA], [0.0], max_new_tokens=24, hf=False)
    assert rep.acceptance.low <= table["alpha"].iloc[0] <= rep.acceptance.high


@pytest.mark.parametrize("gamma", [2, 5])
def test_the_predicted_tokens_per_call_match_the_benchmarks(fast_pair, gamma):
    """The time-free core of the pair check's prediction: its alpha, through 1 + a + ... + a^gamma, gives the
    tokens per target call that the benchmark then measures at that gamma on the same prompts (within 10%).
    At 32 tokens per prompt the last round, cut by the budget, alone makes gamma 5 miss by 10%."""
    from specviz import load_pair
    from specviz.bench.measure import run_bench
    from specviz.theory import expected_tokens

    p, q = load_pair(*fast_pair, device="cpu")
    prompts = [x for v in pairs.SAMPLE_PROMPTS.values() for x in v]
    rep = check_pair(p, q, max_new_tokens=96)
    table = run_bench(p, q, prompts, [gamma], [0.0], max_new_tokens=96, hf=False)  # long enough that the last,
    predicted, measured = expected_tokens(rep.a, gamma), table["tokens_per_call"].iloc[0]  # budget-cut round is minor
    assert abs(predicted / measured - 1) < 0.10, (gamma, rep.a, predicted, measured)


def test_the_lookup_drafter_costs_no_draft_calls(fast_pair):
    rep = check_pair(*fast_pair, device="cpu", max_new_tokens=12, drafter="lookup")
    assert rep.drafter == "lookup" and rep.c == 0 and "lookup drafter" in rep.report()


def test_predict_vs_bench_reports_the_checks_prediction_beside_the_benchmarks_measurement(fast_pair, capsys):
    """benchmarks/predict_vs_bench.py on the fast pair: the prediction is the check's own at the gamma it recommends,
    the benchmark's run at that gamma is exact, and tokens per call agree (time-free). How close the two speeds
    are is a measurement, not a test: BENCHMARKS.md has the runs."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "predict_vs_bench.py"
    spec = importlib.util.spec_from_file_location("predict_vs_bench", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = script.main(["--target", fast_pair[0], "--draft", fast_pair[1], "--max-new-tokens", "96"])
    assert json.loads(capsys.readouterr().out) == out
    assert out["identical"] is True and 1 <= out["gamma"] <= 8
    assert out["alpha_interval"][0] <= out["alpha_check"] <= out["alpha_interval"][1]
    assert abs(out["tokens_per_call_ratio"] - 1) < 0.10, out
    assert out["predicted_speedup"] > 0 and out["measured_speedup"] > 0
    assert out["speedup_ratio"] == pytest.approx(out["predicted_speedup"] / out["measured_speedup"])
    assert out["check_gamma"] == 4 and out["check_measured_speedup"] > 0 and out["check_predicted_speedup"] > 0
