"""Does the pair check predict what vLLM measures? The check's deploy card run on vLLM's CPU server, side by side.

    .venv/bin/python benchmarks/check_vs_vllm.py [--method draft_model|ngram] [--max-new-tokens 32] [--out FILE]

1. The pair check on the built-in pair (drafter "model", or "lookup" for --method ngram): its acceptance a and best
   gamma k; its prediction per draft position i (the share of rounds whose guess i is kept) from its acceptance
   measured per position, and tokens per round 1 + their sum; the one-alpha model a^(i+1) beside it.
2. specviz's own greedy decoding with the same drafter and k on the check's prompts: the same shares, measured.
3. The built-in draft exported with the target's full vocabulary (specviz export-draft), vLLM's CPU server started
   on the built-in target with the card's --speculative-config (the draft's path: the export), the same prompts sent
   as token ids, greedy; vLLM's own counters (/metrics: drafts, draft tokens, accepted tokens per position) read
   before and after. If vLLM refuses the draft model, its own message is printed and the n-gram method is compared
   against the check's lookup drafter instead.
4. transformers' assisted generation with the card's keywords: tokens per target call.

The output (a table, and --out JSON) goes into docs/performance.md with the command and the CPU. The pieces are
functions, so tests/test_check_vs_vllm.py runs them against the real server of the test session.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


@dataclass
class Side:
    """One side of the comparison: per draft position i, the share of rounds whose guess i was kept; tokens a
    round (1 + accepted per drafting round); the rounds counted; and the greedy token ids per prompt."""

    name: str
    per_position: list[float]
    tokens_per_round: float
    rounds: int
    outputs: list = field(default_factory=list)  # the greedy text per prompt
    steps: list = field(default_factory=list)  # vLLM: (drafted, accepted) per verify step, as its replies counted them


def prompt_ids(prompts: list[str]) -> list[list[int]]:
    """The check's prompts as the check encodes them (the built-in target's chat template)."""
    from specviz.api import encode_prompt
    from specviz.config import BUILTIN_TARGET
    from specviz.models.loaded import load_model

    p = load_model(BUILTIN_TARGET, device="cpu")
    return [encode_prompt(p, x) for x in prompts]


def predicted(acceptance, k: int) -> Side:
    """The check's prediction at k speculative tokens: per position the share of rounds that keep it, from the
    check's acceptance measured per position (pairs.measure.Acceptance.kept_shares), and tokens per round."""
    return Side("check (predicted)", acceptance.kept_shares(k), acceptance.tokens_per_round(k), 0)


def iid(a: float, k: int) -> Side:
    """The equal-alpha model the check used before it counted positions: a^(i+1) per position, shown beside."""
    from specviz.theory import expected_tokens

    return Side("one alpha (a^(i+1))", [a ** (i + 1) for i in range(k)], expected_tokens(a, k), 0)


def specviz_side(prompts: list[str], k: int, drafter: str, max_new_tokens: int, draft: str | None = None) -> Side:
    """specviz's own greedy decoding at k: the shares per position over the rounds that drafted."""
    import specviz
    from specviz.events import Done, Round

    steps, outputs = [], []
    for text in prompts:
        done = None
        for ev in specviz.stream(
            text, draft=draft, drafter=drafter, gamma=k, tree="off", temperature=0, max_new_tokens=max_new_tokens
        ):
            if isinstance(ev, Round) and ev.drafted:
                steps.append((len(ev.drafted), ev.n))
            elif isinstance(ev, Done):
                done = ev
        outputs.append(_text(done.token_ids))
    tokens = len(steps) + sum(n for _, n in steps)
    return Side(f"specviz ({drafter})", kept_shares(steps, k), tokens / len(steps), len(steps), outputs)


def kept_shares(steps: list[tuple[int, int]], k: int) -> list[float]:
    """Per draft position 1..k, the share of drafting rounds (drafted, accepted) that kept the guess there: what
    vLLM's per-position counters divided by its drafts read."""
    from specviz.theory import position_counts

    kept = position_counts(steps)[0]
    return [(kept[i] if i < len(kept) else 0) / len(steps) for i in range(k)]


def _text(ids) -> str:
    from specviz.config import BUILTIN_TARGET
    from specviz.models.loaded import load_model

    return load_model(BUILTIN_TARGET, device="cpu").tokenizer.decode(list(ids), skip_special_tokens=True)


def metrics(url: str):
    from specviz.backends.served.http import Client, parse_spec_metrics

    return parse_spec_metrics(Client(url, 30).get("/metrics").decode("utf-8", "replace"))


def vllm_side(url: str, model: str, ids: list[list[int]], max_new_tokens: int, k: int) -> Side:
    """The prompts sent to vLLM as token ids, greedy, one at a time; its counters' change over them, and the verify
    steps each reply carries (--per-request-spec-decode-metrics detailed; the race's vLLM lane draws the same)."""
    from specviz.backends.served.http import Client
    from specviz.backends.served.steps import speculative_metrics

    client, before = Client(url, 600), metrics(url)
    outputs, steps = [], []
    for prompt in ids:
        body = {"model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0}
        reply = client.post("/v1/completions", body)
        outputs.append(reply["choices"][0]["text"])
        counts = speculative_metrics(reply) or {}
        steps += zip(counts.get("per_step_drafted") or (), counts.get("per_step_accepted") or ())
    after = metrics(url)
    drafts = after.drafts - before.drafts
    pos = [
        (after.accepted_per_pos[i] - (before.accepted_per_pos[i] if i < len(before.accepted_per_pos) else 0)) / drafts
        if drafts and i < len(after.accepted_per_pos)
        else 0.0
        for i in range(k)
    ]
    accepted = after.accepted - before.accepted
    return Side("vLLM (its /metrics)", pos, 1 + accepted / drafts if drafts else 0.0, drafts, outputs, steps)


def replies_agree(engine: Side) -> bool:
    """The replies' own verify steps count what /metrics counted: as many drafts, the same kept share per position."""
    if not engine.steps or len(engine.steps) != engine.rounds:
        return False
    shares = kept_shares(engine.steps, len(engine.per_position))
    return all(abs(x - y) < 1e-9 for x, y in zip(shares, engine.per_position))


def transformers_side(target_dir: str, draft_dir: str | None, ids: list[list[int]], kw: dict, max_new: int) -> Side:
    """transformers' assisted generation with the card's keywords: new tokens per target forward call."""
    import torch
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    kw = dict(kw)
    if "assistant_model" in kw:
        kw["assistant_model"] = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    calls = [0]
    target.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    tokens, outputs = 0, []
    for prompt in ids:
        x = torch.tensor([prompt])
        with torch.no_grad():
            out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new, **kw)
        new = out[0, len(prompt) :].tolist()
        tokens += len(new)
        outputs.append(_text(new))
    return Side("transformers (assisted)", [], tokens / calls[0], calls[0], outputs)


def start_vllm(target_dir: str, spec: dict, log: Path, port: int = 8765) -> tuple[subprocess.Popen | None, str]:
    """vLLM's CPU server with `spec` (niced: the machine is shared); (process, "") once ready, or (None, the
    tail of its own log) where it refused or died."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    cmd = ["nice", "-n", "19", str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", target_dir]
    cmd += ["--dtype", "float32", "--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]
    out = open(log, "wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1500:
        if proc.poll() is not None:
            out.close()
            return None, _refusal(log.read_text(errors="replace"))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                if json.load(r).get("data"):
                    return proc, ""
        except OSError:
            pass
        time.sleep(3)
    stop(proc)
    return None, "vLLM was not ready within 25 minutes:\n" + _refusal(log.read_text(errors="replace"))


def _refusal(text: str) -> str:
    """vLLM's own words: the last error lines of its log."""
    lines = [x for x in text.splitlines() if "Error" in x or "error" in x]
    return "\n".join(lines[-6:]) or text[-2000:]


def stop(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def table(sides: list[Side], k: int) -> str:
    head = "                          " + "".join(f"  pos {i:<3d}" for i in range(k)) + "  tokens/round  rounds"
    rows = [head]
    for s in sides:
        cells = "".join(f"  {x:7.3f}" for x in s.per_position) if s.per_position else "  " + " " * (9 * k - 2)
        rows.append(f"{s.name:26s}{cells}  {s.tokens_per_round:12.3f}  {s.rounds:6d}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", choices=["draft_model", "ngram"], default="draft_model")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", help="write the comparison as JSON here")
    ap.add_argument("--no-transformers", action="store_true")
    a = ap.parse_args(argv)

    from specviz.config import BUILTIN_DRAFT
    from specviz.models.builtin import ensure_target
    from specviz.models.export import export_draft
    from specviz.pairs.check import SAMPLE_PROMPTS, check_pair
    from specviz.pairs.deploy import EXPORTED_DRAFT, _Pair, transformers_kwargs

    prompts = [x for v in SAMPLE_PROMPTS.values() for x in v]
    target_dir = str(ensure_target())
    from datetime import datetime, timezone

    from specviz.bench.cli import _commit
    from specviz.bench.machine import machine_info

    result: dict = {
        "command": "python benchmarks/check_vs_vllm.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": _commit(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "machine": machine_info(),
        "vllm": _vllm_version(),
        "method": a.method,
        "max_new_tokens": a.max_new_tokens,
    }
    method = a.method
    while True:
        drafter = "model" if method == "draft_model" else "lookup"
        print(f"[1] the pair check (drafter {drafter}) ...", file=sys.stderr)
        rep = check_pair(drafter=drafter, max_new_tokens=a.max_new_tokens)
        k, alpha = rep.best_gamma, rep.a
        spec = json.loads(_vllm_json(rep.card.engines[0].text))
        draft_dir = None
        if method == "draft_model":
            draft_dir = str(Path(tempfile.mkdtemp(prefix="specviz-draft-")) / "draft")
            export_draft(draft_dir, BUILTIN_DRAFT)
            assert spec["model"] == EXPORTED_DRAFT
            spec["model"] = draft_dir
        print(f"    a = {alpha:.3f}, best gamma {k}; vLLM: {json.dumps(spec)}", file=sys.stderr)
        print("[2] vLLM's CPU server ...", file=sys.stderr)
        log = Path(tempfile.mkdtemp(prefix="specviz-vllm-")) / "server.log"
        proc, refusal = start_vllm(target_dir, spec, log)
        if proc is None:
            print(f"vLLM refused {method}: {refusal}", file=sys.stderr)
            result.setdefault("refused", {})[method] = refusal
            if method == "ngram":
                break
            method = "ngram"
            continue
        try:
            ids = prompt_ids(prompts)
            engine = vllm_side("http://127.0.0.1:8765/v1", target_dir, ids, a.max_new_tokens, k)
        finally:
            stop(proc)
        break
    if proc is None:
        print(json.dumps(result, indent=2))
        return 1
    print("[3] specviz's own greedy runs ...", file=sys.stderr)
    ours = specviz_side(prompts, k, drafter, a.max_new_tokens)
    sides = [predicted(rep.acceptance, k), iid(alpha, k), ours, engine]
    if not a.no_transformers:
        print("[4] transformers' assisted generation ...", file=sys.stderr)
        c = _Pair(target_dir, draft_dir or "", drafter, k, False, False, rep)
        sides.append(transformers_side(target_dir, draft_dir, ids, transformers_kwargs(c), a.max_new_tokens))
    same = [x == y for x, y in zip(ours.outputs, engine.outputs)]
    result |= {
        "method": method,
        "drafter": drafter,
        "gamma": k,
        "a": alpha,
        "speculative_config": spec,
        "sides": [asdict(s) for s in sides],
        "greedy_text_equal": sum(same),
        "prompts": len(prompts),
    }
    m = result["machine"]
    print(
        f"\n{m['cpu']}, {m['usable_cpus']} CPUs; {method}, k = {k}, greedy, {len(prompts)} prompts of the check, {a.max_new_tokens} tokens"
    )
    print(table(sides, k))
    print(f"greedy output equal to specviz's on {sum(same)} of {len(prompts)} prompts")
    result["vs_prediction"] = gaps = against(sides[0], engine)
    result["replies_agree_with_metrics"] = agree = replies_agree(engine)
    print(f"the replies' own verify steps {'equal' if agree else 'DIFFER FROM'} what /metrics counted")
    print(
        f"vLLM against the check's prediction: tokens per round {gaps['tokens_per_round_rel']:+.1%}, acceptance per "
        f"position at most {gaps['max_position_diff']:.3f} apart"
    )
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))
    return 0


def against(prediction: Side, engine: Side) -> dict:
    """How far the engine's counters are from the prediction: tokens per round relative, per position absolute."""
    diffs = [abs(x - y) for x, y in zip(engine.per_position, prediction.per_position)]
    return {
        "tokens_per_round_rel": engine.tokens_per_round / prediction.tokens_per_round - 1,
        "max_position_diff": max(diffs, default=0.0),
        "position_diffs": diffs,
    }


def _vllm_json(text: str) -> str:
    import shlex

    words = shlex.split(text.replace("\\\n", " "))
    return words[words.index("--speculative-config") + 1]


def _vllm_version() -> str:
    out = subprocess.run(
        [str(VLLM_PYTHON), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
