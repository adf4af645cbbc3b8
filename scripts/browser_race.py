"""The race as a visitor on the same machine sees it: the page's own speedup with a browser (Debian's chromium,
not niced) showing the race as it streams, two thread rules for the models' calls alternating from prompt to
prompt in one server process (the measurement behind cpus.threads' busy-neighbour rule).

    python scripts/browser_race.py [--sets everyday,stories,code] [--limit 4] [--ways 2,auto] [--temperature 0.7]

A way is a fixed thread count, or `auto` (cpus.threads: torch's count less the CPUs other programs keep busy).
The app is served in this process at the page's defaults; chromium clicks Run race for each prompt, waits for the
summary line and reads the speedup, both lanes' seconds and, from /proc/stat, how much CPU the other programs (the
browser) used meanwhile. Prints per set and way the median speedup and each lane's tokens per second. Speeds
measured here include the browser's rendering on the same cores, as a teacher's laptop pays it; the bench and
gradio_client measure without it (scripts/app_vs_bench.py).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402

from specviz import ab
from specviz.bench.inputs import load_prompts  # noqa: E402
from specviz.host import compute, cpus  # noqa: E402
from specviz.host.machine import machine_info  # noqa: E402
from specviz.ui import build_demo, serve_locally  # noqa: E402
from specviz.ui.browser import launch as browser_launch  # noqa: E402
from specviz.ui.common import UIContext  # noqa: E402
from specviz.ui.inputs import TEMPERATURE_LABEL, number_box  # noqa: E402

SLOW_MS = 600_000
DONE = re.compile(r"Plain: (\d+) tokens in ([\d.]+) s\. Speculative .*?: (\d+) tokens in ([\d.]+) s .*?([\d.]+)×")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="everyday,stories,code")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--ways", default="2,auto")
    ap.add_argument("--temperature", default="", help="the race's temperature (default: the page's, 0)")
    args = ap.parse_args()
    ways = tuple(args.ways.split(","))
    demo = build_demo(UIContext())
    url = serve_locally(demo)
    m = machine_info()
    print(f"CPU: {m['cpu']} ({m['cpu_id']}; {m['cpu_vector']}); threads: {cpus.fitted()}", flush=True)
    most = torch.get_num_threads()

    def use(way: str) -> None:
        compute.call(ab.thread_way, way, most)  # torch's count is per thread: set it where the models run

    rows = []
    try:
        with sync_playwright() as pw:
            browser = browser_launch(pw)  # not niced: it competes for the cores as a laptop's browser does
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url, wait_until="load", timeout=SLOW_MS)
            expect(page.locator("#sv-status")).to_contain_text("Ready", timeout=SLOW_MS)
            note = page.locator("#sv-message .sv-note")
            if args.temperature:
                box = page.locator(number_box(TEMPERATURE_LABEL)).first
                box.fill(args.temperature)
                box.press("Enter")

            def race(prompt: str) -> tuple[tuple, float]:
                page.get_by_label("Prompt", exact=True).fill(prompt)
                last = note.inner_text() if note.count() else ""
                before = cpus._NEIGHBOURS.sample()
                page.get_by_role("button", name="Run race").click()
                expect(note).not_to_have_text(last, timeout=SLOW_MS)  # this race's line, not the last one's
                expect(note).to_contain_text("Done.", timeout=SLOW_MS)
                found = DONE.search(note.inner_text())
                if found is None:
                    raise SystemExit(f"unexpected summary: {note.inner_text()!r}")
                page.wait_for_timeout(1500)  # the charts finish drawing; the next race starts on a settled page
                return found.groups(), cpus.others_between(before, cpus._NEIGHBOURS.sample())

            for way in ways:  # warm-up, untimed
                use(way)
                race("Say hello in three languages.")
            for name in args.sets.split(","):
                for i, prompt in enumerate(load_prompts(name, args.limit)):
                    for way in ways if i % 2 == 0 else ways[::-1]:
                        use(way)
                        (n_ar, s_ar, n_sp, s_sp, x), busy = race(prompt)
                        rows.append(dict(set=name, way=way, speedup=float(x), ar=int(n_ar) / float(s_ar),
                                         spec=int(n_sp) / float(s_sp), browser=busy))  # fmt: skip
                        print(f"{name} {i} {way}: {x}x, browser {busy:.2f} CPUs", flush=True)
            browser.close()
    finally:
        demo.close()
    for name in args.sets.split(","):
        parts = []
        for way in ways:
            r = [x for x in rows if x["set"] == name and x["way"] == way]
            parts.append(
                f"{way}: {statistics.median(x['speedup'] for x in r):.2f}x, tok/s plain / spec "
                f"{statistics.median(x['ar'] for x in r):.1f} / {statistics.median(x['spec'] for x in r):.1f}, "
                f"browser {statistics.mean(x['browser'] for x in r):.2f} CPUs"
            )
        print(f"{name} | " + " | ".join(parts))


if __name__ == "__main__":
    main()
