"""How good are prompt-lookup guesses, by the length of the match, against the draft model's at the same place?

At every position of the target's greedy teacher replies (teacher files, temperature 0), in the text so far:
- lookup (`specviz.drafters.model.LookupDrafter`, n = 3 down to 1): the length n of the suffix it matched and how
  many of the tokens that followed it equal the reply's next tokens, in a row (at most --k);
- the draft model: how many of its greedy guesses are right in a row from there (teacher-forced; in greedy
  decoding that is also the chained count, since a right guess leaves the draft the same context).
Prints, per kind and n, the positions, P(first guess right) and the mean run for both. No timing: it runs
beside anything.

    python -m specviz.training.lookup_stats --data data/teacher.jsonl.gz --per-kind 40
"""

from __future__ import annotations

import argparse
import collections
import random

import torch

from specviz.config import MAX_MATCHING_NGRAM_SIZE
from specviz.drafters.lookup import LookupDrafter
from specviz.training import teacher_io
from specviz.training.common import ROOT, prompt_ids, target_folder
from specviz.training.eval_draft import draft_guesser, load_draft


def run_length(guess: list[int], truth: list[int]) -> int:
    n = 0
    while n < min(len(guess), len(truth)) and guess[n] == truth[n]:
        n += 1
    return n


@torch.inference_mode()
def positions(guess, tokenizer, row: dict, k: int):
    """(n, lookup run, model run) at every position of one greedy reply; guess: eval_draft.draft_guesser."""
    p, reply = prompt_ids(tokenizer, row["prompt"]), row["ids"]
    right = (guess(torch.tensor(p + reply), len(p)) == torch.tensor(reply)).tolist()  # the draft's first guesses
    lookup = LookupDrafter(max_matching_ngram_size=MAX_MATCHING_NGRAM_SIZE)
    for t in range(len(reply)):
        n, found = lookup.find(p + reply[:t], k)
        yield n, run_length(found, reply[t : t + k]), run_length([True] * k, right[t : t + k])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", default=[str(ROOT / "data" / "teacher.jsonl.gz")])
    ap.add_argument("--draft", default=str(ROOT / "assets" / "draft"))
    ap.add_argument("--per-kind", type=int, default=40, help="greedy replies per kind (seeded sample)")
    ap.add_argument("--k", type=int, default=8, help="the longest run counted")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_folder(None))
    draft, target_ids = load_draft(a.draft)
    guess = draft_guesser(draft, target_ids, len(tokenizer))
    rows = [r for f in a.data for r in teacher_io.read_jsonl(f) if r["temperature"] == 0.0]
    random.Random(0).shuffle(rows)
    picked: dict[str, list] = collections.defaultdict(list)
    for r in rows:
        if len(picked[r.get("kind", "?")]) < a.per_kind:
            picked[r.get("kind", "?")].append(r)
    table: dict[tuple[str, int], list] = collections.defaultdict(list)
    for kind, rs in sorted(picked.items()):
        for r in rs:
            for n, lk, md in positions(guess, tokenizer, r, a.k):
                table[kind, n].append((lk, md))
                table["all", n].append((lk, md))
    print(f"{'kind':<18}{'n':>2}{'positions':>10} | lookup P(1st) run | model P(1st) run")
    for (kind, n), xs in sorted(table.items()):
        m = len(xs)
        lk = (sum(x[0] > 0 for x in xs) / m, sum(x[0] for x in xs) / m)
        md = (sum(x[1] > 0 for x in xs) / m, sum(x[1] for x in xs) / m)
        print(f"{kind:<18}{n:>2}{m:>10} | {lk[0]:13.2f} {lk[1]:4.2f} | {md[0]:12.2f} {md[1]:4.2f}")


if __name__ == "__main__":
    main()
