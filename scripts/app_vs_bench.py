"""The race as a visitor sees it against the benchmark: the app's /race speedup per prompt beside
`python -m specviz bench` on the same prompts and settings (the page's defaults), on this machine.

    python scripts/app_vs_bench.py                          # 4 everyday, 4 story and 4 code prompts
    python scripts/app_vs_bench.py --sets everyday,stories --limit 10 --rounds 2

The app runs in a child process as `python app.py` would (its own compute thread, gradio's threads, the page's
streaming); gradio_client receives every streamed update, as a browser would, with no browser on the machine.
The bench runs in another child process after the app has exited, so the two never share the cores. With
--rounds 2 the order is app, bench, app, bench (drift shows as a difference between rounds). Prints each round's
backends (the app's status line, the bench's forward line: each process times its own choices) and medians, then a
table per prompt (medians over rounds) and the overall medians; --json-out keeps everything.
"""

from __future__ import annotations

import argparse
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


def app_speedups(prompts: list[str], max_new_tokens: int, log_path: Path) -> tuple[list[float], str, list[float]]:
    """The speedup the page reports for each prompt (its summary line), raced through /race at page defaults; the
    app's status line; each prompt's plain tokens/s (the plain pane's)."""
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
        status = re.sub(r"<[^>]+>", "", status)
        page = RunRequest()  # the page's controls start at these: gamma "auto" (the auto policy, at most 8 a round)
        settings = [page.gamma, page.temperature, page.top_k, page.top_p]
        client.predict(prompts[0], *settings, 16, page.seed, api_name="/race")  # warm-up: first-use costs untimed
        out, plain = [], []
        for prompt in prompts:
            job = client.submit(
                prompt, *settings, max_new_tokens, page.seed, page.drafter, page.gamma_policy, api_name="/race"
            )
            final = job.result()  # every streamed update reaches the client on the way, as in a browser
            message = re.sub(r"<[^>]+>", "", final[5])
            found = re.search(r"([0-9.]+)×", message)
            if not found:
                raise SystemExit(f"no speedup in the page's message for {prompt!r}: {message}")
            out.append(float(found.group(1)))
            lanes = " ".join(re.sub(r"<[^>]+>", " ", x) for x in final if isinstance(x, str))
            rate = re.search(r"([0-9]+\.[0-9])\s+tokens/s", lanes)  # the plain pane's, the first on the page
            plain.append(float(rate.group(1)) if rate else float("nan"))
        return out, status, plain
    finally:
        proc.terminate()
        proc.wait(30)


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
        "lookup+model:auto:tree=auto",
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
    ap.add_argument("--json-out", default="")
    a = ap.parse_args()
    from specviz.bench_inputs import load_prompts

    prompts = [p for s in a.sets.split(",") for p in load_prompts(s.strip(), a.limit)]
    apps, benches, machines, statuses, app_plain, bench_plain = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            got, status, rates = app_speedups(prompts, a.max_new_tokens, Path(tmp) / f"app{r}.log")
            apps.append(got)
            statuses.append(status)
            app_plain.append(rates)
            got, machine, rates = bench_speedups(prompts, a.max_new_tokens, Path(tmp))
            benches.append(got)
            machines.append(machine)
            bench_plain.append(rates)
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
