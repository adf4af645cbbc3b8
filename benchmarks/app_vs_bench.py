"""The race as a visitor sees it against the benchmark: the app's /race speedup per prompt beside
`python -m specviz bench` on the same prompts and settings (the page's defaults), on this machine.

    python benchmarks/app_vs_bench.py                          # 4 everyday, 4 story and 4 code prompts
    python benchmarks/app_vs_bench.py --sets everyday,stories --limit 10 --rounds 2

The app runs in a child process as `python app.py` would (its own compute thread, gradio's threads, the page's
streaming); gradio_client receives every streamed update, as a browser would, with no browser on the machine.
The bench runs in another child process after the app has exited, so the two never share the cores. With
--rounds 2 the order is app, bench, app, bench (drift shows as a difference between rounds). With --paired both
processes stay up (the bench as a worker that loads the pair once and measures one prompt at a time) and each prompt
is raced in the app and measured by the bench back to back, the first of the two alternating; the one waiting idles.
The memory these machines get moves from minute to minute (plain decoding of the built-in target 52-73 tokens/s in
fresh processes of one hour on a 2-core Zen 4), which the unpaired rounds leave between the app's figures and the
bench's.

    python benchmarks/app_vs_bench.py --paired --rounds 2

Prints each round's
backends (the app's status line, the bench's forward line: each process times its own choices) and medians, then a
table per prompt (medians over rounds) and the overall medians; --json-out keeps everything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from gradio_client import Client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.request import RunRequest  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app(log_path: Path):
    """`python app.py` in a child process, its models loaded and its first-use costs paid (one untimed race):
    yields (a gradio_client Client, the app's status line)."""
    port = _free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)}
    env.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, stdout=log, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}/"
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(f"the app exited at start-up; see {log_path}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        client = Client(url, verbose=False)
        while "Ready" not in (status := client.predict(api_name="/status")[0]):
            time.sleep(1)
        page, settings = page_defaults()
        client.predict("def fibonacci(n):", *settings, 16, page.seed, api_name="/race")  # warm-up, untimed
        yield client, re.sub(r"<[^>]+>", "", status)
    finally:
        proc.terminate()
        proc.wait(30)


def page_defaults() -> tuple[RunRequest, list]:
    """The page's controls as they start (gamma "auto": the auto policy, at most 8 a round), and /race's first four
    arguments from them (gamma, temperature, top-k, top-p)."""
    page = RunRequest()
    return page, [page.gamma, page.temperature, page.top_k, page.top_p]


def race_once(client: Client, prompt: str, max_new_tokens: int) -> tuple[float, float]:
    """One race through /race at the page's defaults: (the speedup the page reports in its summary line, the plain
    pane's tokens/s). Every streamed update reaches the client on the way, as in a browser."""
    page, settings = page_defaults()
    job = client.submit(prompt, *settings, max_new_tokens, page.seed, page.drafter, page.gamma_policy, api_name="/race")
    final = job.result()
    message = re.sub(r"<[^>]+>", "", final[5])
    found = re.search(r"([0-9.]+)×", message)
    if not found:
        raise SystemExit(f"no speedup in the page's message for {prompt!r}: {message}")
    lanes = " ".join(re.sub(r"<[^>]+>", " ", x) for x in final if isinstance(x, str))
    rate = re.search(r"([0-9]+\.[0-9])\s+tokens/s", lanes)  # the plain pane's, the first on the page
    return float(found.group(1)), float(rate.group(1)) if rate else float("nan")


def app_speedups(prompts: list[str], max_new_tokens: int, log_path: Path) -> tuple[list[float], str, list[float]]:
    """The speedup the page reports for each prompt (its summary line), raced through /race at page defaults; the
    app's status line; each prompt's plain tokens/s (the plain pane's)."""
    with running_app(log_path) as (client, status):
        got = [race_once(client, prompt, max_new_tokens) for prompt in prompts]
    return [g[0] for g in got], status, [g[1] for g in got]


BENCH_CONFIG = "lookup+model:auto:tree=auto"  # the page's defaults, as the bench names them
TAG = "@@ "  # the bench worker's protocol lines on its stdout (anything else printed there is passed over)


def bench_worker(max_new_tokens: int) -> None:
    """--bench-worker: the bench's own measurement (specviz.bench.measure.measure, as `python -m specviz bench --configs
    BENCH_CONFIG --no-hf` runs it: the pair loaded by api.load_for, a warm-up, plain then speculative decoding) for
    one prompt at a time, each read from stdin as a JSON line, answered on stdout as (spec/ar, plain tokens/s)."""
    from specviz.api import load_for
    from specviz.bench.inputs import parse_configs
    from specviz.bench.machine import machine_info
    from specviz.bench.measure import measure
    from specviz.models.loaded import pair_backend

    request = RunRequest.of({"max_new_tokens": max_new_tokens}, "bench")
    p, q = load_for(request.replace(drafter="model"))
    configs = parse_configs(BENCH_CONFIG)
    print(TAG + json.dumps({**machine_info(), "backend": pair_backend(p, q)}), flush=True)
    for line in sys.stdin:
        runs = measure(p, q, [json.loads(line)], configs, [0.0], request=request, hf=False)
        rate = dict(zip(runs["method"], runs["tokens_per_s"]))
        print(TAG + json.dumps([rate["spec"] / rate["ar"], rate["ar"]]), flush=True)


class BenchWorker:
    """A `--bench-worker` child process: its pair loaded once, then one prompt at a time while the app idles."""

    def __init__(self, max_new_tokens: int, log_path: Path):
        self.log = open(log_path, "w")
        cmd = [sys.executable, __file__, "--bench-worker", "--max-new-tokens", str(max_new_tokens)]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        self.machine = self._answer()

    def _answer(self):
        for line in self.proc.stdout:
            if line.startswith(TAG):
                return json.loads(line[len(TAG) :])
        raise SystemExit(f"the bench worker exited; see {self.log.name}")

    def run(self, prompt: str) -> tuple[float, float]:
        self.proc.stdin.write(json.dumps(prompt) + "\n")
        self.proc.stdin.flush()
        return tuple(self._answer())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)
        self.log.close()


def paired(prompts: list[str], max_new_tokens: int, rounds: int, folder: Path) -> tuple:
    """--paired: the app and a bench worker both loaded (the worker after the app is ready, so neither load's timed
    choices share the cores with the other's), each prompt raced through the app and measured by the bench back to
    back, which goes first alternating from prompt to prompt and round to round; one process idles while the other
    runs. The memory's speed moves from minute to minute on these machines; this pairs each prompt's two figures
    within seconds of each other. Returns as the unpaired rounds do: per round (app speedups, status, app plain
    tokens/s, bench speedups, machine, bench plain tokens/s)."""
    out = []
    with running_app(folder / "app.log") as (client, status):
        worker = BenchWorker(max_new_tokens, folder / "bench.log")
        try:
            for r in range(rounds):
                app, bench = [], []
                for i, prompt in enumerate(prompts):
                    if (i + r) % 2:
                        bench.append(worker.run(prompt))
                        app.append(race_once(client, prompt, max_new_tokens))
                    else:
                        app.append(race_once(client, prompt, max_new_tokens))
                        bench.append(worker.run(prompt))
                out.append(
                    (
                        [a[0] for a in app],
                        status,
                        [a[1] for a in app],
                        [b[0] for b in bench],
                        worker.machine,
                        [b[1] for b in bench],
                    )
                )
        finally:
            worker.close()
    return out


def bench_speedups(prompts: list[str], max_new_tokens: int, folder: Path) -> tuple[list[float], dict, list[float]]:
    """Per-prompt speedup of the default configuration over plain decoding, from `python -m specviz bench`."""
    pfile, out = folder / "prompts.txt", folder / "bench.json"
    pfile.write_text("\n".join(p.replace("\n", "\\n") for p in prompts) + "\n", encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "specviz",
        "bench",
        "--prompts",
        str(pfile),
        "--configs",
        BENCH_CONFIG,
        "--max-new-tokens",
        str(max_new_tokens),
        "--no-hf",
        "--json-out",
        str(out),
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    data = json.loads(out.read_text())
    rate = {(r["method"], r["prompt"]): r["tokens_per_s"] for r in data["runs"]}
    n = range(len(prompts))
    return [rate[("spec", i)] / rate[("ar", i)] for i in n], data["machine"], [rate[("ar", i)] for i in n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="everyday,stories,code", help="bench prompt sets (held out from training)")
    ap.add_argument("--limit", type=int, default=4, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="the page's default")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--paired", action="store_true", help="both processes up at once, each prompt app and bench back to back"
    )
    ap.add_argument("--json-out", default="")
    ap.add_argument("--bench-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.bench_worker:
        return bench_worker(a.max_new_tokens)
    from specviz.bench.inputs import load_prompts

    prompts = [p for s in a.sets.split(",") for p in load_prompts(s.strip(), a.limit)]
    with tempfile.TemporaryDirectory() as tmp:
        if a.paired:
            rounds = paired(prompts, a.max_new_tokens, a.rounds, Path(tmp))
        else:
            rounds = []
            for r in range(a.rounds):
                got, status, rates = app_speedups(prompts, a.max_new_tokens, Path(tmp) / f"app{r}.log")
                rounds.append((got, status, rates, *bench_speedups(prompts, a.max_new_tokens, Path(tmp))))
    apps, statuses, app_plain, benches, machines, bench_plain = (list(x) for x in zip(*rounds))
    machine = machines[-1]
    app = [statistics.median(v) for v in zip(*apps)]
    bench = [statistics.median(v) for v in zip(*benches)]
    print(f"{machine.get('cpu')} ({machine.get('cpu_id')}; {machine.get('cpu_vector')})")
    for r, (status, m, x, y, u, v) in enumerate(zip(statuses, machines, apps, benches, app_plain, bench_plain), 1):
        print(
            f"round {r}: app {statistics.median(x):.2f}x, bench {statistics.median(y):.2f}x; plain decoding "
            f"{statistics.median(u):.1f} tokens/s in the app, {statistics.median(v):.1f} in the bench"
        )
        print(f"  app status: {status}")
        print(f"  bench: {m.get('backend')}")
    print(f"{'prompt':60s} {'app':>6s} {'bench':>6s}")
    for p, x, y in zip(prompts, app, bench):
        print(f"{p[:60].replace(chr(10), ' '):60s} {x:6.2f} {y:6.2f}")
    ma, mb = statistics.median(app), statistics.median(bench)
    print(f"{'median':60s} {ma:6.2f} {mb:6.2f}   app / bench = {ma / mb:.3f}; lowest app {min(app):.2f}")
    if a.json_out:
        out = {"machine": machine, "machines": machines, "app_status": statuses, "prompts": prompts}
        rates = {"app_plain_tokens_per_s": app_plain, "bench_plain_tokens_per_s": bench_plain}
        Path(a.json_out).write_text(json.dumps({**out, "app": apps, "bench": benches, **rates}))


if __name__ == "__main__":
    main()
