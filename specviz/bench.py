"""The benchmark harness: python -m specviz bench.

For one pair (target p, draft q), a prompt set, temperatures and a list of speculative configurations
(drafter x gamma x gamma policy x token tree), it runs in ONE process, interleaved per prompt after a warm-up run: for each
prompt, every method once, back to back:
  ar         plain autoregressive decoding of p with our engine (engine.autoregressive_decode)
  spec       our speculative decoding, once per configuration (engine.speculative_decode)
  hf_spec    transformers' assisted generation with the same constant gamma (model drafter, constant policy only)
  hf_assist  transformers' assisted generation at its own defaults (20 tokens, confidence 0.4): what a user gets
  hf_lookup  transformers' prompt lookup (prompt_lookup_num_tokens=10, its default n-gram size 2)
  hf_ar      transformers' plain p.model.generate, the reference for our `ar`
Every method is timed the same way: wall clock around one call, prompt already tokenised, prefill included.
Each speedup is a ratio of runs made seconds apart on the same prompt, under the same load.

Per cell it reports tokens/s (median over prompts and repeats), speedups (median of the paired per-prompt
ratios), the acceptance rate (accepted / drafted), the per-token acceptance alpha (accepted / proposals the
target ruled on), tokens per target call, the cost ratio c, the theoretical speedup
(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) and, where measured falls >15% short of it, where the time went.
At temperature 0 every method must give the plain output of its own forward token for token (spec = ar; hf_spec,
hf_assist and hf_lookup = hf_ar); a difference is flagged loudly. ar and hf_ar may run different forwards (lean.py
beside transformers'), which can part on a float32 near-tie: `forwards_agree` says whether they did.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from .api import encode_prompt
from .config import ASSETS, TREE_DRAFTERS, SpecConfig, SpecvizError
from .engine import autoregressive_decode, eos_ids, speculative_decode
from .events import Done
from .models import LoadedModel
from .request import RunRequest
from .tally import Tally
from .theory import expected_speedup
from .translate import needs_translation

log = logging.getLogger("specviz")

PROMPT_DIR = ASSETS / "prompts"
PROMPT_SETS = ("everyday", "stories", "code", "summarise", "grounded")
METHODS = ("ar", "spec", "hf_spec", "hf_assist", "hf_lookup", "hf_ar")
SHARED = ("ar", "hf_assist", "hf_lookup", "hf_ar")  # run once per prompt, whatever the configuration
# the transformers peers run at transformers' own defaults, not specviz's (RunRequest's), even where they agree
HF_LOOKUP_TOKENS = 10  # prompt_lookup_num_tokens
HF_ASSIST_TOKENS, HF_ASSIST_CONFIDENCE = 20, 0.4  # num_assistant_tokens, assistant_confidence_threshold
SHORTFALL = 0.85  # measured below 85% of theory: say where the time went
WARMUP_TOKENS = 8


# --- inputs ---------------------------------------------------------------------------------------


def load_prompts(spec: str, limit: int = 0) -> list[str]:
    """A built-in set by name (everyday, stories, code, summarise, grounded) or a text file: one prompt per
    non-empty line, where a literal \\n stands for a line break (so a prompt can carry a pasted function or text)."""
    path = PROMPT_DIR / f"{spec}.txt" if spec in PROMPT_SETS else Path(spec).expanduser()
    if not path.is_file():
        raise SpecvizError(f"No prompt set {spec!r}: use one of {', '.join(PROMPT_SETS)} or a file path.")
    lines = path.read_text(encoding="utf-8").splitlines()
    prompts = [line.strip().replace("\\n", "\n") for line in lines if line.strip()]
    if not prompts:
        raise SpecvizError(f"The prompt file {path} has no prompts (one per line).")
    return prompts[:limit] if limit and limit > 0 else prompts


def parse_grid(text: str, kind: Callable[[str], float], name: str) -> list:
    try:
        values = [kind(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise SpecvizError(f"--{name} must be a comma-separated list of numbers, like 1,2,4.") from None
    if not values:
        raise SpecvizError(f"--{name} is empty.")
    return list(dict.fromkeys(values))


def machine_info() -> dict:
    """CPU model, GPU, threads and library versions: the facts a reader needs to compare numbers."""
    import transformers

    cpu = platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "vendor_id", "cpu family", "model", "flags"):
                fields.setdefault(key.strip(), value.strip())
            if not line.strip() and fields:
                break  # the first processor tells
    cpu = fields.get("model name", cpu)
    flags = set(fields.get("flags", "").split())
    vector = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    load = None
    with contextlib.suppress(OSError):
        load = Path("/proc/loadavg").read_text().split()[0]
    return {
        "cpu": cpu,
        "cpu_id": f"{fields.get('vendor_id', '?')} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}",
        "cpu_vector": " ".join(vector) or "none of avx2/avx512",
        "cpu_count": os.cpu_count(),
        "load_avg_1min": load,  # the machine may be shared: read the numbers as ratios within one run
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# --- transformers' assisted generation as the peer ------------------------------------------------


class _MapIds(torch.nn.Module):
    """The draft's input embedding, fed target ids: target id -> draft row (unknown -> row 0)."""

    def __init__(self, embed: torch.nn.Module, input_map: torch.Tensor):
        super().__init__()
        self.embed = embed
        self.register_buffer("input_map", input_map, persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(self.input_map[ids.clamp(max=self.input_map.numel() - 1)])


class _FullVocab(torch.nn.Module):
    """The draft's output layer, widened to the target's V with the engine's own mapping (LoadedModel.to_target_logits)."""

    def __init__(self, draft: LoadedModel, V: int):
        super().__init__()
        self.head, self.draft, self.V = draft.model.get_output_embeddings(), draft, V
        self.register_buffer("blocked", draft.blocked_rows, persistent=False)  # rows never proposed, as in our engine

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        z = self.head(h)  # (B, L, N)
        if self.blocked is not None:
            z = z.index_fill(-1, self.blocked, -torch.inf)
        return self.draft.to_target_logits(z.reshape(-1, z.shape[-1]), self.V).view(*z.shape[:-1], self.V)


def hf_assistant(draft: LoadedModel, target: LoadedModel, gamma: int) -> torch.nn.Module:
    """A view of q that transformers' assisted generation accepts, sharing q's weights (q is not modified).

    transformers needs an assistant that reads and writes the target's token ids with the target's vocabulary
    size; specviz's built-in draft has a trimmed vocabulary (row i = target id vocab_map[i]). The view is the
    same architecture built on the meta device, given q's blocks, an input embedding that maps ids and an
    output layer that scatters logits into the target's V (exactly what our engine does). Its own generation
    config fixes gamma: num_assistant_tokens=gamma, schedule "constant", no confidence early stop.

    A draft with another tokenizer is given to transformers as it is (a shallow copy with its own generation
    config): its Universal Assisted Generation translates through text itself (`assist_kwargs`).
    """
    m, V = draft.model, target.vocab_size
    if needs_translation(target, draft):
        view = copy.copy(m)  # the same modules; only the generation config is its own
        view.generation_config = copy.deepcopy(m.generation_config)
        view.generation_config.num_assistant_tokens = gamma
        view.generation_config.num_assistant_tokens_schedule = "constant"
        view.generation_config.assistant_confidence_threshold = 0.0
        return view
    cfg = copy.deepcopy(m.config)
    cfg.vocab_size = V
    prefix = getattr(m, "base_model_prefix", "model")
    try:
        with torch.device("meta"):
            view = type(m)(cfg)
        src, dst = getattr(m, prefix), getattr(view, prefix)
        for name, child in src.named_children():
            setattr(dst, name, child)
        embed = m.get_input_embeddings()
        if draft.input_map is not None:
            embed = _MapIds(embed, draft.input_map)
        view.set_input_embeddings(embed)
        view.set_output_embeddings(_FullVocab(draft, V))
    except (AttributeError, TypeError, ValueError, RuntimeError) as e:
        raise SpecvizError(f"transformers' assisted generation cannot use this draft ({e}).") from None
    if any(t.is_meta for t in list(view.parameters()) + list(view.buffers())):
        raise SpecvizError("transformers' assisted generation cannot use this draft (unmapped weights).")
    view.generation_config = copy.deepcopy(m.generation_config)
    view.generation_config.num_assistant_tokens = gamma
    view.generation_config.num_assistant_tokens_schedule = "constant"
    view.generation_config.assistant_confidence_threshold = 0.0  # draft exactly gamma, like ours
    return view.eval()


def assist_kwargs(target: LoadedModel, draft: LoadedModel, view: torch.nn.Module) -> dict:
    """generate()'s keywords for assisted generation with `view`: with another tokenizer also both tokenizers,
    which makes it transformers' Universal Assisted Generation (greedy; at T > 0 its heterogeneous-vocabulary
    speculative sampling, the token-level intersection)."""
    kw = {"assistant_model": view}
    if needs_translation(target, draft):
        kw.update(tokenizer=target.tokenizer, assistant_tokenizer=draft.tokenizer)
    return kw


# --- one timed run per method ---------------------------------------------------------------------


def run_row(events: list, seconds: float) -> dict:
    """One run of our engine as a row of `measure`: its tokens, the wall clock around the call, its Tally's
    counts (pooled again by `pool`) and, for a served target, its requests, their seconds and how it decided."""
    done = events[-1]
    assert isinstance(done, Done)
    return {
        "tokens": list(done.token_ids),
        "seconds": seconds,
        **Tally.of(events).counts(),
        "requests": done.stats.get("requests", 0),
        "request_s": done.stats.get("request_s", float("nan")),  # nan / "" for a local target
        "verify": done.stats.get("verify", ""),
    }


def pool(rows: pd.DataFrame) -> Tally:
    """The Tally of every run of ours among `rows` (rows of `run_row`), pooled."""
    names = [k for k in Tally().counts() if k in rows.columns]
    return sum((Tally.from_counts(dict(zip(names, r))) for r in rows[names].itertuples(index=False)), Tally())


def _ours(events_fn) -> dict:
    t0 = time.perf_counter()
    events = list(events_fn())
    return run_row(events, time.perf_counter() - t0)


def _hf(target: LoadedModel, ids: list[int], cfg: SpecConfig, **extra) -> dict:
    """transformers' generate on the target: plain, or with `extra` (an assistant model, prompt lookup ...)."""
    s = cfg.sampling
    x = torch.tensor([ids], device=target.device)
    kw = dict(max_new_tokens=cfg.max_new_tokens, eos_token_id=sorted(eos_ids(target)), do_sample=not s.greedy)
    kw["pad_token_id"] = kw["eos_token_id"][0]
    if not s.greedy:
        kw.update(temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p)
    torch.manual_seed(cfg.seed)  # transformers samples from the global generator
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(input_ids=x, attention_mask=torch.ones_like(x), **kw, **extra)
    seconds = time.perf_counter() - t0
    return {"tokens": out[0, len(ids) :].tolist(), "seconds": seconds}


@dataclass(frozen=True)
class Config:
    """One speculative configuration of the grid."""

    drafter: str  # model | lookup | lookup+model
    gamma: int | str  # a number, or "auto"
    policy: str  # constant | heuristic | confidence | auto
    tree: int | str = "off"  # token trees: "off", a node budget, or "auto" (config.SpecConfig.tree)

    @property
    def label(self) -> str:
        g = f"gamma {self.gamma}" if self.policy == "constant" else f"{self.policy} ≤{self.gamma}"
        tree = "" if self.tree == "off" else f", tree {self.tree}"
        return f"{self.drafter}, {'auto' if self.gamma == 'auto' else g}{tree}"

    def request(self, base: RunRequest) -> RunRequest:
        """`base` (the run's other options) with this configuration's drafter, gamma, policy and tree."""
        policy = "auto" if self.gamma == "auto" else self.policy
        return base.replace(mode="spec", drafter=self.drafter, gamma=self.gamma, gamma_policy=policy, tree=self.tree)


def grid(gammas: Sequence, drafters: Sequence[str] = ("model",), policies: Sequence[str] = ("constant",),
         trees: Sequence = ("off",)) -> list:  # fmt: skip
    """Every (drafter, gamma, policy, tree); gamma "auto" takes the auto policy alone, and trees go only to the
    drafters that grow them (config.TREE_DRAFTERS)."""
    out = []
    for d in drafters:
        for g in gammas:
            for pol in ("auto",) if g == "auto" else policies:
                for tree in trees if d in TREE_DRAFTERS else ("off",):
                    if Config(d, g, pol, tree) not in out:
                        out.append(Config(d, g, pol, tree))
    return out


def parse_trees(text: str) -> list:
    """--trees "off,4,8,auto" -> ["off", 4, 8, "auto"] (each checked as SpecConfig checks it)."""
    return list(dict.fromkeys(SpecConfig(tree=v.strip()).tree for v in str(text).split(",") if v.strip())) or ["off"]


def parse_configs(text: str) -> list[Config]:
    """--configs "model:1,model:auto,lookup:auto,lookup+model:2:heuristic,model:auto:tree=8":
    drafter:gamma[:policy][:tree=N] each."""
    out = []
    for item in (x.strip() for x in str(text).split(",") if x.strip()):
        parts = item.split(":")
        tree = "off"
        if len(parts) > 2 and parts[-1].startswith("tree="):
            tree = SpecConfig(tree=parts.pop()[5:]).tree
        if len(parts) not in (2, 3):
            raise SpecvizError(
                f"--configs items look like model:3, lookup:auto, model:6:confidence or model:auto:tree=8, not {item!r}."
            )
        gamma = "auto" if parts[1] == "auto" else parts[1]
        try:
            gamma = gamma if gamma == "auto" else int(gamma)
        except ValueError:
            raise SpecvizError(f"--configs: {parts[1]!r} is not a gamma (a whole number or auto).") from None
        policy = "auto" if gamma == "auto" else (parts[2] if len(parts) == 3 else "constant")
        out.append(Config(parts[0], gamma, policy, tree))
    for c in out:
        c.request(RunRequest())  # one sentence for an unknown drafter or policy, before loading
    return out


def _shared_runners(target: LoadedModel, draft: LoadedModel | None, hf: bool) -> tuple[dict, dict]:
    """The methods run once per prompt: ar and transformers' peers."""
    notes = {}
    runners = {"ar": lambda ids, cfg: _ours(lambda: autoregressive_decode(target, ids, cfg))}
    if not hf:
        return runners, notes
    if draft is not None:
        try:
            default = hf_assistant(draft, target, HF_ASSIST_TOKENS)
            default.generation_config.assistant_confidence_threshold = HF_ASSIST_CONFIDENCE
            assist = assist_kwargs(target, draft, default)
            runners["hf_assist"] = lambda ids, cfg: _hf(target, ids, cfg, **assist)
        except SpecvizError as e:
            notes["hf_assist"] = f"n/a: {e}"
    runners["hf_lookup"] = lambda ids, cfg: _hf(target, ids, cfg, prompt_lookup_num_tokens=HF_LOOKUP_TOKENS)
    runners["hf_ar"] = lambda ids, cfg: _hf(target, ids, cfg)
    return runners, notes


def _config_runners(target: LoadedModel, draft: LoadedModel | None, hf: bool, configs: Sequence[Config]):
    """(config, method, run) for each configuration: ours, and transformers' at the same constant gamma."""
    out, notes = [], {}
    for c in configs:
        out.append((c, "spec", lambda ids, cfg: _ours(lambda: speculative_decode(target, draft, ids, cfg))))
        chain = c.tree == "off"
        if (
            hf
            and draft is not None
            and c.drafter == "model"
            and c.policy == "constant"
            and chain
            and "hf_spec" not in notes
        ):
            try:
                view = hf_assistant(draft, target, int(c.gamma))
            except SpecvizError as e:
                notes["hf_spec"] = f"n/a: {e}"
                continue
            kw = dict(**assist_kwargs(target, draft, view), num_assistant_tokens=int(c.gamma),
                      num_assistant_tokens_schedule="constant")  # fmt: skip
            out.append((c, "hf_spec", lambda ids, cfg, kw=kw: _hf(target, ids, cfg, **kw)))
    return out, notes


def row(temperature: float, c: Config | None, repeat: int, prompt: int, method: str, r: dict) -> dict:
    """One row of `measure`: the cell it belongs to and one timed run `r` (`run_row`, or a peer's tokens and
    seconds); tokens_per_s is over the wall clock around the call, the same for every method."""
    n = len(r["tokens"])
    return {"temperature": temperature, "config": c.label if c else "", "drafter": c and c.drafter,
            "gamma": c and c.gamma, "policy": c and c.policy, "tree": c.tree if c else "", "repeat": repeat,
            "prompt": prompt, "method": method, "new_tokens": n,
            "tokens_per_s": n / r["seconds"] if r["seconds"] > 0 else float("nan"), **r}  # fmt: skip


def measure(
    target: LoadedModel,
    draft: LoadedModel | None,
    prompts: Sequence[str],
    configs: Sequence[Config],
    temperatures: Sequence[float],
    repeats: int = 1,
    *,
    request: RunRequest | None = None,
    hf: bool = True,
    progress: bool = False,
) -> pd.DataFrame:
    """Every timed run: one row per (temperature, repeat, prompt, method[, configuration]). See `summarise_runs`.

    request: the options every run shares (max_new_tokens, top_k, top_p, seed, raw; default RunRequest()'s); each
    configuration sets the drafter, gamma, policy and tree, the grid the temperature, and each prompt its seed."""
    from tqdm.auto import tqdm

    base = request or RunRequest()
    for c in configs:  # validates every value before anything runs
        c.request(base)
    for t in temperatures:
        base.replace(temperature=t)
    if repeats < 1:
        raise SpecvizError("--repeats must be at least 1.")
    if not prompts or not configs:
        raise SpecvizError("There are no prompts or no configurations to run.")
    encoded = [encode_prompt(target, p, base.raw) for p in prompts]
    shared, notes = _shared_runners(target, draft, hf)
    per_config, more = _config_runners(target, draft, hf, configs)
    notes.update(more)
    for note in notes.values():
        log.warning("a transformers peer is skipped: %s", note)

    warm = base.replace(max_new_tokens=min(WARMUP_TOKENS, base.max_new_tokens), temperature=0.0)
    for run in shared.values():  # first calls pay for lazy initialisation (and auto's cost calibration): untimed
        run(encoded[0], warm.replace(mode="ar").spec)
    for c, _, run in per_config:
        run(encoded[0], c.request(warm).spec)

    rows = []
    bar = tqdm(total=len(temperatures) * repeats * len(prompts), desc="bench", unit="prompt", disable=not progress)
    with bar:
        for temperature in temperatures:
            for rep in range(repeats):
                for i, ids in enumerate(encoded):
                    at = base.replace(temperature=temperature, seed=base.seed + 1000 * rep + i)
                    slot = [(None, m, r) for m, r in shared.items()] + per_config
                    for c, method, run in slot:
                        cfg = c.request(at).spec if c else at.replace(mode="ar").spec
                        rows.append(row(temperature, c, rep, i, method, run(ids, cfg)))
                    bar.update(1)
    runs = pd.DataFrame(rows)
    runs.attrs["notes"] = notes
    return runs


RANK_TOP = 4  # the rank histogram's ranks 1 .. RANK_TOP, then "beyond" (drafters.TREE_CHILDREN branches at most)


@torch.inference_mode()
def draft_ranks(target: LoadedModel, draft: LoadedModel, prompt_ids: Sequence[list[int]],
                replies: Sequence[Sequence[int]], top: int = RANK_TOP) -> dict:  # fmt: skip
    """The draft's rank histogram on the target's greedy replies: how often the target's token is the draft's 1st,
    2nd ... choice (ties count against it), teacher-forced: one draft call reads a prompt and the reply the
    target wrote, as a greedy round's draft always continues text the target wrote. It decides which trees are
    worth growing: a runner-up pays only where the target's token is often the draft's 2nd or 3rd choice.
    Returns {"tokens": n, "shares": [rank 1, ..., rank top, beyond]}."""
    from .models import CachedModel

    counts = [0] * (top + 1)
    for ids, reply in zip(prompt_ids, replies):
        if not reply:
            continue
        run = CachedModel(draft, target.vocab_size)
        run.prefill(torch.tensor(ids, device=draft.device))
        logits = run.feed(torch.tensor([*ids[-1:], *reply[:-1]], device=draft.device))  # (R, V): row j -> reply[j]
        want = logits.gather(1, torch.tensor(list(reply), device=logits.device)[:, None])  # (R, 1)
        for r in (logits > want).sum(1).tolist():
            counts[min(r, top)] += 1
    total = sum(counts)
    return {"tokens": total, "shares": [c / total if total else float("nan") for c in counts]}


def ranks_line(ranks: dict) -> str:
    """The rank histogram in one sentence."""
    nth = ("1st", "2nd", "3rd", *(f"{i}th" for i in range(4, len(ranks["shares"]))))
    shares = ", ".join(f"{n} {s:.0%}" for n, s in zip(nth, ranks["shares"][:-1]))
    return (
        f"the target's greedy token is the draft's {shares}, beyond {ranks['shares'][-1]:.0%} "
        f"({ranks['tokens']} tokens of the plain replies, teacher-forced)"
    )


# --- the table ------------------------------------------------------------------------------------


def _paired(a: pd.DataFrame, b: pd.DataFrame) -> float:
    """Median over prompts and repeats of tokens/s of runs `a` over runs `b` in the same interleaved slot."""
    if a.empty or b.empty:
        return float("nan")
    x = a.set_index(["repeat", "prompt"])["tokens_per_s"]
    y = b.set_index(["repeat", "prompt"])["tokens_per_s"]
    return float((x / y).dropna().median())


def _identical(runs: list[pd.DataFrame], ar: pd.DataFrame) -> tuple[bool | None, list[str]]:
    """Greedy cells: does every method give the same tokens as ar on every prompt? Returns (ok, differences)."""
    if ar.empty or ar["temperature"].iloc[0] != 0:
        return None, []
    ref = {(r.repeat, r.prompt): tuple(r.tokens) for r in ar.itertuples()}
    diffs = []
    for frame in runs:
        for r in frame.itertuples():
            toks, want = tuple(r.tokens), ref.get((r.repeat, r.prompt))
            if want is not None and toks != want:
                at = next((k for k, (x, y) in enumerate(zip(toks, want)) if x != y), min(len(toks), len(want)))
                diffs.append(f"prompt {r.prompt} repeat {r.repeat}: {r.method} differs from ar at new token {at}")
    return not diffs, diffs


def _where_time_goes(spec: pd.DataFrame, run: Tally, plain: Tally, gamma: int, c: float) -> dict:
    """Shares of spec's decode time (prefill excluded) and what one verify call cost in plain steps."""
    decode = float((spec["seconds"] - spec["prefill_s"]).sum())
    step = plain.step_s
    draft, verify, rounds = run.draft_s, run.verify_s, run.rounds
    return {
        "draft_share": draft / decode if decode > 0 else float("nan"),
        "verify_share": verify / decode if decode > 0 else float("nan"),
        "other_share": max(decode - draft - verify, 0.0) / decode if decode > 0 else float("nan"),
        "prefill_share": float(spec["prefill_s"].sum() / spec["seconds"].sum()),
        "verify_cost": verify / rounds / step if rounds and step > 0 else float("nan"),  # theory assumes 1
        "draft_per_call": draft / rounds / step if rounds and step > 0 else float("nan"),  # drafting per round, steps
        "draft_cost": draft / rounds / (gamma * c * step) if rounds and c > 0 and step > 0 else float("nan"),
    }


def _note(r: dict) -> str:
    if not r["measured_over_theory"] < SHORTFALL:
        return ""
    return (
        f"{1 - r['measured_over_theory']:.0%} below theory: decode time is draft {r['draft_share']:.0%}, "
        f"verify {r['verify_share']:.0%}, sampling/bookkeeping {r['other_share']:.0%}; one verify call of "
        f"{r['gamma'] + 1} tokens costs {r['verify_cost']:.2f} single-token target steps (theory: 1); "
        f"prefill is {r['prefill_share']:.0%} of spec wall time"
    )


def summarise_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (temperature, configuration) cell from the rows of `measure`."""
    table = []
    for temperature, at_t in runs.groupby("temperature", sort=True):
        shared = {m: at_t[at_t["method"] == m] for m in SHARED}
        ar = shared["ar"]
        plain = pool(ar)
        ar_dec = ar["new_tokens"].sum() / (ar["seconds"] - ar["prefill_s"]).sum()
        for label, cell in at_t[at_t["config"] != ""].groupby("config", sort=False):
            spec, hf_spec = cell[cell["method"] == "spec"], cell[cell["method"] == "hf_spec"]
            first = spec.iloc[0]
            run = pool(spec)  # every count and the acceptance, alpha, tokens per call and c read from it
            a, c = run.alpha, run.c(plain)  # per-token acceptance: what the formula assumes
            spec_dec = spec["new_tokens"].sum() / (spec["seconds"] - spec["prefill_s"]).sum()
            constant = first["policy"] == "constant"
            gamma = int(first["gamma"]) if first["gamma"] != "auto" else first["gamma"]
            theory = expected_speedup(a, gamma, c) if constant and math.isfinite(c) else float("nan")
            peers = pd.concat([shared["hf_assist"], shared["hf_lookup"]])
            best_peer = peers.groupby(["repeat", "prompt"], as_index=False)["tokens_per_s"].max()
            # each method against plain decoding on its own forward: ours (maybe lean.py's) against ar,
            # transformers' against its own generate; the two forwards may part on a float32 near-tie
            ok, diffs = _identical([spec], ar)
            ok_hf, diffs_hf = _identical([hf_spec, shared["hf_assist"], shared["hf_lookup"]], shared["hf_ar"])
            ok, diffs = (ok if ok_hf is None else ok_hf if ok is None else ok and ok_hf), diffs + diffs_hf
            agree = _identical([shared["hf_ar"]], ar)[0] if len(shared["hf_ar"]) else None
            row = {
                "temperature": temperature,
                "config": label,
                "drafter": first["drafter"],
                "gamma": gamma,
                "policy": "auto" if gamma == "auto" else first["policy"],
                "tree": str(first.get("tree", "off") or "off"),
                "prompts": spec["prompt"].nunique(),
                "repeats": spec["repeat"].nunique(),
                "ar_tok_s": float(ar["tokens_per_s"].median()),
                "spec_tok_s": float(spec["tokens_per_s"].median()),
                **{
                    f"{m}_tok_s": float(shared[m]["tokens_per_s"].median()) if len(shared[m]) else float("nan")
                    for m in SHARED[1:]
                },  # fmt: skip
                "hf_spec_tok_s": float(hf_spec["tokens_per_s"].median()) if len(hf_spec) else float("nan"),
                "speedup_vs_ar": _paired(spec, ar),
                "speedup_vs_hf": _paired(spec, hf_spec),
                "speedup_vs_best_peer": _paired(spec, best_peer),  # the faster of hf_assist and hf_lookup
                "ar_vs_hf_ar": _paired(ar, shared["hf_ar"]),
                "hf_assist_vs_ar": _paired(shared["hf_assist"], ar),
                "hf_lookup_vs_ar": _paired(shared["hf_lookup"], ar),
                "acceptance": run.acceptance_rate,
                "alpha": a,
                "tokens_per_call": run.tokens_per_call,
                "drafted_per_call": run.drafted_per_call,
                "c": c,
                "decode_speedup": float(spec_dec / ar_dec),
                "theory": theory,
                "measured_over_theory": float(spec_dec / ar_dec / theory) if theory > 0 else float("nan"),
                **_where_time_goes(spec, run, plain, gamma if constant else 1, c),
                "identical": ok,
                "differences": "; ".join(diffs),
                "forwards_agree": agree,  # ar's tokens == transformers' generate's (both plain, greedy)
                "verify": first["verify"],  # a served target: greedy | exact | approximate: top-20
                "ar_request_share": float(ar["request_s"].sum() / ar["seconds"].sum()),
                "spec_request_share": float(spec["request_s"].sum() / spec["seconds"].sum()),
            }
            row["note"] = _note(row) if constant and row["tree"] == "off" else ""
            table.append(row)
    table = pd.DataFrame(table)
    return _beside_best_chain(table, runs) if len(table) else table


def _beside_best_chain(table: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Tree rows beside the best chain of their temperature (the fastest chain configuration, same draft, same
    prompts): paired speedup, tokens per call, and in the note why, from the measured verify cost per call."""
    table = table.copy()
    table["best_chain"], table["vs_best_chain"], table["tokens_per_call_vs_best_chain"] = "", math.nan, math.nan
    for t, cell in table.groupby("temperature"):
        chains = cell[cell["tree"] == "off"]
        if chains.empty:
            continue
        best = chains.loc[chains["speedup_vs_ar"].idxmax()]
        at_t = runs[(runs["temperature"] == t) & (runs["method"] == "spec")]
        best_runs = at_t[at_t["config"] == best["config"]]
        for i, row in cell[cell["tree"] != "off"].iterrows():
            ratio = _paired(at_t[at_t["config"] == row["config"]], best_runs)
            tpc = row["tokens_per_call"] / best["tokens_per_call"]
            table.loc[i, ["best_chain", "vs_best_chain", "tokens_per_call_vs_best_chain"]] = [
                best["config"],
                ratio,
                tpc,
            ]
            extra = row["drafted_per_call"] - best["drafted_per_call"]  # positions more than the chain's per verify
            per_node = (row["verify_cost"] - best["verify_cost"]) / extra if abs(extra) >= 0.5 else math.nan
            table.loc[i, "note"] = (
                f"{row['tokens_per_call']:.2f} tokens per call, {tpc - 1:+.0%} against the best chain "
                f"({best['config']}: {best['tokens_per_call']:.2f}); a verify of {row['drafted_per_call'] + 1:.1f} "
                f"positions costs {row['verify_cost']:.2f} plain steps (the chain's of "
                f"{best['drafted_per_call'] + 1:.1f}: {best['verify_cost']:.2f}"
                + (f", {per_node:+.3f} a node" if math.isfinite(per_node) else "")
                + f") and drafting {row['draft_per_call']:.2f} (the chain's: {best['draft_per_call']:.2f}), "
                f"so it runs {ratio:.2f}x the chain"
            )
    return table


def run_bench(
    target: LoadedModel,
    draft: LoadedModel | None,
    prompts: Sequence[str],
    gammas: Sequence,
    temperatures: Sequence[float],
    max_new_tokens: int | None = None,
    repeats: int = 1,
    *,
    drafters: Sequence[str] = ("model",),
    policies: Sequence[str] = ("constant",),
    trees: Sequence = ("off",),
    hf: bool = True,
    progress: bool = False,
    **options,
) -> pd.DataFrame:
    """Run the grid and return the per-cell table. options: a run's options every run shares (top_k, top_p, seed,
    raw; request.RunRequest's, as is max_new_tokens, whose default is RunRequest's); hf, progress as in `measure`.

    Cells: every drafter x gamma (a number or "auto") x policy. Columns: temperature, config, drafter, gamma,
    policy, prompts, repeats, {ar,spec,hf_spec,hf_assist,hf_lookup,hf_ar}_tok_s, speedup_vs_ar, speedup_vs_hf,
    speedup_vs_best_peer, ar_vs_hf_ar, acceptance, alpha, tokens_per_call, drafted_per_call, c, decode_speedup,
    theory, measured_over_theory, draft_share, verify_share, other_share, prefill_share, verify_cost, draft_per_call,
    draft_cost, identical, differences, note, tree, best_chain, vs_best_chain, tokens_per_call_vs_best_chain
    (tree rows beside the fastest chain of their temperature).
    """
    configs = grid(gammas, drafters, policies, trees)
    if max_new_tokens is not None:
        options["max_new_tokens"] = max_new_tokens
    request = RunRequest.of(options, "run_bench")
    runs = measure(target, draft, prompts, configs, temperatures, repeats, request=request, hf=hf, progress=progress)
    table = summarise_runs(runs)
    for d in table.loc[table["identical"] == False, "differences"]:  # noqa: E712  (None means not greedy)
        log.warning("GREEDY OUTPUTS DIFFER: %s", d)
    return table


# --- output ---------------------------------------------------------------------------------------

SHOW = {
    "temperature": "T",
    "config": "configuration",
    "ar_tok_s": "ar tok/s",
    "spec_tok_s": "spec tok/s",
    "hf_spec_tok_s": "hf_spec tok/s",
    "speedup_vs_ar": "spec/ar",
    "speedup_vs_hf": "spec/hf_spec",
    "speedup_vs_best_peer": "spec/best hf",
    "ar_vs_hf_ar": "ar/hf_ar",
    "acceptance": "accepted/drafted",
    "alpha": "alpha",
    "tokens_per_call": "tok/call",
    "drafted_per_call": "nodes/call",
    "verify_cost": "verify/step",
    "vs_best_chain": "vs best chain",
    "c": "c",
    "theory": "theory",
    "measured_over_theory": "meas/theory",
    "identical": "identical",
}
SHOW_SERVED = {
    "verify": "served verify",
    "ar_request_share": "ar in requests",
    "spec_request_share": "spec in requests",
}


def format_table(table: pd.DataFrame) -> str:
    show = {**SHOW, **SHOW_SERVED} if (table["verify"] != "").any() else SHOW  # a served target's row
    shown = table[list(show)].rename(columns=show).copy()
    shown["identical"] = shown["identical"].map({True: "yes", False: "NO", None: "n/a (sampled)"})
    return shown.to_string(index=False, float_format=lambda v: f"{v:.2f}", na_rep="n/a")


COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")  # Okabe-Ito: one per temperature


def _figures(table: pd.DataFrame) -> dict:
    """Speedup and acceptance per configuration: one colour per temperature; transformers' peers as lines."""
    import plotly.graph_objects as go

    speed, accept = go.Figure(), go.Figure()
    for i, (t, cell) in enumerate(table.groupby("temperature")):
        colour = COLOURS[i % len(COLOURS)]
        speed.add_bar(x=cell["config"], y=cell["speedup_vs_ar"], name=f"specviz / plain, T={t:g}", marker_color=colour)
        for col, name, dash in (("hf_assist_vs_ar", "transformers assisted (defaults)", "dash"),
                                ("hf_lookup_vs_ar", "transformers prompt lookup", "dot")):  # fmt: skip
            v = cell[col].median()
            if pd.notna(v):
                speed.add_hline(y=v, line={"color": colour, "dash": dash, "width": 1.5},
                                annotation_text=f"{name}, T={t:g}: {v:.2f}x")  # fmt: skip
        accept.add_bar(x=cell["config"], y=cell["alpha"], name=f"alpha (per token), T={t:g}", marker_color=colour)
        accept.add_bar(x=cell["config"], y=cell["acceptance"], name=f"accepted / drafted, T={t:g}",
                       marker_color=colour, opacity=0.45)  # fmt: skip
    speed.add_hline(y=1.0, line={"color": "grey", "width": 1})
    speed.update_layout(title="Speedup over plain decoding by configuration", yaxis_title="speedup", barmode="group")
    accept.update_layout(title="Acceptance by configuration: per token (alpha) and of all drafted tokens",
                         yaxis_title="acceptance", yaxis={"range": [0, 1]}, barmode="group")  # fmt: skip
    return {"speedup": speed, "acceptance": accept}


def write_plots(table: pd.DataFrame, folder: str | Path) -> tuple[list[str], str | None]:
    """HTML always; PNG where kaleido finds a Chrome (Debian's chromium is tried). Returns (files, note)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files, note = [], None
    if not os.environ.get("BROWSER_PATH"):
        for chrome in ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"):
            if Path(chrome).is_file():
                os.environ["BROWSER_PATH"] = chrome  # where kaleido 1.x (choreographer) looks for a browser
                break
    for name in ("kaleido", "choreographer", "logistro"):  # their progress chatter is not ours to print
        logging.getLogger(name).setLevel(logging.WARNING)
    for name, fig in _figures(table).items():
        html = folder / f"{name}.html"
        fig.write_html(html, include_plotlyjs=True)  # self-contained: opens offline
        files.append(str(html))
        if note is None and os.environ.get("SPECVIZ_BENCH_PNG", "1") != "0":
            try:
                png = folder / f"{name}.png"
                fig.write_image(png, width=900, height=500)
                files.append(str(png))
            except Exception as e:  # kaleido raises many types when no browser runs; HTML is enough then
                note = f"PNG export unavailable ({type(e).__name__}: {str(e).splitlines()[0][:120]}); HTML written."
    return files, note


def _ranks_of(
    target: LoadedModel, draft: LoadedModel | None, prompts: Sequence[str], runs: pd.DataFrame
) -> dict | None:
    """The draft's rank histogram on the plain greedy replies of this run (None without a draft of the target's
    tokenizer or a greedy plain run)."""
    ar = runs[(runs["method"] == "ar") & (runs["temperature"] == 0) & (runs["repeat"] == 0)].sort_values("prompt")
    if draft is None or ar.empty or needs_translation(target, draft):
        return None
    ids = [encode_prompt(target, prompts[i]) for i in ar["prompt"]]
    return draft_ranks(target, draft, ids, [list(t) for t in ar["tokens"]])


def main(args) -> dict:
    """The `bench` subcommand; prints the table (unless --json) and returns what --json prints."""
    from .api import load_for
    from .models import pair_backend, pair_dtypes
    from .served import is_url

    prompts = load_prompts(args.prompts, args.limit)
    gammas = parse_grid(args.gammas, lambda v: "auto" if v.strip() == "auto" else int(v), "gammas")
    temperatures = parse_grid(args.temperatures, float, "temperatures")
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    trees = parse_trees(getattr(args, "trees", "off"))
    configs = parse_configs(args.configs) if getattr(args, "configs", None) else grid(gammas, drafters, policies, trees)
    given = {k: getattr(args, k, None) for k in ("target", "draft", "device", "dtype", "quantize", "tokenizer",
                                                 "max_new_tokens", "seed")}  # fmt: skip
    request = RunRequest.of({k: v for k, v in given.items() if v is not None}, "bench")  # unset: RunRequest's
    # both models, whatever the configurations (the peers need the draft); a served target: p scores on its server,
    # both lanes through the same endpoint, and no transformers peers
    p, q = load_for(request.replace(drafter="model"))
    hf = not args.no_hf and not is_url(args.target)
    runs = measure(p, q, prompts, configs, temperatures, args.repeats, request=request, hf=hf, progress=True)
    table = summarise_runs(runs)
    ranks = _ranks_of(p, q, prompts, runs) if any(c.tree != "off" for c in configs) else None
    facts = machine_info()
    facts.update(target=p.name, draft=q.name, dtypes=pair_dtypes(p, q), backend=pair_backend(p, q), prompts=args.prompts, n_prompts=len(prompts),
                 max_new_tokens=request.max_new_tokens, command="python -m specviz " + " ".join(sys.argv[1:]))  # fmt: skip
    warnings = [f"GREEDY OUTPUTS DIFFER: {d}" for d in table.loc[table["identical"] == False, "differences"]]  # noqa: E712
    warnings += [f"{m}: {n}" for m, n in runs.attrs.get("notes", {}).items()]
    files = []
    if args.csv:
        table.to_csv(args.csv, index=False)
        files.append(args.csv)
    if args.plots:
        plot_files, plot_note = write_plots(table, args.plots)
        files += plot_files
        if plot_note:
            warnings.append(plot_note)
    records = json.loads(table.to_json(orient="records"))
    out = {"machine": facts, "table": records, "warnings": warnings, "files": files, "ranks": ranks}
    if args.json_out:
        run_rows = json.loads(runs.drop(columns=["tokens"]).to_json(orient="records"))
        Path(args.json_out).write_text(json.dumps({**out, "runs": run_rows}, indent=2))
        files.append(args.json_out)
    if not args.json:
        print(f"{p.name} + {q.name} ({facts['dtypes']}) · {len(prompts)} prompts from {args.prompts} · "
              f"{request.max_new_tokens} new tokens")  # fmt: skip
        print(f"{facts['cpu']} ({facts['cpu_id']}; {facts['cpu_vector']}) · GPU {facts['gpu']} · torch {facts['torch']} "
              f"({facts['torch_threads']} threads) · transformers {facts['transformers']}")  # fmt: skip
        print(f"On this CPU: {facts['backend']}")
        print(format_table(table))
        peers = table.groupby("temperature")[["hf_assist_vs_ar", "hf_lookup_vs_ar"]].median()
        for t, r in peers.dropna(how="all").iterrows():  # none with --no-hf
            print(f"  T={t:g}: transformers assisted (defaults) {r['hf_assist_vs_ar']:.2f}x plain, "
                  f"transformers prompt lookup {r['hf_lookup_vs_ar']:.2f}x plain")  # fmt: skip
        for _, r in table[table["note"] != ""].iterrows():
            print(f"  T={r['temperature']:g} {r['config']}: {r['note']}")
        if ranks:
            print(f"  Ranks: {ranks_line(ranks)}")
        for w in warnings:
            print(("!" * 8 + " " if "DIFFER" in w else "note: ") + w, file=sys.stderr)
        for f in files:
            print(f"wrote {f}")
    return out
