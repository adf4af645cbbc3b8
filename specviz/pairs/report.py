"""The pair check's report: every finding of one check in a frozen dataclass, as JSON (to_dict) and as text
for the terminal (report).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specviz.models.translate import TokenizerCheck
from specviz.pairs.measure import CHECK_GAMMA, Acceptance, TreeTrial

VERDICTS = ("compatible", "not worth it", "incompatible")


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
    # The prediction's costs (pairs_measure.RoundCosts: a round of each gamma priced from the rounds the acceptance
    # runs paid), in single-token target steps (costs.forward_times): a verify over k + 1 tokens as the loop pays it
    # (the isolated call's growth with k, scaled to the loop's verify calls), k = 1..8; drafting one proposal (the
    # draft model's calls; re-tokenising is paid once a round); the round's work paid once whatever gamma is
    # (re-tokenising, accept/reject, roll back, bookkeeping); and one plain decoding step.
    verify_costs: tuple[float, ...] = field(default=())
    draft_cost: float | None = None
    round_overhead: float | None = None
    plain_cost: float | None = None
    speedups_measured: tuple[float, ...] = field(default=())  # with those measured costs, gamma 1..8: the prediction
    # What the acceptance runs (gamma CHECK_GAMMA) gained over the plain runs beside them: decoding tokens per second
    # (prefills left out), measured; the prediction at that gamma is speedups_measured[CHECK_GAMMA - 1]
    measured_speedup: float | None = None
    best_gamma: int | None = None  # the best gamma by the measured-cost prediction
    best_speedup: float | None = None
    # best_speedup with the prompt's prefill counted, as the race and the benchmark time a run: the check's prompts
    # and reply length, each side's prefill as its runs paid it (the speculative side's includes the draft's)
    prefill_speedup: float | None = None
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
    # The deploy card (pairs.deploy.DeployCard, which reads this report: so not named here): the settings that
    # reproduce the check's advice in vLLM, SGLang, llama.cpp and transformers; set by check_pair, None if incompatible
    deploy: object = None

    @property
    def param_ratio(self) -> float:
        return self.draft_params / self.target_params if self.target_params else 0.0

    @property
    def a(self) -> float | None:
        return self.acceptance.a if self.acceptance else None

    @property
    def card(self):
        """The deploy card (pairs.deploy.DeployCard) check_pair made of this report; None for an incompatible pair."""
        return self.deploy

    def to_dict(self) -> dict:
        d = asdict(self)  # the card too, as a dict under "deploy"
        if d["acceptance"] is not None:
            d["acceptance"].pop("tally")  # its numbers are the acceptance's own fields
        d["param_ratio"] = self.param_ratio
        d["tokenizer"]["mismatch_fraction"] = self.tokenizer.mismatch_fraction
        d["tokenizer"]["compatible"] = self.tokenizer.compatible
        d["speedups"] = [{"gamma": g, "speedup": s} for g, s in enumerate(self.speedups, start=1)]
        if self.acceptance is not None and self.best_gamma:  # what an engine's counters should read at the advice
            k = self.best_gamma
            d["predicted_rounds"] = {
                "gamma": k,
                "alphas": self.acceptance.alphas(k),
                "kept_by_position": self.acceptance.kept_shares(k),
                "tokens_per_round": self.acceptance.tokens_per_round(k),
            }
        d["speedups_measured"] = [
            {"gamma": g, "speedup": s, "verify_cost": v}
            for g, (s, v) in enumerate(zip(self.speedups_measured, self.verify_costs), start=1)
        ]
        return d

    def report(self) -> str:
        """A readable summary for the terminal."""
        t = self.tokenizer
        size = (
            f"{_params(self.target_params)} parameters, {self.target_precision}, {_bytes(self.target_memory_bytes)}"
            if not self.served
            else "served (its size is the server's business)"
        )
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
                f"by position a guess is kept {_list(acc.alphas(CHECK_GAMMA))} of the times it is ruled on (positions "
                f"1-{CHECK_GAMMA}; later ones priced at {acc.alphas(CHECK_GAMMA + 1)[-1]:.2f}, a guess whose predecessor "
                "was kept)",
                "expected speedup by gamma: tokens per round from the acceptance by position times a plain step's cost P, over",
                "(g c' + v_g + o), priced from the rounds measured here, in target forward steps: v_g a verify over",
                f"g + 1 tokens as the loop pays it, c' = {self.draft_cost:.3f} drafting one proposal, o = "
                f"{self.round_overhead:.3f} the work paid once a round (re-tokenising, accept, roll back), P = "
                f"{self.plain_cost:.3f} (the textbook formula has c' = c, v = 1, o = 0, P = 1)",
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
            if self.prefill_speedup is not None:
                lines.append(
                    f"with prefill {self.prefill_speedup:.2f}x at gamma {self.best_gamma}: the prompt's prefill counted "
                    f"too, as the race and the benchmark time a run of up to {self.max_new_tokens} tokens"
                )
            if self.measured_speedup is not None:
                lines.append(
                    f"measured    at gamma {CHECK_GAMMA} the acceptance runs decoded {self.measured_speedup:.2f}x as "
                    f"fast as the plain runs beside them (expected {self.speedups_measured[CHECK_GAMMA - 1]:.2f}x)"
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
        if self.deploy is not None:
            lines.append(self.deploy.text())
        return "\n".join(lines)


def _list(xs) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def memory_words(params: int, precision: str, memory_bytes: int) -> str:
    """One model's size for a reader: "135.0M parameters, NF4, bitsandbytes, 158.2 MiB"."""
    return f"{_params(params)} parameters, {precision}, {_bytes(memory_bytes)}"


def _bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
