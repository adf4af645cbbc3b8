"""A token tree's reads at T = 0 in one native call each (CachedModel.tree_read, lean_chain.tree_read,
csrc/chain.c's llama_tree_read): the children, probabilities and cache of the torch read they stand for (feed or
feed_tree, then to_probs and topk) in every forward it runs on; greedy tree decoding with them equals plain decoding
and grows the trees the torch reads grow; they step aside where a read must stay in torch (T > 0, a round's detail,
no cut output layer, PyTorch's ops)."""

from __future__ import annotations

import pytest
import torch
from conftest import blocking_pair
from test_chain import BLOCKED, FORWARDS, PROMPTS  # the chain's tiny pair with a cut output layer, and its forwards
from two_tokens import chi2_z, exact_two_token_law, two_token_counts

from specviz import Round, generate
from specviz.api import encode_prompt
from specviz.backends import local as runtime
from specviz.backends.local import CachedModel
from specviz.config import SamplingConfig
from specviz.drafters.model import TREE_CHILDREN
from specviz.engine.loop import speculative_decode
from specviz.native import chain as lean_chain
from specviz.request import RunRequest
from specviz.sampling import to_probs


@pytest.fixture
def reads(monkeypatch):
    """The native reads asked for: whether each ran (not None)."""
    calls, real = [], lean_chain.tree_read

    def spy(*args):
        out = real(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(lean_chain, "tree_read", spy)
    return calls


def _torch_read(run: CachedModel, q, ids: torch.Tensor, parent: int | None, n: int = TREE_CHILDREN):
    """The read the native one stands for: feed (the root) or feed_tree (a node), then the top children at T = 1."""
    out = run.feed(ids, last_only=True) if parent is None else run.feed_tree(ids, [parent])
    view = to_probs(out[-1][q.proposable], SamplingConfig(1.0))
    top = torch.topk(view, min(n, view.numel()))
    return top.values.tolist(), q.proposable[top.indices].tolist()


def _state(run: CachedModel) -> tuple:
    n = run.cache.length
    return run.length, run.calls, dict(run.tree_rows), run.cache.k[:, :, :n].clone(), run.cache.v[:, :, :n].clone()


@pytest.mark.parametrize("forward,int8,half,reverse", [(*f, False) for f in FORWARDS] + [("llama.c", "0", "0", True)])
def test_a_native_read_gives_the_torch_reads_children_and_cache(
    pair_with, tiny_pair, tmp_path, forward, int8, half, reverse
):
    """A root fed 1 or 3 tokens, then nodes that continue it, a node (a tree row: its ancestry climbed) and a sibling
    of that node: the same children in the same order, probabilities within float rounding, the cache bit for bit."""
    pair = blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED, reverse=reverse)
    p, q = pair_with(forward, pair=pair, int8=int8, half=half)
    assert q.lean.kept is not None and q.lean.lib is not None
    prompt = torch.tensor([5, 9, 12, 30, 7, 8])
    children = set()
    for first in (1, 3):
        runs = [CachedModel(q, p.vocab_size) for _ in range(2)]
        for run in runs:
            run.prefill(prompt)
        root = prompt[-first:]
        got, want = [runs[0].tree_read(root, None, TREE_CHILDREN)], [_torch_read(runs[1], q, root, None)]
        base = runs[0].length - 1  # the root's row
        node = torch.tensor([want[0][1][0]])
        for parent in (base, base + 1, base + 1, base):  # the root, the node just read (twice), the root again
            got.append(runs[0].tree_read(node, parent, TREE_CHILDREN))
            want.append(_torch_read(runs[1], q, node, parent))
            node = torch.tensor([want[-1][1][1]])
        for (gp, gi), (wp, wi) in zip(got, want):
            assert gi == wi, (first, got, want)
            assert gp == pytest.approx(wp, rel=1e-5, abs=1e-7)
            children |= set(gi)
        a, b = _state(runs[0]), _state(runs[1])
        assert a[:3] == b[:3] and torch.equal(a[3], b[3]) and torch.equal(a[4], b[4]), first
    assert children <= {q.proposable[i].item() for i in range(q.proposable.numel())} and len(children) > 4


def test_a_native_read_leaves_out_the_children_whose_probability_is_0_as_torchs_read_gives_them(
    pair_with, tiny_pair, tmp_path
):
    """The draft's output layer scaled up 3000 times: its scores spread so far that most probabilities are 0 in
    float32. The native read gives the children torch's read gives a probability above 0, in the same order, then
    -1 and 0.0 where torch's topk has zeros; asking for no children gives none."""
    p, q = pair_with("llama.c", pair=blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED))
    assert q.lean.head.dtype == torch.float32
    q.lean.head.mul_(3000.0)  # in place: the native call reads these very weights
    prompt = torch.tensor([5, 9, 12, 30, 7, 8])
    zeros = 0
    for cut in range(2, prompt.numel() + 1):
        runs = [CachedModel(q, p.vocab_size) for _ in range(2)]
        for run in runs:
            run.prefill(prompt[:cut])
        gp, gi = runs[0].tree_read(prompt[cut - 1 : cut], None, 8)
        wp, wi = _torch_read(runs[1], q, prompt[cut - 1 : cut], None, 8)
        live = [w > 0.0 for w in wp]
        assert gi == [i if ok else -1 for i, ok in zip(wi, live)], (cut, gi, wi, wp)
        assert gp == pytest.approx([w if ok else 0.0 for w, ok in zip(wp, live)], rel=1e-5, abs=1e-7)
        zeros += live.count(False)
    assert zeros > 0  # the scale made some of the top 8 underflow
    run = CachedModel(q, p.vocab_size)
    run.prefill(prompt)
    assert run.tree_read(prompt[-1:], None, 0) == ([], [])


@pytest.mark.parametrize("forward,int8,half", FORWARDS)
def test_greedy_trees_with_native_reads_equal_plain_and_grow_the_torch_reads_trees(
    pair_with, tiny_pair, tmp_path, monkeypatch, reads, forward, int8, half
):
    p, q = pair_with(forward, pair=blocking_pair(tiny_pair, tmp_path / "d64", BLOCKED), int8=int8, half=half)
    branched = 0
    for tree, drafter in ((3, "model"), (6, "lookup+model"), ("auto", "model")):
        for prompt in PROMPTS:
            ids = encode_prompt(p, prompt)
            ar = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=32)
            cfg = RunRequest(drafter=drafter, gamma=4, tree=tree, max_new_tokens=32).spec
            reads.clear()
            native = list(speculative_decode(p, q, ids, cfg))
            assert native[-1].token_ids == ar.token_ids, (tree, drafter, prompt)
            assert reads and all(reads), (tree, drafter, prompt)  # every read in one native call
            with monkeypatch.context() as m:
                m.setattr(runtime.CachedModel, "tree_read", lambda *a: None)  # every read in torch
                in_torch = list(speculative_decode(p, q, ids, cfg))
            shape = [(e.tokens, e.tree and (e.tree.tokens, e.tree.parents)) for e in native if isinstance(e, Round)]
            same = [(e.tokens, e.tree and (e.tree.tokens, e.tree.parents)) for e in in_torch if isinstance(e, Round)]
            assert shape == same, (tree, drafter, prompt)
            keys = ("drafted", "accepted", "target_calls", "draft_calls")
            assert [native[-1].stats[k] for k in keys] == [in_torch[-1].stats[k] for k in keys]
            branched += sum(e.tree is not None for e in native if isinstance(e, Round))
    assert branched > 20  # trees were grown and verified, not only chains


def test_reads_stay_in_torch_at_t_above_0_with_detail_and_without_a_cut_output_layer(
    pair_with, tiny_pair, tmp_path, reads
):
    p, q = pair_with("llama.c")  # every row proposable: no cut output layer
    run = CachedModel(q, p.vocab_size)
    run.prefill(torch.tensor([3, 4, 5]))
    assert run.tree_read(torch.tensor([5]), None, 4) is None and run.length == 2 and run.calls == 0  # nothing fed
    p, q = pair_with("PyTorch ops", pair=blocking_pair(tiny_pair, tmp_path / "a", BLOCKED))
    assert q.lean.kept is not None and CachedModel(q, p.vocab_size).tree_read(torch.tensor([3]), None, 4) is None
    p, q = pair_with("llama.c", pair=blocking_pair(tiny_pair, tmp_path / "b", BLOCKED))
    ids = encode_prompt(p, "hello world")
    reads.clear()
    detailed = list(speculative_decode(p, q, ids, RunRequest(drafter="model", gamma=3, tree=4, detail=3).spec))
    assert reads == [] and any(isinstance(e, Round) and e.tree is not None for e in detailed)
    plain = generate("hello world", target=p, mode="ar", max_new_tokens=64).token_ids
    assert detailed[-1].token_ids == plain  # the detailed run reads in torch and keeps the target's output
    reads.clear()
    ids, N = [1, 5, 6], 3000
    counts, _ = two_token_counts(p, q, ids, N, gamma=2, tree=3)
    assert reads == []  # sampled: every read in torch
    assert chi2_z(counts, exact_two_token_law(p, ids), N) < 4.0
