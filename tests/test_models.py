"""Model loading: every mistake a user can make is one quick SpecvizError; the cache keeps what it should."""

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from conftest import engine_config, make_model, make_tokenizer
from transformers import BertConfig, BertModel

import specviz.models.hub as hub
import specviz.models.loaded as models
from specviz import SpecvizError, load_model, load_pair
from specviz.models.cache import ModelCache
from specviz.models.loaded import LoadedModel, pair_dtypes
from specviz.request import RunRequest

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

    asked = []

    class Hanging:
        def head(self, *a, **k):
            asked.append(a)
            time.sleep(30)

    monkeypatch.setattr(hub, "_offline", lambda: False)
    monkeypatch.setattr(hub, "HUB_PROBE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(hub, "_probe", {})
    monkeypatch.setattr(huggingface_hub, "get_session", lambda: Hanging())
    t0 = time.perf_counter()
    assert hub.hub_reachable() is False
    assert time.perf_counter() - t0 < 1.5
    assert hub.hub_reachable() is False and len(asked) == 1  # remembered: no second probe, no second wait
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

    monkeypatch.setattr(hub, "read_model", never)
    t = tiny_pair[0]
    fails("Unknown dtype 'float8'", t, dtype="float8")
    fails("Unsupported dtype torch.int8", t, dtype=torch.int8)
    fails("Unknown device 'gpu0'", t, device="gpu0")
    fails("Unsupported device", t, device="meta")
    if not torch.cuda.is_available():
        fails("no CUDA GPU is available", t, device="cuda")
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
    p, q = load_pair(tiny_pair[0], tiny_pair[1], device="cpu", dtype="bfloat16")
    assert pair_dtypes(p, q).startswith("bfloat16 (rounds apart from one-token steps: greedy output can part")
    assert "rounds apart" not in pair_dtypes(f32, f32)  # float32: a verify and a step pick alike
    nf4 = dataclasses.replace(f32, quantize="4bit")  # the words only: bitsandbytes multiplies in bfloat16 on GPUs
    assert "rounds apart" in pair_dtypes(dataclasses.replace(nf4, device=torch.device("cuda")), f32)
    assert "rounds apart" not in pair_dtypes(nf4, f32)  # on the CPU its layers multiply in float32


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


def _trimmed(folder: Path, keep: list[int], rows: int | None = None, **extra) -> str:
    """A draft whose output layer keeps the target ids `keep` (specviz_vocab.json), with the target's tokenizer."""
    make_model(rows or len(keep), seed=0).save_pretrained(folder)
    make_tokenizer(64, chat=True).save_pretrained(folder)
    (folder / "specviz_vocab.json").write_text(json.dumps({"target_ids": keep, **extra}))
    return str(folder)


def test_trimmed_draft_maps_every_target_id_and_pairing_changes_nothing(tiny_pair, tmp_path, fresh_cache, monkeypatch):
    """A draft keeping target ids 0..39: ids it lacks, and ids past its map, are fed to it as row 0; pairing it
    with a target does not touch the cached draft (other requests may be using it)."""
    monkeypatch.setenv("SPECVIZ_CPU_HALF_DRAFT", "0")  # the same dtype alone and paired: one cached model
    keep = list(range(40))
    q0 = load_model(_trimmed(tmp_path / "trim", keep), device="cpu")
    input_map = q0.input_map
    p, q = load_pair(tiny_pair[0], str(tmp_path / "trim"), device="cpu")
    assert q is q0 and q.input_map is input_map  # not grown, not replaced
    assert q.vocab_map.tolist() == keep
    fed = q.input_map[torch.arange(p.vocab_size).clamp(max=q.input_map.numel() - 1)]  # as the engine feeds it
    assert fed[:40].tolist() == keep and fed[40:].eq(0).all()


def test_a_draft_that_cannot_serve_the_target_is_one_sentence_from_load_pair(tiny_pair, tmp_path, fresh_cache):
    gap = _trimmed(tmp_path / "gap", list(range(30)) + list(range(60, 70)))  # ids 64..69: the target has 64
    msg = str(pytest.raises(SpecvizError, load_pair, tiny_pair[0], gap, device="cpu").value)
    why = "its trimmed vocabulary includes token id 69 and the target has only 64 token ids"
    assert msg == f"The draft {gap} cannot serve the target {tiny_pair[0]}: {why}."
    small = tmp_path / "small"  # an untrimmed draft with a smaller vocabulary: cannot read ids 40..63
    make_model(40, seed=0).save_pretrained(small)
    make_tokenizer(40, chat=True).save_pretrained(small)
    with pytest.raises(SpecvizError, match="it can read only 40 token ids and the target writes 64"):
        load_pair(tiny_pair[0], str(small), device="cpu")
    assert models.vocab_gap(*load_pair(*tiny_pair, device="cpu")) is None


@pytest.mark.parametrize(
    "vocab, match",
    [
        ("{not json", "unreadable specviz_vocab.json"),
        ('{"ids": [1, 2]}', "unreadable specviz_vocab.json"),
        (json.dumps({"target_ids": list(range(50))}), "one target id .* for each of its 40 output rows; it lists 50"),
        (json.dumps({"target_ids": [-1, *range(1, 40)]}), "one target id"),
        (json.dumps({"target_ids": list(range(40)), "never_propose": [40]}), "blocks rows it does not have"),
        (json.dumps({"target_ids": [*range(39), 5]}), "lists a target id twice"),
    ],
)
def test_a_malformed_vocabulary_file_is_one_sentence(tmp_path, fresh_cache, vocab, match):
    folder = Path(_trimmed(tmp_path / "bad", list(range(40))))
    (folder / "specviz_vocab.json").write_text(vocab)
    fails(match, str(folder), device="cpu")
    assert len(fresh_cache) == 0


def test_kv_bytes_per_token_bounds_the_real_cache(loaded_pair):
    """What the step-through's memory bound counts, against the bytes a real run's KV caches hold (transformers'
    caches, or the lean forward's, allocated ahead: lean.LeanCache)."""
    import gc

    from transformers import DynamicCache

    from specviz.engine.loop import speculative_decode
    from specviz.native.forward import LeanCache

    p, q = loaded_pair
    caches = (DynamicCache, LeanCache)
    before = {id(o) for o in gc.get_objects() if isinstance(o, caches)}
    run = speculative_decode(
        p, q, [1, 7, 9, 11], RunRequest(drafter="model", gamma=4, tree="off", max_new_tokens=16, seed=0).spec
    )
    events = [next(run) for _ in range(3)]  # Start and two rounds: the caches are alive inside the generator
    tokens = 4 + sum(len(e.tokens) for e in events[1:]) + 4 + 1  # at most gamma + 1 past the tokens kept
    held = 0
    for obj in gc.get_objects():
        if isinstance(obj, LeanCache) and id(obj) not in before:
            held += obj.k.numel() * obj.k.element_size() + obj.v.numel() * obj.v.element_size()
        elif isinstance(obj, DynamicCache) and id(obj) not in before:
            for layer in obj.layers:
                held += sum(t.numel() * t.element_size() for t in (layer.keys, layer.values) if t is not None)
    run.close()
    assert 0 < held <= p.kv_bytes(tokens) + q.kv_bytes(tokens)
    assert p.kv_bytes_per_token == 2 * 2 * 2 * 8 * 4  # K and V, 2 layers, 2 kv heads of 32/4 = 8, float32


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

    from specviz.engine.loop import autoregressive_decode, speculative_decode
    from specviz.events import Round

    def trimmed(name: str, **extra) -> LoadedModel:
        return load_pair(tiny_pair[0], _trimmed(tmp_path / name, list(range(40)), **extra), device="cpu")

    def proposals(p, q, temperature: float) -> tuple[list[int], list]:
        events = list(
            speculative_decode(
                p,
                q,
                [1, 7, 9, 11],
                RunRequest(
                    drafter="model", gamma=4, tree="off", max_new_tokens=24, seed=3, temperature=temperature
                ).spec,
            )
        )
        return [t for e in events if isinstance(e, Round) for t in e.drafted], events

    p, free = trimmed("free")
    assert free.blocked_rows is None
    favourite = [t for t, _ in Counter(proposals(p, free, 0.0)[0] + proposals(p, free, 1.0)[0]).most_common(2)]
    p, q = trimmed("blocked", never_propose=favourite)  # rows = target ids here
    assert q.blocked_rows.tolist() == favourite
    for temperature in (0.0, 1.0):
        drafted, events = proposals(p, q, temperature)
        assert drafted and not set(favourite) & set(drafted), (favourite, drafted)
    ar = list(
        autoregressive_decode(
            p,
            [1, 7, 9, 11],
            RunRequest(drafter="model", gamma=4, tree="off", max_new_tokens=24, seed=3, temperature=0.0).spec,
        )
    )
    assert proposals(p, q, 0.0)[1][-1].token_ids == ar[-1].token_ids  # greedy output is still the target's


# --- loading under concurrency -------------------------------------------------------------------


class SlowLoad:
    """A loader that blocks until released, counting how often it ran."""

    def __init__(self, value="model", fail: Exception | None = None):
        self.value, self.fail, self.calls = value, fail, 0
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self):
        self.calls += 1
        self.started.set()
        assert self.release.wait(10), "never released"
        if self.fail is not None:
            raise self.fail
        return self.value


def _in_thread(fn) -> Future:
    out = Future()
    threading.Thread(target=lambda: _settle(out, fn), daemon=True).start()
    return out


def _settle(out: Future, fn) -> None:
    try:
        out.set_result(fn())
    except BaseException as err:
        out.set_exception(err)


def test_a_slow_load_blocks_neither_loaded_models_nor_other_loads():
    cache = ModelCache(capacity=4)
    cache.get("loaded", lambda: "L")
    slow = SlowLoad("S")
    first = _in_thread(lambda: cache.get("slow", slow))
    assert slow.started.wait(5)
    t0 = time.perf_counter()
    assert cache.get("loaded", lambda: "never") == "L"  # no wait for the slow load
    assert cache.get("other", lambda: "O") == "O"  # another model loads meanwhile
    assert time.perf_counter() - t0 < 0.5 and not first.done()
    second = _in_thread(lambda: cache.get("slow", lambda: "a second load"))  # the same model: waits for it
    time.sleep(0.2)
    assert not second.done() and cache.loading() == 1
    slow.release.set()
    assert first.result(5) == second.result(5) == "S" and slow.calls == 1
    assert cache.loading() == 0 and cache.get("slow", lambda: "never") == "S"


def test_a_load_past_the_wait_limit_is_a_sentence_and_the_next_caller_gets_the_model():
    cache = ModelCache(capacity=4)
    slow = SlowLoad("S")
    t0 = time.perf_counter()
    with pytest.raises(SpecvizError, match="The model big is still loading .* try again in a minute"):
        cache.get("big", slow, timeout_s=0.3, what="The model big")
    assert 0.25 < time.perf_counter() - t0 < 2 and cache.loading() == 1  # the load goes on
    with pytest.raises(SpecvizError, match="still loading"):
        cache.get("big", lambda: "a second load", timeout_s=0.1, what="The model big")
    slow.release.set()
    assert cache.get("big", lambda: "a second load", timeout_s=5) == "S" and slow.calls == 1


def test_a_failed_load_reaches_every_waiter_and_the_next_caller_tries_again():
    cache = ModelCache(capacity=4)
    slow = SlowLoad(fail=SpecvizError("The model x could not be loaded."))
    waiters = [_in_thread(lambda: cache.get("x", slow, timeout_s=5)) for _ in range(3)]
    assert slow.started.wait(5)
    time.sleep(0.1)
    slow.release.set()
    for w in waiters:
        with pytest.raises(SpecvizError, match="could not be loaded"):
            w.result(5)
    assert slow.calls == 1 and len(cache) == 0 and cache.loading() == 0
    assert cache.get("x", lambda: "fixed") == "fixed"


def test_importing_specviz_changes_no_environment_variable():
    code = (
        "import os, json; before = dict(os.environ)\n"
        "import specviz, specviz.models.loaded, specviz.ui\n"
        "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GRADIO_"))}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-800:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


def test_models_loading_side_by_side_leave_no_transformers_patch_behind(tmp_path, fresh_cache):
    """transformers' from_pretrained patches process-wide state while it builds; loads in parallel must not leave
    it patched (a model built afterwards would have meta tensors, or the wrong default dtype)."""
    from transformers import PreTrainedModel

    tie, dtype = PreTrainedModel.tie_weights, torch.get_default_dtype()
    folders = []
    for i in range(4):
        folders.append(tmp_path / f"m{i}")
        make_model(16, seed=i).save_pretrained(folders[-1])
        make_tokenizer(16, chat=False).save_pretrained(folders[-1])
    for _ in range(3):
        fresh_cache.clear()
        loads = [_in_thread(lambda f=f: load_model(str(f), device="cpu", dtype="bfloat16")) for f in folders]
        assert all(x.result(60).dtype == torch.bfloat16 for x in loads)
        assert PreTrainedModel.tie_weights is tie and torch.get_default_dtype() == dtype
        assert next(make_model(16, seed=0).parameters()).device.type == "cpu"


def test_the_cache_goes_by_the_name_the_installed_transformers_takes(loaded_pair):
    """transformers 5.24 renamed `past_key_values` to `cache` and drops the old name in 5.40: the engine
    asks the model's own forward which one it takes, so a decode warns of nothing and uses the cache."""
    import inspect
    import warnings

    from specviz.backends.local import cache_kwargs
    from specviz.engine.loop import speculative_decode

    p, q = loaded_pair

    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None): ...

    class New(torch.nn.Module):
        def forward(self, input_ids, cache=None): ...

    assert cache_kwargs(Old(), "c") == {"past_key_values": "c"}
    assert cache_kwargs(New(), "c") == {"cache": "c"}
    takes = inspect.signature(type(p.model).forward).parameters
    assert list(cache_kwargs(p.model, None)) == ["cache" if "cache" in takes else "past_key_values"]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        events = list(speculative_decode(p, q, [1, 7, 9, 11], engine_config(max_new_tokens=12, seed=0)))
    done = events[-1]
    assert len(done.token_ids) == 12 or done.finish_reason == "eos"
    assert done.stats["drafted"] > 0  # the draft's cache was used too


# --- every input of a pair found before any model loads -----------------------------------------------------


@pytest.fixture
def no_loads(monkeypatch, fresh_cache):
    """Records every model read; a test that expects none asserts the list stays empty."""
    reads = []

    def read(name, *a, **k):
        reads.append(name)
        raise AssertionError(f"{name} was read")

    monkeypatch.setattr(hub, "read_model", read)
    return reads


def test_a_missing_draft_is_told_before_the_target_loads(tiny_pair, tmp_path, monkeypatch, no_loads):
    """specviz.generate with a misspelt draft used to load (and time) the whole target first."""
    import specviz
    from specviz.config import BUILTIN_TARGET

    monkeypatch.setattr(hub, "_offline", lambda: True)
    target = tiny_pair[0]
    for draft, match in (
        ("no-such-org/no-such-model", "could not be found \\(the hub is offline here and it is not in the local cache"),
        (str(tmp_path / "nope"), "does not exist"),
        (str(tmp_path), "no config.json"),
        ("not an id", "neither a folder nor a Hugging Face model id"),
    ):
        for t in (target, BUILTIN_TARGET, None):
            with pytest.raises(SpecvizError, match=match):
                specviz.generate("Hi", target=t, draft=draft, device="cpu")
        with pytest.raises(SpecvizError, match=match):
            load_pair(draft, target, device="cpu")  # a missing target, the draft found: nothing loads either
    assert no_loads == []


def test_a_hub_id_is_asked_once_of_a_reachable_hub(tiny_pair, monkeypatch, no_loads):
    monkeypatch.setattr(hub, "hub_reachable", lambda: True)
    asked = []
    monkeypatch.setattr(hub, "_on_hub", lambda repo: asked.append(repo) or False)
    with pytest.raises(SpecvizError, match="could not be found on the Hugging Face hub; check its spelling"):
        load_pair(tiny_pair[0], "nobody/no-such-model", device="cpu")
    assert asked == ["nobody/no-such-model"] and no_loads == []
    # a hub that does not answer in time, or will not say (gated), leaves the verdict to the load
    monkeypatch.setattr(hub, "_on_hub", lambda repo: None)
    with pytest.raises(AssertionError, match="was read"):
        load_pair(tiny_pair[0], "nobody/some-model", device="cpu")


def test_a_cached_hub_id_needs_no_hub(tmp_path, monkeypatch, no_loads):
    """Offline, an id in the local cache is found there: the load goes ahead (and reads it from the cache)."""
    import huggingface_hub

    monkeypatch.setattr(hub, "_offline", lambda: True)
    config = tmp_path / "config.json"
    config.write_text("{}")
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: str(config))
    with pytest.raises(AssertionError, match="some-org/cached-model was read"):
        load_model("some-org/cached-model", device="cpu")


def test_a_missing_head_folder_is_told_before_the_models_load(tmp_path, no_loads):
    import specviz

    with pytest.raises(SpecvizError, match="is not a draft head folder"):
        specviz.generate("Hi", drafter="lookup+head", head=str(tmp_path), device="cpu")
    assert no_loads == []


def test_a_served_target_with_a_missing_draft_asks_the_server_nothing(monkeypatch, no_loads):
    import specviz.backends.served.connect as connect

    monkeypatch.setattr(hub, "_offline", lambda: True)
    monkeypatch.setattr(connect, "connect", lambda *a, **k: pytest.fail("the server was asked"))
    with pytest.raises(SpecvizError, match="not in the local cache"):
        connect.load_served_pair("http://127.0.0.1:9/v1", "no-such-org/no-such-model")
    assert no_loads == []
