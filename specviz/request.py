"""One run's options: `RunRequest`, frozen and keyword-built, holding the one set of defaults a user gets.

The API (`generate`, `stream`, `record_run`), the CLI, the Race tab's handlers and the benchmark each build one and
pass it on; every value is checked once, when it is built (one SpecvizError sentence for the first bad value), and
a recording's settings are the request that ran (`settings`), so a file can only say what really ran.

The defaults are what a user gets without choosing, everywhere: the configuration the benchmark found best for
the built-in pair (config.DEFAULT_DRAFTER, gamma "auto", tree "auto": token trees in the rounds where this
machine's costs say they pay, chains in the others and wherever trees cannot grow). gamma "auto" is resolved here, once, as SpecConfig
resolves it: the auto policy with at most AUTO_GAMMA_MAX guesses a round, so `RunRequest().gamma` is that number
and `.gamma_policy` "auto" (what the page's controls start at), while a caller who names only a gamma gets it
constant. SpecConfig (config.py) is the engine's own configuration, built from a request only (`spec`), with no
defaults of its own: code that measures the paper's plain algorithm names it (drafter "model", a gamma, tree "off").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from specviz.config import (
    CONFIDENCE_THRESHOLD,
    DEFAULT_DRAFTER,
    DEFAULT_GAMMA_SETTING,
    DEFAULT_TREE_SETTING,
    MAX_MATCHING_NGRAM_SIZE,
    PROMPT_LOOKUP_NUM_TOKENS,
    SamplingConfig,
    SpecConfig,
    SpecvizError,
)

MODES = ("spec", "ar")
MODEL_OPTIONS = ("target", "draft", "device", "dtype", "quantize", "tokenizer")  # how the models load, not a run


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """Everything one run is asked to do (the models, how guesses are made and checked, sampling, budget)."""

    # the models: a hub id, a folder, a LoadedModel, or None (the built-in pair, or the deployment's default);
    # target may also be a served target's address (served.py), with tokenizer its tokenizer (hub id or folder)
    target: object = None
    draft: object = None
    mode: str = "spec"  # "spec" (speculative) or "ar" (plain decoding of the target)
    drafter: str = DEFAULT_DRAFTER  # one of config.DRAFTERS (drafters.py)
    gamma: int | str = DEFAULT_GAMMA_SETTING  # 1..16, or "auto": the auto policy, at most AUTO_GAMMA_MAX a round
    gamma_policy: str = "constant"  # constant | heuristic | confidence | auto; gamma is then the start or the most
    confidence: float = CONFIDENCE_THRESHOLD  # the confidence policy's threshold on the draft's top probability
    prompt_lookup_num_tokens: int = PROMPT_LOOKUP_NUM_TOKENS
    max_matching_ngram_size: int = MAX_MATCHING_NGRAM_SIZE
    head: str = ""  # the head drafters' head folder; "" = the built-in target's own head
    tree: int | str = DEFAULT_TREE_SETTING  # token trees: "off", a node budget 1..32 or "auto" (depth at most gamma)
    temperature: float = 0.0  # 0 is greedy
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0  # 1 keeps every token
    max_new_tokens: int = 64
    seed: int = 0
    raw: bool = False  # skip the chat template
    detail: int = 0  # top candidates of p and q per drafted position (the step-through view); 0 off
    relaxed_w: float = 1.0  # below 1: verify against w·p + (1 − w)·q, NOT exact; refused unless allow_lossy
    allow_lossy: bool = False
    device: object = None  # cpu, cuda, cuda:N, mps; None: the best available
    dtype: object = None
    quantize: str | None = None  # "4bit" (NF4) or "8bit" (int8) for the target, with bitsandbytes
    tokenizer: str | None = None
    spec: SpecConfig = field(init=False, repr=False, compare=False)  # the engine's configuration of this request

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpecvizError(f"Unknown mode {self.mode!r}; use 'spec' (speculative) or 'ar' (plain decoding).")
        if not isinstance(self.raw, bool) or not isinstance(self.allow_lossy, bool):
            raise SpecvizError("raw and allow_lossy must be True or False.")
        sampling = SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        cfg = SpecConfig(
            gamma=self.gamma,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
            sampling=sampling,
            detail=self.detail,
            drafter=self.drafter,
            head=self.head,
            gamma_policy=self.gamma_policy,
            confidence=self.confidence,
            prompt_lookup_num_tokens=self.prompt_lookup_num_tokens,
            max_matching_ngram_size=self.max_matching_ngram_size,
            relaxed_w=self.relaxed_w,
            tree=self.tree,
        )
        if cfg.relaxed_w < 1.0 and not self.allow_lossy:
            raise SpecvizError(
                "relaxed_w below 1 makes the output stop following the target (not exact); "
                "pass allow_lossy=True to use it anyway."
            )
        resolved = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "sampling"}
        resolved |= dataclasses.asdict(cfg.sampling)  # numbers as checked: gamma "auto" as what it means, 2.0 as 2 ...
        for name, value in resolved.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "spec", cfg)

    @classmethod
    def of(cls, options: dict, where: str = "this run") -> RunRequest:
        """A request from keyword options (the API's **options); an unknown name gets one sentence."""
        unknown = sorted(set(options) - set(NAMES))
        if unknown:
            raise SpecvizError(f"Unknown option {unknown[0]!r} for {where}; the options are {', '.join(NAMES)}.")
        return cls(**options)

    @staticmethod
    def default(name: str):
        """The default of one option, as a caller who does not name it gets it (gamma: "auto")."""
        return _FIELDS[name].default

    def replace(self, **changes) -> RunRequest:
        """This request with some options changed, checked again."""
        return dataclasses.replace(self, **changes)

    @property
    def label(self) -> str:
        """A short name for how guesses are made: "lookup+model, auto", "model, gamma 3" ..."""
        return self.spec.label

    def settings(self, prompt: str) -> dict:
        """The request as a recording keeps it: flat, the prompt first, a model object by its name."""
        out: dict = {"prompt": prompt}
        for name in NAMES:
            value = getattr(self, name)
            if name in MODEL_OPTIONS:
                if value is None:  # the default pair: the recording's env names the models
                    continue
                value = getattr(value, "name", value)  # a LoadedModel or ServedTarget by its name
                value = value if isinstance(value, (str, int, float, bool)) else str(value)
            if name not in ("mode", "allow_lossy"):  # a race records both modes; lossy runs carry relaxed_w
                out[name] = value
        return out


_FIELDS = {f.name: f for f in dataclasses.fields(RunRequest) if f.init}
NAMES = tuple(_FIELDS)  # every option, in order
