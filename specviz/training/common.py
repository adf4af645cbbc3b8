"""What the training tools share: where the repository and its held-out prompt sets are, how a held-out prompt is
recognised (`HeldOut`), how near a prompt comes to others (`OverlapIndex`, `nearest_overlap`), how prompt files are
read, and the target's folder and chat template around one prompt.

Held out: every prompt in every file under HELDOUT_DIR (assets/prompts/: heldout, everyday, code, summarise, and
whatever set is added there later) is never trained or generated for, by its normalised text, and neither is any
prompt that shares a run of SHINGLE words with one of them (a held-out text or function pasted under another
instruction).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: assets/, data/ and runs/ are found from here
HELDOUT_DIR = ROOT / "assets" / "prompts"
HELDOUT = HELDOUT_DIR / "heldout.txt"
SHINGLE = 8  # words in a row shared with a held-out prompt that exclude a prompt


def norm_prompt(text: str) -> str:
    return " ".join(text.split()).casefold()


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


class HeldOut:
    """Every prompt of the held-out and benchmark sets, and every run of SHINGLE words in them."""

    def __init__(self, prompts: list[str]):
        self.prompts = list(prompts)
        self.exact = {norm_prompt(p) for p in prompts}
        self.shingles = {
            tuple(w[i : i + SHINGLE]) for p in prompts for w in [_words(p)] for i in range(len(w) - SHINGLE + 1)
        }

    @classmethod
    def from_dir(cls, folder: str | Path = HELDOUT_DIR) -> HeldOut:
        """All non-empty lines of all files in `folder` (one prompt per line)."""
        folder, prompts = Path(folder), []
        for f in sorted(folder.glob("*")) if folder.is_dir() else []:
            if f.is_file():
                prompts += [line.strip() for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
        return cls(prompts)

    def blocks(self, prompt: str) -> bool:
        if norm_prompt(prompt) in self.exact:
            return True
        w = _words(prompt)
        return any(tuple(w[i : i + SHINGLE]) in self.shingles for i in range(len(w) - SHINGLE + 1))


class OverlapIndex:
    """Prompts indexed by their words, to find the one nearest a prompt by word-set Jaccard overlap (the measure of
    `nearest_overlap`, which says why); prompts can be added one by one, as a batch is filtered."""

    def __init__(self, pool: Iterable[str] = ()):
        self.sets: list[set[str]] = []
        self.index: dict[str, list[int]] = {}
        for prompt in pool:
            self.add(prompt)

    def add(self, prompt: str) -> None:
        words = set(_words(prompt))
        for w in words:
            self.index.setdefault(w, []).append(len(self.sets))
        self.sets.append(words)

    def nearest(self, prompt: str) -> tuple[float, int]:
        """(the largest overlap with an indexed prompt, its position); (0.0, -1) if none shares a word."""
        words = set(_words(prompt))
        shared: dict[int, int] = {}
        for w in words:
            for i in self.index.get(w, ()):
                shared[i] = shared.get(i, 0) + 1
        overlap = {i: n / (len(words) + len(self.sets[i]) - n) for i, n in shared.items()}  # n shared / the union
        best = max(overlap, key=lambda i: (overlap[i], -i), default=-1)  # of equals, the first added
        return (overlap[best], best) if best >= 0 else (0.0, -1)


def nearest_overlap(prompts: list[str], pool: list[str]) -> list[float]:
    """For each prompt, the largest word-set Jaccard overlap with a prompt of `pool` (0 for an empty pool).

    Why: the prompt builder writes many prompts from one template and topic ("Write a short story about a magic
    paintbrush who ..."), so a validation prompt usually has a sibling in the training split whose reply the draft
    has all but seen: a draft's first guess is right more often the more the nearest prompt it trained on overlaps
    (assets/draft/MODEL_CARD.md shows the effect on held-out prompts), so validation must leave such siblings out."""
    index = OverlapIndex(pool)
    return [index.nearest(prompt)[0] for prompt in prompts]


def read_heldout(path: str | Path) -> list[str]:
    path = Path(path)
    if not path.is_file():
        return []
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_prompts(path: str | Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def target_folder(target: str) -> Path:
    """The target's model folder: `target` if given, else the built-in target (converted on first use)."""
    if target:
        return Path(target)
    from specviz.models.builtin import ensure_target

    return ensure_target()


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The target's chat template around one user message, ending where the reply starts."""
    enc = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)
