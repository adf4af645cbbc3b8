"""What the interleaved A/B scripts behind BENCHMARKS.md's comparisons share (scripts/*_ab.py): two ways of running
the same race in one process, every prompt of each set run each way, their order alternating from prompt to prompt,
every run timed by the wall clock around it (bench.timed_events) after an untimed warm-up. A script says what its
two ways are and what each run records; here are the arguments, the machine line, the prompt loop, the per-set
lines and the output check."""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specviz.api import encode_prompt, load_for
from specviz.bench.inputs import load_prompts, parse_configs
from specviz.bench.measure import timed_events
from specviz.engine.loop import autoregressive_decode, speculative_decode
from specviz.events import Round
from specviz.host import cpus
from specviz.host.machine import machine_info
from specviz.request import RunRequest

WARM_PROMPT = "Tell me something about the sea."  # the untimed warm-up's prompt (in no prompt set)


def parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every A/B script takes (a script adds its own): the sets, prompts per set, the configuration,
    the tokens per run and a JSON file for every run."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--sets", default="everyday,stories,code")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--config", default="lookup+model:auto")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json-out", default="")
    return ap


def load(args: argparse.Namespace) -> tuple:
    """(the base request, the configuration, the target, the draft) for the script's --config and --max-new-tokens,
    loaded as the app loads them."""
    base = RunRequest(max_new_tokens=args.max_new_tokens)
    (config,) = parse_configs(args.config)
    return base, config, *load_for(config.request(base))


def print_machine() -> dict:
    """machine_info(), its CPU printed first: every figure comes with its CPU."""
    m = machine_info()
    print(f"CPU: {m['cpu']} ({m['cpu_id']}; {m['cpu_vector']})", flush=True)
    return m


@dataclass
class Run:
    """One timed run: its tokens, its wall-clock seconds and its events (the first a Start, the last a Done)."""

    tokens: list[int]
    seconds: float
    events: list

    @property
    def stats(self) -> dict:
        return self.events[-1].stats

    @property
    def prefill_s(self) -> float:
        return self.events[0].prefill_s

    @property
    def rounds(self) -> list[Round]:
        return [e for e in self.events if isinstance(e, Round)]


def timed(decode, *args) -> Run:
    events, seconds = timed_events(decode, *args)
    return Run(list(events[-1].token_ids), seconds, events)


def prompts(p, sets: str, limit: int, ways: tuple[str, str]) -> Iterator[tuple[str, int, list[int], tuple]]:
    """(set, prompt index, its ids under p's chat template, the two ways in this prompt's order) for the first
    `limit` prompts of each set: the first way first on even prompts, second on odd ones."""
    for name in sets.split(","):
        for i, prompt in enumerate(load_prompts(name)[:limit]):
            yield name, i, encode_prompt(p, prompt), ways if i % 2 == 0 else ways[::-1]


def speedup(rows: list[dict]) -> str:
    """The median per-prompt speedup of these runs (each row's "speedup": plain seconds over the run's)."""
    return f"{statistics.median(r['speedup'] for r in rows):.2f}x"


def per_set(results: list[dict], sets: str, ways: tuple[str, str], describe, label: str = "") -> None:
    """A line per set: describe(that way's rows) for each way."""
    for name in sets.split(","):
        line = [name, label] if label else [name]
        for way in ways:
            line.append(f"{way}: {describe([r for r in results if r['set'] == name and r['way'] == way])}")
        print(" | ".join(line), flush=True)


def finish(results: list[dict], json_out: str, **extra) -> None:
    """Say whether greedy output equalled plain decoding's in every run; write every run to json_out if asked."""
    print("greedy output equal to plain decoding in every run:", all(r["same"] for r in results))
    if json_out:
        Path(json_out).write_text(json.dumps({**extra, "runs": results}, indent=1))


def both_lanes(p, q, args, ar_cfg, spec_cfg, ways: tuple[str, str], use) -> list[dict]:
    """For a switch that changes both lanes (use(way) sets it): an untimed warm-up each way, then for each prompt,
    each way, plain decoding and the configuration. A row per prompt and way, with each lane's prefill."""
    warm = encode_prompt(p, WARM_PROMPT)
    for way in ways:
        use(way)
        timed(autoregressive_decode, p, warm, ar_cfg)
        timed(speculative_decode, p, q, warm, spec_cfg)
    results = []
    for name, i, ids, order in prompts(p, args.sets, args.limit, ways):
        for way in order:
            use(way)
            plain = timed(autoregressive_decode, p, ids, ar_cfg)
            spec = timed(speculative_decode, p, q, ids, spec_cfg)
            results.append(dict(set=name, prompt=i, way=way, tokens=len(spec.tokens), prompt_tokens=len(ids),
                                same=spec.tokens == plain.tokens, out=spec.tokens, speedup=plain.seconds / spec.seconds,
                                ar_s=plain.seconds, spec_s=spec.seconds, ar_prefill=plain.prefill_s,
                                spec_prefill=spec.prefill_s))  # fmt: skip
    return results


def spec_ways(p, q, args, ar_cfg, spec_cfg, ways: tuple[str, str], use) -> list[dict]:
    """For a switch that changes the speculative lane only (use(way) sets it): an untimed warm-up each way, then for
    each prompt plain decoding once and the configuration each way. A row per prompt and way, with its tokens per
    target call and guesses per round (`guesses`)."""
    warm = encode_prompt(p, WARM_PROMPT)
    timed(autoregressive_decode, p, warm, ar_cfg)
    for way in ways:
        use(way)
        timed(speculative_decode, p, q, warm, spec_cfg)
    results = []
    for name, i, ids, order in prompts(p, args.sets, args.limit, ways):
        plain = timed(autoregressive_decode, p, ids, ar_cfg)
        for way in order:
            use(way)
            spec = timed(speculative_decode, p, q, ids, spec_cfg)
            results.append(dict(set=name, prompt=i, way=way, same=spec.tokens == plain.tokens,
                                speedup=plain.seconds / spec.seconds, tokens=len(spec.tokens), calls=len(spec.rounds),
                                guesses=[len(r.drafted) for r in spec.rounds]))  # fmt: skip
    return results


def guesses(rows: list[dict]) -> str:
    """The median speedup, tokens per target call and mean guesses per round over these rows (spec_ways')."""
    drafted = [g for r in rows for g in r["guesses"]]
    calls = sum(r["tokens"] for r in rows) / sum(r["calls"] for r in rows)
    return f"{speedup(rows)}, {calls:.2f} tokens a call, {statistics.mean(drafted):.2f} guesses a round"


def lanes(rows: list[dict]) -> str:
    """The median speedup and each lane's tokens per second over these rows (both_lanes')."""
    tokens = sum(r["tokens"] for r in rows)
    plain, spec = tokens / sum(r["ar_s"] for r in rows), tokens / sum(r["spec_s"] for r in rows)
    return f"{speedup(rows)}, tok/s plain / spec {plain:.1f} / {spec:.1f}"


def differing_prompts(results: list[dict]) -> tuple[int, int]:
    """(prompts where the two ways wrote other tokens, prompts)."""
    outs: dict[tuple, list] = {}
    for r in results:
        outs.setdefault((r["set"], r["prompt"]), []).append(r["out"])
    return sum(a != b for a, b in outs.values()), len(outs)


def thread_way(way: str, most: int) -> None:
    """Run the models' native calls the A/B way `way`: a fixed thread count ("1", "2", ...), or "auto": `most`
    threads, fewer for busy neighbours where the process's fit allows that rule (cpus.threads). Torch's count is
    the calling thread's: call it on the thread that runs the models (the app's: compute.call)."""
    adaptive = way == "auto" and cpus.fitted().endswith("fewer while other programs keep a CPU busy")
    cpus.follow_neighbours(most if adaptive else None, most if way == "auto" else int(way))


@contextlib.contextmanager
def busy_neighbour(duty: float) -> Iterator[None]:
    """A second program keeping one CPU busy `duty` of every 10 ms (1: the whole time; 0: none) while the block
    runs."""
    loop = (
        "import time\nt = time.time()\nwhile time.time() - t < 3600:\n    s = time.time()\n"
        f"    while time.time() - s < {0.01 * duty}: pass\n    time.sleep({0.01 * (1 - duty)})"
    )
    neighbour = subprocess.Popen([sys.executable, "-c", loop]) if duty > 0 else None
    try:
        yield
    finally:
        if neighbour is not None:
            neighbour.kill()
