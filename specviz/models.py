"""Loading models: hub id or local folder or the built-in pair; device, dtype, quantisation; a bounded cache.

Every failure a caller can cause becomes one SpecvizError sentence. Hub look-ups fail fast when offline: one
short probe of the hub decides whether to read the local cache only (nothing here changes the environment).
The cache loads each model once, without holding its lock while loading, so a slow load never blocks requests
for models already loaded; other models' configs, tokenizers and checks proceed meanwhile, but transformers
builds one model at a time (`_BUILD_LOCK`). p is the target, q the draft.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import kernels, lean
from .config import BUILTIN_DRAFT, BUILTIN_DRAFT_DIR, BUILTIN_TARGET, SpecvizError
from .kernels import draft_dtype, use_fast_linear
from .lean import LeanCache, LeanLlama
from .limits import env_int
from .quant import QUANT_LABELS, QUANTIZE, exact_cpu_layers, quant_state_bytes, weights_held  # noqa: F401 (QUANTIZE)
from .quant import quant_config as _quant_config

HUB_PROBE_TIMEOUT_S = 3.0  # huggingface_hub retries a dead network 5 times with backoff (~25 s): ask once first
HUB_PROBE_TTL_S = 60.0  # remember the answer a minute, so a UI does not probe on every load

# transformers' from_pretrained swaps process-wide state while it builds a model (the default dtype, a meta-device
# mode, patched init and tie functions) and restores it after: two at once can leave the patches in place. So
# models are built one at a time; the cache's own lock is never held meanwhile (see ModelCache).
_BUILD_LOCK = threading.Lock()
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def cache_kwargs(model: torch.nn.Module, cache) -> dict:
    """The keyword that hands a model its KV cache: `cache` from transformers 5.24 on, `past_key_values` before
    (5.24 still takes the old name but warns that 5.40 drops it). Read from the model's own forward signature."""
    return {_cache_kwarg(type(model)): cache}


@functools.cache
def _cache_kwarg(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def scatter_rows(logits: torch.Tensor, ids: torch.Tensor, V: int) -> torch.Tensor:
    """(L, N) logits over a subset of the target's tokens (row i is target token ids[i]) -> (L, V), -inf elsewhere."""
    return logits.new_full((logits.shape[0], V), -torch.inf).index_copy_(1, ids, logits)


@dataclass
class LoadedModel:
    """A causal LM ready for the engine. `vocab_map` is set for drafts with a trimmed vocabulary.

    `input_map` feeds target token ids to such a draft: entry i is the draft row of target id i (0 where the
    draft lacks it), and its last entry is 0, so an id past the map, clamped to the map's end, is row 0 too.
    It is built once at load and never changed, so requests sharing a cached draft never see it move.
    """

    model: torch.nn.Module
    tokenizer: object
    name: str
    device: torch.device
    dtype: torch.dtype
    quantize: str | None = None
    memory_bytes: int = 0
    vocab_map: torch.Tensor | None = None  # (N,) draft row -> target token id
    input_map: torch.Tensor | None = field(default=None, repr=False)  # (max id + 2,) target token id -> draft row
    blocked_rows: torch.Tensor | None = field(default=None, repr=False)  # draft rows it must never propose
    lean: LeanLlama | None = field(default=None, repr=False)  # its lean forward (lean.py), where the model fits

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def input_rows(self) -> int:
        """Token ids the model can read: rows of its input embedding."""
        return int(self.model.get_input_embeddings().weight.shape[0])

    @property
    def n_params(self) -> int:
        """Parameters; a 4-bit layer's counted as the weights it holds (bitsandbytes packs two to a byte)."""
        return sum(weights_held(p) for p in self.model.parameters())

    def to_target_logits(self, logits: torch.Tensor, V: int) -> torch.Tensor:
        """(L, Vm) logits in this model's vocabulary -> (L, V) in the target's: a trimmed vocabulary is scattered
        (-inf elsewhere), a smaller one padded with -inf, padding rows past V cut. The one vocabulary mapping."""
        if self.vocab_map is not None:
            return scatter_rows(logits, self.vocab_map, V)
        vm = logits.shape[-1]
        if vm > V:
            return logits[:, :V]
        if vm < V:
            return torch.nn.functional.pad(logits, (0, V - vm), value=-torch.inf)
        return logits

    @property
    def precision(self) -> str:
        """How its weights are held, in words: "float32", "NF4, bitsandbytes" for a 4-bit target, "int8" for a
        draft whose lean forward reads int8 weights (lean.draft_forward)."""
        if self.lean is not None and self.lean.is_int8:
            return "int8"
        return QUANT_LABELS[self.quantize] if self.quantize else str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        """Its size in words for a header: "135 M parameters, NF4, bitsandbytes, 158 MiB"."""
        return f"{self.n_params / 1e6:.0f} M parameters, {self.precision}, {self.memory_bytes / 2**20:.0f} MiB"

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes its KV cache grows by per token: K and V, per layer, per key-value head (an upper bound)."""
        c = self.model.config.get_text_config()
        heads = int(c.num_attention_heads)
        head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
        kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
        itemsize = 4 if self.lean is not None else self.dtype.itemsize  # the lean forward keeps float32 keys
        return 2 * int(c.num_hidden_layers) * kv_heads * head_dim * itemsize

    def kv_bytes(self, tokens: int) -> int:
        """Bytes one of its KV caches holds for a run of `tokens` tokens (the lean forward's cache is allocated
        ahead, doubling: lean.LeanCache)."""
        return self.kv_bytes_per_token * (LeanCache.rows_for(tokens) if self.lean is not None else tokens)


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _resolve_device(device: str | torch.device | None) -> torch.device:
    if device in (None, "", "auto"):
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise SpecvizError(f"Unknown device {device!r}; use cpu, cuda, cuda:N or mps.") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpecvizError("CUDA was asked for but no CUDA GPU is available here; use --device cpu.")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise SpecvizError(f"There is no GPU {dev}; this machine has {torch.cuda.device_count()} (cuda:0 ...).")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise SpecvizError("MPS was asked for but is not available here; use --device cpu.")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise SpecvizError(f"Unsupported device {device!r}; use cpu, cuda, cuda:N or mps.")
    return dev


def _resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise SpecvizError(f"Unsupported dtype {dtype}; use float32, float16 or bfloat16.")
        return dtype
    if dtype in (None, "", "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float16 if device.type == "mps" else torch.float32
    if dtype not in DTYPES:
        raise SpecvizError(f"Unknown dtype {dtype!r}; use auto, float32, float16 or bfloat16.")
    return DTYPES[dtype]


def resolve_source(name: str) -> str:
    """A hub id or folder for `name`; the built-in names become their local folders."""
    if name == BUILTIN_TARGET:
        from .builtin import ensure_target

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

    answer: dict[str, bool] = {}
    done = threading.Event()

    def ask() -> None:
        try:
            get_session().head(constants.ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S)
            answer["ok"] = True  # any status, even an error page, means the network works
        except Exception:
            answer["ok"] = False
        finally:
            done.set()

    threading.Thread(target=ask, daemon=True).start()
    done.wait(HUB_PROBE_TIMEOUT_S)
    ok = answer.get("ok", False)
    _probe.update(at=time.monotonic(), ok=ok)
    return ok


def _load_vocab_map(name: str, source: str, device: torch.device, rows: int) -> tuple:
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


def _load(name: str, device: torch.device, dtype: torch.dtype, quantize: str | None, trust_remote_code: bool):
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
    use_fast_linear(model)
    memory = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    return model, tokenizer, source, memory


class ModelCache:
    """Loaded models by (name, device, dtype, quantize), least recently used evicted past `capacity`.

    One load per key: a second caller asking for a model that is loading waits for that load. The lock guards
    the two dicts only and is never held while loading, so callers whose models are loaded never wait for
    someone else's load (loads of other models wait only for transformers' model building, `_BUILD_LOCK`). With a timeout the load runs in its own thread and outlives
    the caller who gave up: it lands in the cache for the next caller.
    """

    def __init__(self, capacity: int = 4):
        self.capacity = capacity
        self._items: OrderedDict[tuple, LoadedModel] = OrderedDict()
        self._loading: dict[tuple, Future] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple, make, timeout_s: float | None = None, what: str = "The model"):
        """The cached value for `key`, else `make()`'s (once, however many callers ask at the same time).

        timeout_s: how long this caller waits for a load; past it, one SpecvizError naming `what`.
        """
        future = self._future(key, make, background=timeout_s is not None)
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            raise SpecvizError(
                f"{what} is still loading and this request reached the server's time limit; "
                "the load goes on, so try again in a minute."
            ) from None

    def start(self, key: tuple, make) -> None:
        """Start loading `key` in the background unless it is loaded or loading (a later `get` waits for it)."""
        self._future(key, make, background=True)

    def _future(self, key: tuple, make, background: bool) -> Future:
        with self._lock:
            future = self._loading.get(key)
            if future is None:
                future, owner = Future(), True
                if key in self._items:
                    self._items.move_to_end(key)
                    future.set_result(self._items[key])
                    return future
                self._loading[key] = future
            else:
                owner = False
        if owner and background:
            threading.Thread(target=self._load, args=(key, make, future), name="specviz-load", daemon=True).start()
        elif owner:
            self._load(key, make, future)
        return future

    def _load(self, key: tuple, make, future: Future) -> None:
        try:
            value = make()
        except BaseException as err:  # a failed load never poisons the cache: the next caller tries again
            with self._lock:
                self._loading.pop(key, None)
            future.set_exception(err)
            return
        with self._lock:
            self._loading.pop(key, None)
            self._items[key] = value
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        future.set_result(value)

    def loading(self) -> int:
        """Loads in flight."""
        with self._lock:
            return len(self._loading)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


CACHE = ModelCache(env_int("SPECVIZ_MAX_LOADED_MODELS", 4))


def _request(name, device, dtype, quantize, trust_remote_code) -> tuple[tuple, object, str]:
    """(cache key, loader, "The model <name>") for one model; every argument is checked before anything is read."""
    if not isinstance(name, str) or not name.strip():
        raise SpecvizError("A model must be named by a Hugging Face id or a folder.")
    name = name.strip()
    dev = _resolve_device(device)
    dt = _resolve_dtype(dtype, dev)
    _quant_config(quantize, dev)  # a bad --quantize fails here, before anything is read

    def make() -> LoadedModel:
        model, tokenizer, source, memory = _load(name, dev, dt, quantize, trust_remote_code)
        if quantize and dev.type == "cpu":  # float32 products, so a verify block computes as single steps do
            exact_cpu_layers(model)
        memory += quant_state_bytes(model)  # scales bitsandbytes keeps outside the parameters
        rows = int(model.get_output_embeddings().weight.shape[0])
        vocab_map, input_map, blocked = _load_vocab_map(name, source, dev, rows)
        fast = lean.build(model, kernels.path_of(model))
        return LoadedModel(model, tokenizer, name, dev, dt, quantize, memory, vocab_map, input_map, blocked, fast)

    return (name, str(dev), str(dt), quantize, trust_remote_code), make, f"The model {name}"


def load_model(
    name: str | LoadedModel,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    quantize: str | None = None,
    trust_remote_code: bool = False,
    timeout_s: float | None = None,
) -> LoadedModel:
    """Load (or fetch from the cache) one causal LM by hub id, folder or built-in name.

    timeout_s: the most seconds to wait for a load (None: as long as it takes); past it, one SpecvizError,
    while the load goes on in the background and the next call gets the model once it is ready.
    """
    if isinstance(name, LoadedModel):
        return name
    key, make, what = _request(name, device, dtype, quantize, trust_remote_code)
    return CACHE.get(key, make, timeout_s, what)


def pair_dtypes(p: LoadedModel, q: LoadedModel) -> str:
    """The pair's dtypes in words: "float32", or "float32, draft float16" where the draft runs in another;
    a quantised target: "NF4, bitsandbytes; draft float16"; a served target: "target served, draft float16"."""
    if not isinstance(p, LoadedModel):  # a served target (served.py): its dtype is the server's
        return f"target served, draft {q.precision}"
    a, b = p.precision, q.precision
    return a if a == b else f"{a}; draft {b}" if p.quantize else f"{a}, draft {b}"


def backend(lm: LoadedModel) -> str:
    """How one loaded model computes here, in words: "specviz forward (llama.c), specviz kernel (AVX-512, 2
    threads)" where the lean forward runs it (lean.py), else "transformers forward, <its linear layers' path>"."""
    if lm.lean is not None:
        return f"specviz forward ({lm.lean.engine}), {kernels.describe(lm.model)}"
    return f"transformers forward, {kernels.describe(lm.model)}"


def pair_backend(p: LoadedModel, q: LoadedModel) -> str:
    """How the pair computes here, in words: "forward: specviz forward (llama.c), specviz kernel (AVX-512, 2
    threads)", or with "; draft: ..." where the draft's differs (kernels.py's and lean.py's choices)."""
    b = backend(q)
    if not isinstance(p, LoadedModel):  # a served target (served.py): it runs on its server
        return f"forward: the target's on its server, the draft's {b}"
    a = backend(p)
    return f"forward: {a}" if a == b else f"forward: {a}; draft: {b}"


def vocab_gap(p: LoadedModel, q: LoadedModel) -> str | None:
    """Why the draft q cannot serve the target p, in one sentence; None when it can.

    A trimmed draft must propose only ids the target has; any other draft must be able to read every id the
    target's tokenizer can write (ids it lacks would index past its embedding). A draft with another tokenizer
    guesses through text (translate.py): refused only when its tokenizer cannot write ordinary text or shares
    no token with the target's.
    """
    from .translate import needs_translation, translator

    if needs_translation(p, q):
        tr = translator(p.tokenizer, q.tokenizer)
        return tr.gap(p.name, q.name, tr.shared(q.vocab_size))
    if q.vocab_map is not None and q.vocab_map.numel() and int(q.vocab_map.max()) >= p.vocab_size:
        top = int(q.vocab_map.max())
        why = f"its trimmed vocabulary includes token id {top:,} and the target has only {p.vocab_size:,} token ids"
    elif q.vocab_map is None and q.input_rows < len(p.tokenizer):
        why = f"it can read only {q.input_rows:,} token ids and the target writes {len(p.tokenizer):,}"
    else:
        return None
    return f"The draft {q.name} cannot serve the target {p.name}: {why}."


def load_pair(
    target: str | LoadedModel | None = None,
    draft: str | LoadedModel | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    quantize: str | None = None,
    trust_remote_code: bool = False,
    timeout_s: float | None = None,
    check_vocab: bool = True,
) -> tuple[LoadedModel, LoadedModel]:
    """The target p and the draft q; None means the built-in pair. Quantisation applies to the target only.

    A draft whose vocabulary cannot serve the target is refused here (`vocab_gap`), so every path that runs a
    pair gives the same sentence (the pair check, check_vocab=False, reports it as its verdict instead). timeout_s caps the wait for both loads together (see `load_model`). Without
    an explicit dtype the draft takes float16 on a CPU that runs it faster (`kernels.draft_dtype`), and its lean
    forward int8 weights where those run faster still (`lean.draft_forward`).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    draft = draft or BUILTIN_DRAFT
    q_device = device or (target.device if isinstance(target, LoadedModel) else None)  # None: as p's, the default
    q_dtype = dtype
    if dtype in (None, "", "auto"):  # float16 where this CPU runs it faster (kernels.draft_dtype); p keeps its own
        q_dtype = draft_dtype(_resolve_device(q_device)) or dtype
    if timeout_s is not None and not isinstance(draft, LoadedModel):  # both load at once, even if we give up
        CACHE.start(*_request(draft, q_device, q_dtype, None, trust_remote_code)[:2])
    p = load_model(
        target or BUILTIN_TARGET,
        device=device,
        dtype=dtype,
        quantize=quantize,
        trust_remote_code=trust_remote_code,
        timeout_s=timeout_s,
    )
    left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    q = load_model(
        draft, device=q_device or p.device, dtype=q_dtype, trust_remote_code=trust_remote_code, timeout_s=left
    )
    gap = vocab_gap(p, q) if check_vocab else None
    if gap:
        raise SpecvizError(gap)
    if dtype in (None, "", "auto") and not isinstance(draft, LoadedModel) and q.lean is not None:
        fast = lean.draft_forward(p.lean, q.lean)  # int8 weights where this machine runs them faster
        if fast is not q.lean:
            q = dataclasses.replace(q, lean=fast)
    return p, q


class CachedModel:
    """A loaded causal LM with its own KV cache, returning logits in the target's vocabulary (`V` wide).

    Every model call of the engine, the drafters, the step-through, the pair check and the cost measurements
    goes through here, so all of them compute the same numbers. `length` is the number of tokens in the cache.
    """

    def __init__(self, lm: LoadedModel, V: int):
        from transformers import DynamicCache

        self.lm, self.V = lm, V
        self.cache = lm.lean.new_cache() if lm.lean is not None else DynamicCache(config=lm.model.config)
        self.length = 0
        self.calls = 0
        # rows fed as tree nodes (feed_tree): row -> (parent row, position); every other row r continues row r - 1
        self.tree_rows: dict[int, tuple[int, int]] = {}

    def prefill(self, prompt: torch.Tensor, hidden: bool = False) -> torch.Tensor | None:
        """Cache every prompt token but the last (which the first decoding call feeds); not a decoding call.
        With `hidden`, return the last hidden states of those positions (P - 1, H)."""
        if prompt.numel() > 1:
            h = self._forward(prompt[:-1], last_only=not hidden, hidden=hidden)[1]
            self.calls -= 1
            return h
        return None

    def feed(self, ids: torch.Tensor, last_only: bool = False, hidden: bool = False):
        """ids (L,) -> logits (L or 1, V); the cache grows by L. With `hidden`, also the last hidden states (L, H)."""
        logits, h = self._forward(ids, last_only, hidden)
        logits = self.lm.to_target_logits(logits.float(), self.V)  # a float16 draft's too: p and q in float32
        return (logits, h) if hidden else logits

    def next_greedy(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed ids (L,) and return the argmax next token as a (1,) target id.

        The argmax is taken in the model's own (maybe trimmed) vocabulary and mapped, so the V-wide logits are
        never built. Same token as greedy(feed(...)[-1]).
        """
        from .sampling import greedy

        logits = self._forward(ids, last_only=True)[0][-1]  # (Vm,)
        if self.lm.vocab_map is not None:
            return self.lm.vocab_map[greedy(logits)].view(1)
        return greedy(logits[: self.V]).view(1)  # a padded head: the extra rows never count

    def feed_tree(self, ids: torch.Tensor, parents: list[int], hidden: bool = False):
        """Feed tokens that branch: token i continues cache row parents[i] (-1: none, the very start; row
        length + j is the j-th token of this call, so parents[i] < length + i). Each token sees only its own
        ancestry: the rows its parent saw and its parent; its position is its parent's plus one. One forward call,
        through a 4-D additive attention mask and explicit position ids. ids (L,) -> logits (L, V) (and the last
        hidden states (L, H) with `hidden`); the cache grows by L rows, kept apart until `keep_path`.
        """
        L, base = int(ids.numel()), self.length
        pos, lines = [], []  # per new token: its position, and the rows it sees
        for i, par in enumerate(parents):
            if not -1 <= par < base + i:
                raise ValueError(f"token {i} of a tree continues row {par}, which it cannot see")
            seen = self._line(par, base, parents, lines)
            pos.append(self._pos(par, base, pos) + 1)
            lines.append(seen + [base + i])
        dtype = self.lm.model.dtype if self.lm.model.dtype.is_floating_point else torch.float32
        mask = torch.full((L, base + L), torch.finfo(dtype).min, dtype=dtype, device=self.lm.device)
        for i, seen in enumerate(lines):
            mask[i, seen] = 0.0
        position_ids = torch.tensor([pos], device=self.lm.device)
        logits, h = self._forward(ids, False, hidden, mask=mask[None, None], position_ids=position_ids)
        for i, par in enumerate(parents):
            self.tree_rows[base + i] = (par, pos[i])
        logits = self.lm.to_target_logits(logits.float(), self.V)
        return (logits, h) if hidden else logits

    def _pos(self, row: int, base: int, new_pos: list[int]) -> int:
        """The position of a row (-1 for none): a tree row's own, a plain row's index."""
        if row >= base:
            return new_pos[row - base]
        return self.tree_rows[row][1] if row in self.tree_rows else row

    def _line(self, row: int, base: int, parents: list[int], lines: list[list[int]]) -> list[int]:
        """The rows a token continuing `row` sees: `row` and everything `row` saw (nothing for -1)."""
        if row >= base:
            return lines[row - base]
        tail = []
        while row in self.tree_rows:  # a tree row from an earlier call: climb to the plain rows
            tail.append(row)
            row = self.tree_rows[row][0]
        return list(range(row + 1)) + tail[::-1]

    def keep_path(self, prefix: int, rows: list[int]) -> None:
        """Keep the first `prefix` rows and then `rows` (a path of tree rows, each continuing the one before),
        moved into place; drop every other row. After this the cache is a plain sequence again."""
        want = list(range(prefix, prefix + len(rows)))
        for i, r in enumerate(rows):
            parent, pos = self.tree_rows.get(r, (r - 1, r))
            if pos != prefix + i or parent != (rows[i - 1] if i else prefix - 1):
                raise ValueError("keep_path needs a path that continues the kept prefix")
        if rows != want:  # gather the path's keys and values into place, in every layer
            idx = torch.tensor(want, dtype=torch.long, device=self.lm.device)
            src = torch.tensor(rows, dtype=torch.long, device=self.lm.device)
            if self.lm.lean is not None:
                self.cache.move_rows(src, idx)
            for layer in [] if self.lm.lean is not None else self.cache.layers:
                layer.keys[..., idx, :] = layer.keys[..., src, :]
                layer.values[..., idx, :] = layer.values[..., src, :]
        self.tree_rows = {}
        self.rollback(prefix + len(rows))

    @property
    def supports_trees(self) -> bool:
        """Whether `feed_tree` / `keep_path` work on this model's cache (plain full-attention layers only)."""
        from transformers.cache_utils import DynamicLayer

        if self.lm.lean is not None:
            return True
        return all(type(layer) is DynamicLayer for layer in self.cache.layers)

    def _forward(self, ids: torch.Tensor, last_only: bool, hidden: bool = False, mask=None, position_ids=None):
        """ids (L,) -> (logits (L or 1, Vm) in the model's own vocabulary, last hidden states or None)."""
        x = ids.view(1, -1)
        if self.lm.input_map is not None:  # a trimmed draft: target ids -> its own rows (unknown -> row 0)
            x = self.lm.input_map[x.clamp(max=self.lm.input_map.numel() - 1)]
        if mask is None and self.tree_rows:
            raise RuntimeError("a plain feed after a tree feed: keep_path or rollback first")
        if self.lm.lean is not None:
            logits, h = self._lean(x.view(-1), last_only, mask, position_ids)
            return logits, (h if hidden else None)
        extra = {} if mask is None else {"attention_mask": mask, "position_ids": position_ids}
        out = self.lm.model(
            input_ids=x,
            **cache_kwargs(self.lm.model, self.cache),
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
            output_hidden_states=hidden,
            **extra,
        )
        self.length += x.shape[1]
        self.calls += 1
        h = out.hidden_states[-1][0] if hidden else None  # (L, H)
        if self.lm.blocked_rows is not None:  # a draft's catch-all rows: q(x) = 0 there
            return out.logits[0].index_fill_(-1, self.lm.blocked_rows, -torch.inf), h
        return out.logits[0], h

    def _lean(self, ids: torch.Tensor, last_only: bool, mask, position_ids):
        """The lean forward (lean.py) over this model's cache: (logits (L or 1, Vm), last hidden states (L, H))."""
        if mask is not None:  # (1, 1, L, T) with the dtype's minimum where a row is hidden -> (L, T), -inf there
            mask = mask[0, 0].float()
            mask = mask.masked_fill(mask < 0, -torch.inf)
            position_ids = position_ids.view(-1)
        logits, h = self.lm.lean.forward(self.cache, ids, position_ids, mask, last_only)
        self.length += ids.numel()
        self.calls += 1
        if self.lm.blocked_rows is not None:
            logits.index_fill_(-1, self.lm.blocked_rows, -torch.inf)
        return logits, h

    def rollback(self, keep: int) -> None:
        """Drop cached tokens past the first `keep`."""
        if keep < self.length:
            self.cache.crop(keep - self.length)  # transformers 5: a negative count of tokens to remove
            self.length = keep
            self.tree_rows = {r: v for r, v in self.tree_rows.items() if r < keep}
