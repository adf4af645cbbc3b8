"""The README's picture: the app with the default pair racing, in Debian's chromium.

    .venv/bin/python scripts/screenshot.py assets/screenshot.png [--prompt TEXT] [--sweep] [--tab NAME]
        [--drafter lookup+model] [--policy auto] [--tree 4] [--lane3 lookup --policy3 auto] [--tab "Pair check" --check]
    .venv/bin/python scripts/screenshot.py tree.png --step 3 --tree 8 --width 1280 --height 720 [--present]
        (the Step-through tab after 3 rounds with token trees of 8 nodes, no race; the viewport only)

The default pair is the built-in one unless SPECVIZ_TARGET / SPECVIZ_DRAFT say otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from specviz.ui import build_demo, serve_locally  # noqa: E402
from specviz.ui.browser import launch as browser_launch  # noqa: E402
from specviz.ui.common import UIContext  # noqa: E402
from specviz.ui.inputs import TEMPERATURE_LABEL, number_box  # noqa: E402

SLOW_MS = 600_000  # real models on a small shared CPU


def _choose(page, label: str, value: str) -> None:
    """Pick `value` in the gradio dropdown labelled `label` (nothing when value is empty)."""
    if value:
        page.get_by_label(label, exact=True).click()
        page.get_by_role("option", name=value, exact=True).click()


def _step(page, args) -> None:
    """The Step-through tab after args.step rounds (with args.tree), scrolled to the round's tree or table."""
    if args.present:
        page.locator("#sv-present input[type=checkbox]").check()
    page.get_by_role("tab", name="Step through").click()
    if args.prompt:
        page.get_by_label("Prompt", exact=True).last.fill(args.prompt)
    _choose(page, "token tree: guesses per round (depth ≤ gamma)", args.tree)
    for i in range(args.step):
        page.get_by_role("button", name="Next round ▶").click()
        expect(page.get_by_text(f"Round {i + 1}.")).to_be_visible(timeout=SLOW_MS)
    target = page.locator(".sv-tree").first if args.tree not in ("", "off") else page.locator(".sv-draws").first
    target.scroll_into_view_if_needed()
    page.evaluate("window.scrollBy(0, -140)")  # the round's words above the tree stay in the picture
    page.wait_for_timeout(800)
    page.screenshot(path=args.out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="PNG file to write")
    ap.add_argument("--prompt", default="", help="default: the page's own first example")
    ap.add_argument("--sweep", action="store_true", help="run the gamma sweep before the race")
    ap.add_argument("--tab", default="", help="take the picture of this tab instead (after the race)")
    ap.add_argument("--check", action="store_true", help="with --tab 'Pair check': run the check of the default pair")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--drafter", default="", help="the speculative lane's drafter (model, lookup, lookup+model)")
    ap.add_argument("--temperature", default="", help="the race's temperature (default: the page's, 0)")
    ap.add_argument("--policy", default="", help="its gamma policy (constant, heuristic, confidence, auto)")
    ap.add_argument("--lane3", default="", help="add a third lane with this drafter")
    ap.add_argument("--policy3", default="", help="the third lane's gamma policy (default auto)")
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--step", type=int, default=0, help="instead of the race: this many rounds of the Step-through")
    ap.add_argument(
        "--tree", default="", help="the token tree (off, 4, 8, auto): the race's, or with --step the round's"
    )
    ap.add_argument("--present", action="store_true", help="presentation mode (large type, for projectors)")
    args = ap.parse_args()

    demo = build_demo(UIContext())
    url = serve_locally(demo)
    # the load times its choices (kernels.py, lean_panels.py): chromium starting beside it once cost a process its
    # fast path (Zen 4, 2 Dec 2026: plain 12.9 tokens/s, not 33.5), so the browser starts once it is done
    try:
        demo.preloader.wait(SLOW_MS / 1000)
        with sync_playwright() as pw:
            browser = browser_launch(pw, niced=True)  # its drawing would otherwise slow the models' calls
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            page.goto(url, wait_until="load", timeout=SLOW_MS)
            expect(page.locator("#sv-status")).to_contain_text("Ready", timeout=SLOW_MS)
            if args.step:
                _step(page, args)
                browser.close()
                print(f"wrote {args.out}")
                return
            # settings chosen below would each race ("Race when a setting changes"): only the button's race is wanted
            page.locator("#sv-auto input").uncheck()
            if args.prompt:
                page.get_by_label("Prompt", exact=True).fill(args.prompt)
            if args.temperature:
                box = page.locator(number_box(TEMPERATURE_LABEL)).first
                box.fill(args.temperature)
                box.press("Enter")
            for label, value in (
                ("guesses from (drafter)", args.drafter),
                ("gamma policy", args.policy),
                ("token tree (model drafters)", args.tree),
            ):
                _choose(page, label, value)
            if args.lane3:
                page.get_by_text("Race a third lane").click()
                _choose(page, "third lane: guesses from", args.lane3)
                _choose(page, "third lane: gamma policy", args.policy3)
            if args.sweep:
                page.get_by_role("button", name="Sweep gamma").click()
                page.wait_for_function("() => /Sweep done/.test(document.body.innerText)", timeout=SLOW_MS)
            page.get_by_role("button", name="Run race").click()
            expect(page.locator("#sv-message .sv-note")).to_contain_text("Done.", timeout=SLOW_MS)
            # a vLLM target that speculates: its own rounds arrive after the lanes (race_run, vllm_lane)
            page.wait_for_function("() => !/Asking the server/.test(document.body.innerText)", timeout=SLOW_MS)
            if args.tab:
                page.get_by_role("tab", name=args.tab).click()
                page.wait_for_timeout(1000)
            if args.check:
                page.get_by_role("button", name="Check pair").click()
                expect(page.locator(".sv-verdict")).to_be_visible(timeout=SLOW_MS)
                page.wait_for_timeout(2000)  # the chart draws after the verdict
            page.screenshot(path=args.out, full_page=True)
            browser.close()
    finally:
        demo.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
