"""Build the prompt set for the teacher data: many distinct instructions over many kinds, none held out.

    python -m specviz.training.build_prompts --out data/prompts.jsonl.gz            # templates + real texts (seconds)
    python -m specviz.training.build_prompts --out data/prompts.jsonl.gz --target-written 400   # + prompts the target writes

Writes one JSON object per line, `{"prompt": str, "kind": str}`, in a seeded shuffled order (so a teacher run
that stops early still covers every kind), and prints the count per kind. The kinds:
  question, howto, advice, creative (stories, poems), list, comparison, reasoning (multi-step, with numbers):
      templates over topic lists (below) and city names from the time-zone database;
  code_write, code_edit: templates over tasks and languages, and the source of small standard-library functions;
  summarise, rewrite, answer_from_text: a real paragraph pasted into the prompt, from Python's docstrings,
      installed packages' descriptions and /usr/share/doc (prompt_sources.py);
  target_written: questions and instructions the target itself wrote from seed topics (--target-written N
      asks it for N more, niced, cached in --target-cache and reused on every later build).

Held out: every prompt in every file under --heldout-dir (assets/prompts/ by default: heldout, everyday, code,
summarise, and whatever set is added there later) is excluded by its normalised text, and so is every prompt
that shares a run of 8 words with one of them (this catches a held-out text or function pasted under another
instruction). The same test is `HeldOut.blocks(prompt)` (common.py), for filtering teacher data made before a set was added.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import random
import re
import sys
from pathlib import Path

from specviz.training import prompt_sources as src
from specviz.training.common import HELDOUT_DIR, ROOT, HeldOut, norm_prompt, read_prompts  # noqa: F401 (read_prompts: as before)
from specviz.training.prompt_lists import (
    ACTIONS,
    ADVICE,
    CHARACTERS,
    CODE_TASKS,
    CREATIVE_FORMS,
    EDITS,
    GOALS,
    LANGS,
    PAIRS,
    PLACES,
    REWRITES,
    SUBJECTS,
    SUMMARIES,
    THINGS,
    TOPICS,
    TWISTS,
)

# How many prompts of the kinds below to make; the templated kinds' sizes are the n of each _fill call in
# templated() (question 1,500, creative 1,100, howto 900, code_write 800, advice 700, list 700, comparison 600).
QUOTA = {"reasoning": 800, "code_edit": 700, "summarise": 700, "rewrite": 600, "answer_from_text": 600}


# --- the kinds ---------------------------------------------------------------------------------------


def _fill(templates: list[str], fillers: list, rng: random.Random, n: int) -> list[str]:
    """n distinct prompts drawn from templates x fillers (a filler is a string or a tuple)."""
    pool = [t.format(*(f if isinstance(f, tuple) else (f,))) for t in templates for f in fillers]
    pool = list(dict.fromkeys(pool))
    rng.shuffle(pool)
    return pool[:n]


def templated(rng: random.Random) -> dict[str, list[str]]:
    cities = src.cities()
    mods = src.stdlib_module_summaries()
    topics = list(TOPICS)
    return {
        "question": _fill(
            [
                "What is {}?",
                "Explain {} in simple terms.",
                "How does {} work?",
                "Why does {} matter?",
                "Tell me three interesting facts about {}.",
                "Explain {} to a ten-year-old.",
                "Give me a brief history of {}.",
                "What are common misconceptions about {}?",
                "Write a short paragraph about {}.",
                "What should everyone know about {}?",
                "Explain {} as if I were a university student.",
                "What are the main ideas behind {}?",
            ],
            topics,
            rng,
            1150,
        )
        + _fill(
            [
                "What is {} known for?",
                "Tell me about the city of {}.",
                "What is the weather usually like in {}?",
                "What language do people speak in {}?",
            ],
            cities,
            rng,
            250,
        )
        + _fill(
            ["What is Python's {} module for?", "Explain what the Python module {} does."],
            [m for m, _ in mods],
            rng,
            100,
        ),
        "howto": _fill(
            [
                "How do I {}?",
                "What are the steps to {}?",
                "Explain step by step how to {}.",
                "I want to {}. Where do I start?",
                "What is the easiest way to {}?",
                "How long does it take to {}?",
                "What do I need to {}?",
            ],
            list(ACTIONS),
            rng,
            900,
        ),
        "advice": _fill(
            ["{}", "{} Any advice?", "{} What would you suggest?", "Give me some advice: {}"], list(ADVICE), rng, 450
        )
        + _fill(
            [
                "What are good habits for {}?",
                "How can I stay motivated to {}?",
                "What mistakes should I avoid when I {}?",
                "Give me five tips to {}.",
            ],
            list(GOALS) + list(ACTIONS),
            rng,
            250,
        ),
        "creative": _fill(["Write a {} about {}."], [(f, s) for f in CREATIVE_FORMS for s in SUBJECTS], rng, 450)
        + _fill(
            [
                "Write a short story about {} {}.",
                "Write a children's story about {} {}.",
                "Write the opening paragraph of a story about {} {}.",
                "Write a fable about {} {}.",
            ],
            [(c, t) for c in CHARACTERS for t in TWISTS],
            rng,
            450,
        )
        + _fill(
            [
                "Describe {} in vivid detail.",
                "Write a postcard from {}.",
                "Write a short travel diary entry about a day in {}.",
            ],
            list(PLACES) + cities,
            rng,
            200,
        ),
        "list": _fill(
            [
                "List 10 {}.",
                "Name five {} and say one thing about each.",
                "Give me a list of {}.",
                "List seven {}, from the best known to the least known.",
                "What are some {}?",
            ],
            list(THINGS),
            rng,
            700,
        ),
        "comparison": _fill(
            [
                "Compare {} and {}.",
                "What is the difference between {} and {}?",
                "Which is better, {} or {}?",
                "What do {} and {} have in common?",
                "Give me the pros and cons of {} versus {}.",
                "Make a table comparing {} and {}.",
            ],
            list(PAIRS),
            rng,
            600,
        ),
        "code_write": _fill(
            ["Write a {} function that {}.", "In {}, write a function that {}.", "Show me {} code that {}."],
            [(lang, t) for lang in LANGS for t in CODE_TASKS],
            rng,
            650,
        )
        + _fill(
            [
                "Explain step by step how to write a function that {}.",
                "Write a Python function that {}, with a docstring and tests.",
            ],
            list(CODE_TASKS),
            rng,
            150,
        ),
    }


def reasoning(rng: random.Random, n: int) -> list[str]:
    """Multi-step word problems with seeded numbers (the numbers make each one distinct)."""
    names = [
        "Anna",
        "Ben",
        "Carla",
        "David",
        "Emma",
        "Farid",
        "Grace",
        "Hiro",
        "Ines",
        "Jonas",
        "Kofi",
        "Lena",
        "Mia",
        "Noah",
    ]
    items = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "stamps", "cards", "eggs", "coins"]
    days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
    suffix = ["", " Think step by step.", " Show your working.", " Explain your reasoning.", " Explain each step."]
    forms = [
        lambda a, b, c: (
            f"{rng.choice(names)} has {a} {rng.choice(items)}, buys {b} more and gives away {c}. How many are left?"
        ),
        lambda a, b, c: (
            f"A train travels {a * 10} km in {b} hours. At the same speed, how far does it go in {c} hours?"
        ),
        lambda a, b, c: f"A shirt costs ${a * 5} and is on sale for {b * 5}% off. What is the sale price?",
        lambda a, b, c: f"If today is {rng.choice(days)}, what day of the week will it be in {a + b + c} days?",
        lambda a, b, c: f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        lambda a, b, c: (
            f"{rng.choice(names)} is {a} years old and has a brother {b} years older. How old will the brother be in {c} years?"
        ),
        lambda a, b, c: f"A recipe needs {b} eggs for {a} people. How many eggs are needed for {a * c} people?",
        lambda a, b, c: f"What comes next in the sequence {a}, {a + b}, {a + 2 * b}, {a + 3 * b}, ...?",
        lambda a, b, c: f"I save ${a} every week. How many weeks until I have ${a * (b + c)}?",
        lambda a, b, c: (
            f"A class has {a + b} students; {a} of them walk to school and the rest take the bus. What fraction takes the bus?"
        ),
        lambda a, b, c: f"Is {a * b + c} a prime number? Explain how you check.",
        lambda a, b, c: (
            f"A tank holds {a * 10} litres and fills at {b} litres per minute. How long does it take to fill it from empty?"
        ),
        lambda a, b, c: f"If {a} workers build a wall in {b * c} days, how long would {a * c} workers take?",
        lambda a, b, c: (
            f"{rng.choice(names)} reads {a} pages a day. The book has {a * b + c} pages. How many days to finish it?"
        ),
        lambda a, b, c: f"What is {a}% of {b * 20}, and what is that plus {c}?",
        lambda a, b, c: f"A bag has {a} red and {b} blue balls. If I pick one at random, what is the chance it is red?",
    ]
    out = set()
    while len(out) < n:
        a, b, c = rng.randint(2, 40), rng.randint(2, 12), rng.randint(2, 9)
        out.add(rng.choice(forms)(a, b, c) + rng.choice(suffix))
    return sorted(out)


def grounded(rng: random.Random) -> dict[str, list[str]]:
    """Prompts with a real paragraph or function pasted in."""
    texts = [t for _, t in src.docstring_texts() + src.package_texts()]
    docs = [t for _, t in src.doc_texts()]
    rng.shuffle(docs)
    texts += docs[: 2 * len(texts)]  # /usr/share/doc is large and dry: at most two thirds of the texts
    rng.shuffle(texts)
    funcs = [s for _, s in src.small_functions()]

    def paste(instr: str, body: str) -> str:
        return f"{instr}: {body}" if rng.random() < 0.5 else f"{instr}:\n\n{body}"

    def question(text: str) -> str:
        words = [w for w in re.findall(r"[A-Za-z]{6,}", text) if w.lower() not in {"should", "because", "through"}]
        word = rng.choice(words) if words else "this"
        q = rng.choice(
            [
                f"What does the text say about {word}?",
                "What is the main point of the text?",
                "What problem does the text describe, and how is it solved?",
                f"Why is {word} mentioned in the text?",
                "Who would find this text useful, and why?",
                "According to the text, what should the reader do?",
                "Does the text mention any limitation or warning? Quote it.",
            ]
        )
        lead = rng.choice(
            ["Answer from this text only", "Read the text and answer the question", "Using the text below, answer"]
        )
        return f"{lead}. Question: {q}\n\nText: {text}" if rng.random() < 0.5 else f"Text: {text}\n\n{lead}: {q}"

    n_sum, n_rew, n_ans = QUOTA["summarise"], QUOTA["rewrite"], QUOTA["answer_from_text"]
    return {
        "summarise": [paste(rng.choice(SUMMARIES), t) for t in texts[:n_sum]],
        "rewrite": [paste(rng.choice(REWRITES), t) for t in texts[n_sum : n_sum + n_rew]],
        "answer_from_text": [question(t) for t in texts[n_sum + n_rew : n_sum + n_rew + n_ans]],
        "code_edit": _fill([e + ":\n\n{}" for e in EDITS], funcs, rng, QUOTA["code_edit"]),
    }


def read_target_written(path: str | Path) -> list[str]:
    from specviz.training.target_prompts import read_cache

    return [r["prompt"] for r in read_cache(path)]


def build(seed: int = 0, heldout_dir: str | Path = HELDOUT_DIR, target_cache: str | Path | None = None) -> list[dict]:
    """Every kind, held-out prompts removed, distinct by normalised text, in a seeded shuffled order."""
    rng = random.Random(seed)
    kinds = templated(rng)
    kinds["reasoning"] = reasoning(rng, QUOTA["reasoning"])
    kinds.update(grounded(rng))
    if target_cache and Path(target_cache).is_file():
        kinds["target_written"] = read_target_written(target_cache)
    held = HeldOut.from_dir(heldout_dir)
    rows, seen = [], set()
    for kind in sorted(kinds):
        for p in kinds[kind]:
            key = norm_prompt(p)
            if key not in seen and not held.blocks(p):
                seen.add(key)
                rows.append({"prompt": p, "kind": kind})
    random.Random(seed).shuffle(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "data" / "prompts.jsonl.gz"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout-dir", default=str(HELDOUT_DIR), help="every file here is a held-out prompt set")
    ap.add_argument("--target-cache", default=str(ROOT / "data" / "target_prompts.jsonl.gz"))
    ap.add_argument("--target-written", type=int, default=0, help="ask the target for this many more prompts first")
    ap.add_argument("--target", default="", help="target folder; default: the built-in target")
    args = ap.parse_args(argv)

    if args.target_written:
        from specviz.training.target_prompts import extend_cache

        extend_cache(args.target_cache, args.target_written, target=args.target, seed=args.seed)
    rows = build(args.seed, args.heldout_dir, args.target_cache)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8") if out.suffix == ".gz" else open(out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    counts = collections.Counter(r["kind"] for r in rows)
    for kind, n in sorted(counts.items()):
        print(f"{kind:18s} {n:6d}")
    print(f"{'total':18s} {len(rows):6d} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
