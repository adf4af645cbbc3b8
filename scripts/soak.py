"""A long mixed soak: N concurrent gradio_client visitors use the app the way a public Space's audience does.

    python scripts/soak.py                                  # 8 visitors, 30 minutes, the built-in pair
    python scripts/soak.py --visitors 4 --minutes 1 --target DIR --draft DIR     # tests/test_soak.py

It starts the app (app.py) in a child process on 127.0.0.1 with a public Space's limits (any SPECVIZ_* variable
already set wins). Each visitor has its own session and loops: race, sweep, step, check or exactness, with valid
inputs or invalid ones (bad numbers, huge prompts, unknown models, script tags), cancelling about a fifth of its
requests part-way. The report (stdout, and OUT/soak.json) counts requests by outcome (finished, refused with a
sentence, cancelled, error), gives p50/p95/p99 of the queue wait and of the time to the first token (race) or
first answer, and plots the server's RSS over time (OUT/rss.png where kaleido finds a browser, else rss.html).

Exit status 1 on any traceback in the server's log, any error outcome, any cross-talk (a visitor seeing a result
that is not its own: a race whose prompt echo is another's, or equal requests with different tokens, or a
step-through round out of sequence), or RSS growth above --max-rss-growth after the warm-up (five minutes, or a
third of a shorter run).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from gradio_client import Client
from gradio_client.utils import Status

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specviz.host import memory  # noqa: E402 (the repository's own package, from a checkout)

ROOT = Path(__file__).resolve().parent.parent
TOKEN = re.compile(r'<span class="tok (tok-[a-z]+)[^"]*" title="[^"]*">(.*?)</span>', re.S)
ROUND = re.compile(r"Round (\d+)\.")
PROMPTS = [
    "Tell me about gravity.",
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "The capital of France is",
    "<script>alert(1)</script> what is this?",
]
SERVER_ENV = {  # a public Space's settings; sessions idle a minute so the soak sees them freed
    "SPECVIZ_ALLOWED_MODELS": "builtin",
    "SPECVIZ_MAX_NEW_TOKENS": "64",
    "SPECVIZ_MAX_PROMPT_TOKENS": "256",
    "SPECVIZ_REQUEST_TIMEOUT_S": "60",
    "SPECVIZ_CONCURRENCY": "2",
    "SPECVIZ_MAX_QUEUE": "64",
    "SPECVIZ_MAX_SWEEP": "3",
    "SPECVIZ_MAX_LOADED_MODELS": "2",
    "SPECVIZ_SESSION_IDLE_S": "60",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "HF_HUB_OFFLINE": "1",
}


# --- one request ---------------------------------------------------------------------------------


@dataclass
class Request:
    kind: str  # race, sweep, step, check, exactness
    args: tuple
    valid: bool
    cancel: bool
    key: tuple = ()  # equal keys must give equal results (all runs are seeded)


@dataclass
class Tally:
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> outcome -> count
    queue_wait: list[float] = field(default_factory=list)  # submit -> the server starts it
    first_token: list[float] = field(default_factory=list)  # races: submit -> the first token on the page
    answer: list[float] = field(default_factory=list)  # other requests: submit -> the answer
    problems: list[str] = field(default_factory=list)  # errors and cross-talk, one line each
    seen: dict[tuple, object] = field(default_factory=dict)  # request key -> its result's signature
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, kind: str, outcome: str) -> None:
        with self.lock:
            by = self.outcomes.setdefault(kind, {})
            by[outcome] = by.get(outcome, 0) + 1

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text[:400])

    def same(self, key: tuple, signature, what: str) -> None:
        """Cross-talk check: a request equal to an earlier one must give the same result."""
        with self.lock:
            earlier = self.seen.setdefault(key, signature)
        if earlier != signature:
            self.problem(f"cross-talk: {what} {key!r} gave a different result than an equal earlier request")


def _text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page or "")).strip()


def _error_sentence(page: str) -> str | None:
    """The sentence of an sv-error box in `page`, or None when there is none."""
    m = re.search(r'<div class="sv-error"[^>]*>(.*?)</div>', page or "", re.S)
    return _text(m.group(1)) if m else None


def _tokens(pane: str) -> tuple[str, ...]:
    return tuple(f"{cls}:{body}" for cls, body in TOKEN.findall(pane or ""))


class Visitor:
    """One browser tab: its own gradio session, its step-through run, its random choices."""

    def __init__(self, i: int, url: str, tally: Tally, until: float, seed: int, timeout_s: float):
        self.i, self.tally, self.until, self.timeout_s = i, tally, until, timeout_s
        self.rng = random.Random(seed * 1000 + i)
        self.client = Client(url, verbose=False)
        self.step_settings: tuple | None = None
        self.step_round: int | None = None  # the last round this visitor saw; None: unknown (after a cancel)

    def run(self) -> None:
        while time.monotonic() < self.until:
            req = self.pick()
            try:
                self.send(req)
            except Exception as err:  # the soak itself must not die; the report says what happened
                self.tally.count(req.kind, "error")
                self.tally.problem(f"visitor {self.i} {req.kind}: {type(err).__name__}: {err}")
            time.sleep(self.rng.uniform(0.0, 0.5))  # a person reads the page between clicks

    # --- choosing ------------------------------------------------------------------------------

    def pick(self) -> Request:
        r = self.rng
        kind = r.choice(["race", "sweep", "step", "check", "exactness"])
        valid = r.random() < 0.7
        cancel = r.random() < 0.2
        prompt = r.choice(PROMPTS)
        gamma, temperature, seed = r.randint(1, 6), r.choice([0.0, 0.0, 0.7, 1.0]), r.randint(0, 3)
        tokens = r.choice([8, 16, 32])
        bad = r.choice(["nan", "text", "huge number", "huge prompt", "empty prompt", "negative"])
        if kind == "race":
            args = [prompt, gamma, temperature, 0, 1.0, tokens, seed]
            if not valid:
                args = _spoil(args, bad, prompt_at=0, number_at=r.choice([1, 2, 5, 6]))
            return Request(kind, tuple(args), valid, cancel, ("race", *args))
        if kind == "sweep":
            args = [prompt, temperature, 0, 1.0, r.choice([8, 16]), seed]
            if not valid:
                args = _spoil(args, bad, prompt_at=0, number_at=r.choice([1, 4, 5]))
            return Request(kind, tuple(args), valid, cancel)
        if kind == "step":
            if self.step_settings is None or r.random() < 0.15:  # a new run, or settings changed
                self.step_settings = (prompt, r.randint(1, 6), r.choice([0.0, 1.0]), seed)
            args = list(self.step_settings)
            if not valid:
                args = _spoil(args, r.choice(["huge prompt", "empty prompt", "negative"]), prompt_at=0, number_at=3)
            return Request(kind, tuple(args), valid, cancel)
        if kind == "check":
            if valid:
                return Request(kind, ("", "", r.choice([8, 16])), True, cancel, ("check",))
            name = r.choice(["nobody/no-such-model", "<script>alert(1)</script>", "../../etc", "/etc/passwd"])
            return Request(kind, (name, "", 8), False, cancel)
        args = [prompt, gamma, temperature, seed, r.choice([300, 600]), r.randint(0, 2)]
        if not valid:
            args = _spoil(args, r.choice(["huge prompt", "empty prompt", "negative"]), prompt_at=0, number_at=3)
        return Request("exactness", tuple(args), valid, cancel, ("exactness", *args) if temperature == 0 else ())

    # --- sending -------------------------------------------------------------------------------

    def send(self, req: Request) -> None:
        t0 = time.monotonic()
        job = self.client.submit(*req.args, api_name=f"/{req.kind}")
        started = first = None
        cancel_at = t0 + self.rng.uniform(0.2, 3.0) if req.cancel else math.inf
        while not job.done():
            now = time.monotonic()
            code = job.status().code
            if started is None and code in (Status.PROCESSING, Status.ITERATING, Status.PROGRESS):
                started = now
            if first is None and req.kind == "race" and any(_tokens(o[1] + o[2]) for o in job.outputs()[-1:]):
                first = now
            if now >= cancel_at:
                job.cancel()
                self.tally.count(req.kind, "cancelled")
                self.step_round = None  # the session may or may not have advanced
                _wait_out(job, 10)
                return
            if now - t0 > self.timeout_s:
                job.cancel()
                raise TimeoutError(f"no answer after {self.timeout_s:.0f} s")
            time.sleep(0.02)
        end = time.monotonic()
        try:
            out = job.result(timeout=1)
        except Exception as err:
            return self.refused_by_gradio(req, err)
        with self.tally.lock:
            self.tally.queue_wait.append((started or end) - t0)
            if req.kind == "race":
                self.tally.first_token.append((first or end) - t0)
            else:
                self.tally.answer.append(end - t0)
        self.judge(req, out)

    def refused_by_gradio(self, req: Request, err: Exception) -> None:
        """gradio's own checks (a slider's range, a full queue) raise in the client with their sentence."""
        text = str(err)
        if re.search(r"greater than maximum|less than minimum|Queue is full", text):
            self.tally.count(req.kind, "refused")
        else:
            self.tally.count(req.kind, "error")
            self.tally.problem(f"visitor {self.i} {req.kind} {req.args!r:.200}: {type(err).__name__}: {text}")
        self.step_round = None

    def judge(self, req: Request, out) -> None:
        page = {"race": lambda o: o[5], "sweep": lambda o: o[1], "check": lambda o: o[0]}.get(req.kind, lambda o: o[0])
        main = page(out) or ""
        sentence = _error_sentence(main)
        if sentence is not None:
            outcome = "refused" if sentence and "Something went wrong" not in sentence else "error"
            self.tally.count(req.kind, outcome)
            if outcome == "error" or (req.valid and "still loading" not in sentence and "limit" not in sentence):
                self.tally.problem(f"visitor {self.i} {req.kind} {req.args!r:.200} -> {sentence!r}")
            if req.kind == "step":
                self.step_round = None
            return
        if not req.valid:
            self.tally.problem(f"visitor {self.i} {req.kind}: invalid input {req.args!r:.200} was not refused")
        self.tally.count(req.kind, "finished")
        if req.kind == "race":
            echo = html.escape(req.args[0])
            if f'class="sv-prompt-text">{echo}</span>' not in out[0]:
                self.tally.problem(f"cross-talk: visitor {self.i}'s race shows another prompt")
            self.tally.same(req.key, (_tokens(out[1]), _tokens(out[2])), "race")
        elif req.kind == "step":
            self.check_step(req, out)
        elif req.kind == "check":
            acc = (out[2] or {}).get("acceptance") or {}  # the counts; its seconds differ from run to run
            counts = tuple(
                str(acc.get(k)) for k in ("accepted", "tested", "drafted", "rounds", "new_tokens", "block_sizes")
            )
            self.tally.same(req.key + (req.args[2],), counts, "check")
        elif req.kind == "exactness" and req.key:
            self.tally.same(req.key, "Identical." in main, "exactness")

    def check_step(self, req: Request, out) -> None:
        say, text = out[0], out[1]
        m = ROUND.search(say)
        if m is None:  # "Done": the run is complete; no new round
            return
        k = int(m.group(1))
        restarted = "started over" in say or "freed" in say
        expected = self.step_round + 1 if self.step_round is not None and not restarted else None
        if k != 1 and expected is not None and k != expected:
            self.tally.problem(f"cross-talk: visitor {self.i} expected step round {expected}, got {k}")
        if expected is None and restarted and k != 1:
            self.tally.problem(f"cross-talk: visitor {self.i}'s restarted run began at round {k}")
        self.step_round = k
        if isinstance(text, str):  # the answer so far, for these settings after k rounds: equal everywhere
            self.tally.same(("step", *req.args, k), _tokens(text), "step")


def _spoil(args: list, bad: str, prompt_at: int, number_at: int) -> list:
    args = list(args)
    if bad == "huge prompt":
        args[prompt_at] = "word " * 20_000
    elif bad == "empty prompt":
        args[prompt_at] = "   "
    else:
        # NaN as the text a JSON client sends (gradio_client cannot encode a float NaN)
        args[number_at] = {"nan": "NaN", "text": "four", "huge number": 1e300, "negative": -5}[bad]
    return args


def _wait_out(job, seconds: float) -> None:
    t0 = time.monotonic()
    while not job.done() and time.monotonic() - t0 < seconds:
        time.sleep(0.05)


# --- the server ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**SERVER_ENV, **os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)}
    for name, value in (("SPECVIZ_TARGET", args.target), ("SPECVIZ_DRAFT", args.draft)):
        if value:
            env[name] = value
    log = open(log_path, "w")  # noqa: SIM115 (the child writes to it until it exits)
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}/"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 300:
        if proc.poll() is not None:
            raise SystemExit(f"the app exited at start-up; see {log_path}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the app did not answer within 300 s")


def wait_ready(url: str, seconds: float = 600) -> None:
    """Until the default pair has loaded (the status line says Ready), then one request of each kind, so that
    loading and first-use costs are counted neither as queue wait nor as memory growth."""
    c = Client(url, verbose=False)
    t0 = time.monotonic()
    while "Ready" not in (status := c.predict(api_name="/status")[0]):
        if "could not be loaded" in status or time.monotonic() - t0 > seconds:
            raise SystemExit(f"the default models did not load: {_text(status)}")
        time.sleep(1)
    c.predict(PROMPTS[0], 2, 0.0, 0, 1.0, 8, 0, api_name="/race")
    c.predict(PROMPTS[0], 0.0, 0, 1.0, 8, 0, api_name="/sweep")
    c.predict(PROMPTS[0], 2, 0.0, 0, api_name="/step")
    c.predict("", "", 8, api_name="/check")
    c.predict(PROMPTS[0], 2, 1.0, 0, 300, 1, api_name="/exactness")


def sample_rss(pid: int, log_path: Path, until: threading.Event, every_s: float, samples: list, blocks: list) -> None:
    """RSS every `every_s` seconds into `samples`, and the server's latest count of Python blocks (its memory
    line, specviz/host/memory.py) into `blocks`, both as (seconds, value)."""
    proc, t0 = psutil.Process(pid), time.monotonic()
    while not until.is_set():
        try:
            samples.append((time.monotonic() - t0, proc.memory_info().rss / 2**20))
        except psutil.Error:
            return
        lines = memory.LINE.findall(log_path.read_text(errors="replace"))
        if lines:
            blocks.append((time.monotonic() - t0, int(lines[-1][1])))
        until.wait(every_s)


# --- the report ----------------------------------------------------------------------------------


def percentiles(xs: list[float]) -> dict[str, float | None]:
    if len(xs) < 2:
        return {"p50": xs[0] if xs else None, "p95": xs[0] if xs else None, "p99": xs[0] if xs else None}
    q = statistics.quantiles(xs, n=100, method="inclusive")
    return {"p50": round(q[49], 3), "p95": round(q[94], 3), "p99": round(q[98], 3)}


def rss_growth(samples: list, warmup_s: float) -> tuple[float | None, float | None, float]:
    """(value at the end of the warm-up, at the end, growth): medians of a few samples at each end."""
    after = [mb for t, mb in samples if t >= warmup_s]
    if len(after) < 2:
        return None, None, 0.0
    k = max(1, min(3, len(after) // 4))
    start, end = statistics.median(after[:k]), statistics.median(after[-k:])
    return start, end, (end - start) / start


def plot_rss(samples: list, blocks: list, warmup_s: float, out: Path) -> str:
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[t / 60 for t, _ in samples], y=[mb for _, mb in samples], mode="lines", name="RSS"))
    if blocks:  # the server's own count: flat while RSS climbs means the allocator, not a Python leak
        xs, ys = [t / 60 for t, _ in blocks], [b / 1e6 for _, b in blocks]
        fig.add_scatter(x=xs, y=ys, mode="lines", name="Python blocks (millions)", yaxis="y2", line_dash="dot")
    fig.add_vline(x=warmup_s / 60, line_dash="dash", annotation_text="end of warm-up")
    fig.update_layout(
        title="specviz soak: server RSS and Python's allocated blocks",
        xaxis_title="minutes",
        yaxis={"title": "RSS (MiB)", "rangemode": "tozero"},
        yaxis2={
            "title": "Python blocks (millions)",
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "tickformat": ".1f",
            "showgrid": False,
        },
        legend={"orientation": "h", "y": -0.2},
        template="plotly_white",
    )
    fig.write_html(out / "rss.html", include_plotlyjs=True)
    try:
        if not os.environ.get("BROWSER_PATH") and Path("/usr/bin/chromium").is_file():
            os.environ["BROWSER_PATH"] = "/usr/bin/chromium"  # where kaleido looks for a browser
        fig.write_image(out / "rss.png", width=900, height=450)
        return str(out / "rss.png")
    except Exception:  # no browser for kaleido: the HTML plot is there
        return str(out / "rss.html")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--visitors", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--warmup-minutes", type=float, default=None, help="default: 5, or a third of a shorter run")
    ap.add_argument("--target", help="the app's default target (SPECVIZ_TARGET); default: the built-in pair")
    ap.add_argument("--draft", help="the app's default draft (SPECVIZ_DRAFT)")
    ap.add_argument("--max-rss-growth", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--png", action=argparse.BooleanOptionalAction, default=True, help="plot RSS as PNG/HTML")
    ap.add_argument("--out", default="soak-out", help="folder for soak.json, server.log and the RSS plot")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    warmup_s = 60 * (a.warmup_minutes if a.warmup_minutes is not None else min(5.0, a.minutes / 3))

    proc, url = start_server(a, out / "server.log")
    samples: list = []
    blocks: list = []
    stop = threading.Event()
    try:
        wait_ready(url)
        every_s = max(1.0, a.minutes * 60 / 200)
        args = (proc.pid, out / "server.log", stop, every_s, samples, blocks)
        threading.Thread(target=sample_rss, args=args).start()
        tally = Tally()
        until = time.monotonic() + 60 * a.minutes
        timeout_s = 3 * int(os.environ.get("SPECVIZ_REQUEST_TIMEOUT_S", SERVER_ENV["SPECVIZ_REQUEST_TIMEOUT_S"])) + 60
        visitors = [Visitor(i, url, tally, until, a.seed, timeout_s) for i in range(a.visitors)]
        threads = [threading.Thread(target=v.run, name=f"visitor-{i}") for i, v in enumerate(visitors)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()

    log = (out / "server.log").read_text(errors="replace")
    tracebacks = log.count("Traceback (most recent call last)")
    start_mb, end_mb, growth = rss_growth(samples, warmup_s)
    start_blocks, end_blocks, blocks_growth = rss_growth(blocks, warmup_s)
    totals: dict[str, int] = {}
    for by in tally.outcomes.values():
        for k, v in by.items():
            totals[k] = totals.get(k, 0) + v
    crosstalk = [p for p in tally.problems if p.startswith("cross-talk")]
    errors = totals.get("error", 0)
    report = {
        "visitors": a.visitors,
        "minutes": round(wall / 60, 2),
        "requests": sum(totals.values()),
        "outcomes": totals,
        "by_kind": tally.outcomes,
        "queue_wait_s": percentiles(tally.queue_wait),
        "first_token_s": percentiles(tally.first_token),
        "answer_s": percentiles(tally.answer),
        "rss_mb": {
            "after_warmup": start_mb and round(start_mb, 1),
            "end": end_mb and round(end_mb, 1),
            "max": round(max((mb for _, mb in samples), default=0), 1),
            "growth": round(growth, 4),
        },
        "python_blocks": {  # flat while RSS grows: the allocator, not a Python leak
            "after_warmup": start_blocks and int(start_blocks),
            "end": end_blocks and int(end_blocks),
            "growth": round(blocks_growth, 4),
        },
        "tracebacks": tracebacks,
        "cross_talk": len(crosstalk),
        "problems": tally.problems[:50],
    }
    if a.png and samples:
        report["rss_plot"] = plot_rss(samples, blocks, warmup_s, out)
    (out / "soak.json").write_text(json.dumps(report, indent=2))
    (out / "rss.csv").write_text("seconds,rss_mb\n" + "".join(f"{t:.1f},{mb:.1f}\n" for t, mb in samples))
    (out / "blocks.csv").write_text("seconds,python_blocks\n" + "".join(f"{t:.1f},{b}\n" for t, b in blocks))
    print(json.dumps(report, indent=2))
    failed = []
    if tracebacks:
        failed.append(f"{tracebacks} traceback(s) in {out / 'server.log'}")
    if crosstalk:
        failed.append(f"{len(crosstalk)} cross-talk finding(s)")
    if errors or tally.problems:
        failed.append(f"{errors} error outcome(s), {len(tally.problems)} problem(s)")
    if growth > a.max_rss_growth:
        failed.append(f"RSS grew {growth:.1%} after the warm-up (limit {a.max_rss_growth:.0%})")
    for f in failed:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
