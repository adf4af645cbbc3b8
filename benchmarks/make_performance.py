"""Rewrite docs/performance.md's tables (and README.md's short one) from the result files in benchmarks/results/
(and the pair check against vLLM from benchmarks/results/check_vs_vllm/, benchmarks/check_vs_vllm.py's files).

    python benchmarks/make_performance.py           # rewrite the pages
    python benchmarks/make_performance.py --check   # exit 1 if a page differs from what the files make

A result file is what `python -m specviz bench --results benchmarks/results` writes (or a measurement transcribed
in the same form, its `source` naming where it came from): the command, the commit, the date, the machine and the
bench table's rows (specviz/bench/summary.py's column names). Machines are grouped by CPU model, its vector units
and the CPUs the process could use. Within a machine, a row (what ran, the prompt set, the configuration, the
temperature, prompts and tokens) shows its latest day's measurements only: a new result replaces its row, it does
not add a section. tests/test_docs.py fails when a committed page differs from this script's output.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "performance.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- results:begin (benchmarks/make_performance.py) -->", "<!-- results:end -->"
ENGINE_BEGIN, ENGINE_END = "<!-- engine:begin (benchmarks/make_performance.py) -->", "<!-- engine:end -->"
ENGINE_RESULTS = RESULTS / "check_vs_vllm"  # benchmarks/check_vs_vllm.py --out: one file per method
SPEED_BEGIN, SPEED_END = "<!-- speed:begin (benchmarks/make_performance.py) -->", "<!-- speed:end -->"
SETS = ("everyday", "stories")  # README's two columns
README_RUNS = (6, 64)  # README's table counts runs of at least 6 prompts of 64 new tokens: a quick check stays here
DEFAULTS = ("lookup+model, auto, tree auto", "lookup+model, auto")  # the page's default, then the default before trees
NAMES = {  # CPU models met so far, by vendor, family and model (cpuinfo); others show their model name
    "AuthenticAMD family 23 model 1": "AMD EPYC Zen 1",
    "AuthenticAMD family 25 model 1": "AMD EPYC Zen 3",
    "AuthenticAMD family 25 model 17": "AMD EPYC Zen 4",
    "AuthenticAMD family 26 model 2": "AMD EPYC Zen 5",
    "GenuineIntel family 6 model 167": "Intel Xeon",
}


def load(folder: Path = RESULTS) -> list[dict]:
    """Every result file, with its path's name kept."""
    return [{**json.loads(f.read_text()), "_file": f.name} for f in sorted(folder.glob("*.json"))]


def machine_class(m: dict) -> str:
    """'AMD EPYC Zen 4 (AVX-512), 2 CPUs': the CPU model, its widest vector unit and the CPUs the process could use."""
    vector = set((m.get("cpu_vector") or "").split())
    units = "AMX" if "amx_bf16" in vector else "AVX-512" if "avx512f" in vector else "AVX2" if "avx2" in vector else ""
    name = NAMES.get(m.get("cpu_id", ""), m.get("cpu") or "unknown CPU")
    cpus = m.get("usable_cpus")
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    return f"{name}{f' ({units})' if units else ''}{f', {cpus} CPUs' if cpus else ''}{gpu}"


def _day(result: dict) -> str:
    return result["date"][:10]


def latest_rows(results: list[dict]) -> dict[str, list[tuple[dict, dict]]]:
    """Machine class -> [(result, row)]: for each row key, the rows of the latest day it was measured on."""
    by_key: dict[tuple, list[tuple[dict, dict]]] = defaultdict(list)
    for res in results:
        s = res["set"]
        for row in res["rows"]:
            key = (machine_class(res["machine"]), row.get("kind", "bench"), s["prompts"], row["config"],
                   row.get("temperature", 0.0), s.get("n_prompts"), s.get("max_new_tokens"))  # fmt: skip
            by_key[key].append((res, row))
    out: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
    for key, pairs in by_key.items():
        last = max(_day(res) for res, _ in pairs)
        out[key[0]] += [(res, row) for res, row in pairs if _day(res) == last]
    for cls in out:
        out[cls].sort(key=lambda p: (p[1].get("kind", "bench") != "bench", p[0]["set"]["prompts"], p[0]["date"]))
    return dict(sorted(out.items(), key=lambda kv: max(res["date"] for res, _ in kv[1]), reverse=True))


def _x(v, unit: str = "x") -> str:
    return "" if v is None else f"{v:.2f}{unit}"


def _n(v, digits: int = 2) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def machine_table(pairs: list[tuple[dict, dict]]) -> str:
    head = (
        "| date (UTC) | what | prompts | configuration | plain tok/s | speedup | lowest prompt | vs faster "
        "transformers peer | tokens / call | verify, steps | alpha | c | identical | commit |\n"
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
    )
    lines = [head]
    for res, r in pairs:
        s = res["set"]
        what = "app's race" if r.get("kind") == "app" else f"bench, T={r.get('temperature', 0):g}"
        prompts = f"{s['prompts']} ({s.get('n_prompts')}), {s.get('max_new_tokens')} tokens"
        same = {True: "yes", False: "**NO**", None: "n/a"}[r.get("identical")]
        lines.append(
            f"| {res['date']} | {what} | {prompts} | `{r['config']}` | {_n(r.get('ar_tok_s'), 1)} | "
            f"**{_x(r.get('speedup_vs_ar'))}** | {_x(r.get('speedup_lowest'))} | {_x(r.get('speedup_vs_best_peer'))} | "
            f"{_n(r.get('tokens_per_call'))} | {_n(r.get('verify_cost'))} | {_n(r.get('alpha'))} | {_n(r.get('c'))} | "
            f"{same} | {res['commit']} |"
        )
    notes = {f"- {res['date']}: {r['note']}" for res, r in pairs if r.get("note")}
    notes |= {
        f"- {res['date']}: load average {res['machine']['load_avg_1min']} when the run started (the machine was shared)"
        for res, _ in pairs
        if res["machine"].get("load_avg_1min") and float(res["machine"]["load_avg_1min"]) >= 1.5
    }
    notes = sorted(notes)
    commands = sorted({f"- `{res['command']}`" for res, _ in pairs})
    sources = sorted({f"- {res['source']}" for res, _ in pairs})
    pair = sorted({f"{res['pair'].get('target')} + {res['pair'].get('draft')}" for res, _ in pairs})
    parts = ["\n".join(lines), "Pair: " + "; ".join(pair) + ".", "Notes:\n" + "\n".join(notes) if notes else ""]
    parts += ["Commands:\n" + "\n".join(commands), "Where the figures come from:\n" + "\n".join(sources)]
    return "\n\n".join(p for p in parts if p)


def performance_tables(results: list[dict]) -> str:
    blocks = []
    for cls, pairs in latest_rows(results).items():
        blocks.append(f"### {cls}\n\n{machine_table(pairs)}")
    return "\n\n".join(blocks)


def _span(values: list[float], unit: str = "x") -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    return f"{lo:.2f}{unit}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}-{hi:.2f}{unit}"


def _full(res: dict) -> bool:
    s = res["set"]
    return (s.get("n_prompts") or 0) >= README_RUNS[0] and s.get("max_new_tokens") == README_RUNS[1]


def speed_table(results: list[dict]) -> str:
    """README's short table: per machine, the default's speedup on everyday prompts and stories (the range over the
    latest day's runs), against the faster transformers peer, and the app's race."""
    lines = [
        "| CPU | everyday prompts | stories | against transformers' faster peer | the app's race (median) |",
        "|---|---:|---:|---:|---:|",
    ]
    for cls, pairs in latest_rows(results).items():
        greedy = [(res, r) for res, r in pairs if r.get("temperature", 0) == 0]
        config = next((c for c in DEFAULTS if any(r["config"] == c for _, r in greedy)), None)
        if config is None:
            continue
        mine = [(res, r) for res, r in greedy if r["config"] == config and _full(res)]
        bench = [(res, r) for res, r in mine if r.get("kind", "bench") == "bench"]
        on = {name: _span([r["speedup_vs_ar"] for res, r in bench if res["set"]["prompts"] == name]) for name in SETS}
        peer = _span([r["speedup_vs_best_peer"] for _, r in bench if r.get("speedup_vs_best_peer") is not None])
        app = _span([r["speedup_vs_ar"] for _, r in mine if r.get("kind") == "app"])
        trees = "" if config == DEFAULTS[0] else " (trees off)"
        lines.append(f"| {cls}{trees} | {on['everyday']} | {on['stories']} | {peer} | {app} |")
    return "\n".join(lines)


def engine_tables(results: list[dict]) -> str:
    """Per method, the check's prediction beside specviz's own rounds, vLLM's counters and transformers' tokens per
    call (benchmarks/check_vs_vllm.py's result files), with how far vLLM is from the prediction."""
    blocks = []
    for res in results:
        k = res["gamma"]
        head = "| per drafting round | " + " | ".join(f"pos {i + 1}" for i in range(k)) + " | tokens / round | rounds |"
        lines = [head, "|---|" + "---:|" * (k + 2)]
        for side in res["sides"]:
            cells = [f"{x:.3f}" for x in side["per_position"]] or [""] * k
            rounds = str(side["rounds"]) if side["rounds"] else ""
            lines.append(f"| {side['name']} | {' | '.join(cells)} | {side['tokens_per_round']:.3f} | {rounds} |")
        gap = res["vs_prediction"]
        m = res["machine"]
        facts = [
            f"vLLM against the check's prediction: tokens per round {gap['tokens_per_round_rel']:+.1%}, acceptance per "
            f"position at most {gap['max_position_diff']:.3f} apart",
            f"vLLM's greedy text equals specviz's on {res['greedy_text_equal']} of {res['prompts']} prompts",
            "each reply's own verify steps (`--per-request-spec-decode-metrics detailed`) "
            + (
                "count what `/metrics` counted"
                if res.get("replies_agree_with_metrics")
                else "**differ from `/metrics`**"
            ),
        ]
        hf = next((x for x in res["sides"] if x["name"].startswith("transformers")), None)
        if hf is not None:
            rel = hf["tokens_per_round"] / res["sides"][0]["tokens_per_round"] - 1
            counted = (
                "the prefill and the steps where lookup found nothing" if res["method"] == "ngram" else "the prefill"
            )
            facts.append(f"transformers' tokens per target call ({counted} counted too) {rel:+.1%} from the prediction")
        title = f"{res['method']} (the check's {res['drafter']} drafter), k = {k}, a = {res['a']:.3f}"
        where = f"{res['date']} UTC, {machine_class(m)}, vLLM {res['vllm']}, commit {res['commit']}"
        blocks.append(
            f"### {title}\n\n{where}; greedy, the check's {res['prompts']} prompts, {res['max_new_tokens']} tokens.\n\n"
            + "\n".join(lines)
            + "\n\n"
            + "\n".join(f"- {x}." for x in facts)
            + f"\n\nCommand: `{res['command']}`"
        )
    return "\n\n".join(blocks)


def _between(text: str, begin: str, end: str, body: str, name: str) -> str:
    if begin not in text or end not in text:
        raise SystemExit(f"{name} has no {begin} ... {end} markers.")
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}"


def render(results: list[dict] | None = None) -> dict[Path, str]:
    """The pages as this script would write them: {path: text}."""
    results = load() if results is None else results
    page = _between(PAGE.read_text(), BEGIN, END, performance_tables(results), "docs/performance.md")
    engines = [json.loads(f.read_text()) for f in sorted(ENGINE_RESULTS.glob("*.json"))]
    page = _between(page, ENGINE_BEGIN, ENGINE_END, engine_tables(engines), "docs/performance.md")
    readme = _between(README.read_text(), SPEED_BEGIN, SPEED_END, speed_table(results), "README.md")
    return {PAGE: page, README: readme}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a page differs from what the result files make")
    a = ap.parse_args(argv)
    stale = []
    for path, text in render().items():
        if path.read_text() != text:
            stale.append(path.relative_to(ROOT))
            if not a.check:
                path.write_text(text)
    if a.check and stale:
        print(f"out of date: {', '.join(map(str, stale))}; run python benchmarks/make_performance.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
