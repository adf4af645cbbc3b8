"""The CUDA path (the app and the API pick a GPU when there is one): greedy speculative output equals plain greedy
output token for token with the pair as it loads by default (target float32, draft bfloat16) and all in float32,
for the draft model, prompt lookup with it and token trees; sampled output follows the target's law (chi-square),
in float32 and bfloat16. CI has no GPU, so these skip there;
they ran on a GPU lent to a session (BENCHMARKS.md, "The CUDA path on an H200"). SPECVIZ_TEST_DEVICE=cpu runs the
same checks on the CPU, which is how their logic is checked without one.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import save_pair
from two_tokens import chi2_z, exact_two_token_law, two_token_counts

from specviz import generate, load_pair
from specviz.backends.local import CachedModel

DEVICE = os.environ.get("SPECVIZ_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(), reason="no CUDA GPU here (SPECVIZ_TEST_DEVICE=cpu runs it)"
)
PROMPTS = ["hello world", "the cat sat on the mat", "abc", "what is 2+2?", "once upon a time", "x = (1, 2)"]
WAYS = [("model", 1, "off"), ("model", 3, "off"), ("model", 6, "off"), ("lookup+model", "auto", "off"),
        ("model", 4, 8)]  # fmt: skip


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """The tests' tiny pair (64 wide) and a wider one (vocabulary 4,096, 512 wide), whose products take the GPU's
    blocked matrix kernels, where a call of several tokens and a step of one can sum in another order."""
    root = tmp_path_factory.mktemp("cuda")
    return {"tiny": save_pair(root / "tiny", 64), "wide": save_pair(root / "wide", 4096, hidden=512)}


@pytest.mark.parametrize("dtype", [None, "float32"], ids=["default dtypes", "float32"])
@pytest.mark.parametrize("name", ["tiny", "wide"])
def test_greedy_spec_equals_greedy_plain_on_the_device(pairs, name, dtype):
    p, q = load_pair(*pairs[name], device=DEVICE, dtype=dtype)
    assert p.model.device.type == DEVICE and p.dtype == torch.float32  # a target without a dtype: float32
    if dtype is None and DEVICE == "cuda":
        assert q.dtype == torch.bfloat16  # the draft in the GPU's half dtype: only its guesses change
    rejected = 0
    for prompt in PROMPTS:
        plain = generate(prompt, target=p, draft=q, mode="ar", max_new_tokens=48)
        for drafter, gamma, tree in WAYS:
            spec = generate(prompt, target=p, draft=q, drafter=drafter, gamma=gamma, tree=tree, max_new_tokens=48)
            assert spec.token_ids == plain.token_ids, (prompt, drafter, gamma, tree)
            rejected += spec.stats["drafted"] - spec.stats["accepted"]
    assert rejected > 0  # the draft disagrees sometimes: rollbacks ran
    gap = _call_against_steps(p, PROMPTS[1])
    print(
        f"{name} {p.dtype}/{q.dtype} on {DEVICE}: a call of 8 tokens against 8 steps, largest logit difference {gap:.3g}"
    )


def _call_against_steps(p, prompt: str) -> float:
    """The largest difference between the target's logits for 8 tokens computed in one cached call and in 8
    one-token steps, through the engine's own `CachedModel`: zero where the kernels sum in the same order."""
    ids = torch.tensor(p.tokenizer(prompt)["input_ids"] + list(range(10, 18)), device=p.model.device)
    by_call, by_step = CachedModel(p, p.vocab_size), CachedModel(p, p.vocab_size)
    with torch.inference_mode():
        by_call.prefill(ids[:-7])  # caches all but the last of these: the 8 compared tokens come after
        by_step.prefill(ids[:-7])
        call = by_call.feed(ids[-8:])
        steps = torch.cat([by_step.feed(ids[i : i + 1]) for i in range(len(ids) - 8, len(ids))])
    return float((call - steps).abs().max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampled_spec_follows_the_target_on_the_device(tmp_path, dtype):
    """Vocabulary 8: the joint law of the first two tokens (64 outcomes, EOS pooled) computed from the target on the
    device, against speculative draws at gamma 1 (kept, resampled and bonus tokens all occur)."""
    p, q = load_pair(*save_pair(tmp_path, 8, chat=False, draft_noise=1.0), device=DEVICE, dtype=dtype)
    ids, V, n = [1, 5, 6], p.vocab_size, 3000
    law = exact_two_token_law(p, ids)
    counts, _ = two_token_counts(p, q, ids, n, gamma=1)
    z = chi2_z(counts, law, n)
    assert z < 4.0, z

    def first(x):  # the law of the first token alone: the pairs it starts, and its ending alone
        return x[: V * V].view(V, V).sum(1) + x[V * V :]

    tv_p, tv_q = (0.5 * float((first(counts) / n - first(x)).abs().sum()) for x in (law, exact_two_token_law(q, ids)))
    assert tv_q > tv_p + 0.05, (tv_p, tv_q)  # the draft's own law is another: the test can tell them apart
    print(f"{dtype} on {DEVICE}: chi-square z {z:.2f}")
