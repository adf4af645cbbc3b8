"""Filter a batch of prompts written by hand before their replies are made: keep those that are one of a kind, and say
why each other one is dropped (the rules: specviz/training/prompt_filter.py).

    python -m specviz.training.filter_prompts --candidates drafts.txt --append        # the kept ones onto data/prompts_written.txt
    python -m specviz.training.filter_prompts --candidates drafts.txt --out kept.txt  # or into a file; without either, to stdout

Candidates are one a line, blank lines ignored. Each dropped prompt goes to stderr with its reason, then the count per
reason and of the kept.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from specviz.training.common import read_heldout
from specviz.training.prompt_filter import MAX_OVERLAP, REASONS, WRITTEN, Dropped, Pools, filter_prompts


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", required=True, help="the batch, one prompt a line")
    ap.add_argument("--out", help="write the kept prompts here (default: stdout)")
    ap.add_argument("--max-overlap", type=float, default=MAX_OVERLAP, help="drop a prompt this near another one")
    ap.add_argument("--written", default=str(WRITTEN), help="the earlier batches")
    ap.add_argument("--append", action="store_true", help="append the kept prompts to --written")
    args = ap.parse_args(argv)
    if args.append and args.out:
        ap.error("--append writes the kept prompts to --written; give --out or --append, not both")
    if not Path(args.candidates).is_file():
        ap.error(f"no file {args.candidates}")
    return args


def report(dropped: list[Dropped], kept: int, total: int) -> None:
    for d in dropped:
        print(f"{d.reason:8s} {d.prompt}  <- {d.detail}", file=sys.stderr)
    counts = collections.Counter(d.reason for d in dropped)
    for reason in REASONS:
        print(f"dropped {reason:8s} {counts[reason]:5d}", file=sys.stderr)
    print(f"kept             {kept:5d} of {total}", file=sys.stderr)


def write(kept: list[str], args: argparse.Namespace) -> None:
    lines = "".join(p + "\n" for p in kept)
    if args.append:
        path = Path(args.written)
        before = path.read_text(encoding="utf-8") if path.is_file() else ""
        with path.open("a", encoding="utf-8") as f:
            f.write(("\n" if before and not before.endswith("\n") else "") + lines)
    elif args.out:
        Path(args.out).write_text(lines, encoding="utf-8")
    else:
        sys.stdout.write(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    candidates = read_heldout(args.candidates)
    kept, dropped = filter_prompts(candidates, Pools.load(args.written), args.max_overlap)
    report(dropped, len(kept), len(candidates))
    write(kept, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
