"""Auto's verify-cost calibration, the old way against the new, interleaved in one process (the measurement behind
`costs.CALIBRATION_REPS` and `costs.monotone`; BENCHMARKS.md).

Old: the median of 2 interleaved calls per size, as measured. New: CALIBRATION_REPS interleaved calls per size,
each read against the same repetition's one-token call (`costs.relative_times`), made monotone.
Each way is drawn --draws times up front (alternately, so the machine's mood falls on both alike): a process
gets one draw, and the noise between draws is what the choice is about. Then, for each prompt of each set, plain
decoding and the configuration once with each way's next draw (their order alternating from prompt to prompt),
every run timed by the wall clock around it after an untimed warm-up. Prints the draws as steps of the plain
call, and per set the median per-prompt speedup, tokens per target call and the mean guesses per round each
way; greedy output must equal plain decoding's in every run.

    python scripts/calibration_ab.py [--sets everyday,stories,code] [--limit 12] [--config lookup+model:auto]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

import specviz.engine.setup as run_setup  # noqa: E402
from specviz import ab
from specviz.api import encode_prompt  # noqa: E402
from specviz.engine import costs  # noqa: E402

SIZES = 9  # auto's gamma at most 8: a verify of 1 .. 9 tokens
WAYS = ("old", "new")


def main() -> None:
    ap = ab.parser(__doc__)
    ap.add_argument("--draws", type=int, default=4)
    args = ap.parse_args()
    base, config, p, q = ab.load(args)
    ab.print_machine()
    ar_cfg = base.replace(mode="ar").spec
    warm = encode_prompt(p, ab.WARM_PROMPT)
    draws: dict[str, list[list[float]]] = {"old": [], "new": []}
    for _ in range(args.draws):
        draws["old"].append(costs.forward_times(p, warm, SIZES, reps=2))
        samples = costs.forward_samples(p, warm, SIZES, costs.CALIBRATION_REPS)
        draws["new"].append(costs.monotone(costs.relative_times(samples)))
    for way, curves in draws.items():
        for c in curves:
            print(f"{way} draw: step {1000 * c[0]:.1f} ms, " + " ".join(f"{t / c[0]:.3f}" for t in c[1:]), flush=True)
    real = run_setup.calibration
    current = {"curve": draws["old"][0]}

    def scripted(lm, prompt_ids, max_tokens, vocab_size=None):  # the target gets the draw in use, the draft its own
        if lm is p:
            return current["curve"][:max_tokens], 0.0
        return real(lm, prompt_ids, max_tokens, vocab_size=vocab_size)

    run_setup.calibration = scripted
    used = [0]

    def use(way: str) -> None:  # the warm-ups take each way's first draw; then every prompt the next one
        current["curve"] = draws[way][max(used[0] - 2, 0) // 2 % args.draws]
        used[0] += 1

    results = ab.spec_ways(p, q, args, ar_cfg, config.request(base).spec, WAYS, use)
    ab.per_set(results, args.sets, WAYS, ab.guesses, config.label)
    ab.finish(results, args.json_out, draws=draws)


if __name__ == "__main__":
    main()
