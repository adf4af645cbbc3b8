"""Where a speculative round's time goes in the race, in plain steps of the same race: the draft, the verify by the
number of tokens it fed, and the rest (acceptance, rollback, the drafter's and the policy's updates, the events).

    python benchmarks/round_costs.py                                  # 6 everyday, 6 story and 6 code prompts
    python benchmarks/round_costs.py --sets stories --limit 10 --max-new-tokens 128

The pair loads as the app loads it, and each prompt is raced at the page's defaults (plain decoding against the
default lane, interleaved event by event on the main thread, as engine.race runs the app's /race without the server),
so the memory's drift from second to second falls on both lanes alike. A step is the median forward of that
prompt's plain lane. Prints the means per round, a table by tokens fed (the guesses and the last token: a verify of
k guesses, or of a tree of k nodes, feeds k + 1), and the speedup the parts imply beside the one the lanes' clocks
measured and the one a verify costing one step would give.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="everyday,stories,code")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=0, help="0: the page's default")
    a = ap.parse_args()
    from specviz.bench.inputs import load_prompts
    from specviz.bench.machine import machine_info
    from specviz.engine.loop import autoregressive_decode, race, speculative_decode
    from specviz.events import Round, Start, Step
    from specviz.models.loaded import pair_backend
    from specviz.request import RunRequest
    from specviz.ui.common import default_context
    from specviz.ui.inputs import prepare

    ctx = default_context()
    p, q = ctx.pair()
    m = machine_info()
    print(f"{m['cpu']} ({m['cpu_id']}; {m['cpu_vector']}); {pair_backend(p, q)}")
    page = RunRequest() if not a.max_new_tokens else RunRequest(max_new_tokens=a.max_new_tokens)
    plain = page.replace(mode="ar").spec
    prompts = [x for s in a.sets.split(",") for x in load_prompts(s.strip(), a.limit)]
    print(f"{len(prompts)} prompts ({a.sets}), page defaults: {page.label}")
    # tokens fed -> each round's (draft, verify, rest) in steps and the tokens it gave
    fed: dict[int, list[tuple[float, float, float, int]]] = defaultdict(list)
    steps, ratios = [], []
    for prompt in prompts:
        ids = prepare(ctx, prompt, page)[2]
        lanes: dict[str, list] = {"ar": [], "spec": []}
        for side, ev in race(autoregressive_decode(p, ids, plain), speculative_decode(p, q, ids, page.spec)):
            lanes[side].append(ev)
        step = statistics.median(e.forward_s for e in lanes["ar"] if isinstance(e, Step))
        steps.append(step)
        last = next(e.prefill_s for e in lanes["spec"] if isinstance(e, Start))  # a round's elapsed_s counts it
        for r in (e for e in lanes["spec"] if isinstance(e, Round)):
            rest = r.elapsed_s - last - r.draft_s - r.verify_s
            fed[r.proposed + 1].append((r.draft_s / step, r.verify_s / step, rest / step, len(r.tokens)))
            last = r.elapsed_s
        ar, spec = lanes["ar"][-1].stats, lanes["spec"][-1].stats
        ratios.append((ar["wall_s"] / ar["new_tokens"]) / (spec["wall_s"] / spec["new_tokens"]))
    rounds = [x for v in fed.values() for x in v]
    d, v, r, out = (sum(x[i] for x in rounds) for i in range(4))
    n = len(rounds)
    print(f"plain step: median {statistics.median(steps) * 1e3:.2f} ms (prompts' medians {min(steps) * 1e3:.1f}-"
          f"{max(steps) * 1e3:.1f}); {n} rounds, {out / n:.2f} tokens a round")  # fmt: skip
    print(f"a round, in steps (means): draft {d / n:.3f}, verify {v / n:.3f}, rest {r / n:.3f}")
    print("tokens fed  rounds  verify (median, steps)  tokens a round  steps a token (all parts)")
    for k in sorted(fed):
        xs = fed[k]
        cost = sum(x[0] + x[1] + x[2] for x in xs) / sum(x[3] for x in xs)
        print(f"{k:10d}  {len(xs):6d}  {statistics.median(x[1] for x in xs):22.3f}  "
              f"{statistics.mean(x[3] for x in xs):14.2f}  {cost:24.3f}")  # fmt: skip
    print(f"speedup: measured by the lanes' clocks {statistics.median(ratios):.2f}x (median over prompts); implied by "
          f"the parts {out / (d + v + r):.2f}x; were every verify one step {out / (d + n + r):.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
