"""Token trees: the tree-masked forward and its cache, the walk's exactness (greedy equality with plain decoding,
the sampled law at T = 1), the budget policy, settings and recordings."""

import dataclasses
import math
import re

import pytest
import torch
from conftest import engine_config
from two_tokens import chi2_z, exact_two_token_law

from specviz import Round, SamplingConfig, SpecvizError, generate, load_pair
from specviz.backends.local import CachedModel
from specviz.drafters.model import DraftContext, ModelDrafter
from specviz.drafters.policies import GammaPolicy, TreePolicy
from specviz.engine.loop import speculative_decode
from specviz.request import RunRequest
from specviz.sampling import verify_tree_greedy, verify_tree_sampled

PROMPTS = ["hello world", "the cat sat on the mat", "abc", "q", "what is 2+2?", "once upon a time", "x = (1, 2)"]


def _fresh_logits(lm, ids):
    run = CachedModel(lm, lm.vocab_size)
    run.prefill(torch.tensor(ids))
    return run.feed(torch.tensor(ids[-1:]))[-1]


# --- the tree-masked forward ----------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["lean", "sdpa", "eager"])
def test_a_tree_forward_scores_each_node_as_its_own_line_and_the_kept_path_is_a_plain_cache(tiny_pair, impl):
    p, _ = load_pair(*tiny_pair, device="cpu")
    if impl != "lean":  # transformers' forward with one attention implementation (lean.py's: its own)
        p = dataclasses.replace(p, lean=None)
        p.model.set_attn_implementation(impl)
    try:
        ids = [5, 9, 12, 30, 7, 8]
        run = CachedModel(p, p.vocab_size)
        run.prefill(torch.tensor(ids))
        L = run.length  # the root (8) is fed first; then a=20 and b=21 under it, c=22 under a, d=23 under b
        out = run.feed_tree(torch.tensor([8, 20, 21, 22, 23]), [L - 1, L, L, L + 1, L + 2])
        for row, line in enumerate([[], [20], [21], [20, 22], [21, 23]]):
            torch.testing.assert_close(out[row], _fresh_logits(p, ids + line), atol=1e-4, rtol=1e-4)
        # a second call branching off rows of the first (as the draft reads one node per call)
        more = run.feed_tree(torch.tensor([24, 25]), [L + 4, L + 1])
        torch.testing.assert_close(more[0], _fresh_logits(p, ids + [21, 23, 24]), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(more[1], _fresh_logits(p, ids + [20, 25]), atol=1e-4, rtol=1e-4)
        run.keep_path(L, [L, L + 2, L + 4, L + 5])  # root -> b -> d -> 24, gathered into place
        assert run.length == L + 4 and not run.tree_rows
        nxt = run.feed(torch.tensor([40]))[-1]
        torch.testing.assert_close(nxt, _fresh_logits(p, ids + [21, 23, 24, 40]), atol=1e-4, rtol=1e-4)
        with pytest.raises(ValueError):
            run.keep_path(2, [5])  # not a path continuing the prefix
    finally:
        p.model.set_attn_implementation("sdpa")


def test_the_draft_cache_after_a_tree_round_matches_a_fresh_encoding(loaded_pair):
    """Greedy equality cannot see a wrong draft cache (it only changes the guesses): check it directly."""
    p, q = loaded_pair
    V = p.vocab_size
    seq = p.tokenizer("the cat sat on")["input_ids"]
    d = ModelDrafter(q, V)
    d.begin(list(seq))
    tree = TreePolicy(8, 8)
    g = torch.Generator().manual_seed(0)
    for step in range(4):
        ctx = DraftContext(SamplingConfig(0.0), g, V, torch.device("cpu"), GammaPolicy(4), 50, need_q=False, tree=tree)
        prop = d.propose(list(seq), ctx)
        assert prop.is_tree
        # take a path through a rank-1 node where there is one, then a token the tree lacks
        node = next((i for i, r in enumerate(prop.ranks) if r == 1), 0)
        path = []
        while node >= 0:
            path.insert(0, node)
            node = prop.parents[node]
        seq += [prop.tokens[i].item() for i in path] + [3 + step]
        rest = d.sync(list(seq))  # what the next proposal does first
        assert len(rest) < len(path) + 1 or not any(r > 0 for r in prop.ranks)  # some of the path was kept
        got = d.run.feed(rest)[-1]
        torch.testing.assert_close(got, _fresh_logits(q, seq), atol=2e-3, rtol=2e-3)
        d.run.rollback(len(seq) - 1)  # back to the state the next proposal expects
        d.confirmed = len(seq) - 1


# --- the walk ------------------------------------------------------------------------------------------


def test_the_greedy_walk_descends_into_the_argmax_child_and_stops_with_the_argmax():
    V = 6
    tokens = torch.tensor([1, 2, 3, 4])  # root -> 1, 2; 2 -> 3, 4
    parents = (-1, -1, 1, 1)
    logits = torch.full((5, V), -5.0)
    logits[0, 2] = 5.0  # the target's choice after the root: 2 (the second child)
    logits[2, 4] = 5.0  # after 2: 4 (the second grandchild)
    logits[4, 0] = 5.0  # after 4 (a leaf): the bonus 0
    v = verify_tree_greedy(tokens, parents, logits)
    assert v.path == (1, 3) and v.correction == 0
    assert v.status == ("rejected", "kept", "rejected", "kept")
    logits[2, 4], logits[2, 5] = -5.0, 5.0  # now neither grandchild: stop at node 1 with 5
    v = verify_tree_greedy(tokens, parents, logits)
    assert v.path == (1,) and v.correction == 5 and v.status[3] == "rejected"


@pytest.mark.parametrize("children", [2, 3])
def test_the_sampled_walk_emits_the_target_law_with_children_drawn_without_replacement(children):
    """Two levels: the root's children drawn from q without replacement (plus a point-mass guess), each with one
    sampled child. The first two emitted tokens must follow p exactly (chi-square over the V * V pairs)."""
    torch.manual_seed(1)
    V = 5
    p_root = torch.softmax(torch.randn(V) * 1.5, -1)
    p_next = torch.softmax(torch.randn(V, V) * 1.5, -1)  # (V, V): p after each first token
    q_root = torch.softmax(torch.randn(V) * 1.5, -1)
    q_next = torch.softmax(torch.randn(V, V) * 1.5, -1)
    g = torch.Generator().manual_seed(7)
    n = 12_000
    counts = torch.zeros(V * V)
    for _ in range(n):
        firsts = []
        for _ in range(children):  # without replacement from q_root
            w = q_root.clone()
            w[firsts] = 0.0
            firsts.append(int(torch.multinomial(w, 1, generator=g)))
        point = next(t for t in range(V) if t not in firsts)  # one deterministic guess after them
        tokens, parents, q_rows = list(firsts) + [point], [-1] * (children + 1), [q_root] * children
        q_rows.append(torch.nn.functional.one_hot(torch.tensor(point), V).float())
        for i, a in enumerate(list(tokens)):  # each first-level node gets one sampled child
            tokens.append(int(torch.multinomial(q_next[a], 1, generator=g)))
            parents.append(i)
            q_rows.append(q_next[a])
        p_rows = torch.cat([p_root[None], p_next[tokens[: children + 1]], p_next[tokens[children + 1 :]]])
        v = verify_tree_sampled(torch.tensor(tokens), tuple(parents), torch.stack(q_rows), p_rows, g)
        emitted = [tokens[i] for i in v.path] + [v.correction]
        if len(emitted) < 2:  # stopped at the root: the second token is a plain step from p
            emitted.append(int(torch.multinomial(p_next[emitted[0]], 1, generator=g)))
        counts[emitted[0] * V + emitted[1]] += 1
    law = (p_root[:, None] * p_next).flatten()
    assert chi2_z(counts, law, n) < 4.0
    draft_law = (q_root[:, None] * q_next).flatten()
    assert 0.5 * float((counts / n - draft_law).abs().sum()) > 0.05  # the check has power


# --- end to end: greedy equality and the sampled law ---------------------------------------------------------


@pytest.mark.parametrize("children", [2, 4])
@pytest.mark.parametrize("drafter", ["model", "lookup+model"])
def test_greedy_tree_decoding_equals_plain_decoding_token_for_token(loaded_pair, monkeypatch, children, drafter):
    import specviz.drafters.model

    monkeypatch.setattr(specviz.drafters.model, "TREE_CHILDREN", children)
    p, q = loaded_pair
    plain = {pr: generate(pr, target=p, mode="ar", max_new_tokens=40).token_ids for pr in PROMPTS}
    branched = off_first = 0
    for tree in (2, 5, 16, "auto"):
        for gamma in (1, 4):
            for pr in PROMPTS:
                events = list(
                    speculative_decode(
                        p, q, _ids(p, pr), RunRequest(drafter=drafter, gamma=gamma, tree=tree, max_new_tokens=40).spec
                    )
                )
                assert events[-1].token_ids == plain[pr], (tree, gamma, pr)
                trees = [e.tree for e in events if isinstance(e, Round) and e.tree is not None]
                branched += len(trees)
                off_first += sum(t.ranks[i] > 0 for t in trees for i in t.path)
    assert branched > 50 and off_first > 10  # trees were verified, and paths went through runner-ups


def _ids(p, prompt):
    from specviz.api import encode_prompt

    return encode_prompt(p, prompt)


@pytest.mark.parametrize("children", [2, 3])
def test_sampled_tree_decoding_follows_the_target_over_two_tokens(small_vocab_pair, monkeypatch, children):
    """Vocabulary 8: the exact law of the first two tokens (64 outcomes) against tree runs at T = 1, whose first
    round is a tree of depth 2 with `children` children per node."""
    import specviz.drafters.model

    monkeypatch.setattr(specviz.drafters.model, "TREE_CHILDREN", children)
    p, q = load_pair(*small_vocab_pair, device="cpu")
    ids = [1, 5, 6]
    V, n = p.vocab_size, 1000
    counts = torch.zeros(V * V + V)
    shapes = set()
    for seed in range(n):
        cfg = RunRequest(
            drafter="model", gamma=2, tree=children * (children + 1), max_new_tokens=2, seed=seed, temperature=1.0
        ).spec
        events = list(speculative_decode(p, q, ids, cfg))
        first = next(e for e in events if isinstance(e, Round))
        if first.tree is not None:
            shapes.add(max(first.tree.ranks))
        t = events[-1].token_ids
        counts[V * V + t[0] if len(t) == 1 else t[0] * V + t[1]] += 1
    assert shapes == {children - 1}  # the first round's tree had that many children at some node
    law = exact_two_token_law(p, ids)
    assert chi2_z(counts, law, n) < 4.0
    q_law = exact_two_token_law(q, ids)
    assert 0.5 * float((counts / n - q_law).abs().sum()) > 0.05  # the draft's own law is told apart


def test_prompt_lookup_proposes_a_tree_where_the_text_continued_differently_before(loaded_pair):
    from specviz.drafters.model import LookupDrafter

    seq = [5, 6, 7, 8, 9, 5, 6, 3, 4, 5, 6, 7, 8, 1, 5, 6]  # "5 6" went on with 7 8 9 5 .., 3 4 5 6 .., 7 8 1 5 ..
    d = LookupDrafter(max_matching_ngram_size=2)
    g = torch.Generator().manual_seed(0)
    ctx = DraftContext(
        SamplingConfig(0.0), g, 64, torch.device("cpu"), GammaPolicy(4), 50, need_q=False, tree=TreePolicy(9, 9)
    )
    prop = d.propose(seq, ctx)
    assert prop.tokens.tolist() == [7, 8, 1, 5, 3, 4, 5, 6, 9]  # the most recent continuation whole, then the others
    assert prop.parents == (-1, 0, 1, 2, -1, 4, 5, 6, 1) and prop.ranks == (0, 0, 0, 0, 1, 0, 0, 0, 1)
    assert prop.sources == ("lookup",) * 9 and prop.key == "lookup:2"
    assert torch.equal(prop.q, torch.nn.functional.one_hot(prop.tokens, 64).float())  # point masses
    chain = LookupDrafter(max_matching_ngram_size=2).propose([5, 6, 7, 2, 5, 6], ctx)  # one occurrence: a chain
    assert not chain.is_tree and chain.tokens.tolist() == [7, 2, 5, 6]
    off = DraftContext(SamplingConfig(0.0), g, 64, torch.device("cpu"), GammaPolicy(4), 50)  # trees off: as ever
    assert LookupDrafter(max_matching_ngram_size=2).propose(seq, off).tokens.tolist() == [7, 8, 1, 5]


@pytest.mark.parametrize("drafter", ["lookup", "lookup+model"])
def test_greedy_lookup_trees_equal_plain_decoding(loaded_pair, drafter):
    p, q = loaded_pair
    prompts = ["the cat sat on the mat. the cat ran to the dog. the cat ate the fish. the cat", "ab ac ad ab ac ae ab"]
    trees = 0
    for pr in prompts:
        plain = generate(pr, target=p, mode="ar", max_new_tokens=40, raw=True).token_ids
        for tree in (3, 8, "auto"):
            events = list(
                speculative_decode(
                    p,
                    q,
                    p.tokenizer(pr)["input_ids"],
                    RunRequest(drafter=drafter, gamma=4, tree=tree, max_new_tokens=40).spec,
                )
            )
            assert events[-1].token_ids == plain, (pr, tree)
            trees += sum(isinstance(e, Round) and e.tree is not None and e.tree.sources[0] == "lookup" for e in events)
    assert trees > 0


def test_sampled_lookup_trees_follow_the_target(small_vocab_pair):
    p, q = load_pair(*small_vocab_pair, device="cpu")
    ids = [5, 6, 7, 5, 6, 5, 5, 6]  # "5 6" went on with 7 and with 5: a lookup tree of point masses (not with 3:
    # ids 0, 1, 3 and 4 are this tokenizer's control tokens, which lookup does not copy; 2 is its end of turn)
    V, n = p.vocab_size, 1000
    counts = torch.zeros(V * V + V)
    trees = 0
    for seed in range(n):
        cfg = RunRequest(drafter="lookup", gamma=2, tree=4, max_new_tokens=2, seed=seed, temperature=1.0).spec
        events = list(speculative_decode(p, q, ids, cfg))
        trees += any(isinstance(e, Round) and e.tree is not None for e in events)
        t = events[-1].token_ids
        counts[V * V + t[0] if len(t) == 1 else t[0] * V + t[1]] += 1
    assert trees == n  # the first round is a tree every time
    law = exact_two_token_law(p, ids)
    assert chi2_z(counts, law, n) < 4.0


# --- the budget ----------------------------------------------------------------------------------------


def _policy_with_curve(verify_s):
    tree = TreePolicy(None, 8, verify_s, read_s=0.01)
    for _ in range(5):  # each node of the best-first tree promises less: 0.6, 0.3, 0.15 ...
        tree.observe([0.6 * 0.5**k for k in range(8)], [1 + k // 2 for k in range(8)])
    return tree


def test_auto_grows_a_tree_where_verifying_more_positions_is_nearly_free_and_stays_small_where_it_is_not():
    flat = _policy_with_curve([1.0] * 9)  # a verify of 9 positions costs what one does (a GPU)
    steep = _policy_with_curve([1.0 + k for k in range(9)])  # each position costs a full step (a slow CPU)
    assert flat.nodes() >= 5
    assert steep.nodes() == 1
    assert TreePolicy(5, 5).nodes() == 5  # a fixed budget is a fixed budget


def test_auto_grows_a_tree_only_where_it_beats_the_best_chain_and_looks_again_now_and_then():
    """With the flat-verify curve above, the best tree's rate is the best of (1 + the first k scores) / (the k-th
    node's draft reads * 0.01 s + a verify of 1 s), k = 1 .. 8 (k = 6 here)."""
    tree = _policy_with_curve([1.0] * 9)
    best = tree.best_rate()
    by_hand = max((1 + sum(0.6 * 0.5**j for j in range(k))) / ((1 + (k - 1) // 2) * 0.01 + 1.0) for k in range(1, 9))
    assert abs(best - by_hand) < 1e-9
    assert [tree.grows(best * 0.9) for _ in range(3)] == [True] * 3  # the tree is expected to be faster
    every = TreePolicy.EXPLORE_EVERY
    looks = [tree.grows(best * 1.1) for _ in range(2 * every)]  # the chain is: a tree once in EXPLORE_EVERY
    assert looks == ([False] * (every - 1) + [True]) * 2
    assert tree.grows(None)  # a gamma policy without estimates: trees are sized, never weighed against it
    assert TreePolicy(4, 4).grows(1e9)  # a fixed budget always grows its tree
    assert TreePolicy(None, 8, [1.0] * 9, 0.01).grows(1e9)  # auto with no curve yet starts with a tree


def test_auto_prices_a_tree_node_by_the_drafts_own_timed_read(loaded_pair):
    from specviz.engine.costs import tree_read_calibration
    from specviz.engine.setup import make_run

    p, q = loaded_pair
    ids = _ids(p, "hello world")
    (read_s,), _ = tree_read_calibration(q, ids, p.vocab_size, greedy=True)  # as the greedy runs below read
    again, spent = tree_read_calibration(q, ids, p.vocab_size, greedy=True)
    assert read_s > 0 and again == [read_s] and spent == 0.0  # measured once per loaded model and kind of read
    (sampled_s,), spent = tree_read_calibration(q, ids, p.vocab_size)  # at T > 0 (or with detail): torch's read
    assert sampled_s > 0 and spent > 0.0
    _, _, tree, _ = make_run(
        p, q, ids, RunRequest(drafter="model", gamma=3, tree="auto", gamma_policy="auto").spec, None
    )
    assert tree.read_s == read_s and tree.fixed is None
    _, _, fixed, _ = make_run(p, q, ids, RunRequest(drafter="model", gamma=3, tree=4).spec, None)
    assert fixed.fixed == 4


def _alternating(start: bool):
    """TreePolicy.grows replaced by tree, chain, tree ... (or chain first): every way a run can switch."""
    state = {"next": start}

    def grows(self, chain_rate):
        now, state["next"] = state["next"], not state["next"]
        return now

    return grows


@pytest.mark.parametrize("start", [True, False])
def test_greedy_runs_that_switch_between_trees_and_chains_equal_plain_decoding(loaded_pair, monkeypatch, start):
    monkeypatch.setattr(TreePolicy, "grows", _alternating(start))
    p, q = loaded_pair
    shapes = set()
    for pr in PROMPTS:
        plain = generate(pr, target=p, mode="ar", max_new_tokens=40).token_ids
        for gamma in (2, 4):
            cfg = RunRequest(drafter="model", gamma=gamma, tree="auto", gamma_policy="auto", max_new_tokens=40).spec
            events = list(speculative_decode(p, q, _ids(p, pr), cfg))
            assert events[-1].token_ids == plain, (pr, gamma)
            shapes.update(e.tree is not None for e in events if isinstance(e, Round))
    assert shapes == {True, False}  # both kinds of round ran, one after the other


def test_auto_runs_chains_at_a_temperature_above_zero_and_they_follow_the_target(small_vocab_pair, monkeypatch):
    """tree="auto" grows trees at T = 0 only (run_setup.runs_chains): at T = 1 no tree policy is made, even where
    one would always grow, no round is a tree, and the first two tokens follow the target's law."""
    p, q = load_pair(*small_vocab_pair, device="cpu")
    monkeypatch.setattr(TreePolicy, "grows", lambda self, chain_rate: True)
    ids, n = [1, 5, 6], 1000
    V = p.vocab_size
    counts = torch.zeros(V * V + V)
    for seed in range(n):
        cfg = RunRequest(drafter="model", gamma=2, tree="auto", max_new_tokens=2, seed=seed, temperature=1.0).spec
        events = list(speculative_decode(p, q, ids, cfg))
        assert events[0].tree == "" and not any(isinstance(e, Round) and e.tree for e in events)
        t = events[-1].token_ids
        counts[V * V + t[0] if len(t) == 1 else t[0] * V + t[1]] += 1
    assert chi2_z(counts, exact_two_token_law(p, ids), n) < 4.0
    greedy = RunRequest(drafter="model", gamma=2, tree="auto", max_new_tokens=8).spec
    assert next(iter(speculative_decode(p, q, ids, greedy))).tree == "auto"  # at T = 0 it is made


def test_the_calibration_learns_how_often_each_rank_is_kept():
    tree = TreePolicy(4, 4)
    for _ in range(50):  # the draft says 0.5 for its first choice and 0.2 for its second; kept 0.5 and 0.0
        tree.update([0.5, 0.2], [0, 1], [-1, -1], [0], [True, False])
        tree.update([0.5, 0.2], [0, 1], [-1, -1], [], [False, False])
    assert abs(tree.cal(0) - 1.0) < 0.1 and tree.cal(1) < 0.3


@pytest.mark.parametrize(
    "ranks, parents, path, want",
    [
        # root -> a (rank 0) -> c (rank 0), c a leaf: the chain of first choices kept both, then got the bonus
        ((0, 1, 0), (-1, -1, 0), [0, 2], (2, 2)),
        # root -> b (the root's rank-1 child): the chain's first guess (a) was turned down
        ((0, 1, 0), (-1, -1, 0), [1], (1, 0)),
        # root -> a, then every child of a turned down: the chain kept one and its second guess was checked
        ((0, 1, 0), (-1, -1, 0), [0], (2, 1)),
        # root -> a -> d (a's rank-1 child): kept one, the second (c) turned down
        ((0, 1, 0, 1), (-1, -1, 0, 0), [0, 3], (2, 1)),
        # nothing kept at the root
        ((0, 1), (-1, -1), [], (1, 0)),
    ],
)
def test_a_tree_round_teaches_the_gamma_policy_what_its_chain_of_first_choices_would_have_got(
    ranks, parents, path, want
):
    from specviz.drafters.policies import chain_outcome

    assert chain_outcome(parents, ranks, path) == want


def test_tree_rounds_leave_the_chains_estimates_as_the_chains_own_rounds_would(loaded_pair, monkeypatch):
    """Every gamma-policy update of a tree round is the spine of first choices': its kept count is the path's
    leading rank-0 nodes, never a sibling's success (the walked line's length counted those, and made the
    chain look better than it is wherever trees ran)."""
    from specviz.engine import loop as engine

    p, q = loaded_pair
    seen, walked = [], []
    real = engine.chain_outcome

    def spy(parents, ranks, path):
        out = real(parents, ranks, path)
        seen.append((out, [ranks[i] for i in path]))
        return out

    monkeypatch.setattr(engine, "chain_outcome", spy)
    for pr in PROMPTS[:4]:
        cfg = RunRequest(drafter="model", gamma=4, tree=8, gamma_policy="auto", max_new_tokens=30).spec
        walked += [
            len(e.tree.path) for e in speculative_decode(p, q, _ids(p, pr), cfg) if isinstance(e, Round) and e.tree
        ]
    assert len(seen) == len(walked) > 0
    for ((proposed, n), path_ranks), steps in zip(seen, walked):
        lead = next((i for i, r in enumerate(path_ranks) if r), len(path_ranks))
        assert n == lead <= steps and n <= proposed <= n + 1
    assert any(n < steps for ((_, n), _), steps in zip(seen, walked))  # a sibling was kept somewhere


def test_lookup_is_weighed_against_the_tree_the_model_would_grow():
    """lookup+model under tree=auto: the model's best is the better of its chain and its tree; with a fixed
    budget it is the tree's."""
    from specviz.drafters.policies import Auto

    policy = Auto(3, [1.0] * 4, 0.01)
    for _ in range(20):  # lookup's guesses: the first kept half the time; the model's chain about the same
        policy.update("lookup", 3, 1, 0.0, 1.0)
        policy.update("lookup", 3, 0, 0.0, 1.0)
        policy.update("model", 3, 1, 0.0, 1.0)
        policy.update("model", 3, 0, 0.0, 1.0)
    tree = _policy_with_curve([1.0] * 9)  # a tree expected to run about 1.8 tokens a second
    assert policy.best_rate("lookup") > policy.best_rate("model") and tree.best_rate() > policy.best_rate("lookup")
    ctx = lambda t: DraftContext(SamplingConfig(0.0), None, 50, "cpu", policy, budget=20, tree=t)  # noqa: E731
    assert ctx(None).prefers("lookup", "model")  # against the chain, lookup wins
    assert not ctx(tree).prefers("lookup", "model")  # against the tree auto would grow, it loses
    fixed = _policy_with_curve([1.0] * 9)
    fixed.fixed = 1  # a tree of one node: (1 + 0.6) / 1.01 a second
    assert abs(fixed.grown_rate() - 1.6 / 1.01) < 1e-9
    assert not ctx(fixed).prefers("lookup", "model")
    fixed.fixed = 8
    fixed.verify_s = [1.0] * 4  # the costs of a tree of 8 unknown: the chain's rate stands in
    assert fixed.grown_rate() == 0.0 and ctx(fixed).prefers("lookup", "model")


# --- settings, errors, the event ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, want", [("off", "off"), (0, "off"), (None, "off"), ("auto", "auto"), (7, 7), ("12", 12)]
)
def test_the_tree_setting(value, want):
    assert RunRequest(drafter="model", gamma=3, tree=value).spec.tree == want


@pytest.mark.parametrize(
    "kw, says",
    [
        (dict(tree=33), "from 1 to 32"),
        (dict(tree="wide"), "node budget"),
        (dict(tree=2.5), "whole number"),
        (dict(tree=4, drafter="head"), "grow from the draft model or prompt lookup"),
        (dict(tree=4, drafter="lookup+head"), "grow from the draft model or prompt lookup"),
        (dict(tree=4, relaxed_w=0.5), "turn tree off"),
    ],
)
def test_a_bad_tree_setting_gets_one_sentence(kw, says):
    with pytest.raises(SpecvizError, match=says):
        engine_config(**kw)


def test_a_tree_round_says_what_the_walk_did(loaded_pair):
    p, q = loaded_pair
    cfg = RunRequest(drafter="model", gamma=3, tree=8, max_new_tokens=30, detail=4).spec
    events = list(speculative_decode(p, q, _ids(p, "once upon a time"), cfg))
    assert events[0].tree == "8"
    rounds = [e for e in events if isinstance(e, Round) and e.tree is not None]
    assert rounds
    for rd in rounds:
        t = rd.tree
        assert len(t.tokens) == rd.proposed <= 8 and all(par < i for i, par in enumerate(t.parents))
        assert rd.n == len(t.path) and all(t.status[i] == "kept" for i in t.path)
        assert rd.drafted[: rd.n] == tuple(t.tokens[i] for i in t.path)
        assert rd.tokens[: rd.n] == rd.drafted[: rd.n]
        assert len(rd.candidates) == len(rd.drafted) + 1
        assert max(t.depths) <= 3
        if rd.kind == "resampled":  # the walk stopped where every child was turned down
            stop = t.path[-1] if t.path else -1
            assert all(t.status[i] == "rejected" for i, par in enumerate(t.parents) if par == stop)
    done = events[-1]
    assert done.stats["drafted"] >= sum(r.proposed for r in rounds)


def test_a_greedy_tree_round_shows_the_same_p_and_q_whether_or_not_q_rows_were_built(loaded_pair, monkeypatch):
    """Greedy with no detail view, a tree's q rows are never built (its q(x) come from the draft's ranked
    probabilities) and p at T = 1 is read on the parents' rows only: every round shows the numbers it shows where
    all of them are built (detail on, p from a softmax of every row of the verify)."""
    from specviz.engine import loop as engine
    from specviz.sampling import to_probs

    p, q = loaded_pair
    rounds, parents_only = {}, engine._p_at_parents

    def every_row(p_run, p_probs, p_logits, parents, x):  # the reference: p at T = 1 on every row, then read
        return to_probs(p_logits, SamplingConfig(1.0))[[par + 1 for par in parents], x].tolist()

    for detail in (0, 4):
        monkeypatch.setattr(engine, "_p_at_parents", parents_only if detail == 0 else every_row)
        cfg = RunRequest(drafter="model", gamma=3, tree=6, max_new_tokens=30, detail=detail).spec
        events = list(speculative_decode(p, q, _ids(p, "once upon a time"), cfg))
        rounds[detail] = [e for e in events if isinstance(e, Round)]
    assert [r.tokens for r in rounds[0]] == [r.tokens for r in rounds[4]]
    trees = [(a.tree, b.tree) for a, b in zip(rounds[0], rounds[4]) if a.tree is not None]
    assert trees and any(len(set(a.parents)) < len(a.parents) for a, _ in trees)  # some rounds branched
    for a, b in trees:
        assert (a.tokens, a.parents, a.status) == (b.tokens, b.parents, b.status)
        assert a.q == pytest.approx(b.q, abs=0) and a.p == pytest.approx(b.p, rel=1e-6, abs=1e-9)
        assert 0.0 < min(a.q) and max(a.p) <= 1.0


def test_a_greedy_tree_rounds_p_for_the_page_is_read_after_its_clock_stops(loaded_pair, monkeypatch):
    """At T = 0 a tree's p(x) at each node's parent is only shown (decoding reads the argmax; plain decoding's steps
    show p = 1), so it is read once the round's clock has stopped: a clock that jumps 1000 s while it is read leaves
    every round's elapsed_s as it was, and every node still gets its p."""
    from specviz.engine import loop as engine

    p, q = loaded_pair
    cfg = RunRequest(drafter="model", gamma=3, tree=6, max_new_tokens=24).spec
    real_read, now = engine._p_at_parents, [0.0]
    monkeypatch.setattr(engine.time, "perf_counter", lambda: now[0])

    def slow_read(*args):
        now[0] += 1000.0
        return real_read(*args)

    for way in ("ticking", "slow"):
        monkeypatch.setattr(engine, "_p_at_parents", real_read if way == "ticking" else slow_read)
        now[0] = 0.0
        rounds = [e for e in speculative_decode(p, q, _ids(p, "once upon a time"), cfg) if isinstance(e, Round)]
        trees = [r.tree for r in rounds if r.tree is not None]
        assert trees and all(len(t.p) == len(t.tokens) and 0.0 < min(t.p) and max(t.p) <= 1.0 for t in trees)
        assert now[0] == (1000.0 * len(trees) if way == "slow" else 0.0)
        assert all(r.elapsed_s == 0.0 for r in rounds)  # the clock never moved but for the reads of p


def test_a_recording_carries_the_trees_through_json_and_the_exported_page(tiny_pair, tmp_path):
    from specviz import export_html, load_recording, record_run

    rec = record_run(
        "once upon a time",
        target=tiny_pair[0],
        draft=tiny_pair[1],
        device="cpu",
        drafter="model",
        gamma=3,
        tree=8,
        max_new_tokens=30,
    )
    path = tmp_path / "run.json"
    rec.save(path)
    back = load_recording(path)  # validated against the schema built from the events
    rounds = [e for e in back.lanes["spec"] if isinstance(e, Round)]
    original = [e for e in rec.lanes["spec"] if isinstance(e, Round)]
    assert [r.tree for r in rounds] == [r.tree for r in original] and any(r.tree for r in rounds)
    assert back.settings["tree"] == 8 and back.lanes["spec"][0].tree == "8"
    export_html(back, tmp_path / "run.html")
    page = (tmp_path / "run.html").read_text()
    assert "sv-round" in page and ("tok-branch" in page) == any(
        r.tree and any(r.tree.ranks[i] for i in r.tree.path) for r in rounds
    )


def test_a_float16_draft_grows_trees_through_its_own_mask_dtype(tiny_pair, monkeypatch):
    """The built-in draft runs in float16 where the CPU is faster at it: its tree mask is float16 too."""
    monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", "1")
    p, q = load_pair(*tiny_pair, device="cpu")
    assert q.dtype == torch.float16
    trees = 0
    for pr in PROMPTS[:4]:
        plain = generate(pr, target=p, mode="ar", max_new_tokens=32).token_ids
        events = list(
            speculative_decode(p, q, _ids(p, pr), RunRequest(drafter="model", gamma=3, tree=8, max_new_tokens=32).spec)
        )
        assert events[-1].token_ids == plain
        trees += sum(isinstance(e, Round) and e.tree is not None and max(e.tree.depths) > 1 for e in events)
    assert trees > 0  # the draft read tree nodes (depth 2 needs a tree-masked draft call)


# --- drawn for a class: the step-through's tree, the chart by depth and rank, the race's and export's figure -----


def _sampled_tree_round():
    """A sampled round over the tiny pair's token ids: the root's children 10 (the draft's 1st draw, turned down)
    and 11 (its 2nd draw, kept); 11's children 12 and 13 both turned down, so 40 was drawn from what was left of p
    at 11; 14 under 10 was never tested."""
    from specviz.events import TreeRound

    tree = TreeRound(
        tokens=(10, 11, 12, 13, 14),
        parents=(-1, -1, 1, 1, 0),
        ranks=(0, 1, 0, 1, 0),
        sources=("model",) * 5,
        p=(0.05, 0.6, 0.1, 0.02, 0.3),
        q=(0.5, 0.3, 0.4, 0.2, 0.7),
        accept_prob=(0.1, 1.0, 0.25, 0.125, math.nan),
        r=(0.62, 0.41, 0.9, 0.5, math.nan),
        status=("rejected", "kept", "rejected", "rejected", ""),
        path=(1,),
    )
    return Round(
        index=0,
        drafted=(11, 12),
        q=(0.3, 0.4),
        p=(0.6, 0.1),
        accept_prob=(1.0, 0.25),
        r=(0.41, 0.9),
        n=1,
        correction=40,
        kind="resampled",
        tokens=(11, 40),
        draft_s=0.01,
        verify_s=0.02,
        elapsed_s=0.03,
        sources=("model", "model"),
        tree=tree,
    )


def _nodes(html: str) -> dict[str, tuple[str, str]]:
    """The drawn nodes: token text -> (their classes, their hover text)."""
    import html as h

    found = re.findall(r'<span class="sv-tn ([^"]+)"[^>]*title="([^"]*)">[^<]*?(t\d+)', html)
    return {tok: (cls, h.unescape(title)) for cls, title, tok in found}


def test_the_tree_view_draws_the_walk_with_its_numbers():
    from specviz.ui.step_html import CSS, draws_html

    rd = _sampled_tree_round()
    page = draws_html(rd, lambda t: f"t{t}", greedy=False, rounds=[rd], last="t9")
    nodes = _nodes(page)
    assert nodes["t11"][0] == "sv-t-kept" and '<li class="sv-t-on"><span class="sv-tn sv-t-kept"' in page
    assert {t for t, (cls, _) in nodes.items() if cls == "sv-t-rejected"} == {"t10", "t12", "t13"}
    assert nodes["t14"][0] == "sv-t-untested" and "not tested" in nodes["t14"][1]
    assert nodes["t40"][0] == "sv-t-fix" and "drawn from what was left of p" in nodes["t40"][1]
    # the fix hangs under the node where the walk stopped (t11), after the guesses turned down there
    assert page.index("t12") < page.index("t13") < page.index("t40") and page.index("t11") < page.index("t12")
    title = nodes["t10"][1]
    assert "the draft's first draw here (depth 1)" in title  # at T > 0 siblings are draws from q, not choices
    assert "p(x) = 0.050 target · q(x) = 0.500 draft" in title and "min(1, p/q) = 0.100" in title
    assert "r = 0.62 → turned down" in title
    assert "the draft's second draw" in nodes["t11"][1] and "r = 0.41 → kept" in nodes["t11"][1]
    assert "<sup>2nd</sup>" in page  # the rank mark
    assert re.search(r"\.sv-t-rejected \{[^}]*text-decoration: line-through", CSS)  # turned-down guesses struck through
    assert "1st draw" in page and "100% of 1" in page and "0% of 1" in page  # the chart: depth 1's draws
    greedy = draws_html(rd, lambda t: f"t{t}", greedy=True, rounds=[rd], last="t9")
    assert "the draft's second choice here" in _nodes(greedy)["t11"][1] and "1st choice" in greedy


def test_the_chart_counts_tested_guesses_by_depth_and_rank():
    from specviz.view import metrics, plots

    rd = _sampled_tree_round()
    table = metrics.tree_acceptance([rd, rd, Round(**{**rd.__dict__, "tree": None})])  # a chain round adds nothing
    assert table[["depth", "rank", "tested", "kept"]].values.tolist() == [
        [1, 0, 2, 0],
        [1, 1, 2, 2],
        [2, 0, 2, 0],
        [2, 1, 2, 0],
    ]
    fig = plots.tree_figure(table)
    assert [t.name for t in fig.data] == ["draft's 1st choice", "draft's 2nd choice"]
    assert list(fig.data[1].y) == [1.0, 0.0] and list(fig.data[1].text) == ["2/2", "0/2"]
    assert metrics.tree_acceptance([Round(**{**rd.__dict__, "tree": None})]).empty


def test_a_race_and_a_recording_with_trees_chart_them_by_depth_and_rank(tiny_pair):
    from specviz import record_run
    from specviz.recording.export import figures, play_all

    kw = dict(target=tiny_pair[0], draft=tiny_pair[1], device="cpu", drafter="model", gamma=3, max_new_tokens=24)
    rec = record_run("once upon a time", tree=6, **kw)
    titles = [f.layout.title.text for f in figures(rec, play_all(rec))]
    assert any(t.startswith("Token trees: guesses kept") for t in titles)
    assert not any(t.startswith("Acceptance rate") for t in titles)  # kept per round means little for a tree
    chain = record_run("once upon a time", tree="off", **kw)
    titles = [f.layout.title.text for f in figures(chain, play_all(chain))]
    assert any(t.startswith("Acceptance rate") for t in titles) and not any("Token trees" in t for t in titles)


def test_the_benchs_rank_histogram_counts_where_the_targets_token_sits_among_the_drafts_choices(loaded_pair):
    from specviz.bench.measure import draft_ranks, ranks_line

    p, q = loaded_pair
    prompts = [_ids(p, pr) for pr in PROMPTS[:4]]
    replies = [list(generate(pr, target=p, mode="ar", max_new_tokens=20).token_ids) for pr in PROMPTS[:4]]
    got = draft_ranks(p, q, prompts, replies, top=3)
    counts = [0] * 4  # the same by hand: the draft over the whole text at once, its order of every token
    for ids, reply in zip(prompts, replies):
        with torch.no_grad():
            logits = q.model(torch.tensor([ids + reply])).logits[0, len(ids) - 1 : -1].float()  # (R, V)
        for row, want in zip(logits, reply):
            counts[min(int((row > row[want]).sum()), 3)] += 1
    assert got["tokens"] == sum(counts) == sum(map(len, replies))
    assert got["shares"] == pytest.approx([c / sum(counts) for c in counts])
    assert 0 < got["shares"][0] < 1 and got["shares"][1] > 0  # the tiny draft is right at times, and 2nd at times
    assert ranks_line(got).startswith(f"the target's greedy token is the draft's 1st {got['shares'][0]:.0%}, 2nd ")


def test_the_step_throughs_leftover_where_the_walk_stopped_is_what_the_correction_was_drawn_from(
    small_vocab_pair, monkeypatch
):
    """Where the walk turned down several guesses at a branch, p shrank once per guess: the leftover the view
    shows has no mass on any of them (with the first guess's norm(max(0, p - q)) alone it would) and sums to 1."""
    import specviz.drafters.model
    from specviz.sampling import residual

    monkeypatch.setattr(specviz.drafters.model, "TREE_CHILDREN", 3)
    p, q = load_pair(*small_vocab_pair, device="cpu")
    V, seen, naive_wrong = p.vocab_size, 0, 0
    for seed in range(60):
        cfg = RunRequest(drafter="model", gamma=2, tree=6, max_new_tokens=6, seed=seed, detail=V, temperature=1.0).spec
        for rd in speculative_decode(p, q, [1, 5, 6], cfg):
            if not isinstance(rd, Round) or rd.tree is None or rd.kind != "resampled":
                continue
            t, stop = rd.tree, (rd.tree.path[-1] if rd.tree.path else -1)
            tried = [t.tokens[i] for i, par in enumerate(t.parents) if par == stop]
            if len(tried) < 2:
                continue
            seen += 1
            c = rd.candidates[rd.n]
            left = dict(zip(c.token_ids, c.residual))
            assert sorted(c.token_ids) == list(range(V)) and sum(left.values()) == pytest.approx(1.0, abs=1e-5)
            assert all(left[x] == 0.0 for x in tried), (tried, left)
            naive = residual(torch.tensor(c.p), torch.tensor(c.q))  # the first guess's leftover alone
            naive_wrong += any(float(naive[c.token_ids.index(x)]) > 0 for x in tried[1:])
    assert seen >= 5 and naive_wrong >= 1  # such rounds happened, and the one-guess leftover would have misled
