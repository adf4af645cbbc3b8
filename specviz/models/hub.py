"""Reading one model's files: a hub id, a local folder or the built-in pair; every failure a caller can cause as
one SpecvizError sentence.

Hub look-ups fail fast when offline: one short probe of the hub decides whether to read the local cache only
(nothing here changes the environment). `read_model` refuses encoders and seq2seq models before their weights are
read, and builds one model at a time (`_BUILD_LOCK`); `load_vocab_map` reads a trimmed draft's vocabulary. What is
made of them (LoadedModel, the cache, the pair) is models.py's.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import torch

from specviz.config import BUILTIN_DRAFT, BUILTIN_DRAFT_DIR, BUILTIN_TARGET, SpecvizError
from specviz.native import forward as lean
from specviz.native.linear import KERNEL_MARGIN, LEAN_MARGIN, use_fast_linear
from specviz.quant import quant_config as _quant_config

HUB_PROBE_TIMEOUT_S = 3.0  # huggingface_hub retries a dead network 5 times with backoff (~25 s): ask once first
HUB_PROBE_TTL_S = 60.0  # remember the answer a minute, so a UI does not probe on every load

# transformers' from_pretrained swaps process-wide state while it builds a model (the default dtype, a meta-device
# mode, patched init and tie functions) and restores it after: two at once can leave the patches in place. So
# models are built one at a time; the cache's own lock is never held meanwhile (see model_cache.ModelCache).
_BUILD_LOCK = threading.Lock()


def resolve_source(name: str) -> str:
    """A hub id or folder for `name`; the built-in names become their local folders."""
    if name == BUILTIN_TARGET:
        from specviz.models.builtin import ensure_target

        return str(ensure_target())
    if name == BUILTIN_DRAFT:
        if not (BUILTIN_DRAFT_DIR / "config.json").is_file():
            raise SpecvizError(f"The built-in draft is missing from {BUILTIN_DRAFT_DIR}; reinstall specviz.")
        return str(BUILTIN_DRAFT_DIR)
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise SpecvizError(f"{name} is a file; give the folder that holds the model's config.json.")
    looks_like_path = name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1)
    if looks_like_path or name.count("/") > 1:
        raise SpecvizError(f"The folder {name} does not exist.")
    return name


def locate(name: str) -> None:
    """Every failure a model's name can cause, as one SpecvizError sentence, before anything slow starts.

    Called for each model of a pair before either loads, so a misspelt id or folder is told at once instead of
    after the other model's load: a folder must hold a config.json; a hub id must be in the local cache when the
    hub is offline (HF_HUB_OFFLINE) or unreachable (one short probe, remembered a minute), and on a reachable hub
    must have a config.json there (one request, bounded by HUB_PROBE_TIMEOUT_S; a slower answer leaves it to the
    load). The built-in target is not converted here: that is its load's work.
    """
    if name == BUILTIN_TARGET:
        return
    source = resolve_source(name)
    if Path(source).is_dir():
        if not (Path(source) / "config.json").is_file():
            raise SpecvizError(f"The folder {name} has no config.json, so it does not hold a Hugging Face model.")
        return
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(source, "config.json")
    except ValueError:  # not a valid repo id ("a b", "x--y" ...)
        raise SpecvizError(f"{name} is neither a folder nor a Hugging Face model id (owner/name).") from None
    if isinstance(cached, str):
        return
    if not hub_reachable():
        why = "the hub is offline here" if _offline() else "the hub cannot be reached from here"
        raise SpecvizError(f"The model {name} could not be found ({why} and it is not in the local cache).")
    if _on_hub(source) is False:
        raise SpecvizError(f"The model {name} could not be found on the Hugging Face hub; check its spelling.")


def _on_hub(repo_id: str) -> bool | None:
    """Whether the hub has `repo_id`'s config.json; None when it does not answer in time or will not say
    (a gated or private repository: its load gives the hub's own sentence)."""
    from huggingface_hub import file_exists

    return _within_probe_time(lambda: file_exists(repo_id, "config.json"), None)


def _within_probe_time(ask, otherwise):
    """ask() in a thread, so that even a hanging DNS lookup costs at most HUB_PROBE_TIMEOUT_S: its answer, or
    `otherwise` where it raised or did not answer in time."""
    answer = {"value": otherwise}
    done = threading.Event()

    def run() -> None:
        try:
            answer["value"] = ask()
        except Exception:
            pass
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    done.wait(HUB_PROBE_TIMEOUT_S)
    return answer["value"] if done.is_set() else otherwise


def _offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


_probe: dict[str, float | bool] = {}


def hub_reachable() -> bool:
    """Whether the hub answers one HEAD request (proxies honoured) within HUB_PROBE_TIMEOUT_S; cached a minute.

    The request runs in a thread so that even a hanging DNS lookup costs at most the timeout.
    """
    if _offline():
        return False
    if _probe and time.monotonic() - float(_probe["at"]) < HUB_PROBE_TTL_S:
        return bool(_probe["ok"])
    from huggingface_hub import constants, get_session

    def ask() -> bool:
        get_session().head(constants.ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S)
        return True  # any status, even an error page, means the network works

    ok = _within_probe_time(ask, False)
    _probe.update(at=time.monotonic(), ok=ok)
    return ok


def load_vocab_map(name: str, source: str, device: torch.device, rows: int) -> tuple:
    """(vocab_map, input_map, blocked_rows) from a trimmed draft's specviz_vocab.json; Nones without one."""
    f = Path(source) / "specviz_vocab.json"
    if not f.is_file():
        return None, None, None
    try:
        spec = json.loads(f.read_text())
        ids = torch.tensor(spec["target_ids"], dtype=torch.long)
        blocked = torch.tensor(spec.get("never_propose") or [], dtype=torch.long)
    except (ValueError, KeyError, TypeError, RuntimeError):
        raise SpecvizError(
            f"The draft {name} has an unreadable specviz_vocab.json (it needs a target_ids list)."
        ) from None
    if ids.ndim != 1 or ids.numel() != rows or (ids.numel() and int(ids.min()) < 0):
        raise SpecvizError(
            f"The draft {name}'s specviz_vocab.json must list one target id (0 or more) for each of its {rows} "
            f"output rows; it lists {ids.numel()}."
        )
    if ids.unique().numel() != ids.numel():
        raise SpecvizError(f"The draft {name}'s specviz_vocab.json lists a target id twice; each row needs its own.")
    if blocked.numel() and not (0 <= int(blocked.min()) and int(blocked.max()) < rows):
        raise SpecvizError(f"The draft {name}'s specviz_vocab.json blocks rows it does not have.")
    inp = torch.zeros(int(ids.max()) + 2 if ids.numel() else 1, dtype=torch.long)  # target id -> draft row
    inp[ids] = torch.arange(len(ids))  # ids it lacks, and (clamped) ids past the end: row 0
    # "never_propose": rows trained as a catch-all for target tokens outside the trimmed vocabulary (the
    # built-in draft's row 0); proposing one would only ever be rejected, so q gives them probability 0
    return ids.to(device), inp.to(device), (blocked.to(device) if blocked.numel() else None)


def _causal_classes() -> frozenset[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names: set[str] = set()
    for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update(v if isinstance(v, (list, tuple)) else [v])
    return frozenset(names)


def _check_causal(name: str, config, trust_remote_code: bool) -> None:
    """Refuse encoders (BERT, ...) and seq2seq models before their weights are read."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    archs = list(getattr(config, "architectures", None) or [])
    if archs:  # what the checkpoint was saved as: a BertModel folder says so even though bert has a causal head
        causal = _causal_classes()
        if any(a in causal or a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
            return
        raise SpecvizError(
            f"{name} is a {archs[0]} ({config.model_type}), not a causal language model that generates text."
        )
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not trust_remote_code:
        raise SpecvizError(f"{name} is a {config.model_type} model, not a causal language model that generates text.")


def _first_line(e: BaseException) -> str:
    """The first line of an exception's message, short and without its final full stop (we add ours)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return (lines[0] if lines else type(e).__name__)[:200].rstrip(" .:")


_IMPORT_LOCK = threading.Lock()  # transformers' lazy module is not thread-safe: two loads importing at once fail


def read_model(name: str, device: torch.device, dtype: torch.dtype, quantize: str | None, trust_remote_code: bool):
    with _IMPORT_LOCK:
        from safetensors import SafetensorError  # a corrupt or truncated weights file
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = resolve_source(name)
    local_dir = Path(source).is_dir()
    if local_dir and not (Path(source) / "config.json").is_file():
        raise SpecvizError(f"The folder {name} has no config.json, so it does not hold a Hugging Face model.")
    # Offline or unreachable hub: read the local cache only, instead of retrying the network for half a minute.
    cache_only = not local_dir and not hub_reachable()
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, local_files_only=cache_only)
    except (OSError, ValueError) as e:
        if "trust_remote_code" in str(e):
            raise SpecvizError(f"{name} needs custom code from its repository, which specviz does not run.") from None
        if local_dir:
            raise SpecvizError(f"The folder {name} holds no model transformers can read: {_first_line(e)}.") from None
        where = ""
        if cache_only:
            why = "the hub is offline here" if _offline() else "the hub cannot be reached from here"
            where = f" ({why} and it is not in the local cache)"
        raise SpecvizError(f"The model {name} could not be found{where}.") from None
    _check_causal(name, config, trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, trust_remote_code=trust_remote_code, local_files_only=cache_only
        )
        with _BUILD_LOCK:
            model = AutoModelForCausalLM.from_pretrained(
                source,
                dtype=dtype,
                quantization_config=_quant_config(quantize, device),
                device_map={"": str(device)} if quantize else None,
                trust_remote_code=trust_remote_code,
                local_files_only=cache_only,
            )
    except SpecvizError:
        raise
    except torch.OutOfMemoryError:
        raise SpecvizError(f"Out of memory while loading {name}; try a smaller model or --quantize 4bit.") from None
    except ImportError as e:
        raise SpecvizError(f"The model {name} needs a package that is not installed: {_first_line(e)}.") from None
    except (OSError, ValueError, RuntimeError, KeyError, TypeError, SafetensorError) as e:
        raise SpecvizError(f"The model {name} could not be loaded: {_first_line(e)}.") from None
    if not quantize:
        try:
            model.to(device)
        except (RuntimeError, TypeError) as e:
            raise SpecvizError(f"The model {name} could not be moved to {device}: {_first_line(e)}.") from None
    model.eval()
    use_fast_linear(model, kernel_margin(model))
    memory = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    return model, tokenizer, source, memory


def kernel_margin(model: torch.nn.Module) -> float:
    """How much slower than PyTorch's the kernel's products may time and still be kept (kernels.choose): LEAN_MARGIN
    where the lean forward will run this model (the kernel brings llama.c's whole forward), else KERNEL_MARGIN."""
    return LEAN_MARGIN if lean.mode() == "auto" and lean.why_not(model) is None else KERNEL_MARGIN
