"""The draft model and the head on one first guess (drafters_mix.py, "model+head" and "lookup+model+head"): the
first guess is drawn from the mixture it says, greedy output equals plain greedy output on every path the head
and the draft can take, sampled output follows the target (chi-square), and what it cannot do is one sentence."""

from __future__ import annotations

import pytest
import torch
from conftest import a_head, blocking_pair
from test_drafters import PROMPTS
from test_head_native import forced
from two_tokens import chi2_z, exact_two_token_law, two_token_counts

from specviz import Round, SpecvizError, generate, load_pair
from specviz.config import SamplingConfig
from specviz.drafters.mix import MixDrafter
from specviz.drafters.model import DraftContext, HeadDrafter, ModelDrafter, make_drafter
from specviz.drafters.policies import GammaPolicy
from specviz.models.head import head_for
from specviz.native import chain as lean_chain
from specviz.native import library as native

MIXED = ("model+head", "lookup+model+head")
BLOCKED = [r for r in range(64) if r % 4]  # the tiny draft proposes 16 of its 64 rows: a cut output layer
needs_kernel = pytest.mark.skipif(native.library() is None, reason=f"no native kernel here: {native.why_not()}")


def context(V: int, temperature: float, gamma: int = 3, need_q: bool = True) -> DraftContext:
    s = SamplingConfig(temperature)
    return DraftContext(s, torch.Generator().manual_seed(0), V, torch.device("cpu"), GammaPolicy(gamma), 50, need_q)


def begun(drafter, p, prompt: list[int]):
    """`drafter` begun on `prompt` as the engine begins it, with the target's hidden states of every position but
    the last, and told of the verify that confirmed the last one (its feature pending, as after a round)."""
    with torch.no_grad():
        h = p.model(torch.tensor([prompt]), output_hidden_states=True).hidden_states[-1][0]  # (P, H)
    drafter.begin(prompt[:-1], h[:-2] if drafter.wants_hidden else None)
    drafter.update(0, prompt[-1], h[-2:-1] if drafter.wants_hidden else None)
    return drafter


@pytest.mark.parametrize("w", [0.0, 0.3, 1.0])
def test_the_first_guess_is_drawn_from_the_mixture(loaded_pair, tmp_path, w):
    """q_1 = w q_head + (1 - w) q_draft at T = 1, each guesser's own first row computed apart; later rows the
    draft's, fed the first guess."""
    p, q = loaded_pair
    a_head(p, tmp_path / "h")
    head = head_for(p, tmp_path / "h")
    V, prompt = p.vocab_size, p.tokenizer("the cat sat")["input_ids"]
    seq = prompt + [p.tokenizer("o")["input_ids"][-1]]
    mix = begun(MixDrafter(ModelDrafter(q, V), HeadDrafter(head, V), weight=w), p, seq)
    prop = mix.propose(seq, context(V, 1.0))
    model_alone = begun(ModelDrafter(q, V), p, seq).propose(seq, context(V, 1.0, gamma=1))
    head_alone = begun(HeadDrafter(head, V), p, seq).propose(seq, context(V, 1.0, gamma=1))
    want = w * head_alone.q[0] + (1 - w) * model_alone.q[0]
    assert torch.allclose(prop.q[0], want, atol=1e-6)
    assert prop.sources == ("model+head",) * 3 and prop.tokens.numel() == 3
    after = ModelDrafter(q, V)  # the draft's own rows after the first guess, fed it
    after.begin(seq + [int(prop.tokens[0])])
    ctx = context(V, 1.0, gamma=1)
    want2 = after.propose(seq + [int(prop.tokens[0])], ctx).q[0]
    assert torch.allclose(prop.q[1], want2, atol=1e-5)
    greedy = begun(MixDrafter(ModelDrafter(q, V), HeadDrafter(head, V), weight=w), p, seq)
    first = greedy.propose(seq, context(V, 0.0, need_q=False)).tokens[0]
    assert int(first) == int(want.argmax())  # at T = 0: the mixture's argmax, read at T = 1


def greedy_runs(p, q, head: str, **options) -> tuple[int, int]:
    """Every test prompt decoded greedily with `options` (a mixing drafter) and plainly: the same tokens, asserted;
    the guesses drafted and accepted over all of them."""
    drafted = accepted = 0
    for prompt in PROMPTS:
        ar = generate(prompt, target=p, mode="ar", max_new_tokens=30)
        sp = generate(prompt, target=p, draft=q, head=head, max_new_tokens=30, **options)
        assert sp.token_ids == ar.token_ids, (prompt, options)
        drafted, accepted = drafted + sp.stats["drafted"], accepted + sp.stats["accepted"]
    return drafted, accepted


@pytest.mark.parametrize("path", ["pytorch", "llama.c int8"])
@pytest.mark.parametrize("drafter", MIXED)
@pytest.mark.parametrize("policy, gamma", [("constant", 1), ("constant", 3), ("constant", 5), ("auto", 4)])
def test_greedy_output_equals_plain_greedy(loaded_pair, tmp_path, monkeypatch, path, drafter, policy, gamma):
    if path != "pytorch" and native.library() is None:
        pytest.skip(f"no native kernel here: {native.why_not()}")
    p, q = loaded_pair
    a_head(p, tmp_path / "h")
    forced(monkeypatch, p, tmp_path / "h", path)
    drafted, accepted = greedy_runs(p, q, str(tmp_path / "h"), drafter=drafter, gamma=gamma, gamma_policy=policy)
    assert 0 < accepted < drafted  # guesses were kept and turned down


@pytest.mark.parametrize("confidence", [0.0, 0.12])
def test_greedy_output_under_the_confidence_policy_and_the_detail_view(loaded_pair, tmp_path, confidence):
    """The drafter's slower path (q rows built for the detail view) and the confidence stop, greedy."""
    p, q = loaded_pair
    a_head(p, tmp_path / "h")
    options = dict(drafter="model+head", gamma=4, gamma_policy="confidence", confidence=confidence, detail=5)
    drafted, _ = greedy_runs(p, q, str(tmp_path / "h"), **options)
    assert drafted > 0


@pytest.mark.parametrize("drafter", MIXED)
def test_sampled_output_follows_the_target(small_vocab_pair, tmp_path, drafter):
    """Chi-square of the first two tokens at T = 1; the control: lossy verification of the same draws fails."""
    p, q = load_pair(*small_vocab_pair, device="cpu")
    a_head(p, tmp_path / "h", first_row=0)
    ids, n = [5, 6, 7, 5, 6], 1000
    law = exact_two_token_law(p, ids)
    counts, sources = two_token_counts(p, q, ids, n, gamma=2, drafter=drafter, head=str(tmp_path / "h"))
    assert "model+head" in sources
    z, tv = chi2_z(counts, law, n), 0.5 * float((counts / n - law).abs().sum())
    assert z < 4.0 and tv < 0.1, (z, tv)
    lossy, _ = two_token_counts(p, q, ids, n, gamma=2, drafter=drafter, head=str(tmp_path / "h"), relaxed_w=0.0)
    assert chi2_z(lossy, law, n) > 4.0


def test_what_it_cannot_do_is_one_sentence(loaded_pair, tmp_path):
    p, q = loaded_pair
    a_head(p, tmp_path / "h")
    head = head_for(p, tmp_path / "h")
    with pytest.raises(SpecvizError, match="needs a draft model"):
        make_drafter("model+head", None, p.vocab_size, head=head, target=p)
    with pytest.raises(SpecvizError, match="needs a draft head"):
        make_drafter("lookup+model+head", q, p.vocab_size, head=None, target=p)
    with pytest.raises(SpecvizError, match="no draft head for this target"):
        generate("hi", target=p, draft=q, drafter="model+head", max_new_tokens=4)  # the tiny target has no built-in


def test_a_draft_with_another_tokenizer_is_refused_in_one_sentence(loaded_pair, tmp_path, monkeypatch):
    """The mixture adds the two guessers' probabilities token by token: a draft that reads and writes text through
    another tokenizer (translate.py) has no such row to add."""
    import specviz.models.translate

    p, q = loaded_pair
    a_head(p, tmp_path / "h")
    head = head_for(p, tmp_path / "h")
    monkeypatch.setattr(specviz.models.translate, "needs_translation", lambda target, draft: True)
    with pytest.raises(SpecvizError, match="must share the target's tokenizer; use lookup\\+model"):
        make_drafter("lookup+model+head", q, p.vocab_size, head=head, target=p)


@needs_kernel
@pytest.mark.parametrize("forward,int8", [("llama.c", "0"), ("llama.c", "1"), ("llama.c, weights in panels", "1")])
def test_the_native_chain_guesses_what_the_python_mixture_guesses(
    pair_with, tiny_pair, tmp_path, monkeypatch, forward, int8
):
    """Greedy, a lean draft with a cut output layer: the round's guesses in one native call (the first the argmax of
    the mixture over the draft's rows, csrc/chain.c) are the Python path's (mixture over both guessers' rows, here
    the same rows, then the draft's chain), and speculative output equals plain output with it. (The head's weight
    is 0.9 here: the tiny draft is so sure of itself that at 0.5 the head never changes its first guess.)"""
    p, q = pair_with(forward, pair=blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED), int8=int8)
    a_head(p, tmp_path / "h", rows=q.proposable.tolist())
    head, V = head_for(p, tmp_path / "h"), p.vocab_size
    ran, real = [], lean_chain.greedy_chain

    def spy(lm, cache, ids, k, mix=None):
        out = real(lm, cache, ids, k, mix)
        ran.append(mix is not None and out is not None)
        return out

    monkeypatch.setattr(lean_chain, "greedy_chain", spy)
    mixed_first = 0
    for prompt in PROMPTS:
        seq = p.tokenizer(prompt)["input_ids"] + [9]
        fast = begun(MixDrafter(ModelDrafter(q, V), HeadDrafter(head, V), weight=0.9), p, seq)
        got = fast.propose(seq, context(V, 0.0, gamma=4, need_q=False))
        assert ran.pop() is True  # the native chain ran, with the mix
        slow = begun(MixDrafter(ModelDrafter(q, V), HeadDrafter(head, V), weight=0.9), p, seq)
        with monkeypatch.context() as m:
            m.setattr(lean_chain, "greedy_chain", lambda *a: None)  # the Python path
            want = slow.propose(seq, context(V, 0.0, gamma=4, need_q=False))
        assert got.tokens.tolist() == want.tokens.tolist(), prompt
        alone = begun(ModelDrafter(q, V), p, seq).propose(seq, context(V, 0.0, gamma=1, need_q=False))
        mixed_first += int(alone.tokens[0]) != int(got.tokens[0])  # the head changed the first guess
        ran.clear()
        drafted, _ = greedy_runs(p, q, str(tmp_path / "h"), drafter="model+head", gamma=3)
        assert drafted > 0 and ran and all(ran)
        ran.clear()
    assert mixed_first > 0  # the mix mattered somewhere, so the comparison above could fail


def test_the_race_streams_the_plain_text_in_every_mixing_lane(tiny_pair, tmp_path):
    """The page's race with model+head and a third lane of lookup+model+head: both lanes end on the plain lane's
    tokens, and the closing sentences name how the head ran."""
    from specviz.request import RunRequest
    from specviz.ui.common import UIContext
    from specviz.ui.race_run import race_stream

    ctx = UIContext(device="cpu", default_target=tiny_pair[0], default_draft=tiny_pair[1])
    p, _ = ctx.pair()
    a_head(p, tmp_path / "h")
    head = str(tmp_path / "h")
    lanes = {
        "spec": RunRequest(drafter="model+head", head=head, gamma=3, max_new_tokens=24),
        "spec2": RunRequest(drafter="lookup+model+head", head=head, gamma="auto", max_new_tokens=24),
    }
    stream = race_stream(ctx, "the cat sat on the mat, the cat", lanes)
    try:
        while True:
            message = next(stream)[5]
    except StopIteration as stop:
        view = stop.value
    assert "Done." in message and "sv-error" not in message, message
    assert "The draft head ran on " in message, message
    plain = view.done["ar"].token_ids
    assert view.done["spec"].token_ids == plain and view.done["spec2"].token_ids == plain
    sources = {s for e in view.events["spec"] if isinstance(e, Round) for s in e.sources}
    assert sources == {"model+head"}
