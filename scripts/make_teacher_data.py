"""Generate teacher data for the built-in draft: the target's own replies to a broad set of instructions.

Each output line is `{"prompt": str, "temperature": float, "ids": [int, ...]}`, where `ids` are the tokens the
target generated after its chat template was applied to `[{"role": "user", "content": prompt}]` with
add_generation_prompt=True (token 2, <|im_end|>, ends a reply and is kept; replies that hit --max-new-tokens
stop there). temperature 0 is greedy; others are plain sampling (no top-k, no top-p).

The prompts are built from templates (questions, explanations, how-tos, stories, poems, lists, code,
comparisons, emails ...), shuffled with --seed; the held-out evaluation prompts (assets/prompts/heldout.txt)
are never generated for. The run is resumable: it appends to --out (plain or .gz) and skips every
(prompt, temperature) reply already there, so it can be stopped and started again at will, e.g.

    nohup nice -n 15 python scripts/make_teacher_data.py --out runs/teacher.jsonl.gz --n-prompts 600 \
        --temperatures 0 0.7 1.0 > runs/teacher.log 2>&1 &

A temperature listed twice asks for two samples per prompt at it. Runs on CUDA when present, else CPU.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import itertools
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from train_draft import HELDOUT, norm_prompt, prompt_ids, read_heldout, target_folder  # noqa: E402

# --- the built-in prompts: templates x fillers --------------------------------------------------------

# fmt: off
TOPICS = (
    "the water cycle", "volcanoes", "the solar system", "honey bees", "the Roman Empire", "electricity",
    "recycling", "the human heart", "earthquakes", "rainbows", "the moon's phases", "ocean tides", "dinosaurs",
    "the printing press", "climate change", "the immune system", "magnets", "sound waves", "the pyramids",
    "coral reefs", "compound interest", "the stock market", "renewable energy", "the French Revolution",
    "jazz music", "the Olympic Games", "DNA", "bread baking", "time zones", "the human brain", "glaciers",
    "hurricanes", "the telephone", "bicycles", "chocolate", "coffee", "tea ceremonies", "the Silk Road",
    "the Amazon rainforest", "deserts", "penguins", "whales", "spiders", "mushrooms", "trees in autumn",
    "the periodic table", "atoms", "light bulbs", "solar panels", "wind turbines", "batteries", "email",
    "passwords", "encryption", "databases", "operating systems", "video games", "chess openings", "origami",
)
ACTIONS = (
    "learn to cook", "save money each month", "stay focused while studying", "plant a vegetable garden",
    "write a good resume", "prepare for a long flight", "keep a houseplant alive", "make friends in a new city",
    "learn to play the guitar", "organise my desk", "reduce my screen time", "train a puppy",
    "prepare for a marathon", "back up my phone", "write a cover letter", "clean a laptop keyboard",
    "memorise a speech", "start a journal", "make homemade pizza", "brew a good cup of tea",
    "choose a good book", "paint a room", "ask for a raise", "learn a new word every day",
)
SUBJECTS = (
    "the sea", "the wind", "a rainy afternoon", "spring flowers", "the mountains", "a quiet library",
    "friendship", "a city at night", "autumn leaves", "snow", "the stars", "an old lighthouse", "a cat",
    "the first day of school", "a train journey", "a summer storm", "the desert", "a garden at dawn",
)
CHARACTERS = (
    "a robot who learns to paint", "a pirate searching for treasure", "a snowman that comes alive",
    "a girl who can talk to birds", "an astronaut lost on Mars", "a talking tree in a city park",
    "a shy ghost", "a detective cat", "a baker who bakes magic bread", "two friends lost in a forest",
    "a boy and his first bicycle", "a lighthouse keeper", "a time-travelling teacher", "a brave little mouse",
)
THINGS = (
    "fruits", "animals that live in the ocean", "countries in Europe", "famous scientists", "board games",
    "musical instruments", "programming languages", "vegetables that are easy to grow", "famous painters",
    "ways to reduce stress", "hobbies you can do at home", "uses for baking soda", "inventions of the 1900s",
)
TASKS = (
    "checks if a number is prime", "reverses a string", "counts the vowels in a string",
    "finds the largest element in a list", "sorts a list using bubble sort", "merges two sorted lists",
    "removes duplicates from a list", "computes the factorial of a number", "checks if two strings are anagrams",
    "converts Celsius to Fahrenheit", "reads a file and prints its lines", "flattens a nested list",
    "counts the words in a sentence", "returns the n-th Fibonacci number", "validates an email address",
)
LANGS = ("Python", "JavaScript", "C", "Java", "Rust", "Go")
PAIRS = (
    ("cats", "dogs"), ("tea", "coffee"), ("weather", "climate"), ("viruses", "bacteria"), ("RAM", "storage"),
    ("a lake", "a sea"), ("renting", "buying a home"), ("trains", "planes"), ("books", "films"),
    ("Python", "JavaScript"), ("summer", "winter"), ("frogs", "toads"), ("stocks", "bonds"),
)
WHO = ("my manager", "a teacher", "my landlord", "a new colleague", "a customer", "my grandmother")
ABOUT = ("a late delivery", "a day off", "a broken heater", "a team lunch", "a thank-you", "a meeting change")


def _one(xs: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [(x,) for x in xs]


TEMPLATES: tuple[tuple[str, list[tuple[str, ...]]], ...] = (
    ("What is {}?", _one(TOPICS)), ("Explain {} to a ten-year-old.", _one(TOPICS)),
    ("Tell me about {}.", _one(TOPICS)), ("Tell me three interesting facts about {}.", _one(TOPICS)),
    ("Write a short paragraph about {}.", _one(TOPICS)), ("What are common misconceptions about {}?", _one(TOPICS)),
    ("Why is {} important?", _one(TOPICS)), ("Give me a brief history of {}.", _one(TOPICS)),
    ("What are the key facts about {}?", _one(TOPICS)),
    ("How do I {}?", _one(ACTIONS)), ("What are the steps to {}?", _one(ACTIONS)),
    ("List 5 tips to {}.", _one(ACTIONS)), ("What mistakes do people make when they {}?", _one(ACTIONS)),
    ("Write a short poem about {}.", _one(SUBJECTS)), ("Write a haiku about {}.", _one(SUBJECTS)),
    ("Write a four-line poem about {}.", _one(SUBJECTS)), ("Describe {} in vivid detail.", _one(SUBJECTS)),
    ("Write a short story about {}.", _one(CHARACTERS)),
    ("Write the opening paragraph of a story about {}.", _one(CHARACTERS)),
    ("Write a children's story about {}.", _one(CHARACTERS)),
    ("List 10 {}.", _one(THINGS)), ("Name five {} and say one thing about each.", _one(THINGS)),
    ("Write a {} function that {}.", list(itertools.product(LANGS, TASKS))),
    ("Explain step by step how to write a function that {}.", _one(TASKS)),
    ("Compare {} and {}.", list(PAIRS)), ("What is the difference between {} and {}?", list(PAIRS)),
    ("Which is better, {} or {}?", list(PAIRS)),
    ("Write a short email to {} about {}.", list(itertools.product(WHO, ABOUT))),
)
# fmt: on


def builtin_prompts(seed: int = 0) -> list[str]:
    """Every template filled with every filler, unique, in a seeded shuffled order."""
    prompts = list(dict.fromkeys(t.format(*f) for t, fills in TEMPLATES for f in fills))
    random.Random(seed).shuffle(prompts)
    return prompts


# --- generation ---------------------------------------------------------------------------------------


def existing_counts(path: Path) -> collections.Counter:
    """How many replies per (prompt, temperature) the output file already holds."""
    counts: collections.Counter = collections.Counter()
    if path.is_file():
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by an interrupted run: redo it
                    continue
                counts[(row["prompt"], float(row["temperature"]))] += 1
    return counts


@torch.inference_mode()
def generate_batch(model, batch: list[list[int]], temperature: float, max_new_tokens: int) -> list[list[int]]:
    """Left-padded batched generation; each reply cut after its first <|im_end|> (id 2)."""
    T = max(map(len, batch))
    ids = torch.tensor([[2] * (T - len(x)) + x for x in batch], device=model.device)  # (B, T)
    mask = torch.tensor([[0] * (T - len(x)) + [1] * len(x) for x in batch], device=model.device)
    sample = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {}
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=2,
                         eos_token_id=2, **(sample or {"do_sample": False}))  # fmt: skip
    replies = []
    for row in out[:, T:].tolist():  # (B, <= max_new_tokens)
        replies.append(row[: row.index(2) + 1] if 2 in row else row)
    return replies


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSONL file to append to (.gz for gzip)")
    ap.add_argument("--n-prompts", type=int, default=600, help="how many built-in prompts to use")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0, help="prompt order and sampling")
    ap.add_argument("--target", default="", help="target folder; default: the built-in target")
    ap.add_argument("--heldout", default=str(HELDOUT), help="prompts never generated for")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    args = ap.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # once: generate() draws from the global generator
    target_dir = target_folder(args.target)

    # 1. the prompts (held-out ones removed) and what is still to do, one (prompt, temperature) per reply
    banned = {norm_prompt(p) for p in read_heldout(args.heldout)}
    prompts = [p for p in builtin_prompts(args.seed) if norm_prompt(p) not in banned][: args.n_prompts]
    out = Path(args.out)
    have = existing_counts(out)
    want: collections.Counter = collections.Counter()
    todo: list[tuple[float, str]] = []
    for t in args.temperatures:  # greedy first when listed first: an interrupted run is still useful
        for p in prompts:
            want[(p, t)] += 1
            if want[(p, t)] > have[(p, t)]:
                todo.append((t, p))
    print(f"{len(prompts)} prompts, {len(todo)} replies to generate ({sum(have.values())} already in {out})")
    if not todo:
        return 0

    # 2. the target, then batches of one temperature, prompts of similar length together
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device).eval()
    encoded = {p: prompt_ids(tokenizer, p) for p in prompts}
    out.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if out.suffix == ".gz" else open
    done, n_tokens, t0 = 0, 0, time.time()
    for t, group in itertools.groupby(todo, key=lambda x: x[0]):
        group = sorted((p for _, p in group), key=lambda p: len(encoded[p]))
        for i in range(0, len(group), args.batch_size):
            chunk = group[i : i + args.batch_size]
            replies = generate_batch(model, [encoded[p] for p in chunk], t, args.max_new_tokens)
            # 3. append the whole batch at once (a gzip member per batch), so a kill loses at most one batch
            with opener(out, "at", encoding="utf-8") as f:
                f.write("".join(json.dumps({"prompt": p, "temperature": t, "ids": r}) + "\n"
                                for p, r in zip(chunk, replies)))  # fmt: skip
            done += len(chunk)
            n_tokens += sum(map(len, replies))
            rate = n_tokens / (time.time() - t0)
            print(f"{done}/{len(todo)} replies, {n_tokens} tokens, {rate:.0f} tokens/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
