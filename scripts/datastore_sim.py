"""Would a datastore of the target's own replies make a better drafter (REST-style retrieval)? A simulation, before
building one (BENCHMARKS.md, 26 Nov 2026: +0-5%, not built).

The held-out prompts of the given sets get the target's plain greedy replies; the draft's greedy guesses are read
teacher-forced along each reply (what the chain drafter proposes while its guesses are accepted); the datastore
is every teacher reply (data/ and the shared sets), indexed by its n-grams. A round then either takes the
datastore's continuation of the text's last n tokens (followed while at least --min-support occurrences agree)
or the draft's chain of --gamma, and pays this machine's costs in target steps: c a draft call, a verify of k
guesses 1 + --verify-slope * k. Prints tokens per call and the speedup each way, per set.

    python scripts/datastore_sim.py [--sets stories,everyday,code] [--n 4] [--min-support 2]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's specviz, from any folder

from specviz.api import encode_prompt, load_for  # noqa: E402
from specviz.backends.local import CachedModel  # noqa: E402
from specviz.engine.loop import autoregressive_decode  # noqa: E402
from specviz.events import Done  # noqa: E402
from specviz.request import RunRequest  # noqa: E402

TEACHER = [ROOT / "data/teacher.jsonl.gz", *sorted(Path("/work/shared/data").glob("smollm2-teacher*/teacher.jsonl.gz"))]


def replies(p, q, sets: list[str], max_new_tokens: int):
    """(set, prompt ids, the target's greedy reply, whether the draft's greedy guess was right at each position)."""
    req = RunRequest(mode="ar", max_new_tokens=max_new_tokens)
    for name in sets:
        for line in (ROOT / "assets/prompts" / f"{name}.txt").read_text().splitlines():
            if not line.strip():
                continue
            ids = encode_prompt(p, line.strip())
            done = next(ev for ev in autoregressive_decode(p, ids, req.spec) if isinstance(ev, Done))
            reply = list(done.token_ids)
            with torch.inference_mode():
                guess = CachedModel(q, p.vocab_size).feed(torch.tensor(ids + reply)).argmax(-1).tolist()
            yield name, ids, reply, [guess[len(ids) + t - 1] == reply[t] for t in range(len(reply))]


class Datastore:
    def __init__(self, files: list[Path], n: int, min_support: int):
        self.n, self.min_support, self.seqs = n, min_support, []
        for path in files:
            with gzip.open(path, "rt") as f:
                self.seqs += [json.loads(line)["ids"] for line in f if line.strip()]
        self.at = collections.defaultdict(list)  # n-gram -> (reply, where its continuation starts)
        for i, s in enumerate(self.seqs):
            for e in range(n, len(s)):
                self.at[tuple(s[e - n : e])].append((i, e))

    def continuation(self, text: list[int], k: int = 8) -> list[int]:
        live = self.at.get(tuple(text[-self.n :]), [])
        out: list[int] = []
        while live and len(out) < k:
            j = len(out)
            votes = collections.Counter(self.seqs[i][e + j] for i, e in live if e + j < len(self.seqs[i]))
            if not votes:
                break
            t, support = votes.most_common(1)[0]
            if support < self.min_support:
                break
            out.append(t)
            live = [(i, e) for i, e in live if e + j < len(self.seqs[i]) and self.seqs[i][e + j] == t]
        return out


def simulate(ids, reply, right, store: Datastore | None, gamma: int, c: float, slope: float):
    """(rounds, cost in target steps) of decoding `reply`: the datastore's continuation where it has one (if a
    store is given), else the draft's chain of gamma."""
    t, rounds, cost = 0, 0, 0.0
    while t < len(reply):
        guess = store.continuation(ids + reply[:t]) if store else []
        if guess:
            kept = next((a for a in range(len(guess)) if t + a >= len(reply) or guess[a] != reply[t + a]), len(guess))
            t, cost = t + kept + 1, cost + 1 + slope * len(guess)
        else:
            kept = next((a for a in range(gamma) if t + a >= len(reply) or not right[t + a]), gamma)
            t, cost = t + kept + 1, cost + gamma * c + 1 + slope * gamma
        rounds += 1
    return rounds, cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="stories,everyday,code")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--n", type=int, default=4, help="the n-gram the datastore matches")
    ap.add_argument("--min-support", type=int, default=2, help="occurrences that must agree on each token")
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--c", type=float, default=0.07, help="a draft call in target steps (the bench's c)")
    ap.add_argument("--verify-slope", type=float, default=0.035, help="a verify's cost per guess, in steps")
    args = ap.parse_args()
    p, q = load_for(RunRequest(drafter="model"))
    store = Datastore([f for f in TEACHER if f.exists()], args.n, args.min_support)
    print(
        f"datastore: {len(store.seqs)} replies, {sum(map(len, store.seqs)):,} tokens, {len(store.at):,} {args.n}-grams"
    )
    sums = collections.defaultdict(lambda: [0, 0, 0.0])  # (set, way) -> tokens, rounds, cost
    for name, ids, reply, right in replies(p, q, args.sets.split(","), args.max_new_tokens):
        for way, s in (("draft chain", None), ("datastore, else chain", store)):
            rounds, cost = simulate(ids, reply, right, s, args.gamma, args.c, args.verify_slope)
            acc = sums[(name, way)]
            acc[0], acc[1], acc[2] = acc[0] + len(reply), acc[1] + rounds, acc[2] + cost
    for (name, way), (tokens, rounds, cost) in sums.items():
        print(f"{name:9} {way:22} tokens/call {tokens / rounds:.2f}  speedup {tokens / cost:.2f}x")


if __name__ == "__main__":
    main()
