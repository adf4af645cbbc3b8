"""The page in a real browser (Debian's chromium through playwright): the race runs, the colours and plots
are there, a hostile prompt stays text, and nothing is fetched from outside (the page works offline).

The README's picture of the real pair is made by scripts/screenshot.py.
"""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from chromium import require_chromium
from conftest import served_app

require_chromium()

from playwright.sync_api import expect  # noqa: E402

from specviz.limits import Limits  # noqa: E402
from specviz.ui.inputs import number_box  # noqa: E402

pytestmark = pytest.mark.browser
PROMPT = "the cat sat on the mat"  # greedy with the tiny pair: accepted, rejected, resampled and bonus tokens
XSS = "<img src=x onerror=alert(1)>"
TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def app_url(tiny_pair):
    yield from served_app(tiny_pair, Limits(max_new_tokens=64))


@pytest.fixture
def page(browser, app_url):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.outside = []  # requests that leave 127.0.0.1: the page must render without a CDN
    page.dialogs = []
    page.on("request", lambda r: _note_outside(page, r.url))
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.goto(app_url, wait_until="load", timeout=TIMEOUT_MS)
    yield page
    page.close()


def _note_outside(page, url: str) -> None:
    host = urlparse(url).hostname
    if url.startswith(("http:", "https:", "ws:", "wss:")) and host not in ("127.0.0.1", "localhost"):
        page.outside.append(url)


def _run(page, prompt: str, timeout: int = TIMEOUT_MS) -> None:
    box = page.get_by_label("Prompt", exact=True)
    box.fill(prompt)
    page.get_by_role("button", name="Run race").click()
    for side in ("ar", "spec"):
        expect(page.locator(f'#sv-{side} .sv-pane[data-state="done"]')).to_be_visible(timeout=timeout)
    expect(page.locator("#sv-message .sv-note")).to_contain_text("Done.", timeout=timeout)


def test_race_in_the_browser(page, tmp_path):
    expect(page.locator("#sv-status")).to_contain_text("Ready", timeout=TIMEOUT_MS)
    _run(page, PROMPT)
    spec, ar = page.locator("#sv-spec"), page.locator("#sv-ar")
    for cls in ("tok-accepted", "tok-rejected", "tok-resampled", "tok-bonus"):
        assert spec.locator(f".{cls}").count() > 0, cls
    assert ar.locator(".tok-ar").count() > 0 and spec.locator(".tok-ar").count() == 0
    assert spec.locator(".sv-round").count() > 1
    title = spec.locator(".tok-accepted").first.get_attribute("title")
    assert "greedy: accepted because it equals the target's top token" in title
    # the rejected token is drawn struck through, not only in another colour
    deco = spec.locator(".tok-rejected").first.evaluate("e => getComputedStyle(e).textDecorationLine")
    assert "line-through" in deco
    for plot in ("race", "accept", "hist", "share"):
        expect(page.locator(f"#sv-plot-{plot} .js-plotly-plot")).to_be_visible(timeout=TIMEOUT_MS)
    assert page.locator("#sv-plot-race .scatterlayer .trace").count() == 2
    assert "speedup" in page.locator("#sv-spec-stats").inner_text()
    shot = tmp_path / "screenshot.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert page.outside == [], f"the page fetched from outside: {page.outside[:3]}"


def test_hostile_prompt_shows_as_text(page):
    _run(page, XSS)
    assert page.locator(".sv-prompt-text").inner_text() == XSS
    assert page.locator("#sv-spec img, #sv-ar img, .sv-prompt img").count() == 0
    page.wait_for_timeout(300)
    assert page.dialogs == []


def test_three_lane_race_in_the_browser(page):
    expect(page.locator("#sv-status")).to_contain_text("Ready", timeout=TIMEOUT_MS)
    page.get_by_text("Race a third lane").click()
    page.get_by_label("third lane: guesses from", exact=True).click()
    page.get_by_role("option", name="lookup", exact=True).click()
    expect(page.locator("#sv-spec2")).to_be_visible(timeout=TIMEOUT_MS)
    _run(page, "hello world")  # the tiny target then repeats itself: prompt lookup has matches to propose
    expect(page.locator('#sv-spec2 .sv-pane[data-state="done"]')).to_be_visible(timeout=TIMEOUT_MS)
    assert page.locator("#sv-spec2 .src-lookup").count() > 0  # lookup's guesses carry their mark
    mark = page.locator("#sv-spec2 .src-lookup").first.evaluate("e => getComputedStyle(e, '::before').content")
    assert "⧉" in mark
    assert page.locator("#sv-plot-race .scatterlayer .trace").count() == 3  # one line per lane
    for plot in ("position", "timeline"):
        expect(page.locator(f"#sv-plot-{plot} .js-plotly-plot")).to_be_visible(timeout=TIMEOUT_MS)
    assert "speedup" in page.locator("#sv-spec2-stats").inner_text()


def _step_number(page, label: str, value: str) -> None:
    box = page.locator(number_box(label)).last
    box.fill(value)
    box.press("Enter")


@pytest.mark.parametrize("present", [False, True])
def test_the_step_throughs_token_tree_in_the_browser(browser, app_url, present):
    """At 1280x720 (and in presentation mode): the tree drawn whole in the window's width, turned-down guesses
    struck through, the accepted path's edges green, and a node's p, q, min(1, p/q) and r in a large card on hover."""
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    try:
        page.goto(app_url + ("?present=1" if present else ""), wait_until="load", timeout=TIMEOUT_MS)
        expect(page.locator("#sv-status")).to_contain_text("Ready", timeout=TIMEOUT_MS)
        page.get_by_role("tab", name="Step through").click()
        page.get_by_label("Prompt", exact=True).last.fill(PROMPT)
        _step_number(page, "temperature (0 = greedy)", "1")
        page.get_by_label("token tree: guesses per round (depth ≤ gamma)", exact=True).click()
        page.get_by_role("option", name="8", exact=True).click()
        for i in range(12):  # until a round turned a guess down (the tiny draft is often wrong)
            page.get_by_role("button", name="Next round ▶").click()
            expect(page.get_by_text(f"Round {i + 1}.")).to_be_visible(timeout=TIMEOUT_MS)
            if page.locator(".sv-tree .sv-t-rejected").count():
                break
        rejected = page.locator(".sv-tree .sv-t-rejected").first
        assert rejected.evaluate("e => getComputedStyle(e).textDecorationLine") == "line-through"
        assert page.locator(".sv-tree .sv-t-fix, .sv-tree .sv-t-bonus").count() == 1  # where the walk stopped
        edge = page.locator(".sv-tree li.sv-t-on").first.evaluate("e => getComputedStyle(e, '::before').borderTopColor")
        assert edge == "rgb(0, 158, 115)"  # the accepted path's green
        tree = page.locator(".sv-tree").first
        tree.scroll_into_view_if_needed()
        box = tree.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 1280
        size = page.locator(".sv-tree .sv-tn").first.evaluate("e => parseFloat(getComputedStyle(e).fontSize)")
        assert size >= (21 if present else 18)  # readable from the back of a room
        rejected.hover()
        card = page.locator("#sv-tipcard")
        expect(card).to_be_visible()
        text = card.inner_text()
        assert "p(x) = " in text and "q(x) = " in text and "min(1, p/q) = " in text and "→ turned down" in text
        assert rejected.get_attribute("title") is None  # the browser's own small tooltip does not show on top
        c = card.bounding_box()
        assert c["x"] >= 0 and c["x"] + c["width"] <= 1280 and c["y"] >= 0 and c["y"] + c["height"] <= 720
        assert float(card.evaluate("e => parseFloat(getComputedStyle(e).fontSize)")) >= (23 if present else 18)
        page.mouse.move(2, 2)
        expect(card).to_be_hidden()
    finally:
        page.close()
