"""The models the app holds: `LoadedModel` (a causal LM ready for the engine), device and dtype, the cache of
loaded models (`CACHE`), `load_model` and `load_pair`, and the pair's descriptions in words (dtypes, backend,
whether the draft's vocabulary can serve the target).

How a model's files are read, and every sentence a failed read gives, is hub.py's; the cache itself is
model_cache.py's; the runtime the engine calls a model through (`CachedModel`) is runtime.py's. p is the target,
q the draft.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field

import torch

from specviz.config import BUILTIN_DRAFT, BUILTIN_TARGET, SpecvizError, env_int
from specviz.host import cpus
from specviz.models import hub
from specviz.models.cache import ModelCache
from specviz.native import draft as lean_draft
from specviz.native import forward as lean
from specviz.native import linear as kernels
from specviz.native import panels as lean_panels
from specviz.native.forward import LeanCache, LeanLlama
from specviz.native.linear import draft_dtype
from specviz.quant import QUANT_LABELS, QUANTIZE, exact_cpu_layers, quant_state_bytes, weights_held  # noqa: F401 (QUANTIZE)
from specviz.quant import quant_config as _quant_config
from specviz.sampling import scatter_rows

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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

    @functools.cached_property
    def proposable(self) -> torch.Tensor | None:
        """The target ids a trimmed draft can ever propose, ascending: its map's rows less the blocked ones. Every
        other column of its V-wide logits (to_target_logits) is -inf, so probabilities over these columns alone
        are the same law (drafters_base.draw). None without a map."""
        if self.vocab_map is None:
            return None
        keep = torch.ones(self.vocab_map.numel(), dtype=torch.bool, device=self.vocab_map.device)
        if self.blocked_rows is not None:
            keep[self.blocked_rows] = False
        return self.vocab_map[keep].sort().values

    def rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Target token ids -> the rows this model reads them as: a trimmed draft's own rows through `input_map`
        (an id past the map -> row 0), else the ids themselves."""
        if self.input_map is None:
            return ids
        return self.input_map[ids.clamp(max=self.input_map.numel() - 1)]

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
        draft whose lean forward reads int8 weights, "int8 with int8 activations" where its products quantise their
        inputs too (lean_draft.draft_forward)."""
        if self.quantize:
            return QUANT_LABELS[self.quantize]
        if self.lean is not None and self.lean.is_int8:
            return "int8 with int8 activations" if self.lean.is_act8 else "int8"
        return str(self.dtype).removeprefix("torch.")

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


def chat_ids(tok, message: str) -> list[int]:
    """`message` as a user turn through the tokenizer's chat template, the assistant's turn opened: its ids."""
    text = tok.apply_chat_template([{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


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


def _resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """The dtype asked for; without one float32 on every device, so a verify of several tokens picks what one-token
    steps pick (in bfloat16 they part at some positions: `pair_dtypes`). A draft's half dtype, which
    changes only its guesses, comes from kernels.draft_dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise SpecvizError(f"Unsupported dtype {dtype}; use float32, float16 or bfloat16.")
        return dtype
    if dtype in (None, "", "auto"):
        return torch.float32
    if dtype not in DTYPES:
        raise SpecvizError(f"Unknown dtype {dtype!r}; use auto, float32, float16 or bfloat16.")
    return DTYPES[dtype]


CACHE = ModelCache(env_int("SPECVIZ_MAX_LOADED_MODELS", 4))


def _request(name, device, dtype, quantize, trust_remote_code) -> tuple[tuple, object, str]:
    """(cache key, loader, "The model <name>") for one model; every argument is checked before anything is read."""
    if not isinstance(name, str) or not name.strip():
        raise SpecvizError("A model must be named by a Hugging Face id or a folder.")
    name = name.strip()
    dev = _resolve_device(device)
    dt = _resolve_dtype(dtype)
    _quant_config(quantize, dev)  # a bad --quantize fails here, before anything is read

    def make() -> LoadedModel:
        model, tokenizer, source, memory = hub.read_model(name, dev, dt, quantize, trust_remote_code)
        if quantize and dev.type == "cpu":  # float32 products, so a verify block computes as single steps do
            exact_cpu_layers(model)
        memory += quant_state_bytes(model)  # scales bitsandbytes keeps outside the parameters
        rows = int(model.get_output_embeddings().weight.shape[0])
        vocab_map, input_map, blocked = hub.load_vocab_map(name, source, dev, rows)
        fast = lean.build(model, kernels.path_of(model), blocked)
        memory += fast.copied_bytes if fast is not None else 0  # a draft's kept output rows
        return LoadedModel(model, tokenizer, name, dev, dt, quantize, memory, vocab_map, input_map, blocked, fast)

    return (name, str(dev), str(dt), quantize, trust_remote_code), make, f"The model {name}"


def locate(*names: str | LoadedModel | None) -> None:
    """Each named model found, or one SpecvizError sentence, before any of them loads (hub.locate); models given
    as objects, and names the cache holds or is loading, are not looked up again."""
    held = {k[0] for k in CACHE.keys()}
    for name in names:
        if isinstance(name, str) and name.strip() and name.strip() not in held:
            hub.locate(name.strip())


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
    cpus.fit_threads()  # before the first load times anything: threads no more than the CPUs the quota allows
    key, make, what = _request(name, device, dtype, quantize, trust_remote_code)
    locate(name)
    return CACHE.get(key, make, timeout_s, what)


def pair_dtypes(p: LoadedModel, q: LoadedModel) -> str:
    """The pair's dtypes in words: "float32", or "float32, draft float16" where the draft runs in another;
    a quantised target: "NF4, bitsandbytes; draft float16"; a served target: "target served, draft float16"."""
    if not isinstance(p, LoadedModel):  # a served target (served.py): its dtype is the server's
        return f"target served, draft {q.precision}"
    a, b = p.precision, q.precision
    if p.dtype in ROUNDS_APART and not p.quantize or p.quantize and p.device.type != "cpu":  # bitsandbytes' GPU
        # kernels multiply in bfloat16 (the CPU's layers multiply in float32: quant.exact_cpu_layers)
        a += " (rounds apart from one-token steps: greedy output can part from plain at a near tie)"
    return a if a == b else f"{a}; draft {b}" if p.quantize else f"{a}, draft {b}"


# A target in half precision: a call of several tokens and a one-token step sum in another order and round apart
# (benchmarks/call_vs_steps.py counts, on real text, the positions where their argmax parts: some in bfloat16 and
# float16, on a GPU and on a CPU; none in float32)
ROUNDS_APART = (torch.bfloat16, torch.float16)


def backend(lm: LoadedModel) -> str:
    """How one loaded model computes here, in words: "specviz forward (llama.c), specviz kernel (AVX-512, 2
    threads)" where the lean forward runs it (lean.py), else "transformers forward, <its linear layers' path>"."""
    if lm.lean is not None:
        return f"specviz forward ({lm.lean.engine}), {kernels.describe(lm.model)}"
    return f"transformers forward, {kernels.describe(lm.model)}"


def pair_backend(p: LoadedModel, q: LoadedModel) -> str:
    """How the pair computes here, in words: "forward: specviz forward (llama.c), specviz kernel (AVX-512, 2
    threads)", or with "; draft: ..." where the draft's differs (kernels.py's and lean.py's choices)."""
    b, why = backend(q), cpus.note() + lean_panels.passes_note()  # a thread count lowered for a CPU quota or set
    # by the operator; the rows kernels' passes where timing changed them
    if not isinstance(p, LoadedModel):  # a served target (served.py): it runs on its server
        return f"forward: the target's on its server, the draft's {b}{why}"
    a = backend(p)
    return (f"forward: {a}" if a == b else f"forward: {a}; draft: {b}") + why


def vocab_gap(p: LoadedModel, q: LoadedModel) -> str | None:
    """Why the draft q cannot serve the target p, in one sentence; None when it can.

    A trimmed draft must propose only ids the target has; any other draft must be able to read every id the
    target's tokenizer can write (ids it lacks would index past its embedding). A draft with another tokenizer
    guesses through text (translate.py): refused only when its tokenizer cannot write ordinary text or shares
    no token with the target's.
    """
    from specviz.models.translate import needs_translation, translator

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
    forward int8 weights where those run faster still (`lean_draft.draft_forward`).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    draft = draft or BUILTIN_DRAFT
    locate(target, draft)  # a misspelt draft is told now, not after the target's load
    q_device = device or (target.device if isinstance(target, LoadedModel) else None)  # None: as p's, the default
    q_dtype = dtype
    if dtype in (None, "", "auto"):  # float16 where this CPU runs it faster (kernels.draft_dtype); p keeps its own
        q_dtype = draft_dtype(_resolve_device(q_device)) or dtype
    if timeout_s is not None and not isinstance(draft, LoadedModel):  # both load even if this request gives up
        first = None if isinstance(target, LoadedModel) else (target or BUILTIN_TARGET, device, dtype, quantize)
        _start_after(first, _request(draft, q_device, q_dtype, None, trust_remote_code), trust_remote_code)
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
        fast = lean_draft.draft_forward(p.lean, q.lean)  # int8 weights where this machine runs them faster
        if fast is not q.lean:
            q = dataclasses.replace(q, lean=fast, memory_bytes=q.memory_bytes + fast.copied_bytes)  # its int8 copy too
    return p, q


def _start_after(target: tuple | None, draft_request: tuple, trust_remote_code: bool) -> None:
    """Start loading the target (name, device, dtype, quantize; None: one already loaded), then the draft once the
    target is in, in the background: both land in the cache for the next caller if this one gives up waiting, but
    one after the other, since each load times its kernels' choices (kernels.py, lean_panels.py): started together,
    each would time its choices while the other's timing loaded the same cores, and choose by that."""
    key, make = draft_request[:2]
    if target is None:  # a target already loaded
        CACHE.start(key, make)
        return
    cpus.fit_threads()  # as load_model does, before the first load times anything
    t_key, t_make = _request(*target, trust_remote_code)[:2]
    CACHE.start(t_key, t_make)

    def after_target():
        try:
            CACHE.get(t_key, t_make)
        except Exception:  # noqa: BLE001 - the target's own caller reports its failure; the draft loads anyway
            pass
        return make()

    CACHE.start(key, after_target)
