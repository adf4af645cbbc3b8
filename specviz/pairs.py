"""The pair check: can this draft q serve this target p, and is it worth it?

Three questions, in order: do the two tokenizers give every token id the same meaning (if not, stop:
the draft's proposals would be nonsense to the target); what does a draft step cost relative to a target
step (c); how often does the target accept the draft's greedy proposals (alpha, written `a` here as in
the formula). From a and c the expected speedup for each block size gamma follows (Leviathan et al. 2023,
Theorem 3.8): (1 - a^(gamma+1)) / ((1 - a)(gamma c + 1)). That formula lives in theory.py; a and c are read from
the decoding runs' tally.Tally (measured in the decode loops, as the benchmark and the sweep measure them).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from .config import AUTO_GAMMA_MAX, CHECK_DRAFTERS, GAMMA_MAX, TREE_DRAFTERS, SamplingConfig, SpecConfig, SpecvizError
from .costs import forward_times
from .models import LoadedModel, load_pair, pair_dtypes, vocab_gap
from .served import ServedTarget, engine_step_s, is_url, load_served_pair
from .tally import Tally
from .theory import (  # noqa: F401  (expected_speedup: re-exported)
    expected_speedup,
    expected_speedup_measured,
    expected_tokens,
    speedup_per_round,
    speedup_table,
    wilson_interval,
)
from .translate import needs_translation

SAMPLE_PROMPTS: dict[str, tuple[str, ...]] = {  # a user's prompts differ: acceptance is measured per kind
    "chat": ("Tell me about gravity.", "What is the capital of France, and why is it famous?"),
    "story": ("Write a short story about a lighthouse keeper.", "Write a short poem about the sea."),
    "code": ("def fibonacci(n):", "Write a Python function that checks whether a word is a palindrome."),
    "summarise": (
        "Summarise this text: The town library will open on Sundays from May. It will also lend board games, "
        "and children under twelve can join a reading club that meets every Saturday morning.",
        "Summarise this text in one sentence: Glaciers form where more snow falls in winter than melts in summer. "
        "Over many years the snow is pressed into ice, which slowly flows downhill under its own weight.",
    ),
}
MEASURED_GAMMAS = range(1, 9)  # the verify cost is measured for blocks of 2 .. 9 tokens
MIN_SPEEDUP = 1.05  # below this a second model is not worth its memory and complexity
MAX_MISMATCH_FRACTION = 0.01  # a few renamed special tokens (Llama 3 vs 3.1) are fine; a different tokenizer is not
CHECK_GAMMA = 4  # the block size of the acceptance run; a is per position, so it barely depends on this
PLAIN_TOKENS = 8  # a plain run this long beside each kind's acceptance runs: c's plain step is their mean
TREE_BUDGETS = (4, 7)  # token trees the check measures: a verify of 8 positions at most, the CPU few-token
# kernel's range (kernels.py; past it a verify here cost about twice: 2.1 steps at 9 positions, 1.3 at 8)
TREE_PAYS = 1.03  # a tree is recommended when it is expected at least 3% faster than the best chain
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
VERDICTS = ("compatible", "not worth it", "incompatible")


# --- tokenizers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizerCheck:
    """Token ids compared one by one over the smaller tokenizer, added tokens included."""

    target_size: int  # len(tokenizer): every id it can produce
    draft_size: int
    compared: int
    mismatches: int  # ids whose token differs, or that only the larger tokenizer has among the compared
    examples: tuple[tuple[int, str | None, str | None], ...]  # (id, target token, draft token), a few
    special_tokens: tuple[tuple[str, str | None, str | None], ...]  # (name, target, draft) where they differ
    chat_template_same: bool
    target_has_chat_template: bool
    draft_has_chat_template: bool

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatches / self.compared if self.compared else 1.0

    @property
    def compatible(self) -> bool:
        return self.compared > 0 and self.mismatch_fraction <= MAX_MISMATCH_FRACTION


def _id_to_token(tok) -> dict[int, str]:
    return {int(i): t for t, i in tok.get_vocab().items()}


def compare_tokenizers(target_tok, draft_tok, n_examples: int = 5) -> TokenizerCheck:
    """Compare id -> token for every id of the smaller tokenizer (not just vocab_size: added tokens count)."""
    p_ids, q_ids = _id_to_token(target_tok), _id_to_token(draft_tok)
    small = p_ids if len(p_ids) <= len(q_ids) else q_ids
    bad = sorted(i for i in small if p_ids.get(i) != q_ids.get(i))
    examples = tuple((i, p_ids.get(i), q_ids.get(i)) for i in bad[:n_examples])
    specials = tuple(
        (name, getattr(target_tok, name, None), getattr(draft_tok, name, None))
        for name in SPECIAL_TOKENS
        if getattr(target_tok, name, None) != getattr(draft_tok, name, None)
    )
    p_tpl, q_tpl = getattr(target_tok, "chat_template", None), getattr(draft_tok, "chat_template", None)
    return TokenizerCheck(
        len(p_ids), len(q_ids), len(small), len(bad), examples, specials, p_tpl == q_tpl, bool(p_tpl), bool(q_tpl)
    )


# --- measurements --------------------------------------------------------------------------------


@dataclass(frozen=True)
class KindAcceptance:
    kind: str  # chat, story, code, summarise, or "given" for the caller's own prompts
    a: float
    low: float  # 95% interval (Wilson) from the number of judged guesses
    high: float
    accepted: int
    tested: int


@dataclass(frozen=True)
class Acceptance:
    """What the greedy acceptance runs counted (tally.Tally's definitions); `tally` is their pooled Tally."""

    a: float  # alpha: accepted / tested positions, the per-token chance under the i.i.d. model (its MLE)
    accepted: int
    tested: int  # positions the target judged: every accepted one plus the first rejected of each round
    drafted: int
    rounds: int
    new_tokens: int
    low: float = 0.0  # 95% interval (Wilson) of a from the number of judged guesses
    high: float = 1.0
    by_kind: tuple[KindAcceptance, ...] = ()
    draft_s: float = 0.0  # seconds the drafter took over all rounds (its catching up included)
    decode_s: float = 0.0  # seconds of the decode loops, prefills excluded
    block_sizes: tuple[int, ...] = ()  # rounds that proposed k = 0, 1, ... tokens
    translate_s: float = 0.0  # a draft with another tokenizer: of draft_s, the seconds spent re-tokenising
    draft_calls: int = 0  # forward calls of the draft model
    tally: Tally = field(default_factory=Tally, repr=False, compare=False)

    @classmethod
    def of(cls, t: Tally, block_sizes: tuple[int, ...], translate_s: float, by_kind=()) -> Acceptance:
        low, high = wilson_interval(t.accepted, t.judged)
        return cls(t.alpha, t.accepted, t.judged, t.drafted, t.rounds, t.new_tokens, low, high, tuple(by_kind),
                   t.draft_s, t.decode_s, tuple(block_sizes), translate_s, t.draft_calls, t)  # fmt: skip


def _within(events, deadline: float | None):
    """Pass events through; past `deadline` (a time.monotonic() value) one SpecvizError (checked every event)."""
    for ev in events:
        if deadline is not None and time.monotonic() > deadline:
            raise SpecvizError("The pair check ran past this server's time limit and was stopped; try fewer tokens.")
        yield ev


def _acceptance_runs(target: LoadedModel, draft: LoadedModel, prompt_ids: list[list[int]], max_new_tokens: int,
                     deadline: float | None, drafter: str) -> tuple[Tally, list[int], float]:  # fmt: skip
    """Greedy speculative decoding of each prompt at CHECK_GAMMA: (their Tally, rounds by block size, seconds spent
    re-tokenising)."""
    from .drafters import make_drafter
    from .engine import speculative_decode
    from .events import Round
    from .translate import needs_translation

    cfg = SpecConfig(gamma=CHECK_GAMMA, max_new_tokens=max_new_tokens, sampling=SamplingConfig(0.0), drafter=drafter)
    t, sizes, translate_s = Tally(), [0] * (CHECK_GAMMA + 1), 0.0
    translated = drafter != "lookup" and needs_translation(target, draft)
    for ids in prompt_ids:
        made = None
        if translated:  # built here, so its re-tokenising time can be read after the run
            lookup = dict(prompt_lookup_num_tokens=cfg.prompt_lookup_num_tokens,
                          max_matching_ngram_size=cfg.max_matching_ngram_size)  # fmt: skip
            made = make_drafter(drafter, draft, target.vocab_size, target=target, **lookup)
        for ev in _within(speculative_decode(target, draft, ids, cfg, drafter=made), deadline):
            t.add(ev)
            if isinstance(ev, Round):
                sizes += [0] * (len(ev.drafted) + 1 - len(sizes))
                sizes[len(ev.drafted)] += 1
        translate_s += getattr(getattr(made, "model", made), "translate_s", 0.0)
    return t, sizes, translate_s


def measure_acceptance(
    target: LoadedModel,
    draft: LoadedModel,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    deadline: float | None = None,
    drafter: str = "model",
) -> Acceptance:
    """Greedy speculative decoding of each prompt (gamma 4); a counts only positions the target judged.

    deadline: a time.monotonic() value; past it the run stops with a SpecvizError (checked every round).

    accepted / drafted (the engine's acceptance_rate) would count proposals after a rejection as failures
    although nobody looked at them, which understates a: at a = 0.8 and gamma 4 it reads 0.59.
    """
    return Acceptance.of(*_acceptance_runs(target, draft, prompt_ids, max_new_tokens, deadline, drafter))


def acceptance_by_kind(
    target: LoadedModel,
    draft: LoadedModel,
    prompt_ids: dict[str, list[list[int]]],
    max_new_tokens: int,
    deadline: float | None = None,
    drafter: str = "model",
) -> tuple[Acceptance, Tally]:
    """measure_acceptance per kind of prompt, and over all of them (the overall a weighs every judged guess); and
    beside each kind's runs a short plain run on its first prompt, so a busy machine slows both alike: their
    pooled Tally is the plain step that c is measured against. Returns (the acceptance, the plain runs' Tally)."""
    from .engine import autoregressive_decode

    parts, plain = {}, Tally()
    for k, ids in prompt_ids.items():
        plain_cfg = SpecConfig(max_new_tokens=PLAIN_TOKENS)
        plain += Tally.of(_within(autoregressive_decode(target, ids[0], plain_cfg), deadline))
        parts[k] = measure_acceptance(target, draft, ids, max_new_tokens, deadline, drafter)
    kinds = tuple(KindAcceptance(k, x.a, x.low, x.high, x.accepted, x.tested) for k, x in parts.items())
    sizes = tuple(map(sum, zip(*(x.block_sizes for x in parts.values()))))
    pooled = sum((x.tally for x in parts.values()), Tally())
    return Acceptance.of(pooled, sizes, sum(x.translate_s for x in parts.values()), kinds), plain


@dataclass(frozen=True)
class TreeTrial:
    """Greedy decoding with token trees of one node budget on the check's prompts, and what it is expected to
    gain: its measured tokens, draft time, verify calls and loop work per round, in target forward steps."""

    budget: int
    tokens_per_call: float
    nodes_per_call: float
    draft_cost: float  # drafting one tree (its draft calls), in target steps
    verify_cost: float  # one verify call over its nodes + 1 positions, in target steps (forward_times)
    overhead: float  # the loop's own work per round (the walk, the cache's gather)
    speedup: float  # expected over plain decoding (theory.speedup_per_round)


def measure_trees(target: LoadedModel, draft: LoadedModel, prompt_ids: list[list[int]], max_new_tokens: int,
                  times: list[float], plain: float, deadline: float | None = None,
                  drafter: str = "model") -> tuple[TreeTrial, ...]:  # fmt: skip
    """One TreeTrial per TREE_BUDGETS entry (depth at most AUTO_GAMMA_MAX); times[k]: a target call over k + 1
    tokens (forward_times), plain: one plain decoding step, in target steps."""
    from .engine import speculative_decode
    from .events import Round

    step, out = times[0], []
    for budget in TREE_BUDGETS:
        cfg = SpecConfig(gamma=AUTO_GAMMA_MAX, tree=budget, max_new_tokens=max_new_tokens, drafter=drafter)
        t, verify_s = Tally(), 0.0
        for ids in prompt_ids:
            for ev in _within(speculative_decode(target, draft, ids, cfg), deadline):
                t.add(ev)
                if isinstance(ev, Round):  # a verify over its nodes + 1 positions, as forward_times measured it
                    verify_s += times[min(ev.proposed, len(times) - 1)]
        r = max(t.rounds, 1)
        d, v = t.draft_s / r / step, verify_s / r / step
        o = max(0.0, t.decode_s - t.draft_s - verify_s) / r / step
        tokens = t.tokens_per_call
        out.append(TreeTrial(budget, tokens, t.drafted_per_call, d, v, o, speedup_per_round(tokens, d, v, o, plain)))
    return tuple(out)


def _tree_advice(trials: tuple[TreeTrial, ...], best_chain: float, gamma: int, chain_tokens: float) -> str:
    """One sentence: does a token tree pay for this pair on this machine, and why (measured)."""
    t = max(trials, key=lambda x: x.speedup)
    ratio = t.speedup / best_chain if best_chain > 0 else float("nan")
    said = (
        f"a tree of {t.budget} nodes gives {t.tokens_per_call:.2f} tokens per target call against "
        f"{chain_tokens:.2f} for the best chain (gamma {gamma}), and its verify of {t.nodes_per_call + 1:.1f} positions costs "
        f"{t.verify_cost:.2f} plain steps here"
    )
    if ratio >= TREE_PAYS:
        return f"Token trees pay on this machine: {said}, so it is expected at {ratio:.2f}x the best chain (use tree={t.budget} or auto)."
    return (
        f"Token trees do not pay on this machine: {said}, so it is expected at {ratio:.2f}x the best chain; keep tree "
        "off (tree=auto sizes each round by these costs and branches only where a runner-up is expected to be kept "
        "more often than a longer chain's next guess)."
    )


# --- the report ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairReport:
    """Everything `check_pair` found. Measured fields are None when the pair is incompatible."""

    target: str
    draft: str
    verdict: str  # one of VERDICTS
    reasons: tuple[str, ...]  # sentences: why this verdict
    warnings: tuple[str, ...]  # sentences: worth knowing, but not deciding
    tokenizer: TokenizerCheck
    device: str
    dtype: str
    target_params: int
    draft_params: int
    target_memory_bytes: int
    draft_memory_bytes: int
    target_vocab_rows: int  # rows of the output layer (may be padded past the tokenizer)
    draft_vocab_rows: int
    draft_trimmed: bool  # the draft carries a specviz_vocab.json (a subset of the target's ids)
    drafter: str = "model"  # where the measured guesses came from: model | lookup | lookup+model
    # in the decode loops (tally.Tally.c): the mean seconds of one plain decoding step (a served target: one
    # request of one token, the round trip and the engine's step) and of one draft call in the acceptance runs
    target_step_s: float | None = None
    draft_step_s: float | None = None
    c: float | None = None  # draft_step_s / target_step_s (0 for lookup: no draft call)
    acceptance: Acceptance | None = None
    prompts: int = 0
    max_new_tokens: int = 0
    speedups: tuple[float, ...] = field(default=())  # the textbook speedup (a verify costs one step), gamma 1..16
    verify_costs: tuple[float, ...] = field(default=())  # one target call over k + 1 tokens, in single steps, k = 1..8
    # Measured in the decode loops, in target forward steps: drafting one proposal (c as the loop pays it), the
    # loop's own work per round beyond the draft and the verify call, and one plain decoding step.
    draft_cost: float | None = None
    round_overhead: float | None = None
    plain_cost: float | None = None
    speedups_measured: tuple[float, ...] = field(default=())  # with those measured costs, gamma 1..8: the prediction
    best_gamma: int | None = None  # the best gamma by the measured-cost prediction
    best_speedup: float | None = None
    target_precision: str = ""  # how each model's weights are held: "float32", "NF4, bitsandbytes" ...
    draft_precision: str = ""
    # A draft with another tokenizer (translate.py): how its guesses become the target's tokens, greedy and at T > 0
    translation: str = ""
    sampling_translation: str = ""
    coverage: float | None = None  # the share of the target's vocabulary the draft has, by string
    draft_share: float | None = None  # the share of the draft's vocabulary the target has
    translate_cost: float | None = None  # re-tokenising, in target forward steps per round (measured)
    trees: tuple[TreeTrial, ...] = field(default=())  # token trees of TREE_BUDGETS nodes, measured (model drafters)
    tree_advice: str = ""  # whether a tree pays here, in one sentence
    # A served target (served.py): target_step_s is then one request of one token (the round trip and the
    # engine's step); engine_step_s the engine's own step inside one long request; engine_speedup the textbook
    # speedup (a verify costs one engine step, no round trip per round) if the engine ran this draft itself at
    # c = draft_step_s / engine_step_s, best over gamma 1..8
    served: str = ""
    engine_step_s: float | None = None
    engine_speedup: float | None = None
    engine_best_gamma: int | None = None

    @property
    def param_ratio(self) -> float:
        return self.draft_params / self.target_params if self.target_params else 0.0

    @property
    def a(self) -> float | None:
        return self.acceptance.a if self.acceptance else None

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["acceptance"] is not None:
            d["acceptance"].pop("tally")  # its numbers are the acceptance's own fields
        d["param_ratio"] = self.param_ratio
        d["tokenizer"]["mismatch_fraction"] = self.tokenizer.mismatch_fraction
        d["tokenizer"]["compatible"] = self.tokenizer.compatible
        d["speedups"] = [{"gamma": g, "speedup": s} for g, s in enumerate(self.speedups, start=1)]
        d["speedups_measured"] = [
            {"gamma": g, "speedup": s, "verify_cost": v}
            for g, (s, v) in enumerate(zip(self.speedups_measured, self.verify_costs), start=1)
        ]
        return d

    def report(self) -> str:
        """A readable summary for the terminal."""
        t = self.tokenizer
        size = (f"{_params(self.target_params)} parameters, {self.target_precision}, {_bytes(self.target_memory_bytes)}" if not self.served
                else "served (its size is the server's business)")  # fmt: skip
        ratio = f"{self.param_ratio:.3g}x the target's parameters" if not self.served else "a draft running here"
        lines = [
            f"target      {self.target}: {size}, output layer {self.target_vocab_rows:,} rows",
            f"draft       {self.draft}: {_params(self.draft_params)} parameters, {self.draft_precision}, "
            f"{_bytes(self.draft_memory_bytes)}, output layer {self.draft_vocab_rows:,} rows{' (trimmed vocabulary)' if self.draft_trimmed else ''}",
            f"            the draft has {ratio} ({self.device}, {self.dtype})",
        ]
        if t.mismatches == 0:
            tok = f"identical over {t.compared:,} ids"
        else:
            tok = f"{t.mismatches:,} of {t.compared:,} ids differ ({t.mismatch_fraction:.1%})"
        sizes = f"target {t.target_size:,} tokens, draft {t.draft_size:,}"
        lines.append(f"tokenizers  {tok} ({sizes}); chat template {'same' if t.chat_template_same else 'differs'}")
        if self.translation:
            lines += [
                f"translated  the draft has {self.coverage:.1%} of the target's vocabulary by string "
                f"({self.draft_share:.1%} of its own tokens are the target's)",
                f"            greedy: {self.translation}",
                f"            T > 0:  {self.sampling_translation}",
            ]
            if self.translate_cost is not None:
                lines.append(
                    f"            re-tokenising costs {self.translate_cost:.3f} target steps a round (measured)"
                )
        if self.c is not None and self.acceptance is not None:
            acc = self.acceptance
            lines += [
                f"cost ratio  c = {self.c:.3f} (in the decode loops: a draft call {self.draft_step_s * 1e3:.2f} ms, "
                f"a plain decoding step {self.target_step_s * 1e3:.2f} ms; means)",
                f"acceptance  a = {acc.a:.3f} ({self.drafter} drafter, greedy, gamma {CHECK_GAMMA}, {self.prompts} prompts: "
                f"{acc.accepted} of {acc.tested} judged proposals accepted, {acc.new_tokens} tokens "
                f"in {acc.rounds} rounds)",
                f"            95% interval {acc.low:.2f}-{acc.high:.2f}; by kind: "
                + ", ".join(f"{k.kind} {k.a:.2f} ({k.low:.2f}-{k.high:.2f})" for k in acc.by_kind),
                "expected speedup by gamma: tokens per round (1 - a^(g+1)) / (1 - a) times a plain step's cost P, over",
                "(g c' + v_g + o), all measured here in target forward steps: v_g one target call over g + 1 tokens,",
                f"c' = {self.draft_cost:.3f} drafting one proposal, o = {self.round_overhead:.3f} the loop's own work per "
                f"round, P = {self.plain_cost:.3f} (the textbook formula has c' = c, v = 1, o = 0, P = 1)",
            ]
            top = max(self.speedups_measured)
            for g, (s, v) in enumerate(zip(self.speedups_measured, self.verify_costs), start=1):
                bar = "█" * max(1, round(30 * s / top))
                mark = "  <- best" if g == self.best_gamma else ""
                lines.append(
                    f"  gamma {g:2d}  {s:5.2f}x  (v = {v:.2f}, textbook {self.speedups[g - 1]:.2f}x)  {bar}{mark}"
                )
            for t in self.trees:
                lines.append(
                    f"  tree {t.budget:2d}  {t.speedup:5.2f}x  ({t.tokens_per_call:.2f} tokens per call, "
                    f"{t.nodes_per_call:.1f} nodes; verify {t.verify_cost:.2f}, drafting {t.draft_cost:.2f} steps)"
                )
        if self.served and self.engine_step_s:
            lines += [
                f"served      {self.served}: a one-token request {self.target_step_s * 1e3:.1f} ms (round trip and "
                f"step), the engine's own step {self.engine_step_s * 1e3:.1f} ms inside one request; every verify "
                "request recomputes the prefix (prompt logprobs skip vLLM's prefix cache), as the v_g above include",
                f"            this draft here, one request per round: {self.best_speedup:.2f}x at gamma {self.best_gamma}; "
                f"the engine drafting with it itself (textbook, c = {self.draft_step_s / self.engine_step_s:.3f}): "
                f"{self.engine_speedup:.2f}x at gamma {self.engine_best_gamma}",
            ]
        lines.append(f"verdict     {self.verdict.upper()}")
        lines += [f"  - {r}" for r in self.reasons]
        if self.warnings:
            lines.append("warnings")
            lines += [f"  - {w}" for w in self.warnings]
        return "\n".join(lines)


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def memory_words(params: int, precision: str, memory_bytes: int) -> str:
    """One model's size for a reader: "135.0M parameters, NF4, bitsandbytes, 158.2 MiB"."""
    return f"{_params(params)} parameters, {precision}, {_bytes(memory_bytes)}"


def _bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _tok(s: str | None) -> str:
    return "nothing" if s is None else repr(s)


def _tokenizer_findings(t: TokenizerCheck) -> tuple[list[str], list[str]]:
    """(reasons it is incompatible, warnings). A draft whose vocabulary cannot serve the target never gets here:
    check_pair refuses it first (models.vocab_gap), as load_pair does on every other path."""
    bad, warn = [], []
    if not t.compatible:
        i, p_tok, q_tok = t.examples[0] if t.examples else (None, None, None)
        eg = f"; e.g. id {i} is {_tok(p_tok)} for the target but {_tok(q_tok)} for the draft" if t.examples else ""
        bad.append(
            f"The tokenizers differ: {t.mismatches:,} of {t.compared:,} token ids ({t.mismatch_fraction:.1%}) "
            f"mean different tokens{eg}, so the target would misread every draft."
        )
    elif t.mismatches:
        ex = ", ".join(f"id {i}: {_tok(p)} vs {_tok(q)}" for i, p, q in t.examples)
        warn.append(f"{t.mismatches} token ids differ ({ex}); drafts of those tokens will be rejected.")
    if t.compatible and t.target_size != t.draft_size:
        side = "target" if t.target_size > t.draft_size else "draft"
        warn.append(
            f"The {side}'s tokenizer has {abs(t.target_size - t.draft_size):,} more tokens "
            f"({t.target_size:,} vs {t.draft_size:,}); the first {t.compared:,} agree."
        )
    for name, p_tok, q_tok in t.special_tokens:
        warn.append(
            f"The {name.replace('_', ' ')} differs: {_tok(p_tok)} for the target, {_tok(q_tok)} for the draft "
            "(decoding uses the target's)."
        )
    if not t.chat_template_same:
        if t.target_has_chat_template and t.draft_has_chat_template:
            what = "The chat templates differ"
        else:
            what = f"Only the {'target' if t.target_has_chat_template else 'draft'} has a chat template"
        warn.append(f"{what}; prompts are formatted with the target's, which may lower acceptance.")
    return bad, warn


def _translation_findings(p: LoadedModel, q: LoadedModel, t: TokenizerCheck) -> tuple[list[str], list[str], dict]:
    """(reasons it cannot work, warnings, the report's translation fields) for a draft with another tokenizer."""
    from .translate import METHODS, sampling_method, translator

    tr = translator(p.tokenizer, q.tokenizer)
    shared = tr.shared(q.vocab_size)
    gap = tr.gap(p.name, q.name, shared)
    m = sampling_method(shared)
    extra = dict(translation=f"text: {METHODS['text']}", sampling_translation=f"{m}: {METHODS[m]}",
                 coverage=shared.coverage, draft_share=shared.draft_share)  # fmt: skip
    warn = [
        f"The tokenizers differ ({t.mismatches:,} of {t.compared:,} token ids mean other tokens), so the draft's "
        f"guesses are translated through text: it has {shared.coverage:.0%} of the target's vocabulary by string "
        f"(after mapping the space marker), and {shared.draft_share:.0%} of its own tokens are the target's. "
        "Each model reads the prompt through its own chat template."
    ]
    return ([gap] if gap else []), warn, extra


def _worth(a: float, c: float, best_gamma: int, best: float, translated: bool = False) -> tuple[str, list[str]]:
    if best >= MIN_SPEEDUP:
        how = (
            "The draft's guesses are translated from its own tokens, and it"
            if translated
            else "The tokenizers match and the draft"
        )
        return "compatible", [
            f"{how} is expected to make greedy decoding {best:.2f}x faster "
            f"at gamma {best_gamma} (acceptance a = {a:.2f}, cost ratio c = {c:.2f})."
        ]
    why = []
    if a < 0.5:
        why.append(f"The draft agrees with the target too rarely: acceptance a = {a:.2f}, so most drafts are wasted.")
    if c > 0.5:
        why.append(f"The draft is too slow: one draft step costs {c:.2f} of a target step (c), eating the saving.")
    if not why:
        why.append(f"Acceptance a = {a:.2f} and cost ratio c = {c:.2f} together leave too little to gain.")
    why.append(
        f"The best expected speedup is {best:.2f}x (gamma {best_gamma}), below the {MIN_SPEEDUP}x "
        "that pays for a second model."
    )
    return "not worth it", why


def check_pair(
    target: str | LoadedModel | None = None,
    draft: str | LoadedModel | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    max_new_tokens: int = 32,
    prompts: list[str] | tuple[str, ...] | dict[str, tuple[str, ...]] | None = None,
    timeout_s: float | None = None,
    drafter: str = "model",
    quantize: str | None = None,
    tokenizer: str | None = None,
) -> PairReport:
    """Load p and q, compare their tokenizers, then (if they match) measure c and a; see PairReport.

    target/draft: a hub id, a folder, a LoadedModel, or None for the built-in pair; target may be a served
    target's address or ServedTarget (served.py; tokenizer: its tokenizer, default the server's model name).
    drafter: where the guesses come from (model, lookup, lookup+model); lookup alone costs no draft calls (c = 0).
    prompts: texts for the acceptance run, formatted as `generate` would: a list, or a dict kind -> texts
    (default: SAMPLE_PROMPTS, two each of chat, story, code and summarise; a is also given per kind).
    timeout_s: a cap on the measuring, from the call on (loading included); past it, one SpecvizError.
    quantize: "4bit" (NF4) or "8bit" (int8) loads the target with bitsandbytes (the draft stays as it is).
    """
    from .api import encode_prompt

    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    cfg = SpecConfig(gamma=CHECK_GAMMA, max_new_tokens=max_new_tokens, drafter=drafter)  # validates them up front
    if drafter not in CHECK_DRAFTERS:
        raise SpecvizError(f"The pair check measures the {', '.join(CHECK_DRAFTERS)} drafters, not {drafter!r}.")
    if prompts is None:
        prompts = SAMPLE_PROMPTS
    if isinstance(prompts, str):
        prompts = (prompts,)
    kinds = {k: tuple(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {"given": tuple(prompts)}
    texts = [x for v in kinds.values() for x in v]
    if not texts or not all(isinstance(x, str) and x.strip() for x in texts):
        raise SpecvizError("prompts must be a list of non-empty texts.")
    if is_url(target) or isinstance(target, ServedTarget):
        p, q = load_served_pair(target, draft, tokenizer=tokenizer, device=device, dtype=dtype)
    else:
        p, q = load_pair(target, draft, device=device, dtype=dtype, quantize=quantize, check_vocab=False)

    t = compare_tokenizers(p.tokenizer, q.tokenizer)
    translated, extra = needs_translation(p, q), {}
    if translated:  # another tokenizer: the guesses go through text (translate.py); refused only if that cannot work
        bad, warnings, extra = _translation_findings(p, q, t)
    else:
        gap = vocab_gap(p, q)
        if gap:  # what load_pair refuses for every other path
            raise SpecvizError(gap)
        bad, warnings = _tokenizer_findings(t)
    base = dict(
        target=p.name,
        draft=q.name,
        tokenizer=t,
        device=str(p.device),
        dtype=pair_dtypes(p, q),
        target_params=p.n_params,
        draft_params=q.n_params,
        target_memory_bytes=p.memory_bytes,
        draft_memory_bytes=q.memory_bytes,
        target_precision=p.precision,
        draft_precision=q.precision,
        target_vocab_rows=p.vocab_size,
        draft_vocab_rows=q.vocab_size,
        draft_trimmed=q.vocab_map is not None,
        warnings=tuple(warnings),
        **extra,
    )
    if bad:  # nothing to measure: the target cannot read the draft's proposals
        return PairReport(verdict="incompatible", reasons=tuple(bad), **base)

    ids = {k: [encode_prompt(p, x) for x in v] for k, v in kinds.items()}
    first = next(iter(ids.values()))[0]
    times = forward_times(p, first, max(MEASURED_GAMMAS) + 1, reps=3)  # one call over 1 .. 9 tokens
    step = times[0]
    verify = tuple(times[g] / step for g in MEASURED_GAMMAS)  # (v_1 .. v_8): a call over g + 1 tokens, in steps
    acc, plain_runs = acceptance_by_kind(p, q, ids, cfg.max_new_tokens, deadline, drafter)
    c = acc.tally.c(plain_runs)  # the one c (tally.py): lookup alone makes no draft call, so c = 0
    p_s, q_s = plain_runs.step_s, acc.tally.draft_call_s
    plain = p_s / step
    draft_cost = acc.draft_s / acc.drafted / step if acc.drafted else c
    forward_s = sum(n * times[k] for k, n in enumerate(acc.block_sizes))  # the verify calls the loop made
    overhead = max(0.0, acc.decode_s - acc.draft_s - forward_s) / max(acc.rounds, 1) / step
    speedups = speedup_table(acc.a, c, range(1, GAMMA_MAX + 1))
    measured = tuple(
        expected_speedup_measured([acc.a] * g, draft_cost, v, overhead, plain) for g, v in zip(MEASURED_GAMMAS, verify)
    )
    best_gamma = max(range(len(measured)), key=measured.__getitem__) + 1
    best = measured[best_gamma - 1]
    verdict, reasons = _worth(acc.a, c, best_gamma, best, translated)
    if translated:
        base["translate_cost"] = acc.translate_s / max(acc.rounds, 1) / step
    trees, advice = (), ""
    if drafter in TREE_DRAFTERS and not isinstance(p, ServedTarget):  # a served target takes chains only
        few = [v[0] for v in ids.values()]  # the first prompt of each kind: trees cost the check a little time only
        trees = measure_trees(p, q, few, cfg.max_new_tokens, times, plain, deadline, drafter)
        advice = _tree_advice(trees, best, best_gamma, expected_tokens(acc.a, best_gamma))
        if verdict == "compatible":
            reasons.append(advice)
    served = {}
    if isinstance(p, ServedTarget):
        e_step = engine_step_s(p, first)
        e_speedups = speedup_table(acc.a, q_s / e_step, MEASURED_GAMMAS)
        e_best = max(range(len(e_speedups)), key=e_speedups.__getitem__)
        served = dict(served=p.url, engine_step_s=e_step, engine_speedup=e_speedups[e_best],
                      engine_best_gamma=MEASURED_GAMMAS[e_best])  # fmt: skip
    return PairReport(
        **served,
        verdict=verdict,
        reasons=tuple(reasons),
        drafter=drafter,
        target_step_s=p_s,
        draft_step_s=q_s,
        c=c,
        acceptance=acc,
        prompts=len(texts),
        max_new_tokens=cfg.max_new_tokens,
        speedups=speedups,
        verify_costs=verify,
        draft_cost=draft_cost,
        round_overhead=overhead,
        plain_cost=plain,
        speedups_measured=measured,
        best_gamma=best_gamma,
        best_speedup=best,
        trees=trees,
        tree_advice=advice,
        **base,
    )
