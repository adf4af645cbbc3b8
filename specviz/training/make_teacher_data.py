"""Generate teacher data for the built-in draft: the target's own replies to a broad set of instructions.

Each output line is `{"prompt": str, "temperature": float, "ids": [int, ...]}` (plus `"kind"` when the prompt
file names one), where `ids` are the tokens the target generated after its chat template was applied to
`[{"role": "user", "content": prompt}]` with add_generation_prompt=True (token 2, <|im_end|>, ends a reply and
is kept; replies that hit --max-new-tokens stop there). temperature 0 is greedy; others are plain sampling
(no top-k, no top-p).

Prompts: --prompts FILE (the output of specviz.training.build_prompts, `{"prompt", "kind"}` JSON lines, or a .txt
with one prompt a line), in the file's order; without it, the small built-in template set below, shuffled
with --seed. Prompts in any file of assets/prompts/ (held-out and benchmark sets) are never generated for.

Soft labels: with --topk K (16 by default, 0 for none) the target's K most likely tokens and their
probabilities at every generated position go beside --out in numbered parts (teacher.jsonl.gz ->
teacher.topk.000.jsonl.gz, teacher.topk.001.jsonl.gz, ...), a new part once the last passes --topk-part-mb:
about 47 MB per million tokens, so one file would soon pass a git host's 100 MB limit. teacher_io.py
documents the format and reads it back.

The run is resumable: it appends one gzip member per batch to --out (plain or .gz), cuts off a member that
an earlier kill left incomplete, and skips every (prompt, temperature) reply already there, so it can be
stopped and started again at will. The top-k record of a batch is written before its replies, so every
reply in --out has its top-k record (a kill between the two leaves a spare top-k record, which readers
match by (prompt, temperature, ids) and otherwise ignore). Prompts are taken in windows of --window, every
temperature within a window, so a run stopped early still covers every kind at every temperature, e.g.

    nohup nice -n 19 python -m specviz.training.make_teacher_data --prompts data/prompts.jsonl.gz \
        --out data/teacher.jsonl.gz --temperatures 0 0.8 > data/teacher.log 2>&1 &

A temperature listed twice asks for two samples per prompt at it. Sampling draws from one torch.Generator
seeded with --seed (a resumed run continues with a fresh one, so it is not bit-for-bit the uninterrupted run).
Runs on CUDA when present, else CPU.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import random
import sys
import time
from pathlib import Path

import torch

from specviz.backends.local import cache_kwargs
from specviz.training.common import HELDOUT, HELDOUT_DIR, HeldOut, prompt_ids, read_heldout, read_prompts, target_folder
from specviz.training.teacher_io import append_jsonl, encode_topk, read_jsonl, repair_tail, topk_part, topk_parts

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
    """How many replies per (prompt, temperature) the output file already holds (a cut-off tail is skipped)."""
    return collections.Counter((row["prompt"], float(row["temperature"])) for row in read_jsonl(path))


def load_prompts(path: str) -> list[tuple[str, str]]:
    """(prompt, kind) from a builder file (JSON lines) or a .txt file (one prompt a line, kind '')."""
    if path.endswith(".txt"):
        return [(p, "") for p in read_heldout(path)]
    return [(r["prompt"], r.get("kind", "")) for r in read_prompts(path)]


@torch.inference_mode()
def generate_batch(
    model, batch: list[list[int]], temperature: float, max_new_tokens: int, k: int = 0, generator=None
) -> tuple[list[list[int]], list[tuple[torch.Tensor, torch.Tensor] | None]]:
    """Left-padded batched decoding with a KV cache; each reply cut after its first <|im_end|> (id 2).

    Returns the replies and, with k > 0, each reply's (top ids (T, k), their probabilities p (T, k)) under the
    target at temperature 1. A row leaves the batch (and the cache) as soon as it has finished.
    """
    from transformers import DynamicCache

    B, T = len(batch), max(map(len, batch))
    ids = torch.tensor([[2] * (T - len(x)) + x for x in batch], device=model.device)  # (B, T)
    mask = torch.tensor([[0] * (T - len(x)) + [1] * len(x) for x in batch], device=model.device)  # (B, T)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)  # (B, T) positions as if unpadded
    cache = DynamicCache(config=model.config)
    rows = torch.arange(B, device=model.device)  # batch rows still generating
    steps = []  # per step: (rows, next token, top ids, top p), all on the CPU
    for _ in range(max_new_tokens):
        # 1. the target's next-token logits for the rows still generating
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            **cache_kwargs(model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1].float()  # (b, V)
        # 2. the next token: greedy, or sampled at `temperature` from the one generator
        if temperature:
            nxt = torch.multinomial((logits / temperature).softmax(-1), 1, generator=generator).squeeze(1)
        else:
            nxt = logits.argmax(-1)  # (b,)
        # 3. p's top-k at temperature 1 (the soft labels)
        top = logits.softmax(-1).topk(k, -1) if k else None
        steps.append((rows.cpu(), nxt.cpu(), *((top.indices.cpu(), top.values.cpu()) if k else (None, None))))
        # 4. drop finished rows from the batch and the cache; feed the rest their new token
        alive = nxt != 2
        if not alive.any():
            break
        if not alive.all():
            keep = alive.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, nxt, mask, pos = rows[keep], nxt[keep], mask[keep], pos[keep]
        ids = nxt[:, None]  # (b, 1)
        mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
        pos = pos[:, -1:] + 1
    replies: list[list[int]] = [[] for _ in batch]
    tops: list[list] = [[] for _ in batch]
    for r, x, ti, tp in steps:
        for j, row in enumerate(r.tolist()):
            replies[row].append(int(x[j]))
            if k:
                tops[row].append((ti[j], tp[j]))
    topk = [(torch.stack([a for a, _ in t]), torch.stack([b for _, b in t])) if k else None for t in tops]
    return replies, topk


def plan(prompts: list[str], temperatures: list[float], have: collections.Counter, window: int) -> list[list]:
    """Work units in order: per window of prompts, per temperature, the replies still missing there."""
    want: collections.Counter = collections.Counter()
    units = []
    step = window or max(1, len(prompts))
    for i in range(0, len(prompts), step):
        for t in dict.fromkeys(temperatures):
            todo = []
            for p in prompts[i : i + step]:
                for _ in range(temperatures.count(t)):
                    want[(p, t)] += 1
                    if want[(p, t)] > have[(p, t)]:
                        todo.append(p)
            if todo:
                units.append([t, todo])
    return units


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSONL file to append to (.gz for gzip)")
    ap.add_argument("--prompts", default="", help="prompt file from specviz.training.build_prompts (or a .txt)")
    ap.add_argument(
        "--n-prompts", type=int, default=None, help="use the first N prompts (default: 600 built-in, all of --prompts)"
    )
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--window", type=int, default=0, help="prompts per window (every temperature per window); 0 = all")
    ap.add_argument("--topk", type=int, default=16, help="target top-k per position to store beside --out; 0 = none")
    ap.add_argument("--topk-part-mb", type=float, default=25.0, help="start a new top-k part past this size")
    ap.add_argument("--seed", type=int, default=0, help="prompt order and sampling")
    ap.add_argument("--target", default="", help="target folder; default: the built-in target")
    ap.add_argument("--heldout", default=str(HELDOUT), help="prompts never generated for")
    ap.add_argument("--heldout-dir", default=str(HELDOUT_DIR), help="every prompt file here is never generated for")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    args = ap.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(args.threads)
    generator = torch.Generator(device).manual_seed(args.seed)  # once: every sampled token draws from it
    target_dir = target_folder(args.target)

    # 1. the prompts (held-out ones removed) and what is still to do, one (prompt, temperature) per reply
    held = HeldOut(read_heldout(args.heldout) + sorted(HeldOut.from_dir(args.heldout_dir).exact))
    pairs = load_prompts(args.prompts) if args.prompts else [(p, "") for p in builtin_prompts(args.seed)]
    pairs = [(p, kind) for p, kind in dict(pairs).items() if not held.blocks(p)]
    n = args.n_prompts if args.n_prompts is not None else (len(pairs) if args.prompts else 600)
    pairs = pairs[:n]
    kinds = dict(pairs)
    out = Path(args.out)
    part_bytes = int(args.topk_part_mb * 2**20)
    for f in [out, *topk_parts(out)[-1:]]:  # only the last part is ever appended to
        if cut := repair_tail(f):
            print(f"cut {cut} bytes of an interrupted write off {f}")
    have = existing_counts(out)
    units = plan([p for p, _ in pairs], args.temperatures, have, args.window)
    n_todo = sum(len(u[1]) for u in units)
    print(f"{len(pairs)} prompts, {n_todo} replies to generate ({sum(have.values())} already in {out})", flush=True)
    if not n_todo:
        return 0

    # 2. the target, then batches of one temperature, prompts of similar length together
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device).eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    done, n_tokens, t0 = 0, 0, time.time()
    for t, todo in units:
        encoded = {p: prompt_ids(tokenizer, p) for p in todo}
        todo = sorted(todo, key=lambda p: len(encoded[p]))
        for i in range(0, len(todo), args.batch_size):
            chunk = todo[i : i + args.batch_size]
            replies, tops = generate_batch(
                model, [encoded[p] for p in chunk], t, args.max_new_tokens, args.topk, generator
            )
            rows = [
                {"prompt": p, "temperature": t, "ids": r} | ({"kind": kinds[p]} if kinds[p] else {})
                for p, r in zip(chunk, replies)
            ]
            # 3. top-k first, then the replies, one gzip member each: a kill loses at most this batch
            if args.topk:
                tops_rows = [
                    {"prompt": r["prompt"], "temperature": t, "ids": r["ids"], **encode_topk(*tk)}
                    for r, tk in zip(rows, tops)
                ]
                append_jsonl(topk_part(out, part_bytes), tops_rows)
            append_jsonl(out, rows)
            done += len(chunk)
            n_tokens += sum(map(len, replies))
            rate = n_tokens / (time.time() - t0)
            print(f"{done}/{n_todo} replies, {n_tokens} tokens, {rate:.0f} tokens/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
