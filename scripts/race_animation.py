"""Make the README's moving picture: a shipped race recording replayed frame by frame in chromium, assembled into
an animated GIF with Pillow. No model runs: the frames are the Replay tab's own HTML (recording.export's lane
views) at regular steps of the recording's clocks, so the two lanes advance as fast as they did where it was made.

    .venv/bin/python scripts/race_animation.py assets/race.gif
    .venv/bin/python scripts/race_animation.py out.gif --recording assets/recordings/race-gravity-greedy-cpu.json

Needs Debian's chromium (`scripts/setup.sh --dev` installs it) and playwright (in requirements-dev.txt).
"""

from __future__ import annotations

import argparse
import html
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout: the specviz beside this script

from PIL import Image  # noqa: E402

from specviz.config import ASSETS  # noqa: E402
from specviz.recording import export, record  # noqa: E402

EXTRA_CSS = "body { margin: 12px; width: 860px; } .sv-lanes { gap: 12px; }"


def frame_pages(rec: record.Recording, step_s: float) -> list[str]:
    """The page at every `step_s` of the recording's clock, then once with every event in."""
    css = (ASSETS / "style.css").read_text(encoding="utf-8") + export.PAGE_CSS + EXTRA_CSS
    title = html.escape(f"“{rec.settings.get('prompt', '')}” · {rec.settings.get('drafter', '')}, gamma "
                        f"{rec.settings.get('gamma', '')} · recorded on {rec.recorded_on}")  # fmt: skip
    views, pages, shown_at = export.lane_views(rec), [], 0.0

    def page() -> str:
        return (
            f'<html><head><meta charset="utf-8"><style>{css}</style></head><body>'
            f'<div class="sv-note">{title}</div>{export.lanes_html(rec, views)}</body></html>'
        )

    for t, lane, ev in record.timeline(rec):
        while t > shown_at + step_s:
            shown_at += step_s
            pages.append(page())
        views[lane].add(ev)
    pages.append(page())
    return pages


def shoot(pages: list[str], width: int) -> list[Image.Image]:
    from playwright.sync_api import sync_playwright

    from specviz.ui.browser import launch

    shots = []
    with sync_playwright() as pw:
        browser = launch(pw, niced=True)
        tab = browser.new_page(viewport={"width": width, "height": 600})
        for p in pages:
            tab.set_content(p)
            shots.append(Image.open(io.BytesIO(tab.screenshot(full_page=True))).convert("RGB"))
        browser.close()
    return shots


def assemble(shots: list[Image.Image], out: Path, step_s: float, hold_s: float, colours: int) -> None:
    """One GIF: every frame on the last one's canvas (white below a shorter one), one shared palette."""
    w = max(s.width for s in shots)
    h = max(s.height for s in shots)
    canvas = []
    for s in shots:
        c = Image.new("RGB", (w, h), "white")
        c.paste(s, (0, 0))
        canvas.append(c)
    palette = canvas[-1].quantize(colors=colours, method=Image.Quantize.MEDIANCUT)
    frames = [c.quantize(palette=palette, dither=Image.Dither.NONE) for c in canvas]
    durations = [round(step_s * 1000)] * (len(frames) - 1) + [round(hold_s * 1000)]
    frames[0].save(out, save_all=True, append_images=frames[1:], duration=durations, loop=0, optimize=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the GIF to write")
    ap.add_argument("--recording", default=str(ASSETS / "recordings" / "race-gravity-greedy-cpu.json"))
    ap.add_argument("--step", type=float, default=0.1, help="seconds of the recording's clock between frames")
    ap.add_argument("--hold", type=float, default=3.0, help="seconds the finished race stays before the loop")
    ap.add_argument("--width", type=int, default=884)
    ap.add_argument("--colours", type=int, default=64)
    a = ap.parse_args(argv)
    rec = record.load(a.recording)
    if rec.kind != "race":
        raise SystemExit(f"{a.recording} is a {rec.kind} recording, not a race.")
    shots = shoot(frame_pages(rec, a.step), a.width)
    assemble(shots, Path(a.out), a.step, a.hold, a.colours)
    print(f"wrote {a.out}: {len(shots)} frames, {Path(a.out).stat().st_size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
