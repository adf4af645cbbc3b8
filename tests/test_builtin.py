"""The built-in pair, for real: the target converted from the PyPI package offline, the shipped draft, exactness."""

import itertools
import os

import pytest

pytestmark = pytest.mark.real

# SmolLM2-135M-Instruct's own greedy reply, recorded in ../shared/data/smollm2-teacher (first 24 tokens):
# the converted target must reproduce it token for token.
TEACHER_PROMPT = "Explain inflation to a 10-year-old."
TEACHER_IDS = [
    4792,
    346,
    457,
    253,
    10976,
    1076,
    338,
    506,
    4048,
    253,
    2341,
    282,
    2478,
    30,
    3569,
    28,
    4219,
    338,
    1076,
    314,
    4048,
    253,
    2341,
    282,
]


@pytest.fixture(scope="module")
def builtin_pair():
    import specviz

    return specviz.load_pair(device="cpu")


def test_target_converts_offline_from_a_clean_cache(tmp_path, monkeypatch):
    from specviz.models import builtin

    monkeypatch.setenv("SPECVIZ_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not builtin.target_dir().exists()
    folder = builtin.ensure_target(progress=lambda msg: None)
    assert folder.is_relative_to(tmp_path)
    assert (folder / "model.safetensors").stat().st_size > 100e6
    assert (folder / "tokenizer.json").is_file()


def test_chat_template_is_applied(builtin_pair):
    from specviz import encode_prompt

    p, _ = builtin_pair
    ids = encode_prompt(p, "What is AI?")
    text = p.tokenizer.decode(ids)
    assert "<|im_start|>user" in text and text.rstrip().endswith("<|im_start|>assistant")
    raw = encode_prompt(p, "What is AI?", raw=True)
    assert "<|im_start|>" not in p.tokenizer.decode(raw)


def test_converted_target_reproduces_its_recorded_greedy_reply(builtin_pair):
    import specviz

    p, _ = builtin_pair
    r = specviz.generate(TEACHER_PROMPT, target=p, mode="ar", max_new_tokens=len(TEACHER_IDS))
    assert list(r.token_ids) == TEACHER_IDS


def test_generate_works_offline_with_the_builtin_pair():
    import specviz

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    r = specviz.generate("Tell me about gravity.", max_new_tokens=24)
    assert len(r.token_ids) == 24 and "ravit" in r.text
    assert r.stats["target_calls"] < 24  # the draft got tokens accepted: fewer target calls than tokens


@pytest.mark.parametrize("gamma", [2, 5])
def test_greedy_speculative_equals_greedy_target_on_the_real_pair(builtin_pair, gamma):
    import specviz

    p, q = builtin_pair
    for prompt in ["What is AI?", "def fibonacci(n):", "Give me three tips for sleeping well."]:
        ar = specviz.generate(prompt, target=p, mode="ar", max_new_tokens=40)
        sp = specviz.generate(prompt, target=p, draft=q, gamma=gamma, max_new_tokens=40)
        assert sp.token_ids == ar.token_ids, prompt


@pytest.mark.parametrize("quantize", ["4bit", "8bit"])
def test_the_builtin_target_quantised_on_the_cpu_is_exact_with_the_builtin_draft(quantize, monkeypatch):
    """bitsandbytes NF4 / int8 on the CPU: speculative greedy output equals the same quantised target's plain one."""
    pytest.importorskip("bitsandbytes")
    import specviz

    # by rows: where timing keeps panels (a second copy of the int8 weights, counted in memory_bytes) the memory check
    # below measures the layout's copy, not the quantisation (a Zen 1's suite failed it so)
    monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", "rows")

    p, q = specviz.load_pair(device="cpu", quantize=quantize)
    full, _ = specviz.load_pair(device="cpu")
    assert p.quantize == quantize and p.n_params == full.n_params and p.memory_bytes < 0.5 * full.memory_bytes
    accepted = 0
    for prompt in ["What is AI?", "def fibonacci(n):", "Give me three tips for sleeping well."]:
        ar = specviz.generate(prompt, target=p, mode="ar", max_new_tokens=40)
        sp = specviz.generate(prompt, target=p, draft=q, drafter="model", gamma=3, max_new_tokens=40)
        assert sp.token_ids == ar.token_ids, prompt
        accepted += sp.stats["accepted"]
    assert accepted > 0  # the draft's guesses were kept: the quantised target verified blocks, not only steps


@pytest.mark.parametrize("tokenizer", ["trained here", "Phi-3's"])
def test_the_builtin_target_with_a_draft_of_another_tokenizer_is_exact(builtin_pair, tmp_path, tokenizer):
    """A tiny ▁-style draft trained here on the built-in target's own replies, its tokenizer trained here too or
    Phi-3's real one (Llama 2's SentencePiece vocabulary): its guesses are translated into SmolLM2's byte-level
    tokens, and greedy output stays the target's token for token."""
    from cross_pair import corpus, metaspace_tokenizer, phi3_tokenizer, save, train_lm

    import specviz

    p, _ = builtin_pair
    prompts = ["What is AI?", "def fibonacci(n):", "Give me three tips for sleeping well."]
    plain = {x: specviz.generate(x, target=p, mode="ar", max_new_tokens=40) for x in prompts}
    replies = [r.text for r in plain.values()]
    tok = metaspace_tokenizer(replies + corpus(100), 400) if tokenizer == "trained here" else phi3_tokenizer()
    draft = save(tmp_path / "draft", train_lm(tok, replies * 8, seed=0, steps=200), tok)
    p, q = specviz.load_pair(p, draft, device="cpu")
    accepted = 0
    for prompt, gamma in itertools.product(prompts, (2, 4)):
        sp = specviz.generate(prompt, target=p, draft=q, drafter="model", gamma=gamma, max_new_tokens=40)
        assert sp.token_ids == plain[prompt].token_ids, (prompt, gamma)
        accepted += sp.stats["accepted"]
    assert accepted > 0  # the draft's translated guesses were kept: blocks verified, not only single steps
