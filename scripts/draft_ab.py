"""Two drafts for the same target, interleaved in one process: which one races faster here (the measurement
behind the built-in draft's proposable rows, `specviz/training/draft_rows.py`; BENCHMARKS.md).

For each prompt of each set: plain decoding, then the configuration once with each draft (their order
alternating from prompt to prompt), every run timed by the wall clock around it, after an untimed warm-up of
each; each draft's pair is calibrated by auto as the app does (its own draft-step cost). Prints per set the
median per-prompt speedup, tokens per target call, alpha and c (draft seconds per draft call over the plain
run's seconds per token) each way; greedy output must equal plain decoding's in every run.

    python scripts/draft_ab.py --a assets/draft --b out/other-draft [--sets everyday,stories,code] [--limit 12]
    python scripts/draft_ab.py --heads --a out/head-before --b assets/head --config lookup+head:auto   # two heads
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz import ab  # noqa: E402
from specviz.api import encode_prompt, load_for  # noqa: E402
from specviz.bench.inputs import parse_configs  # noqa: E402
from specviz.engine.loop import autoregressive_decode, speculative_decode  # noqa: E402
from specviz.models.head import head_backend, head_for  # noqa: E402
from specviz.request import RunRequest  # noqa: E402

WAYS = ("a", "b")


def main() -> None:
    ap = ab.parser(__doc__)
    ap.add_argument("--a", required=True, help="a draft folder (a head's with --heads)")
    ap.add_argument("--b", required=True, help="another draft folder (a head's with --heads)")
    ap.add_argument("--heads", action="store_true", help="--a and --b are draft heads (for the head drafters)")
    args = ap.parse_args()
    (config,) = parse_configs(args.config)
    reqs = {
        w: config.request(RunRequest(max_new_tokens=args.max_new_tokens, **{"head" if args.heads else "draft": d}))
        for w, d in [("a", args.a), ("b", args.b)]
    }
    pairs = {w: load_for(r) for w, r in reqs.items()}
    p = pairs["a"][0]
    ab.print_machine()
    for w, (_, q) in pairs.items():
        if args.heads:
            h = head_for(p, reqs[w].head)
            print(f"{w}: {reqs[w].head}: {head_backend(p, reqs[w].head)}, {h.target_ids.numel():,} output rows")
            continue
        print(f"{w}: {reqs[w].draft}: {q.lean.engine if q.lean else 'transformers'}, "
              f"{q.lean.head.shape[0] if q.lean else q.vocab_size:,} output rows computed", flush=True)  # fmt: skip
    ar_cfg = reqs["a"].replace(mode="ar").spec
    warm = encode_prompt(p, ab.WARM_PROMPT)
    ab.timed(autoregressive_decode, p, warm, ar_cfg)
    for w, (pw, q) in pairs.items():
        ab.timed(speculative_decode, pw, q, warm, reqs[w].spec)
    results = []
    for name, i, ids, ways in ab.prompts(p, args.sets, args.limit, WAYS):
        plain = ab.timed(autoregressive_decode, p, ids, ar_cfg)
        for w in ways:
            spec = ab.timed(speculative_decode, *pairs[w], ids, reqs[w].spec)
            st = spec.stats
            results.append(dict(set=name, prompt=i, way=w, same=spec.tokens == plain.tokens,
                                speedup=plain.seconds / spec.seconds, tokens=len(spec.tokens), calls=st["target_calls"],
                                alpha=st["alpha"], c=(st["draft_s"] / max(st["draft_calls"], 1))
                                / (plain.seconds / len(plain.tokens))))  # fmt: skip

    def describe(rows: list[dict]) -> str:
        return (
            f"{ab.speedup(rows)}, {sum(r['tokens'] for r in rows) / sum(r['calls'] for r in rows):.2f} tokens a call, "
            f"alpha {statistics.mean(r['alpha'] for r in rows):.3f}, c {statistics.median(r['c'] for r in rows):.3f}"
        )

    ab.per_set(results, args.sets, WAYS, describe)
    ab.finish(results, args.json_out, a=args.a, b=args.b)


if __name__ == "__main__":
    main()
