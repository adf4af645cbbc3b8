"""Computations behind the teaching views (no gradio, no plotly).

- `Stepper`: one speculative run advanced one draft/verify round at a time (it holds the engine's generator).
- `greedy_check` / `sample_check`: the exactness panel. At temperature 0 speculative and plain decoding are
  compared token by token; above 0, many one-token speculative draws at one position are compared with p and q.
- `forward_times`: the target's forward-pass time for 1..gamma+1 tokens at once, the reason the method pays.

Names as in the papers: p the target's distribution, q the draft's, gamma the block size, n the accepted
count, r the uniform draw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from specviz.backends.local import CachedModel
from specviz.backends.served.target import eos_ids
from specviz.config import DEFAULT_GAMMA, SamplingConfig, SpecvizError
from specviz.engine.costs import forward_times  # noqa: F401  (the step-through's verify-cost chart imports it from here)
from specviz.engine.loop import autoregressive_decode, run_over, speculative_decode
from specviz.events import Done, Round
from specviz.models.loaded import LoadedModel
from specviz.request import RunRequest
from specviz.sampling import greedy, relaxed, residual, sample, to_probs, verify_sampled
from specviz.theory import cost_ratio

# --- token text -------------------------------------------------------------------------------------


def label(piece: str) -> str:
    """A token made visible for a table or an axis: spaces as ␣, newlines as ⏎, nothing as ∅."""
    return piece.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥") or "∅"


def prob(v: float) -> str:
    """A probability for a table: three decimals, and "<0.001" rather than a misleading 0.000."""
    return "0" if v == 0 else f"{v:.3f}" if v >= 0.001 else "<0.001"


# --- stepping -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSettings:
    """What a step-through run depends on; a change of any of these starts the run over."""

    prompt: str
    gamma: int = DEFAULT_GAMMA
    temperature: float = 0.0
    seed: int = 0
    max_new_tokens: int = 64
    relaxed_w: float = 1.0  # <1: relaxed verification against w·p + (1-w)·q, not exact (sampled runs only)
    tree: int | str = "off"  # token trees from the draft model: "off", a node budget, or "auto"


class Stepper:
    """A speculative run one round at a time. It holds the engine's generator (and so the KV caches)."""

    DETAIL = 6  # top candidates of p and of q kept per drafted position

    def __init__(self, target: LoadedModel, draft: LoadedModel, prompt_ids: list[int], settings: StepSettings):
        self.target, self.settings, self.prompt_ids = target, settings, list(prompt_ids)
        cfg = RunRequest(
            drafter="model",
            gamma=settings.gamma,
            tree=settings.tree,
            max_new_tokens=settings.max_new_tokens,
            seed=settings.seed,
            detail=self.DETAIL,
            relaxed_w=settings.relaxed_w,
            allow_lossy=True,
            temperature=settings.temperature,
        ).spec
        self.config = cfg
        self._eos = eos_ids(target)
        self._events = speculative_decode(target, draft, self.prompt_ids, cfg)
        self.start = next(self._events)  # Start: the prompt is encoded by both models here
        self.rounds: list[Round] = []
        self.done: Done | None = None

    def __deepcopy__(self, memo) -> Stepper:  # gr.State copies its values; a generator can't be copied
        return self

    @property
    def output_ids(self) -> list[int]:
        return [t for r in self.rounds for t in r.tokens]

    def advance(self) -> Round | None:
        """The next round, or None when the answer is complete."""
        if self.done is not None:
            return None
        try:
            ev = next(self._events)
        except StopIteration:  # an earlier error ended the engine's generator
            raise SpecvizError("This run was interrupted by an error; press Reset to start again.") from None
        if isinstance(ev, Done):
            self.done = ev
            return None
        self.rounds.append(ev)
        if run_over(self.output_ids, self._eos, self.settings.max_new_tokens):  # the engine's own stop rule
            self.done = next(self._events)  # no compute: the engine's loop has ended
        return ev

    def close(self) -> None:
        self._events.close()


def _count(k: int, word: str, plural: str = "") -> str:
    return f"{k} {word if k == 1 else plural or word + 's'}"


ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")


def ordinal(rank: int) -> str:
    """0 -> "first" (the draft's first choice), 1 -> "second" ..."""
    return ORDINALS[rank] if rank < len(ORDINALS) else f"{rank + 1}th"


def rank_words(rank: int, source: str, greedy_mode: bool) -> str:
    """How a tree node came to its place among its siblings: the draft's 2nd choice (its 2nd most likely token, at
    temperature 0), its 2nd draw (above 0: siblings are drawn from q without replacement), or the 2nd earlier
    continuation prompt lookup found."""
    if source == "lookup":
        return f"the {ordinal(rank)} earlier continuation prompt lookup found"
    return f"the draft's {ordinal(rank)} {'choice' if greedy_mode else 'draw'}"


def describe_tree_round(rd: Round, text, greedy_mode: bool) -> str:
    """A tree round in plain words. text: token id -> its readable text."""
    t = rd.tree
    depths = t.depths
    quote = lambda i: f"“{label(text(t.tokens[i]))}”"  # noqa: E731
    per = [sum(d == k for d in depths) for k in range(1, max(depths) + 1)]
    out = [
        f"The draft grew a tree of {_count(len(t.tokens), 'guess', 'guesses')} ({', '.join(map(str, per))} at "
        f"depth {', '.join(map(str, range(1, len(per) + 1)))}): at each branch its first, second … "
        f"{'choices' if greedy_mode else 'draws from q'}. The "
        "target checked every one in a single forward pass, each guess seeing only the guesses above it."
    ]
    if t.path:
        steps = []
        for i in t.path:
            turned = [j for j, par in enumerate(t.parents) if par == t.parents[i] and t.status[j] == "rejected"]
            how = f"{quote(i)} ({rank_words(t.ranks[i], t.sources[i], greedy_mode)}"
            how += f", after turning down {', '.join(quote(j) for j in turned)})" if turned else ")"
            steps.append(how)
        out.append(f" Walking from the text, it kept {', then '.join(steps)}.")
    stop = t.path[-1] if t.path else -1
    tried = [j for j, par in enumerate(t.parents) if par == stop]
    fix = f"“{label(text(rd.correction))}”"
    if len(rd.tokens) < rd.n + 1:
        out.append(" The answer ended inside this round.")
    elif not tried:
        src = "its own top choice" if greedy_mode else "drawn from p"
        out.append(f" That branch ends there, so the same pass adds a bonus token, {fix} ({src}).")
    else:
        names = ", ".join(quote(j) for j in tried)
        if greedy_mode:
            out.append(f" Next it turned down {names}: none is its top choice, so it put its own, {fix}.")
        else:
            out.append(
                f" Next it turned down {names} (each tested with min(1, p/q), p shrinking to what was left after "
                f"each), so it drew {fix} from what was left of p."
            )
    out.append(f" This round added {_count(len(rd.tokens), 'token')} for one target pass.")
    return "".join(out)


def describe_round(rd: Round, pieces: list[str], greedy_mode: bool) -> str:
    """The round in plain words. pieces: the text of rd.drafted followed by that of rd.correction."""
    g, n = len(rd.drafted), rd.n
    quote = [f"“{label(s)}”" for s in pieces]
    them = "it" if g == 1 else f"all {g}"
    out = [f"The draft guessed {_count(g, 'token')}. The target checked {them} in one forward pass"]
    if n == g:
        src = "its own top choice" if greedy_mode else "drawn from p"
        out.append(
            f" and accepted {them}. Nothing was rejected, so the same pass adds a bonus token, {quote[g]} ({src})."
        )
    else:
        kept = f"kept the first {n} ({', '.join(quote[:n])})" if n else "kept none"
        if greedy_mode:
            why = "it is not the target's top choice"
        else:
            a = rd.accept_prob[n]
            why = f"the draw r = {rd.r[n]:.2f} was not below p/q {'(almost 0)' if a < 0.005 else f'= {a:.2f}'}"
        out.append(f", {kept} and rejected {quote[n]}: {why}.")
        rest = g - n - 1
        if rest:
            were = "was" if rest == 1 else "were"
            out.append(f" The {_count(rest, 'guess', 'guesses')} after it {were} thrown away.")
        if greedy_mode:
            out.append(f" In its place the target put its own top choice, {quote[g]}.")
        else:
            out.append(f" In its place the target drew {quote[g]} from the leftover distribution max(0, p − q).")
    k = len(rd.tokens)
    out.append(f" This round added {_count(k, 'token')} for one target pass.")
    if k < n + 1:
        out.append(" The answer ended inside this round.")
    return "".join(out)


# --- exactness ------------------------------------------------------------------------------------


def _done(events) -> Done:
    return next(ev for ev in events if isinstance(ev, Done))


@dataclass(frozen=True)
class GreedyCheck:
    spec_ids: tuple[int, ...]
    ar_ids: tuple[int, ...]

    @property
    def first_difference(self) -> int | None:
        for i, (a, b) in enumerate(zip(self.spec_ids, self.ar_ids)):
            if a != b:
                return i
        return None if len(self.spec_ids) == len(self.ar_ids) else min(len(self.spec_ids), len(self.ar_ids))

    @property
    def identical(self) -> bool:
        return self.spec_ids == self.ar_ids


def greedy_check(
    target: LoadedModel, draft: LoadedModel, prompt_ids: list[int], gamma: int, max_new_tokens: int, tree="off"
) -> GreedyCheck:
    """Speculative (with token trees if `tree` is on) and plain greedy decoding of the same prompt, both complete."""
    cfg = RunRequest(
        drafter="model", gamma=gamma, tree=tree, max_new_tokens=max_new_tokens, seed=0, temperature=0.0
    ).spec
    spec = _done(speculative_decode(target, draft, prompt_ids, cfg))
    ar = _done(autoregressive_decode(target, prompt_ids, cfg))
    return GreedyCheck(spec.token_ids, ar.token_ids)


@torch.inference_mode()
def position_probs(
    target: LoadedModel, draft: LoadedModel, prompt_ids: list[int], sampling: SamplingConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """p and q (V,) for the first new token, computed with the engine's own calls (so bit for bit its numbers)."""
    from specviz.models.translate import needs_translation

    if needs_translation(target, draft):
        raise SpecvizError(
            "This check compares p and q over the target's tokens, and this draft writes other tokens (its guesses "
            "are translated); the race, the step-through and the greedy check work with it."
        )
    V, dev = target.vocab_size, target.device
    p_run, q_run = CachedModel(target, V), CachedModel(draft, V)
    prompt = torch.tensor(prompt_ids, device=dev)
    p_run.prefill(prompt)
    q_run.prefill(prompt.to(draft.device))
    q_logits = q_run.feed(prompt[-1:].to(draft.device), last_only=True)[-1].to(dev)  # (V,)
    x = greedy(q_logits).view(1)  # any proposal: row 0 of the verify pass does not look at it
    p_logits = p_run.feed(torch.cat([prompt[-1:], x]))[0]  # (V,) the same 2-token call shape as the engine
    return to_probs(p_logits, sampling), to_probs(q_logits, sampling)


def speculative_draws(
    p: torch.Tensor, q: torch.Tensor, draws: int, gen: torch.Generator, relaxed_w: float = 1.0
) -> torch.Tensor:
    """`draws` one-token speculative samples from fixed p, q (V,): the rule of `verify_sampled`, vectorised.

    x ~ q; keep x when r < min(1, p(x)/q(x)); otherwise draw from residual(p, q) = norm(max(0, p - q)).
    With relaxed_w < 1, p is replaced by relaxed(p, q, w) = w·p + (1 − w)·q, as the engine does: NOT exact.
    """
    p = relaxed(p, q, relaxed_w)  # (V,) p itself when relaxed_w == 1
    x = torch.multinomial(q, draws, replacement=True, generator=gen)  # (draws,) 1. draft
    r = torch.rand(draws, generator=gen, dtype=torch.float32)  # (draws,) 2. the uniform draws (explicit: sampling.py)
    keep = r < (p[x] / q[x]).clamp(max=1.0)  # q[x] > 0: x was drawn from q
    fix = torch.multinomial(residual(p, q), draws, replacement=True, generator=gen)  # (draws,) 3. resample
    return torch.where(keep, x, fix)


def first_tokens(p: torch.Tensor, q: torch.Tensor, seeds: Iterable[int], relaxed_w: float = 1.0) -> list[int]:
    """The first output token of the engine's run with each seed, replayed with `verify_sampled` on fixed p, q (V,).

    Each seed gets its own generator, as a separate run of the engine does, and the same draws in the same
    order (x ~ q, then r, then the resample), so the token matches the engine's bit for bit.
    """
    p_rows = torch.stack([relaxed(p, q, relaxed_w), p])  # (2, V): row 1 is the bonus position (never relaxed)
    q_rows = q[None]  # (1, V)
    out = []
    for seed in seeds:
        gen = torch.Generator(device=p.device).manual_seed(seed)
        x = torch.tensor([sample(q, gen)], device=p.device)  # 1. draft one token from q, as the drafter draws it
        v = verify_sampled(x, q_rows, p_rows, gen)  # 2-3. verify: accept x, or resample from max(0, p - q)
        out.append(int(x) if v.n == 1 else v.correction)
    return out


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


@dataclass(frozen=True)
class SampleCheck:
    p: torch.Tensor  # (V,) the target's distribution at the position
    q: torch.Tensor  # (V,) the draft's
    freq: torch.Tensor  # (V,) how often each token came out of speculative sampling, as a fraction
    draws: int
    seed0: int
    tv_p: float  # total variation distance of the output to p: small
    tv_q: float  # ... and to q: about TV(p, q)
    tv_noise: float  # what the same number of perfect draws from p would show: the floor set by chance
    real: tuple[tuple[int, int, int], ...]  # (seed, token from a real engine run, token replayed here)
    relaxed_w: float = 1.0  # 1: exact speculative sampling; <1: relaxed verification (the output drifts from p)

    @property
    def acceptance(self) -> float:
        """The chance a guess is kept here: sum_x min(q(x), m(x)) = 1 - TV(m, q), m what it is verified against."""
        return 1.0 - total_variation(relaxed(self.p, self.q, self.relaxed_w), self.q)

    @property
    def exact_acceptance(self) -> float:
        """The same with exact verification (w = 1): 1 - TV(p, q)."""
        return 1.0 - total_variation(self.p, self.q)

    @property
    def real_agree(self) -> int:
        return sum(a == b for _, a, b in self.real)


def sample_check(
    target: LoadedModel,
    draft: LoadedModel,
    prompt_ids: list[int],
    sampling: SamplingConfig,
    draws: int = 1000,
    real_runs: int = 5,
    seed0: int = 0,
    relaxed_w: float = 1.0,
) -> SampleCheck:
    """`draws` one-token speculative samples at the first new position, and `real_runs` engine runs end to end.

    The runs (seeds seed0, seed0+1, ...) are replayed here with `verify_sampled` on the same p and q: the
    tokens agree, so the fast draws below follow the engine's own rule on the engine's own numbers.
    """
    p, q = position_probs(target, draft, prompt_ids, sampling)
    V = p.shape[-1]
    gen = torch.Generator(device=p.device).manual_seed(seed0)  # one generator for all the fast draws
    freq = torch.bincount(speculative_draws(p, q, draws, gen, relaxed_w), minlength=V).float() / draws  # (V,)
    perfect = torch.bincount(torch.multinomial(p, draws, replacement=True, generator=gen), minlength=V) / draws
    seeds = range(seed0, seed0 + real_runs)
    engine = [
        _done(
            speculative_decode(
                target,
                draft,
                prompt_ids,
                RunRequest(
                    drafter="model",
                    gamma=1,
                    tree="off",
                    max_new_tokens=1,
                    seed=s,
                    relaxed_w=relaxed_w,
                    allow_lossy=True,
                    **dataclasses.asdict(sampling),
                ).spec,
            )
        ).token_ids[0]
        for s in seeds
    ]
    real = tuple(zip(seeds, engine, first_tokens(p, q, seeds, relaxed_w)))
    tv = total_variation
    return SampleCheck(p, q, freq, draws, seed0, tv(freq, p), tv(freq, q), tv(perfect, p), real, relaxed_w)


# --- why it pays: forward time against block size (measured in costs.forward_times) -------------------


def timing_sentence(times: list[float], draft_time: float | None = None) -> str:
    """One sentence on what the measured forward times mean for the speedup on this machine."""
    k, t1, tk = len(times), times[0], times[-1]
    ratio = tk / t1
    head = (
        f"Here one target pass over {k} tokens takes {tk * 1e3:.0f} ms, {ratio:.1f}× the {t1 * 1e3:.0f} ms of a "
        f"single token (scoring them one by one would take {k}×)"
    )
    if ratio <= 1.3:
        tail = ", so checking a whole block of guesses costs about one token: every kept guess is nearly free."
    elif ratio < 0.6 * k:
        tail = ", so checking guesses together is much cheaper than one by one: each kept guess saves most of a pass."
    elif ratio < 0.9 * k:
        tail = ", so a block is cheaper than one by one, but the saving is modest: expect a smaller speedup here."
    else:
        tail = ", so this machine gains little from checking guesses together: the speedup here will be small or none."
    if draft_time is not None:
        c = cost_ratio(draft_time, 1, t1)
        tail += f" A draft pass costs {draft_time * 1e3:.0f} ms (c = {c:.2f} of a target pass)."
    return head + tail
