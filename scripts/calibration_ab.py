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

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

import specviz.run_setup as run_setup  # noqa: E402
from specviz import costs  # noqa: E402
from specviz.api import encode_prompt, load_for  # noqa: E402
from specviz.bench import timed_events  # noqa: E402
from specviz.bench_inputs import load_prompts, parse_configs  # noqa: E402
from specviz.engine import autoregressive_decode, speculative_decode  # noqa: E402
from specviz.events import Round  # noqa: E402
from specviz.machine import machine_info  # noqa: E402
from specviz.request import RunRequest  # noqa: E402

SIZES = 9  # auto's gamma at most 8: a verify of 1 .. 9 tokens


def timed(decode, *args) -> tuple[list[int], float, list]:
    events, seconds = timed_events(decode, *args)
    return list(events[-1].token_ids), seconds, [e for e in events if isinstance(e, Round)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="everyday,stories,code")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--config", default="lookup+model:auto")
    ap.add_argument("--draws", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    base = RunRequest(max_new_tokens=args.max_new_tokens)
    (config,) = parse_configs(args.config)
    p, q = load_for(config.request(base))
    m = machine_info()
    print(f"CPU: {m['cpu']} ({m['cpu_id']}; {m['cpu_vector']})", flush=True)
    ar_cfg = base.replace(mode="ar").spec
    warm = encode_prompt(p, "Tell me something about the sea.")
    timed(autoregressive_decode, p, warm, ar_cfg)
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
    for way in ("old", "new"):  # warm-up, untimed
        current["curve"] = draws[way][0]
        timed(speculative_decode, p, q, warm, config.request(base).spec)
    results = []
    for name in args.sets.split(","):
        for i, prompt in enumerate(load_prompts(name)[: args.limit]):
            ids = encode_prompt(p, prompt)
            plain, ar_s, _ = timed(autoregressive_decode, p, ids, ar_cfg)
            for way in ("old", "new") if i % 2 == 0 else ("new", "old"):
                current["curve"] = draws[way][(len(results) // 2) % args.draws]
                out, s, rounds = timed(speculative_decode, p, q, ids, config.request(base).spec)
                results.append(dict(set=name, prompt=i, way=way, same=out == plain, speedup=ar_s / s,
                                    tokens=len(out), calls=len(rounds),
                                    guesses=[len(r.drafted) for r in rounds]))  # fmt: skip
    for name in args.sets.split(","):
        line = [name, config.label]
        for way in ("old", "new"):
            rows = [r for r in results if r["set"] == name and r["way"] == way]
            guesses = [g for r in rows for g in r["guesses"]]
            line.append(
                f"{way}: {statistics.median(r['speedup'] for r in rows):.2f}x, "
                f"{sum(r['tokens'] for r in rows) / sum(r['calls'] for r in rows):.2f} tokens a call, "
                f"{statistics.mean(guesses):.2f} guesses a round"
            )
        print(" | ".join(line), flush=True)
    print("greedy output equal to plain decoding in every run:", all(r["same"] for r in results))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"draws": draws, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
