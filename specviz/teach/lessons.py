"""Guided experiments in predict-then-check form, for the Learn tab (no gradio).

Each `Lesson` asks a question with a few answers, runs its experiment on a pair of models (`measure` returns plain
numbers), decides from those numbers which answer was right (`verdict`) and explains it in a few sentences with the
numbers from the run (`explain`). The numbers are JSON-able, so a run made on the built-in pair is shipped in
assets/recordings/lessons.json and shown, marked as a recording, when no model can be loaded.

A new lesson is one more entry in LESSONS. Names as in the papers: p target, q draft, gamma block size, alpha
acceptance, c cost ratio (one draft call / one target call).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from specviz.config import ASSETS, SamplingConfig, SpecvizError
from specviz.engine.tally import Tally
from specviz.models.loaded import LoadedModel
from specviz.request import RunRequest

LESSONS_FILE = ASSETS / "recordings" / "lessons.json"


@dataclass(frozen=True)
class Budget:
    """How much each experiment runs: the page uses the defaults; the tests make them tiny."""

    tokens: int = 64  # new tokens per decoding run
    reps: int = 5  # timing repetitions
    draws: int = 1000  # speculative draws in the distribution check


@dataclass(frozen=True)
class Lesson:
    key: str
    title: str
    question: str
    choices: tuple[str, ...]
    measure: Callable[[LoadedModel, LoadedModel, Budget], dict]  # the experiment: numbers only
    verdict: Callable[[dict], int]  # which of `choices` the numbers say is right
    explain: Callable[[dict], str]  # a few sentences with the numbers


@dataclass(frozen=True)
class Outcome:
    lesson: str  # Lesson.key
    numbers: dict
    answer: int  # the index of the right choice
    explanation: str
    source: dict = field(default_factory=dict)  # where the numbers come from: models, machine, date, live or not


# --- shared measurements ----------------------------------------------------------------------------


def _prompt(kind: str) -> str:
    """The first prompt of one of the benchmark's sets (assets/prompts)."""
    for line in (ASSETS / "prompts" / f"{kind}.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            return line.strip()
    raise SpecvizError(f"The prompt set {kind} is empty.")


def _ids(p: LoadedModel, prompt: str) -> list[int]:
    from specviz.api import encode_prompt

    return encode_prompt(p, prompt)


def _run(p, q, ids, tokens: int, gamma: int = 0, temperature: float = 0.0, seed: int = 0) -> list:
    """One run's events: plain decoding when gamma is 0, else speculative."""
    from specviz.engine.loop import autoregressive_decode, speculative_decode

    cfg = RunRequest(
        drafter="model", gamma=max(gamma, 1), tree="off", max_new_tokens=tokens, seed=seed, temperature=temperature
    ).spec
    return list(speculative_decode(p, q, ids, cfg) if gamma else autoregressive_decode(p, ids, cfg))


def _numbers(events: list) -> dict:
    """What a lesson reads of one run: its Tally's numbers (tally.py) and the acceptance per draft position."""
    from specviz.view.metrics import acceptance_by_position, rounds_frame

    t = Tally.of(events)
    out = {
        k: getattr(t, k)
        for k in (
            "new_tokens",
            "tokens_per_s",
            "drafted",
            "accepted",
            "acceptance_rate",
            "alpha",
            "target_calls",
            "verify_s",
            "tokens_per_call",
        )
    }
    out["per_position"] = [float(v) for v in acceptance_by_position(rounds_frame(events))]
    return out


def _three_way(x: float, low: float, high: float) -> int:
    """0 above `high`, 2 below `low`, 1 between: 'more', 'about the same', 'less'."""
    return 0 if x > high else 2 if x < low else 1


# --- 1. gamma too large -------------------------------------------------------------------------------


def _gamma_measure(p, q, b: Budget) -> dict:
    ids = _ids(p, _prompt("everyday"))
    ar = _numbers(_run(p, q, ids, b.tokens))
    small, large = (_numbers(_run(p, q, ids, b.tokens, gamma=g)) for g in (2, 10))
    return {"gammas": [2, 10], "plain": ar, "small": small, "large": large}


def _speedups(m: dict) -> tuple[float, float]:
    base = max(m["plain"]["tokens_per_s"], 1e-9)
    return m["small"]["tokens_per_s"] / base, m["large"]["tokens_per_s"] / base


def _gamma_explain(m: dict) -> str:
    s2, s10 = _speedups(m)
    pos = m["large"]["per_position"]
    first, last = (pos[0], pos[-1]) if pos else (0.0, 0.0)
    v2 = m["small"]["verify_s"] / max(m["small"]["target_calls"], 1)
    v10 = m["large"]["verify_s"] / max(m["large"]["target_calls"], 1)
    return (
        f"With gamma = 2 speculative decoding ran at {s2:.2f}× the plain speed, with gamma = 10 at {s10:.2f}×. "
        f"In the gamma = 10 run the first guess of a round was kept in {first:.0%} of rounds but the tenth in only "
        f"{last:.0%}: a guess counts only if every guess before it was kept, so the chance falls like α^k. "
        f"Meanwhile every round pays for ten draft calls, and one target pass over 11 tokens took "
        f"{v10 * 1e3:.0f} ms against {v2 * 1e3:.0f} ms over 3. Past a few guesses the extra work buys almost "
        "nothing: the best gamma is small when the acceptance rate is modest."
    )


GAMMA = Lesson(
    key="gamma",
    title="1. Guess more per round?",
    question=(
        "The draft guesses gamma tokens per round, and the target checks them all in one pass. If gamma goes "
        "from 2 to 10, speculative decoding will get…"
    ),
    choices=(
        "faster: more guesses per round means more free tokens",
        "about as fast (within 5%)",
        "slower: late guesses are rarely kept, and making and checking them costs time",
    ),
    measure=_gamma_measure,
    verdict=lambda m: _three_way(_speedups(m)[1] / max(_speedups(m)[0], 1e-9), 0.95, 1.05),
    explain=_gamma_explain,
)


# --- 2. temperature and acceptance ----------------------------------------------------------------------

HOT = 1.2


def _temp_measure(p, q, b: Budget) -> dict:
    ids = _ids(p, _prompt("everyday"))
    cold = Tally.of(_run(p, q, ids, b.tokens, gamma=3))
    hot = [Tally.of(_run(p, q, ids, b.tokens, gamma=3, temperature=HOT, seed=s)) for s in (0, 1)]
    hot_rate = sum(hot, Tally()).acceptance_rate  # two seeds pooled
    return {"temperature": HOT, "cold": cold.acceptance_rate, "hot": hot_rate, "runs_hot": len(hot)}


def _temp_explain(m: dict) -> str:
    cold, hot, t = m["cold"], m["hot"], m["temperature"]
    head = f"At temperature 0 the target kept {cold:.0%} of the draft's guesses; at temperature {t:g}, {hot:.0%}."
    if hot < cold - 0.03:
        why = (
            " Sampling spreads both models' probability over many more tokens. A guess is kept with chance "
            "min(1, p/q), and the draft now often samples words the target gives little weight to, so fewer survive."
        )
    elif hot > cold + 0.03:
        why = (
            " At temperature 0 a guess is kept only if it is exactly the target's top token, so a near-miss is a "
            "miss. Sampled, a guess the target also likes is usually kept (chance min(1, p/q)), even when it is "
            "not the target's favourite."
        )
    else:
        why = (
            " Two effects cancel here: sampling makes the draft pick words the target likes less, but it no longer "
            "needs to hit the target's single top token."
        )
    return (
        head
        + why
        + " The acceptance rate sets the speedup, so the same pair can pay off at one setting and not another."
    )


TEMPERATURE = Lesson(
    key="temperature",
    title="2. Temperature and acceptance",
    question=f"Raise the temperature from 0 (greedy) to {HOT:g}. The share of the draft's guesses the target keeps will…",
    choices=("rise", "stay about the same (within 3 points)", "fall"),
    measure=_temp_measure,
    verdict=lambda m: _three_way(m["hot"] - m["cold"], -0.03, 0.03),
    explain=_temp_explain,
)


# --- 3. a draft good at chat, bad at code -----------------------------------------------------------------


def _domain_measure(p, q, b: Budget) -> dict:
    out = {}
    for kind in ("everyday", "code"):
        prompt = _prompt(kind)
        n = _numbers(_run(p, q, _ids(p, prompt), b.tokens, gamma=3))
        out[kind] = {"prompt": prompt, "acceptance": n["acceptance_rate"], "tokens_per_call": n["tokens_per_call"]}
    return out


def _domain_explain(m: dict) -> str:
    chat, code = m["everyday"], m["code"]
    head = (
        f"On “{chat['prompt']}” the target kept {chat['acceptance']:.0%} of the guesses "
        f"({chat['tokens_per_call']:.2f} tokens per target pass); on “{code['prompt']}” {code['acceptance']:.0%} "
        f"({code['tokens_per_call']:.2f} per pass)."
    )
    if code["acceptance"] < chat["acceptance"] - 0.03:
        why = (
            " A draft only guesses well what it has seen: the built-in draft learned from the target's chat replies, "
            "so code, with its own words and layout, surprises it more often."
        )
    else:
        why = (
            " Code can be very predictable (indentation, keywords, repeated names), which helps any draft; the "
            "difference a training domain makes shows best over many prompts (python -m specviz bench)."
        )
    return head + why + " Pick or train a draft on the kind of text you will generate."


DOMAIN = Lesson(
    key="domain",
    title="3. A chat draft on code",
    question=(
        "The built-in draft was trained on the target's replies to everyday chat prompts. On a coding prompt, "
        "compared with an everyday question, its guesses will be kept…"
    ),
    choices=("more often", "about as often (within 3 points)", "less often"),
    measure=_domain_measure,
    verdict=lambda m: _three_way(m["code"]["acceptance"] - m["everyday"]["acceptance"], -0.03, 0.03),
    explain=_domain_explain,
)


# --- 4. what a verify costs here ---------------------------------------------------------------------------

BLOCK = 5


def _verify_measure(p, q, b: Budget) -> dict:
    from specviz.teach.compute import forward_times

    ids = _ids(p, _prompt("everyday"))
    times = forward_times(p, ids, BLOCK, reps=b.reps)
    draft = forward_times(q, ids, 1, reps=b.reps, vocab_size=p.vocab_size)[0]
    return {"times": times, "draft": draft, "device": p.device.type}


def _verify_explain(m: dict) -> str:
    from specviz.teach.compute import timing_sentence

    times, draft = m["times"], m["draft"]
    c = draft / times[0]
    return (
        f"{timing_sentence(times, draft)} Speculative decoding wins only if checking a block costs about one pass "
        f"and a draft call is cheap: with c = {c:.2f}, every round of gamma guesses costs gamma·c + (one verify) "
        "target passes' worth of time, and must be repaid by kept guesses. On a GPU the verify is nearly free "
        "because the weights are read once for all tokens; on a small CPU the arithmetic itself grows with the "
        "block, so the speedup is smaller."
    )


VERIFY = Lesson(
    key="verify",
    title="4. What does a check cost here?",
    question=(
        f"On this machine, one target pass over {BLOCK} tokens at once (a verify of {BLOCK - 1} guesses) takes, "
        "compared with a pass over 1 token…"
    ),
    choices=(
        "about the same (under 1.3×)",
        "more, but far less than 5 passes (1.3× to 3.5×)",
        f"about as long as {BLOCK} separate passes (3.5× or more)",
    ),
    measure=_verify_measure,
    verdict=lambda m: 0 if m["times"][-1] / m["times"][0] < 1.3 else 1 if m["times"][-1] / m["times"][0] < 3.5 else 2,
    explain=_verify_explain,
)


# --- 5. why the output is the same ---------------------------------------------------------------------------


def _same_measure(p, q, b: Budget) -> dict:
    from specviz.teach.compute import greedy_check, sample_check

    ids = _ids(p, _prompt("everyday"))
    gc = greedy_check(p, q, ids, 4, b.tokens)
    sc = sample_check(p, q, ids, SamplingConfig(1.0), draws=b.draws, real_runs=0)
    return {
        "tokens": len(gc.ar_ids),
        "identical": gc.identical,
        "first_difference": gc.first_difference,
        "draws": sc.draws,
        "tv_p": sc.tv_p,
        "tv_q": sc.tv_q,
        "tv_noise": sc.tv_noise,
    }


def _same_explain(m: dict) -> str:
    if m["identical"]:
        head = f"At temperature 0 both wrote the same {m['tokens']} tokens, token for token."
    else:
        head = (
            f"At temperature 0 the texts first differ at token {m['first_difference'] + 1}: a near-tie between two "
            "tokens, broken differently by rounding in a batched pass (exact arithmetic would give equality)."
        )
    return (
        f"{head} Greedy verification keeps a guess only if it is the target's own top token, and at the first "
        "miss puts the target's top token in its place, so every token is the one the target alone would write. "
        f"Sampled (temperature 1), {m['draws']} speculative draws of the first token were at distance "
        f"{m['tv_p']:.3f} from p, about what {m['draws']} perfect draws from p show by chance ({m['tv_noise']:.3f}), "
        f"and {m['tv_q']:.3f} from the draft q: the rule min(1, p/q) plus the leftover max(0, p − q) gives exactly p."
    )


SAME = Lesson(
    key="same",
    title="5. Is the output really the same?",
    question="At temperature 0, will speculative decoding write the same text as the target model alone?",
    choices=("yes, token for token", "almost: a few words differ", "no: the draft's guesses change the text"),
    measure=_same_measure,
    verdict=lambda m: 0 if m["identical"] else 1 if (m["first_difference"] or 0) > m["tokens"] // 2 else 2,
    explain=_same_explain,
)


# --- 6. a free drafter: prompt lookup on a summarising prompt ------------------------------------------------


def _lookup_measure(p, q, b: Budget) -> dict:
    from specviz.engine.loop import autoregressive_decode, speculative_decode

    prompt = _prompt("grounded")  # summarise a pasted text: the answer reuses the text's own words
    ids = _ids(p, prompt)
    ar = _numbers(
        list(
            autoregressive_decode(
                p, ids, RunRequest(drafter="model", gamma=3, tree="off", max_new_tokens=b.tokens).spec
            )
        )
    )
    out = {"prompt": prompt, "plain": ar}
    for name in ("model", "lookup"):
        cfg = RunRequest(drafter=name, gamma="auto", tree="off", max_new_tokens=b.tokens).spec
        events = list(speculative_decode(p, q if name == "model" else None, ids, cfg))
        out[name] = _numbers(events)
        out[name]["speedup"] = out[name]["tokens_per_s"] / max(ar["tokens_per_s"], 1e-9)
    return out


def _lookup_explain(m: dict) -> str:
    model, lookup = m["model"], m["lookup"]
    return (
        f"Asked to summarise a pasted text, the draft model ran at {model['speedup']:.2f}× plain speed and prompt "
        f"lookup at {lookup['speedup']:.2f}× ({lookup['tokens_per_call']:.2f} tokens per target pass against "
        f"{model['tokens_per_call']:.2f}). Lookup's guesses cost nothing to make: it copies the words that followed "
        f"the last few words of the text wherever they appeared before, and {lookup['alpha']:.0%} of the copies it "
        "offered were kept. A summary repeats its source's phrases, so free guesses go a long way; on an open "
        "question there is little to copy, and the draft model is the better guesser."
    )


LOOKUP = Lesson(
    key="lookup",
    title="6. Guesses for free",
    question=(
        "Prompt lookup needs no draft model: it guesses by copying what followed the same words earlier in the "
        "prompt. On a 'summarise this text' prompt, compared with the trained draft model, it will be…"
    ),
    choices=("faster", "about as fast (within 5%)", "slower"),
    measure=_lookup_measure,
    verdict=lambda m: _three_way(m["lookup"]["speedup"] / max(m["model"]["speedup"], 1e-9), 0.95, 1.05),
    explain=_lookup_explain,
)


LESSONS: tuple[Lesson, ...] = (GAMMA, TEMPERATURE, DOMAIN, VERIFY, SAME, LOOKUP)


def lesson(key: str) -> Lesson:
    for ls in LESSONS:
        if ls.key == key:
            return ls
    raise SpecvizError(f"There is no lesson {key!r}; the lessons are {', '.join(x.key for x in LESSONS)}.")


def run(ls: Lesson, target: LoadedModel, draft: LoadedModel, budget: Budget = Budget()) -> Outcome:
    """Run the lesson's experiment on this pair and explain what it measured."""
    from specviz.recording.record import environment

    numbers = ls.measure(target, draft, budget)
    source = environment(target, draft) | {"live": True}
    return Outcome(ls.key, numbers, ls.verdict(numbers), ls.explain(numbers), source)


def recorded(ls: Lesson) -> Outcome | None:
    """The lesson's shipped run (assets/recordings/lessons.json), for a page with no model loaded."""
    try:
        data = json.loads(LESSONS_FILE.read_text(encoding="utf-8"))
        numbers = data["lessons"][ls.key]
        return Outcome(ls.key, numbers, ls.verdict(numbers), ls.explain(numbers), data["env"] | {"live": False})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_recorded(outcomes: list[Outcome], env: dict) -> None:
    """Write the shipped lesson runs (scripts/make_recordings.py)."""
    data = {"env": env, "lessons": {o.lesson: o.numbers for o in outcomes}}
    LESSONS_FILE.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n", encoding="utf-8")


def feedback(ls: Lesson, picked: int, outcome: Outcome) -> str:
    """One line comparing the prediction with the measurement."""
    right = ls.choices[outcome.answer]
    if picked == outcome.answer:
        return f"✓ Your prediction matches the measurement: {right}."
    return f"✗ You predicted “{ls.choices[picked]}”; the measurement says: {right}."
