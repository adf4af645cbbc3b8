"""Prompts the target writes itself: it is asked for a question or an instruction about a seed topic.

Used by build_prompts.py (--target-written N). Each request is a meta-prompt such as "Write one
question that a curious student might ask about volcanoes. Reply with the question only."; the target's reply
(sampled at temperature 0.8 with one seeded generator) is cleaned to its first sentence-like line and kept if it
reads like a prompt. Every request and its outcome go to a cache (JSON lines, one gzip member per batch):
`{"seed": meta-prompt, "raw": reply text, "prompt": cleaned prompt or ""}`, so a build reuses them and a
later --target-written N adds N more requests without redoing any.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import torch

from specviz.training.prompt_lists import ACTIONS, PAIRS, SUBJECTS, THINGS, TOPICS
from specviz.training.teacher_io import append_jsonl, read_jsonl, repair_tail

ASKS = (
    "Write one question that a curious student might ask about {}. Reply with the question only.",
    "Write one request that someone might type to a helpful AI assistant about {}. Reply with the request only.",
    "Write one interesting question about {} that needs a detailed answer. Reply with the question only.",
    "Suggest one short writing task about {} for an AI assistant, as one sentence. Reply with the task only.",
    "Write one question a beginner might ask about {}. Reply with the question only.",
)


def requests(seed: int) -> list[str]:
    """Every meta-prompt (ask x seed topic), in a seeded order."""
    topics = list(TOPICS) + list(THINGS) + list(SUBJECTS) + [f"how to {a}" for a in ACTIONS]
    topics += [f"{a} and {b}" for a, b in PAIRS]
    out = [ask.format(t) for ask in ASKS for t in topics]
    random.Random(seed).shuffle(out)
    return out


STARTS = (
    "what",
    "why",
    "how",
    "when",
    "where",
    "which",
    "who",
    "can",
    "could",
    "is",
    "are",
    "do",
    "does",
    "should",
    "write",
    "explain",
    "describe",
    "create",
    "list",
    "give",
    "tell",
    "compose",
    "suggest",
    "help",
    "make",
    "compare",
    "summarise",
    "summarize",
    "plan",
    "design",
    "draft",
    "find",
    "show",
    "imagine",
    "if",
)  # how a usable prompt starts
BANNED = ("question", "curious", "student", "assistant", " ai ", "task", "request", "chatbot", "smollm")


def clean(raw: str) -> str:
    """The prompt inside the target's reply (a quoted part, or the text after a lead-in), or '' if none reads well."""
    first = next((s.strip() for s in raw.splitlines() if s.strip()), "")
    quoted = re.findall(r'"([^"]{20,})"?', first)
    text = quoted[0] if quoted else first.split(": ", 1)[-1]
    text = text.strip(" \"'*`")
    words = text.split()
    if not (5 <= len(words) <= 40) or text[-1:] not in "?." or "<" in text:
        return ""
    if words[0].lower().strip(",") not in STARTS or any(b in f" {text.lower()} " for b in BANNED):
        return ""
    return text[0].upper() + text[1:]


def read_cache(path: str | Path) -> list[dict]:
    """Cache rows with a usable prompt, first occurrence of each prompt."""
    seen, out = set(), []
    for r in read_jsonl(path):
        key = " ".join(r.get("prompt", "").split()).casefold()
        if key and key not in seen:
            seen.add(key)
            out.append(r)
    return out


def extend_cache(
    path: str | Path, n: int, target: str = "", seed: int = 0, batch_size: int = 32, threads: int = 1
) -> int:
    """Ask the target n more meta-prompts (the next ones not yet in the cache); returns how many were asked."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specviz.training.common import prompt_ids, target_folder
    from specviz.training.make_teacher_data import generate_batch

    path = Path(path)
    repair_tail(path)
    asked = {r["seed"] for r in read_jsonl(path)}
    todo = [m for m in requests(seed) if m not in asked][:n]
    if not todo:
        return 0
    folder = target_folder(target)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    for i in range(0, len(todo), batch_size):
        chunk = todo[i : i + batch_size]
        replies, _ = generate_batch(model, [prompt_ids(tokenizer, m) for m in chunk], 0.8, 48, 0, generator)
        texts = [tokenizer.decode([t for t in r if t != 2]) for r in replies]
        append_jsonl(path, [{"seed": m, "raw": t, "prompt": clean(t)} for m, t in zip(chunk, texts)])
        print(f"target-written prompts: {i + len(chunk)}/{len(todo)} asked", flush=True)
    return len(todo)
