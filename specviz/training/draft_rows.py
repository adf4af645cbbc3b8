"""Choose the rows a trimmed draft may propose: the target tokens its training replies hold most often.

Why. The built-in draft (version 6) read 17,663 target tokens (every token of its training replies and prompts), and its
output layer, tied to that embedding, was 59 % of its weights; every round reads it again from memory after the target's
verify has streamed 538 MB through the caches. Most of those rows are prompt tokens it has to read but that the target
rarely writes: the 8,000 most frequent reply tokens cover 95 % of the target's reply tokens on the teacher data's last
tenth, and on that tenth's greedy replies the draft, allowed only those rows, guesses the target's next token 0.5366 of
the time against 0.5390 with all of them (`benchmarks/draft_rows_eval.py`, BENCHMARKS "The draft's output layer cut to the
rows it proposes"). The rows left out stay in its embedding (it still reads those tokens) and go into
specviz_vocab.json's "never_propose"; lean.LeanLlama.skip_rows leaves them out of the output layer. The draft's q is
renormalised over the rows it keeps, so the output is still the target's exactly.

    python -m specviz.training.draft_rows --draft assets/draft --teacher data/teacher.jsonl.gz --keep 8000

A feature-level head (head.py) reads the target's own embedding and computes only its `target_ids` output rows, so
for a head the rows it never proposes are simply dropped from that list (`--head FOLDER`): the same law as -inf
logits, with no list beside it.

    python -m specviz.training.draft_rows --head assets/head --teacher data/teacher.jsonl.gz --keep 8000
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Iterable
from pathlib import Path

from specviz.training.teacher_io import read_jsonl

KEEP = 8000  # rows a draft proposes by default (train_draft's --propose-rows)


def never_propose(
    replies: Iterable[list[int]], target_ids: list[int], keep: int = KEEP, catch_all: bool = True
) -> list[int]:
    """Rows to leave out of a draft's guesses: every row but those of the `keep` target tokens most frequent in
    `replies` (ties: the lower row), and with `catch_all` always row 0 (a trimmed draft's row for target tokens
    outside its vocabulary; a head has none). keep 0, or at least the rows there are: row 0 only (none without
    `catch_all`)."""
    rows, first = len(target_ids), 1 if catch_all else 0
    if not keep or keep >= rows - first:
        return [0] if catch_all else []
    counts = collections.Counter(t for ids in replies for t in ids)
    kept = set(sorted(range(first, rows), key=lambda r: (-counts[target_ids[r]], r))[:keep])
    return [r for r in range(rows) if r not in kept]


def main(argv: list[str] | None = None) -> list[int]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--draft", help="a trimmed draft's folder (it has a specviz_vocab.json)")
    which.add_argument("--head", help="a draft head's folder (it has a specviz_head.json): its rows are cut")
    ap.add_argument("--teacher", nargs="+", required=True, help="the target's replies (teacher JSONL(.gz) files)")
    ap.add_argument("--keep", type=int, default=KEEP, help="rows it may propose (0: all but a draft's row 0)")
    args = ap.parse_args(argv)
    f = Path(args.draft) / "specviz_vocab.json" if args.draft else Path(args.head) / "specviz_head.json"
    spec = json.loads(f.read_text())
    ids = spec["target_ids"]
    blocked = never_propose((r["ids"] for p in args.teacher for r in read_jsonl(p)), ids, args.keep, bool(args.draft))
    if args.draft:
        spec["never_propose"] = blocked
    else:  # a head computes only its target_ids rows: keep the others, in their order
        drop = set(blocked)
        spec["target_ids"] = [t for r, t in enumerate(ids) if r not in drop]
    f.write_text(json.dumps(spec))
    print(f"{f}: proposes {len(ids) - len(blocked):,} of its {len(ids):,} rows")
    return blocked


if __name__ == "__main__":
    main()
