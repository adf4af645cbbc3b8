"""Model loading: every mistake a user can make is one quick SpecvizError; the cache keeps what it should."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import make_model, make_tokenizer
from transformers import BertConfig, BertModel

import specviz.models as models
from specviz import SpecvizError, load_model, load_pair
from specviz.models import LoadedModel, ModelCache

ROOT = Path(__file__).resolve().parent.parent


def fails(match: str, *args, seconds: float = 5.0, **kwargs) -> str:
    """load_model(*args, **kwargs) raises a one-line SpecvizError matching `match`, within `seconds`."""
    t0 = time.perf_counter()
    with pytest.raises(SpecvizError, match=match) as e:
        load_model(*args, **kwargs)
    assert time.perf_counter() - t0 < seconds
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith(".") and "Traceback" not in msg
    return msg


@pytest.fixture
def fresh_cache(monkeypatch):
    cache = ModelCache(capacity=2)
    monkeypatch.setattr(models, "CACHE", cache)
    return cache


# --- where the model is --------------------------------------------------------------------------


def test_missing_folders_and_files(tmp_path):
    fails("folder .* does not exist", str(tmp_path / "nope"))
    fails("does not exist", "./no/such/model")
    fails("does not exist", "~/no/such/model/here")
    (tmp_path / "weights.bin").write_bytes(b"\0")
    fails("is a file", str(tmp_path / "weights.bin"))
    (tmp_path / "empty").mkdir()
    fails("no config.json", str(tmp_path / "empty"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    fails("holds no model transformers can read", str(tmp_path / "broken"))
    fails("Hugging Face id or a folder", "   ")


def test_unknown_hub_id_fails_fast_offline():
    msg = fails("could not be found", "nobody/no-such-model-anywhere", seconds=3.0)
    assert "offline" in msg


def test_unreachable_hub_is_probed_once_and_quickly(monkeypatch):
    """A network that hangs (no answer at all) costs the probe's timeout, not huggingface_hub's retries."""
    import huggingface_hub

    class Hanging:
        def head(self, *a, **k):
            time.sleep(30)

    monkeypatch.setattr(models, "_offline", lambda: False)
    monkeypatch.setattr(models, "HUB_PROBE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(models, "_probe", {})
    monkeypatch.setattr(huggingface_hub, "get_session", lambda: Hanging())
    t0 = time.perf_counter()
    assert models.hub_reachable() is False
    assert time.perf_counter() - t0 < 1.5
    t0 = time.perf_counter()
    assert models.hub_reachable() is False  # remembered: no second wait
    assert time.perf_counter() - t0 < 0.05
    msg = fails("could not be found", "nobody/no-such-model-anywhere", seconds=3.0)
    assert "cannot be reached" in msg


def test_unknown_hub_id_fails_fast_without_offline_mode():
    """The real path, HF_HUB_OFFLINE unset: without the probe huggingface_hub retries a dead network ~25 s."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    code = (
        "import time, specviz\n"
        "t = time.perf_counter()\n"
        "try:\n"
        "    specviz.load_model('nobody/no-such-model-anywhere', device='cpu')\n"
        "except specviz.SpecvizError as e:\n"
        "    print(e)\n"
        "print(round(time.perf_counter() - t, 2))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    ).stdout.split("\n")
    assert out[0].startswith("The model nobody/no-such-model-anywhere could not be found"), out
    assert float(out[1]) < 8.0, out


# --- what the model is ---------------------------------------------------------------------------


def test_an_encoder_is_not_a_causal_lm(tmp_path):
    cfg = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    BertModel(cfg).save_pretrained(tmp_path / "bert")
    msg = fails("not a causal language model", str(tmp_path / "bert"))
    assert "BertModel" in msg


def test_remote_code_is_never_run_unless_asked(tmp_path, tiny_pair, monkeypatch, fresh_cache):
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "config.json").write_text(
        json.dumps(
            {
                "model_type": "specviz-custom",
                "architectures": ["CustomForCausalLM"],
                "auto_map": {"AutoConfig": "cfg.CustomConfig", "AutoModelForCausalLM": "modeling.CustomForCausalLM"},
            }
        )
    )
    fails("needs custom code from its repository, which specviz does not run", str(custom))

    import transformers

    seen = []
    for auto in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        original = auto.from_pretrained.__func__

        def spy(cls, *a, _original=original, **k):
            seen.append(k.get("trust_remote_code"))
            return _original(cls, *a, **k)

        monkeypatch.setattr(auto, "from_pretrained", classmethod(spy))
    load_model(tiny_pair[0], device="cpu")
    assert len(seen) >= 3 and set(seen) == {False}  # transformers calls AutoConfig again inside


# --- how to load it ------------------------------------------------------------------------------


def test_device_dtype_and_quantize_mistakes(tiny_pair, monkeypatch):
    def never(*a, **k):
        raise AssertionError("nothing should be read for an argument that is wrong anyway")

    monkeypatch.setattr(models, "_load", never)
    t = tiny_pair[0]
    fails("Unknown dtype 'float8'", t, dtype="float8")
    fails("Unsupported dtype torch.int8", t, dtype=torch.int8)
    fails("Unknown device 'gpu0'", t, device="gpu0")
    fails("Unsupported device", t, device="meta")
    if not torch.cuda.is_available():
        fails("no CUDA GPU is available", t, device="cuda")
    fails("needs a CUDA GPU and this run is on cpu", t, device="cpu", quantize="4bit")
    fails("Unknown quantisation '3bit'", t, device="cpu", quantize="3bit")


def test_dtype_is_applied_and_memory_is_reported(tiny_pair, fresh_cache):
    f32 = load_model(tiny_pair[0], device="cpu", dtype="float32")
    bf16 = load_model(tiny_pair[0], device="cpu", dtype="bfloat16")
    assert next(f32.model.parameters()).dtype == torch.float32 and f32.dtype == torch.float32
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    for lm in (f32, bf16):
        tensors = list(lm.model.parameters()) + list(lm.model.buffers())
        assert lm.memory_bytes == sum(x.numel() * x.element_size() for x in tensors)
    assert f32.n_params * 4 <= f32.memory_bytes and bf16.memory_bytes < 0.6 * f32.memory_bytes


# --- the cache -----------------------------------------------------------------------------------


def test_same_key_same_object_and_lru_eviction(tiny_pair, fresh_cache):
    a = load_model(tiny_pair[0], device="cpu", dtype="float32")
    assert load_model(tiny_pair[0], device="cpu", dtype="float32") is a
    assert load_model(a) is a  # a loaded model passes straight through
    b = load_model(tiny_pair[1], device="cpu", dtype="float32")
    assert load_model(tiny_pair[0], device="cpu", dtype="float32") is a  # a is now the most recent ...
    c = load_model(tiny_pair[0], device="cpu", dtype="bfloat16")  # ... so b is evicted (capacity 2)
    assert len(fresh_cache) == 2 and c is not a
    assert load_model(tiny_pair[0], device="cpu", dtype="float32") is a
    assert load_model(tiny_pair[1], device="cpu", dtype="float32") is not b  # loaded afresh


def test_lru_order_with_plain_objects():
    cache = ModelCache(capacity=2)
    made = []

    def make(x):
        made.append(x)
        return x

    cache.get("a", lambda: make("A"))
    cache.get("b", lambda: make("B"))
    cache.get("a", lambda: make("A2"))
    cache.get("c", lambda: make("C"))
    assert cache.get("a", lambda: make("A3")) == "A"
    assert cache.get("b", lambda: make("B2")) == "B2"
    assert made == ["A", "B", "C", "B2"]


def test_a_failed_load_does_not_poison_the_cache(tmp_path, fresh_cache):
    folder = tmp_path / "later"
    folder.mkdir()
    fails("no config.json", str(folder), device="cpu")
    assert len(fresh_cache) == 0
    make_model(16, seed=0).save_pretrained(folder)  # the user fixes the folder and tries again
    make_tokenizer(16, chat=False).save_pretrained(folder)
    lm = load_model(str(folder), device="cpu")
    assert isinstance(lm, LoadedModel) and lm.vocab_size == 16 and len(fresh_cache) == 1


def test_trimmed_draft_maps_every_target_id(tiny_pair, tmp_path, fresh_cache):
    """A draft keeping target ids 0..39: target ids past its map are fed to it as row 0, not clamped."""
    keep = list(range(40))
    make_model(len(keep), seed=0).save_pretrained(tmp_path / "trim")
    make_tokenizer(64, chat=True).save_pretrained(tmp_path / "trim")
    (tmp_path / "trim" / "specviz_vocab.json").write_text(json.dumps({"target_ids": keep}))
    p, q = load_pair(tiny_pair[0], str(tmp_path / "trim"), device="cpu")
    assert q.vocab_map.tolist() == keep
    assert q.input_map.numel() == p.vocab_size == 64
    assert q.input_map[:40].tolist() == keep and q.input_map[40:].eq(0).all()


def test_corrupt_weights_are_one_sentence_and_not_cached(tmp_path, fresh_cache):
    folder = tmp_path / "corrupt"
    make_model(16, seed=0).save_pretrained(folder)
    make_tokenizer(16, chat=False).save_pretrained(folder)
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(b"not safetensors")  # a truncated download looks like this
    fails("could not be loaded", str(folder), device="cpu")
    assert len(fresh_cache) == 0
    weights.write_bytes(good)
    assert load_model(str(folder), device="cpu").vocab_size == 16


def test_rows_marked_never_propose_are_never_proposed(tiny_pair, tmp_path, fresh_cache):
    """The built-in draft's row 0 is a catch-all for unknown tokens: q(x) = 0 there, output unchanged."""
    from collections import Counter

    from specviz.config import SamplingConfig, SpecConfig
    from specviz.engine import autoregressive_decode, speculative_decode
    from specviz.events import Round

    def trimmed(name: str, **extra) -> LoadedModel:
        folder = tmp_path / name
        make_model(40, seed=0).save_pretrained(folder)
        make_tokenizer(64, chat=True).save_pretrained(folder)
        (folder / "specviz_vocab.json").write_text(json.dumps({"target_ids": list(range(40)), **extra}))
        return load_pair(tiny_pair[0], str(folder), device="cpu")

    def proposals(p, q, temperature: float) -> tuple[list[int], list]:
        events = list(speculative_decode(p, q, [1, 7, 9, 11], SpecConfig(4, 24, 3, SamplingConfig(temperature))))
        return [t for e in events if isinstance(e, Round) for t in e.drafted], events

    p, free = trimmed("free")
    assert free.blocked_rows is None
    favourite = [t for t, _ in Counter(proposals(p, free, 0.0)[0] + proposals(p, free, 1.0)[0]).most_common(2)]
    p, q = trimmed("blocked", never_propose=favourite)  # rows = target ids here
    assert q.blocked_rows.tolist() == favourite
    for temperature in (0.0, 1.0):
        drafted, events = proposals(p, q, temperature)
        assert drafted and not set(favourite) & set(drafted), (favourite, drafted)
    ar = list(autoregressive_decode(p, [1, 7, 9, 11], SpecConfig(4, 24, 3, SamplingConfig(0.0))))
    assert proposals(p, q, 0.0)[1][-1].token_ids == ar[-1].token_ids  # greedy output is still the target's
