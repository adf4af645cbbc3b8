"""The deploy card: what a pair check's advice reads as in four engines (vLLM, SGLang, llama.cpp, transformers).

The check measures one method (the drafter: model, lookup or lookup+model), chains of gamma guesses, greedy, and
advises the best gamma (pairs.report.PairReport.best_gamma) and whether trees pay (tree_advice). Each engine gets
the settings that run the same method with the same number of speculative tokens, as text a user can paste, and
one sentence for each of its own constraints that bites on this pair: a vocabulary it must share, a method it
lacks, how it drafts at a temperature above 0. Every option name was checked against the engine's source named in
ENGINE_SOURCES; tests/test_deploy_card.py parses each engine's lines against those names (and vLLM's JSON against
vLLM's own SpeculativeConfig).

A draft with a trimmed vocabulary (the built-in one keeps 21,513 of the target's 49,152 output rows) loads in no
engine as it is: `specviz export-draft FOLDER` (pairs.export) writes it with the target's full vocabulary, and the
card names that folder.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import asdict, dataclass

from specviz.config import BUILTIN_DRAFT, BUILTIN_TARGET, MAX_MATCHING_NGRAM_SIZE
from specviz.pairs.report import PairReport

# Where each engine's option names were read (one version each; a later release may rename them)
ENGINE_SOURCES = {
    "vLLM": "vLLM 0.32.0, vllm/config/speculative.py (SpeculativeConfig)",
    "SGLang": "SGLang main at fc6d465, docs/advanced_features/speculative_decoding.md (server_args' flags)",
    "llama.cpp": "llama.cpp master at 145b628, common/arg.cpp (llama-server's options)",
    "transformers": "transformers 5.25.0, GenerationConfig and GenerationMixin.generate",
}
# The built-in pair's cards that were run on a real engine beside the check (benchmarks/check_vs_vllm.py)
PROVEN = {
    "model": "vLLM 0.32.0's CPU server ran this card with the exported draft beside the check "
    "(benchmarks/check_vs_vllm.py; the numbers in docs/performance.md)",
    "lookup": "vLLM 0.32.0's CPU server ran this card (ngram) beside the check "
    "(benchmarks/check_vs_vllm.py --method ngram; the numbers in docs/performance.md)",
}
EXPORTED_DRAFT = "./specviz-draft"  # the folder the card tells `specviz export-draft` to write


@dataclass(frozen=True)
class EngineCard:
    """One engine's settings for the pair: `text` to paste (`language` says how to highlight it), `notes` one
    sentence per constraint that bites, `runs` False where the engine cannot run what the check measured."""

    engine: str
    checked: str  # the source and version the option names were read from
    language: str  # "shell" or "python"
    text: str
    notes: tuple[str, ...] = ()
    runs: bool = True


@dataclass(frozen=True)
class DeployCard:
    method: str  # the check's drafter: model | lookup | lookup+model
    gamma: int  # the check's best gamma: the number of speculative tokens a round
    headline: str  # one sentence: what the card reproduces, and whether the check advises it
    engines: tuple[EngineCard, ...]
    prepare: str = ""  # a command to run first (the trimmed draft exported), or ""
    proven: str = ""  # where this card was run on a real engine and compared with the check, or ""
    expect: str = ""  # what an engine's own counters should read running the card greedily on prompts like the check's

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """The card for the terminal: the headline, then each engine's lines and notes."""
        lines = [f"deploy      {self.headline}"]
        if self.prepare:
            lines.append(f"  first:    {self.prepare}")
        if self.expect:
            lines.append(f"  expect:   {self.expect}")
        if self.proven:
            lines.append(f"  proven:   {self.proven}")
        for e in self.engines:
            lines.append(
                f"  {e.engine} (checked against {e.checked}){'' if e.runs else ': cannot run this as checked'}"
            )
            lines += [f"    {x}" for x in e.text.splitlines()]
            lines += [f"    - {n}" for n in e.notes]
        return "\n".join(lines)


def _paths(report: PairReport) -> tuple[str, str, str]:
    """(target, draft, a command to run first): the built-in target as its converted folder, a trimmed draft as
    the folder `specviz export-draft` writes."""
    target = report.target
    if report.served:  # the check reached it by address: the engine needs the model itself
        target = "TARGET"
    elif target == BUILTIN_TARGET:
        from specviz.models.builtin import target_dir

        target = str(target_dir())
    draft, prepare = report.draft, ""
    if report.draft_trimmed:
        draft = EXPORTED_DRAFT
        named = "" if report.draft == BUILTIN_DRAFT else f" --draft {shlex.quote(report.draft)}"
        prepare = f"specviz export-draft {EXPORTED_DRAFT}{named}   (the draft with the target's full vocabulary)"
    if report.served:
        prepare = "; ".join(x for x in (prepare, f"TARGET: the model the server at {report.served} runs") if x)
    return target, draft, prepare


def with_card(report: PairReport) -> PairReport:
    """The report with its deploy card (PairReport.deploy)."""
    return dataclasses.replace(report, deploy=deploy_card(report))


def deploy_card(report: PairReport) -> DeployCard | None:
    """The card for a check's report; None where the check measured nothing (an incompatible pair)."""
    if report.best_gamma is None or report.acceptance is None:
        return None
    k, method = report.best_gamma, report.drafter
    target, draft, prepare = _paths(report)
    other_tokenizer = bool(report.translation)
    vocab_differs = report.target_vocab_rows != report.draft_vocab_rows and not report.draft_trimmed
    advice = "the check advises it" if report.verdict == "compatible" else "the check advises plain decoding here"
    headline = (
        f"{method} drafter, {k} speculative token{'s' if k != 1 else ''} a round, chains, greedy as measured "
        f"({report.best_speedup:.2f}x "
        f"expected here; {advice})"
    )
    ctx = _Pair(target, draft, method, k, other_tokenizer, vocab_differs, report)
    engines = (_vllm(ctx), _sglang(ctx), _llamacpp(ctx), _transformers(ctx))
    proven = ""
    if report.target == BUILTIN_TARGET and report.draft == BUILTIN_DRAFT and method in PROVEN:
        proven = PROVEN[method]
    acc = report.acceptance
    shares = ", ".join(f"{x:.2f}" for x in acc.kept_shares(k))
    expect = (
        f"greedy, on prompts like the check's, about {acc.tokens_per_round(k):.2f} tokens a drafting round (vLLM's "
        f"mean acceptance length) and the guess at position 1..{k} kept in {shares} of rounds (vLLM's per-position "
        "acceptance rate)"
    )
    return DeployCard(
        method=method, gamma=k, headline=headline, engines=engines, prepare=prepare, proven=proven, expect=expect
    )


@dataclass(frozen=True)
class _Pair:
    target: str
    draft: str
    method: str
    k: int
    other_tokenizer: bool  # the draft's tokenizer is not the target's: specviz drafts through text (translate.py)
    vocab_differs: bool  # same tokenizer, output layers of different sizes (padding)
    report: PairReport

    @property
    def lookup(self) -> bool:
        return self.method == "lookup"

    @property
    def trees_pay(self) -> bool:
        """Whether a measured tree beat the best chain (the check's tree advice)."""
        best = max(self.report.trees, key=lambda t: t.speedup, default=None)
        return best is not None and best.speedup > (self.report.best_speedup or 0.0)


def _q(s: str) -> str:
    return shlex.quote(s)


def _temperature_note(engine: str, how: str) -> str:
    return f"The check measured greedy decoding; at a temperature above 0 {engine} {how}."


def _vllm(c: _Pair) -> EngineCard:
    notes, runs = [], True
    if c.lookup:
        spec = {
            "method": "ngram",
            "num_speculative_tokens": c.k,
            "prompt_lookup_max": MAX_MATCHING_NGRAM_SIZE,
            "prompt_lookup_min": 1,
        }
    else:
        spec = {"method": "draft_model", "model": c.draft, "num_speculative_tokens": c.k}
        if c.other_tokenizer:
            spec["use_heterogeneous_vocab"] = True
            notes.append(
                "The draft has another tokenizer: vLLM drafts over the tokens the two vocabularies share "
                "(use_heterogeneous_vocab), not through text as specviz does, so its acceptance can differ from the check's."
            )
        elif c.vocab_differs:
            runs = False
            notes.append(
                f"vLLM's draft_model needs equal vocabulary sizes and these differ ({c.report.target_vocab_rows:,} "
                f"and {c.report.draft_vocab_rows:,} rows): it refuses the pair at start."
            )
        if c.method == "lookup+model":
            notes.append(
                "vLLM has no lookup-then-model drafter: this runs the draft model alone (ngram is the lookup part alone)."
            )
        notes.append(
            _temperature_note(
                "vLLM's draft_model",
                'drafts by argmax (draft_sample_method "greedy", its default); add '
                '"draft_sample_method": "probabilistic" to sample q as specviz does',
            )
        )
    if c.trees_pay:
        notes.append("vLLM grows trees for EAGLE heads only: a draft model or ngram runs chains there.")
    text = f"vllm serve {_q(c.target)} \\\n  --speculative-config {_q(json.dumps(spec))}"
    return EngineCard("vLLM", ENGINE_SOURCES["vLLM"], "shell", text, tuple(notes), runs)


def _sglang(c: _Pair) -> EngineCard:
    notes, runs = [], True
    head = f"python -m sglang.launch_server --model-path {_q(c.target)}"
    if c.lookup:
        flags = [
            "--speculative-algorithm NGRAM",
            f"--speculative-num-draft-tokens {c.k + 1}",
            "--speculative-ngram-min-match-window-size 1",
            f"--speculative-ngram-max-match-window-size {MAX_MATCHING_NGRAM_SIZE}",
            "--speculative-ngram-max-bfs-breadth 1",
        ]
        notes.append("SGLang's NGRAM method runs on CUDA only.")
    else:
        flags = [
            "--speculative-algorithm STANDALONE",
            f"--speculative-draft-model-path {_q(c.draft)}",
            f"--speculative-num-steps {c.k}",
            "--speculative-eagle-topk 1",
            f"--speculative-num-draft-tokens {c.k + 1}",
        ]
        if c.other_tokenizer:
            runs = False
            notes.append("SGLang's STANDALONE draft must share the target's tokenizer; this draft has another.")
        if c.method == "lookup+model":
            notes.append("SGLang has no lookup-then-model drafter: this runs the draft model alone.")
        if c.trees_pay:
            notes.append(
                "A tree paid in the check: SGLang grows one with --speculative-eagle-topk above 1 and "
                "--speculative-num-draft-tokens the tree's size, which the check did not measure in SGLang's form."
            )
    text = head + " \\\n  " + " \\\n  ".join(flags)
    return EngineCard("SGLang", ENGINE_SOURCES["SGLang"], "shell", text, tuple(notes), runs)


def _llamacpp(c: _Pair) -> EngineCard:
    notes, runs = [], True
    if c.lookup:
        runs = False
        text = f"llama-server -m TARGET.gguf --draft-max {c.k}"
        notes.append(
            "llama-server drafts with a draft model (-md) only; its prompt lookup is the separate llama-lookup "
            "program, so the check's lookup drafter has no server setting."
        )
    else:
        text = f"llama-server -m TARGET.gguf -md DRAFT.gguf \\\n  --draft-max {c.k} --draft-min 0 --draft-p-min 0.0"
        notes.append(
            f"llama.cpp reads GGUF files: convert the target ({c.target}) and the draft ({c.draft}) with llama.cpp's "
            "convert_hf_to_gguf.py first."
        )
        notes.append(
            "--draft-p-min 0.0 drafts all --draft-max tokens each round as the check did; llama-server's default cut "
            "stops at the first guess the draft is unsure of."
        )
        if c.other_tokenizer or c.vocab_differs:
            notes.append(
                "llama.cpp requires the draft's vocabulary to match the target's (type, special tokens, and sizes "
                "within 128); --spec-replace TARGET DRAFT translates given strings only."
            )
            runs = not c.other_tokenizer
        if c.method == "lookup+model":
            notes.append("llama-server has no lookup-then-model drafter: this runs the draft model alone.")
        notes.append(
            _temperature_note(
                "llama.cpp",
                "still drafts the draft's most likely token and keeps it where the target's sampled token equals it "
                "(with probability p of that token, not specviz's min(1, p/q) of a sampled guess), so its acceptance "
                "can differ from the check's",
            )
        )
    return EngineCard("llama.cpp", ENGINE_SOURCES["llama.cpp"], "shell", text, tuple(notes), runs)


def transformers_kwargs(c: _Pair) -> dict:
    """The keywords for transformers' generate (model objects by name: assistant_model, tokenizers)."""
    if c.lookup:
        return {"prompt_lookup_num_tokens": c.k, "max_matching_ngram_size": MAX_MATCHING_NGRAM_SIZE}
    kw = {
        "assistant_model": "draft",
        "num_assistant_tokens": c.k,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    if c.other_tokenizer:
        kw |= {"tokenizer": "tokenizer", "assistant_tokenizer": "assistant_tokenizer"}
    return kw


def _transformers(c: _Pair) -> EngineCard:
    notes = []
    kw = transformers_kwargs(c)
    lines = [
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f"target = AutoModelForCausalLM.from_pretrained({c.target!r})",
        f"tokenizer = AutoTokenizer.from_pretrained({c.target!r})",
    ]
    if not c.lookup:
        lines.append(f"draft = AutoModelForCausalLM.from_pretrained({c.draft!r})")
    runs = True
    if c.other_tokenizer:
        lines.append(f"assistant_tokenizer = AutoTokenizer.from_pretrained({c.draft!r})")
        notes.append(
            "The draft has another tokenizer: transformers re-tokenises its guesses through text "
            "(assistant_tokenizer with tokenizer), as specviz does."
        )
        if c.report.target_vocab_rows == c.report.draft_vocab_rows:
            runs = False
            notes.append(
                "transformers takes equal vocabulary sizes for the same tokenizer: it refuses assistant_tokenizer "
                f"here (both have {c.report.target_vocab_rows:,} rows), and without it would pass the draft's ids "
                "through untranslated."
            )
    args = ", ".join(f"{k}={v}" if isinstance(v, str) and k in _OBJECTS else f"{k}={v!r}" for k, v in kw.items())
    lines += [
        'inputs = tokenizer("...", return_tensors="pt")',
        f"out = target.generate(**inputs, do_sample=False, max_new_tokens=64, {args})",
    ]
    if not c.lookup:
        notes.append(
            "num_assistant_tokens_schedule 'constant' keeps gamma fixed as the check measured it, and "
            "assistant_confidence_threshold 0 turns off transformers' own cut (its default 0.4 stops a round early)."
        )
    if c.method == "lookup+model":
        notes.append("transformers has no lookup-then-model drafter: this runs the draft model alone.")
    return EngineCard("transformers", ENGINE_SOURCES["transformers"], "python", "\n".join(lines), tuple(notes), runs)


_OBJECTS = ("assistant_model", "tokenizer", "assistant_tokenizer")  # keywords whose values are the objects above
