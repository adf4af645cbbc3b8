"""How near the teacher data comes to each held-out prompt, and what that does to a draft's alpha there.

The teacher data never holds a held-out prompt (nor one sharing a run of 8 words with one: `common.HeldOut`), but
it holds prompts on the same topics: "What are some breakfast ideas?" beside the held-out "What are some healthy
breakfast ideas?", nine palindrome functions beside the held-out one. For each prompt of assets/prompts/heldout.txt
this counts the short teacher prompts (up to 200 characters: questions and requests, not pasted texts) that name its
topic (word starts below, chosen by hand), and splits a draft's teacher-forced alpha (`eval_draft.py --json`) by
whether a prompt has at least 3 such siblings. assets/prompts/unseen.txt is the set with none (tests/test_data.py).

    python scripts/eval_draft.py --draft assets/draft --timing-steps 0 --decode-gamma 0 --json out/heldout.json
    python scripts/heldout_siblings.py out/heldout.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's specviz, from any folder

from specviz.training import teacher_io  # noqa: E402

SHORT = 200  # characters: a longer teacher prompt carries a pasted text, whose words are not its topic
SIBLINGS = 3  # prompts on the topic that make a held-out prompt's topic "seen"
TOPICS = {
    "Tell me about gravity.": "gravit",
    "What is AI?": r"artificial intelligence, ai\b",
    "Write an essay about intelligence.": "intelligence",
    "Cite 20 famous people.": "famous people",
    "Give me the recipe for the best chicken curry.": "curry",
    "def fibonacci(n):": "fibonacci",
    "Write a Python function that reverses a linked list.": "linked list",
    "How do I center a div in CSS?": r"center, centre, div\b",
    "Write a SQL query that returns the ten most recent orders.": r"orders\b",
    "What is the difference between a list and a tuple in Python?": "tuple",
    "Why do cats purr?": "purr",
    "How does the internet work?": "internet",
    "Explain photosynthesis in simple terms.": "photosynthes",
    "What should I pack for a weekend camping trip?": "camping, pack for",
    "Write a limerick about a clumsy robot.": "robot",
    "Give me three ideas for a birthday party for a seven-year-old.": "birthday party",
    "How can I improve my sleep?": "sleep",
    "What causes inflation?": "inflation",
    "Summarize the plot of Cinderella.": "cinderella",
    "Write a thank-you note to my neighbour for watering my plants.": "neighbo, thank-you note",
    "What are the benefits of learning a second language?": "second language, new language, foreign language, "
    "learning a language",
    "How do vaccines train the immune system?": "vaccin, immune",
    "Describe a sunset over the ocean.": "sunset",
    "What is the capital of Australia and why is it not Sydney?": "australia, sydney, canberra",
    "Write a haiku about coffee.": "coffee",
    "Give me five tips for a job interview.": "interview",
    "Explain what a black hole is.": "black hole",
    "How do I make a good first impression?": "first impression",
    "What is machine learning used for?": "machine learning",
    "Write a short story about a dragon who is afraid of the dark.": "dragon",
    "Compare electric cars and petrol cars.": "electric car, petrol",
    "How do airplanes stay in the air?": "airplane, aeroplane",
    "What is democracy?": "democra",
    "Write a motivational message for a student before an exam.": r"motivational, exam\b, exams\b",
    "List the planets of the solar system in order.": "planet, solar system",
    "How do I start running if I have never exercised?": r"start running, running\b.*beginner, jogging, "
    "start exercising",
    "How do I fix a flat bicycle tyre?": r"bicycle, bike\b, flat tyre, flat tire, puncture",
    "Why is exercise good for mental health?": "exercis",
    "Write a JavaScript function that checks whether a string is a palindrome.": "palindrome",
    "What are some healthy breakfast ideas?": "breakfast",
}
TEACHER = ("data/teacher.jsonl.gz", "data/teacher_written.jsonl.gz")


def teacher_prompts(extra: list[str]) -> list[str]:
    prompts: set[str] = set()
    for path in [ROOT / p for p in TEACHER] + [Path(p) for p in extra]:
        if not path.is_file():
            sys.exit(f"No teacher file {path}.")
        prompts |= {r["prompt"] for r in teacher_io.read_jsonl(path)}
    return sorted(p.lower() for p in prompts if len(p) <= SHORT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("eval_json", help="eval_draft.py --json output over assets/prompts/heldout.txt")
    ap.add_argument("--teacher", nargs="*", default=[], help="more teacher files (e.g. the shared drops)")
    args = ap.parse_args()
    per_prompt = {r["prompt"]: r for r in json.loads(Path(args.eval_json).read_text())["per_prompt"]}
    if set(per_prompt) != set(TOPICS):
        sys.exit("The evaluation must cover exactly the prompts of assets/prompts/heldout.txt.")
    prompts = teacher_prompts(args.teacher)
    groups: dict[bool, list[dict]] = {True: [], False: []}
    print(f"{len(prompts):,} short teacher prompts\nsiblings  alpha  prompt  (an example sibling)")
    for held, stems in TOPICS.items():
        pattern = re.compile("|".join(r"\b" + s.strip() for s in stems.split(",")))
        near = [p for p in prompts if pattern.search(p)]
        row = per_prompt[held]
        groups[len(near) >= SIBLINGS].append(row)
        print(f"{len(near):8d}  {row['alpha']:.3f}  {held[:60]}  {near[0][:60] if near else ''}")
    for seen, rows in groups.items():
        tokens = sum(r["tokens"] for r in rows)
        alpha = sum(r["alpha"] * r["tokens"] for r in rows) / tokens if tokens else float("nan")
        label = f"{SIBLINGS}+ siblings" if seen else f"under {SIBLINGS}"
        print(f"{label}: {len(rows)} prompts, {tokens} tokens, alpha {alpha:.3f}")


if __name__ == "__main__":
    main()
