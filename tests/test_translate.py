"""Drafts with another tokenizer (translate.py, drafters.TranslatingDrafter): exact greedy and sampled output,
prompts through each model's own chat template, what the pair check and the page say, and bad pairs."""

import itertools
import math

import pytest
import torch
from cross_pair import cross_pair, phi3_draft, save, train_lm, useless_tokenizer

from specviz import Round, SpecvizError, check_pair, generate, load_pair, stream
from specviz.api import encode_prompt
from specviz.drafters.model import TranslatingDrafter
from specviz.engine.loop import eos_ids, speculative_decode
from specviz.models.translate import shared_vocabulary, space_marker, translator
from specviz.request import RunRequest
from specviz.view.render import Pieces, round_html

PROMPTS = [
    "the red fox",
    "a small dog sees",
    "the old farmer helps the",
    "tell me about the river",
    "12 times",
    "The Quick Bird!",
]


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    return cross_pair(tmp_path_factory.mktemp("cross"))


@pytest.fixture(scope="module")
def pair(pair_dirs):
    return load_pair(*pair_dirs, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def phi3_pair(pair_dirs, tmp_path_factory):
    """The same target with a draft that speaks Phi-3's real tokenizer (tests/data/phi3_tokenizer)."""
    return load_pair(pair_dirs[0], phi3_draft(tmp_path_factory.mktemp("phi3")), device="cpu", dtype="float32")


@pytest.fixture(params=["trained ▁ tokenizer", pytest.param("Phi-3's tokenizer", marks=pytest.mark.full)])
def any_pair(request):
    """Each exactness test runs with both drafts: the tokenizer trained here and a real one with its quirks."""
    return request.getfixturevalue("pair" if request.param.startswith("trained") else "phi3_pair")


def test_the_two_tokenizers_really_differ(pair):
    p, q = pair
    assert (space_marker(p.tokenizer), space_marker(q.tokenizer)) == ("Ġ", "▁")
    assert len(p.tokenizer) != len(q.tokenizer) and p.tokenizer.eos_token != q.tokenizer.eos_token
    shared = shared_vocabulary(p.tokenizer, q.tokenizer, q.vocab_size)
    assert 0.5 < shared.draft_share < 1.0  # much shared ("Ġthe" is "▁the"), not everything
    the = p.tokenizer.convert_tokens_to_ids("Ġthe")
    assert q.tokenizer.convert_ids_to_tokens(int(shared.q_rows[shared.p_ids.tolist().index(the)])) == "▁the"


@pytest.mark.full  # trains a draft on Phi-3's tokenizer first: the full tier
def test_phi3_s_real_tokenizer_differs_as_real_pairs_do(phi3_pair):
    p, q = phi3_pair
    assert (space_marker(p.tokenizer), space_marker(q.tokenizer)) == ("Ġ", "▁") and len(q.tokenizer) == 32064
    assert q.tokenizer.tokenize("12 times") == ["▁", "1", "2", "▁times"]  # digits one by one, a dummy prefix
    shared = shared_vocabulary(p.tokenizer, q.tokenizer, q.vocab_size)
    assert shared.draft_share < 0.05  # a 32k general vocabulary against the target's 360 tokens: little in common
    mine = translator(p.tokenizer, q.tokenizer).draft_prompt(encode_prompt(p, "hello there"))
    # Phi-3's own template, as its tokenizer reads it: a ▁ after each special token (Llama 2's legacy way)
    assert q.tokenizer.convert_ids_to_tokens(mine) == [
        *["<s>", "<|user|>", "▁", "<0x0A>", "hello", "▁there"],
        *["<|end|>", "▁", "<0x0A>", "<|assistant|>", "▁", "<0x0A>"],
    ]


def test_each_model_reads_the_prompt_through_its_own_chat_template(pair):
    p, q = pair
    ids = encode_prompt(p, "hello there")
    assert p.tokenizer.decode(ids) == "<|user|>hello there</s><|assistant|>"
    mine = translator(p.tokenizer, q.tokenizer).draft_prompt(ids)
    assert q.tokenizer.decode(mine) == "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    raw = translator(p.tokenizer, q.tokenizer).draft_prompt(encode_prompt(p, "hello there", raw=True))
    assert q.tokenizer.decode(raw, skip_special_tokens=True) == "hello there"


def test_greedy_speculative_equals_greedy_plain_over_many_prompts_and_gammas(any_pair):
    p, q = any_pair
    accepted = rejected = 0
    for gamma, prompt, raw in itertools.product((1, 2, 4, 7), PROMPTS, (False, True)):
        ar = generate(prompt, target=p, mode="ar", max_new_tokens=32, raw=raw)
        sp = generate(prompt, target=p, draft=q, drafter="model", gamma=gamma, max_new_tokens=32, raw=raw)
        assert sp.token_ids == ar.token_ids, (gamma, prompt, raw)
        accepted += sp.stats["accepted"]
        rejected += sp.stats["drafted"] - sp.stats["accepted"]
    assert accepted > 100 and rejected > 100  # both the keep and the roll-back paths ran many times


def test_the_default_drafter_and_gamma_translate_too(any_pair):
    """lookup+model at gamma auto (the page's default): the auto policy times the draft on its own prompt ids."""
    p, q = any_pair
    for prompt in PROMPTS[:3]:
        ar = generate(prompt, target=p, mode="ar", max_new_tokens=40)
        sp = generate(prompt, target=p, draft=q, max_new_tokens=40)
        assert sp.token_ids == ar.token_ids, prompt


def _law(p, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact law of the first token and of the second (with one more outcome: no second token after EOS)."""
    V, eos = p.vocab_size, sorted(eos_ids(p))
    with torch.inference_mode():
        p1 = torch.softmax(p.model(torch.tensor([ids])).logits[0, -1].float(), -1)  # (V,)
        nxt = torch.tensor([ids + [a] for a in range(V)])
        p2 = torch.softmax(p.model(nxt).logits[:, -1].float(), -1)  # (V, V)
    go = p1.clone()
    go[eos] = 0
    return p1, torch.cat([go @ p2, p1[eos].sum().view(1)])


def _chi2_z(counts: torch.Tensor, law: torch.Tensor) -> float:
    N = float(counts.sum())
    keep = law * N >= 5
    chi2 = float((((counts[keep] - N * law[keep]) ** 2) / (N * law[keep])).sum())
    dof = int(keep.sum()) - 1
    return (chi2 - dof) / math.sqrt(2 * dof)


@pytest.mark.parametrize("method", ["intersection", "match"])
def test_sampled_output_follows_the_target_at_temperature_one(any_pair, method):
    """The first two tokens at T = 1, gamma 2: their laws against p's own, computed exactly (chi-square)."""
    p, q = any_pair
    ids = p.tokenizer("the red", add_special_tokens=False)["input_ids"]
    law1, law2 = _law(p, ids)
    V, N = p.vocab_size, 1500
    first, second = torch.zeros(V), torch.zeros(V + 1)
    accepted = 0
    for seed in range(N):
        cfg = RunRequest(drafter="model", gamma=2, tree="off", max_new_tokens=2, seed=seed, temperature=1.0).spec
        drafter = TranslatingDrafter(q, p, method=method)
        evs = list(speculative_decode(p, q, ids, cfg, drafter=drafter))
        assert evs[0].translation.startswith(method)  # the run says which way it sampled
        out = evs[-1].token_ids
        first[out[0]] += 1
        second[out[1] if len(out) > 1 else V] += 1
        accepted += sum(ev.n for ev in evs if isinstance(ev, Round))
    assert accepted > N // 10  # guesses were kept often: the test exercises acceptance, not only misses
    assert _chi2_z(first, law1) < 4.0 and _chi2_z(second, law2) < 4.0


def test_the_draft_s_end_of_turn_becomes_the_target_s(pair):
    p, q = pair
    ends = 0
    for prompt in PROMPTS:
        sp = list(
            speculative_decode(
                p,
                q,
                encode_prompt(p, prompt),
                RunRequest(drafter="model", gamma=4, tree="off", max_new_tokens=120).spec,
            )
        )
        rounds = [ev for ev in sp if isinstance(ev, Round)]
        ends += sum(p.tokenizer.eos_token_id in r.drafted for r in rounds)
        assert all(t < p.vocab_size for r in rounds for t in r.drafted)  # never one of the draft's own ids
    assert ends > 0  # the draft's <|im_end|> was guessed as the target's </s>


def test_hover_shows_the_draft_s_own_tokens(pair):
    p, q = pair
    evs = speculative_decode(
        p, q, encode_prompt(p, "the red fox"), RunRequest(drafter="model", gamma=4, tree="off", max_new_tokens=24).spec
    )
    rounds = [ev for ev in evs if isinstance(ev, Round) and ev.drafted]
    assert rounds and all(len(r.origins) == len(r.drafted) for r in rounds)
    assert any("▁" in o for r in rounds for o in r.origins)  # the draft's own ▁ tokens, not the target's Ġ ones
    page = round_html(Pieces(p.tokenizer), rounds[0], greedy=True)
    assert "translated from the draft&#x27;s own tokens: " in page


def test_the_pair_check_says_coverage_method_and_cost(pair):
    from specviz.ui.pair import report_html

    p, q = pair
    r = check_pair(p, q, max_new_tokens=16, prompts=["the red fox", "the old farmer helps the"])
    assert r.verdict in ("compatible", "not worth it") and r.acceptance.accepted > 0
    assert 0.9 < r.coverage <= 1.0 and 0.5 < r.draft_share < 1.0
    assert r.translation.startswith("text:") and r.sampling_translation.startswith("intersection:")
    assert r.translate_cost is not None and r.translate_cost > 0
    assert "translated through text" in " ".join(r.warnings)
    assert r.trees == () and "Token trees" not in r.report()  # its guesses are one line of text: no tree to price
    for shown in (r.report(), report_html(r)):
        assert "token-level intersection" in shown and "re-tokenis" in shown.lower()


def test_a_draft_whose_vocabulary_shares_nothing_useful_gets_a_sentence(pair_dirs, tmp_path):
    tok = useless_tokenizer()
    draft = save(tmp_path / "greek", train_lm(tok, ["άλφα βήτα γάμμα δέλτα"] * 40, seed=2, steps=2), tok)
    with pytest.raises(SpecvizError, match="writes back only 0% of the target's tokens"):
        load_pair(pair_dirs[0], draft, device="cpu")
    with pytest.raises(SpecvizError, match="cannot be translated"):
        generate("the red fox", target=pair_dirs[0], draft=draft, device="cpu", max_new_tokens=4)
    r = check_pair(pair_dirs[0], draft, device="cpu", max_new_tokens=8)  # a verdict, not an exception
    assert r.verdict == "incompatible" and "cannot be translated" in r.reasons[0] and r.acceptance is None


def test_the_race_page_says_the_guesses_were_translated_and_how(pair_dirs):
    from specviz.request import RunRequest
    from specviz.ui.common import UIContext
    from specviz.ui.race_run import race_stream

    ctx = UIContext(device="cpu", default_target=pair_dirs[0], default_draft=pair_dirs[1])
    for temperature, method in ((0.0, "text"), (1.0, "intersection")):
        *_, last = race_stream(
            ctx,
            "the red fox",
            {"spec": RunRequest(drafter="model", gamma=3, temperature=temperature, max_new_tokens=24)},
        )
        spec_pane, message = last[2], last[5]
        assert f"draft&#x27;s guesses translated: {method}" in spec_pane, spec_pane[:300]
        assert "another tokenizer" in message and "sv-error" not in message


def test_a_tree_setting_with_a_translated_draft_runs_chains_and_the_race_says_so(pair_dirs):
    """A draft with another tokenizer proposes chains only: with tree on (or auto) its runs start with trees off,
    and the race's message says the setting had no effect instead of leaving it silent."""
    from specviz.request import RunRequest
    from specviz.ui.common import UIContext
    from specviz.ui.race_run import race_stream

    for tree in (4, "auto"):
        events = list(stream("the red fox", target=pair_dirs[0], draft=pair_dirs[1], device="cpu", tree=tree,
                             gamma=3, max_new_tokens=12))  # fmt: skip
        assert events[0].tree == "" and not any(getattr(e, "tree", None) for e in events[1:-1])
    ctx = UIContext(device="cpu", default_target=pair_dirs[0], default_draft=pair_dirs[1])
    for tree, said in ((4, True), ("off", False)):
        *_, last = race_stream(
            ctx, "the red fox", {"spec": RunRequest(drafter="model", gamma=3, tree=tree, max_new_tokens=16)}
        )
        assert ("Token trees are off for a draft with another tokenizer" in last[5]) is said, last[5][-400:]
        assert ("model, gamma 3, trees off" in last[2]) is said and "tree 4" not in last[2] + last[5]


def test_the_benchmark_races_transformers_universal_assisted_generation_on_the_same_pair(pair):
    """bench's peers for a draft with another tokenizer: transformers' assisted generation given both tokenizers
    (Universal Assisted Generation); at T = 0 every method's output must equal plain greedy decoding."""
    from specviz.bench.measure import run_bench

    p, q = pair
    table = run_bench(p, q, ["the red fox", "the old farmer helps the"], [2], [0.0], max_new_tokens=16)
    assert table["identical"].tolist() == [True], table["differences"].tolist()
    assert table["hf_spec_tok_s"].notna().all() and table["hf_assist_vs_ar"].notna().all()  # the peers ran
