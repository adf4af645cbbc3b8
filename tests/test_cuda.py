"""The CUDA path (the app and the API pick a GPU when there is one): greedy speculative output equals plain greedy
output token for token with the pair as it loads by default (target float32, draft bfloat16) and all in float32,
for the draft model, prompt lookup with it and token trees; sampled output follows the target's law (chi-square),
in float32 and bfloat16. CI has no GPU, so these skip there;
they ran on a GPU lent to a session (BENCHMARKS.md, "The CUDA path on an H200"). SPECVIZ_TEST_DEVICE=cpu runs the
same checks on the CPU, which is how their logic is checked without one.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from conftest import save_pair

from specviz import SamplingConfig, SpecConfig, generate, load_pair
from specviz.engine import eos_ids, speculative_decode

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
    one-token steps (what a verify and the plain lane compute): zero where the kernels sum in the same order."""
    from transformers import DynamicCache

    ids = torch.tensor([p.tokenizer(prompt)["input_ids"] + list(range(10, 18))], device=p.model.device)
    head, tail = ids[:, :-8], ids[:, -8:]
    with torch.inference_mode():
        cache = DynamicCache()
        p.model(head, past_key_values=cache, use_cache=True)
        call = p.model(tail, past_key_values=cache, use_cache=True).logits[0].float()
        cache = DynamicCache()
        p.model(head, past_key_values=cache, use_cache=True)
        steps = torch.cat([p.model(tail[:, i : i + 1], past_key_values=cache, use_cache=True).logits[0] for i in
                           range(8)]).float()  # fmt: skip
    return float((call - steps).abs().max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampled_spec_follows_the_target_on_the_device(tmp_path, dtype):
    """Vocabulary 8: the joint law of the first two tokens (64 outcomes, EOS pooled) computed from the target on the
    device, against speculative draws at gamma 1 (kept, resampled and bonus tokens all occur)."""
    p, q = load_pair(*save_pair(tmp_path, 8, chat=False, draft_noise=1.0), device=DEVICE, dtype=dtype)
    ids, V = [1, 5, 6], p.vocab_size
    with torch.inference_mode():
        first = torch.tensor([ids], device=p.model.device)
        p1 = torch.softmax(p.model(first).logits[0, -1].double(), -1).cpu()
        after = torch.tensor([ids + [a] for a in range(V)], device=p.model.device)
        p2 = torch.softmax(p.model(after).logits[:, -1].double(), -1).cpu()
        q1 = torch.softmax(q.model(first).logits[0, -1].double(), -1).cpu()
    law = torch.cat([(p1[:, None] * p2).flatten(), torch.zeros(V, dtype=torch.float64)])
    for a in eos_ids(p):  # nothing follows EOS: its mass sits on (eos, -)
        law[a * V : a * V + V] = 0
        law[V * V + a] = p1[a]
    n = 3000
    counts = torch.zeros(V * V + V, dtype=torch.float64)
    for seed in range(n):
        cfg = SpecConfig(gamma=1, max_new_tokens=2, seed=seed, sampling=SamplingConfig(1.0))
        t = list(speculative_decode(p, q, ids, cfg))[-1].token_ids
        counts[V * V + t[0] if len(t) == 1 else t[0] * V + t[1]] += 1
    keep = law * n >= 5
    chi2 = float(((counts[keep] - n * law[keep]) ** 2 / (n * law[keep])).sum())
    dof = int(keep.sum()) - 1
    assert (chi2 - dof) / math.sqrt(2 * dof) < 4.0, (chi2, dof)
    firsts = counts[: V * V].view(V, V).sum(1) + counts[V * V :]
    tv_p, tv_q = (0.5 * float((firsts / n - x).abs().sum()) for x in (p1, q1))
    assert tv_q > tv_p + 0.05, (tv_p, tv_q)  # the draft's own law is another: the test can tell them apart
    print(f"{dtype} on {DEVICE}: chi-square {chi2:.1f} on {dof} degrees of freedom")
