"""What specviz knows of a target p behind a server: its tokenizer, vocabulary and EOS here, its scores there.

`ServedTarget` is what the engine reads where it would read a LoadedModel (backends.open_run gives its run);
`load_tokenizer` and `check_tokenizer` are the connection's checks that need no request beyond /tokenize
(served.connect makes them all, once per connection). `eos_ids` reads the stop tokens of either kind of target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specviz.backends.served.http import Client
from specviz.config import SamplingConfig, SpecvizError

if TYPE_CHECKING:
    from specviz.models.loaded import LoadedModel

APPROX_TOP = 20  # vLLM's default --max-logprobs: what any vLLM server gives per position
PROBE_TEXT = "Speculative decoding checks 4 guesses at once: déjà vu, naïve café!"


@dataclass(eq=False)
class ServedTarget:
    """The target p behind a server: its tokenizer and vocabulary here, its scores there (see served.connect)."""

    name: str  # the address as the caller gave it
    client: Client = field(repr=False)
    model: str  # the server's model name (what every request names)
    tokenizer: object = field(repr=False)
    vocab_size: int
    eos: frozenset[int]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    quantize: str | None = None
    memory_bytes: int = 0  # nothing of it is held here
    max_model_len: int = 0
    n_params: int = 0  # not known here: the weights live on the server
    engine: str = "vllm"  # or llamacpp.ENGINE: llama-cpp-python's server, which takes text (llamacpp.py)

    @property
    def precision(self) -> str:
        """How its weights are held, in words (LoadedModel.precision's counterpart): the server's business."""
        return "served"

    @property
    def url(self) -> str:
        return self.client.base

    def verify_mode(self, s: SamplingConfig) -> str:
        """ "greedy", "exact" (T = 1, no filter) or "approximate: top-20": how this target verifies under `s`;
        one sentence where it cannot (llama-cpp-python's server at T > 0, llamacpp.py)."""
        if s.greedy:
            return "greedy"
        if self.engine != "vllm":
            raise SpecvizError(
                f"The server at {self.url} ({self.engine}) names tokens by their text, which verifies greedy "
                "decoding exactly but not sampling; use temperature 0 here, or a vLLM server."
            )
        if s.temperature == 1.0 and s.top_k == 0 and s.top_p >= 1.0:
            return "exact"
        return f"approximate: top-{APPROX_TOP}"


def eos_ids(lm: LoadedModel | ServedTarget) -> frozenset[int]:
    if isinstance(lm, ServedTarget):  # read from its tokenizer's config when it connected
        return lm.eos
    ids = set()
    for src in (getattr(lm.model, "generation_config", None), lm.model.config, lm.tokenizer):
        e = getattr(src, "eos_token_id", None)
        ids.update(e if isinstance(e, (list, tuple)) else [e] if e is not None else [])
    return frozenset(int(i) for i in ids)


def missing(t: ServedTarget, what: str) -> SpecvizError:
    return SpecvizError(f"The server at {t.url} sent a reply without {what}; specviz needs vLLM's /v1/completions.")


def load_tokenizer(source: str, model: str, named: bool):
    """(tokenizer, vocabulary size, EOS ids) of p from a hub id or folder; one sentence when it is not here."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from specviz.models.hub import hub_reachable, resolve_source

    try:
        where = resolve_source(source)
        cache_only = not Path(where).is_dir() and not hub_reachable()
        tok = AutoTokenizer.from_pretrained(where, local_files_only=cache_only)
    except Exception:
        hint = "" if named else " (name a local folder that holds it with --tokenizer / tokenizer=)"
        raise SpecvizError(
            f"The tokenizer for the served model {model}, {source}, is not available here{hint}."
        ) from None
    eos, vocab_size = set(), len(tok)
    if tok.eos_token_id is not None:
        eos.add(int(tok.eos_token_id))
    for load in (AutoConfig.from_pretrained, GenerationConfig.from_pretrained):
        try:
            cfg = load(where, local_files_only=cache_only)
        except Exception:
            continue
        e = getattr(cfg, "eos_token_id", None)
        eos.update(int(i) for i in (e if isinstance(e, (list, tuple)) else [e] if e is not None else []))
        vocab_size = max(vocab_size, int(getattr(cfg, "vocab_size", 0) or 0))
    return tok, vocab_size, frozenset(eos)


def check_tokenizer(t: ServedTarget, source: str, theirs) -> None:
    """The tokenizer here must split a probe text as the server's own tokenizer did (`theirs`: the token ids its
    tokenize endpoint gave for PROBE_TEXT)."""
    if not isinstance(theirs, list):
        raise missing(t, "the token ids of /tokenize")
    ours = t.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    if not same_tokens(list(map(int, theirs)), list(ours), t.tokenizer):
        raise SpecvizError(
            f"The tokenizer {source} splits text differently from the server's model {t.model}; "
            "name the model's own tokenizer."
        )


def same_tokens(theirs: list[int], ours: list[int], tok) -> bool:
    """Whether the server split a text as the tokenizer here does (a beginning-of-text token it adds aside:
    llama-cpp-python's tokenize endpoint adds one where the model's GGUF says so)."""
    bos = getattr(tok, "bos_token_id", None)
    if theirs[:1] != ours[:1] and bos is not None and theirs[:1] == [bos]:
        theirs = theirs[1:]
    return theirs == ours
