"""Recordings in a real browser (Debian's chromium): the exported page shows what the live page showed, offline;
the Replay tab plays a download back and keeps a hostile file as text; the page fits a phone and a projector;
keys and screen readers can drive and read it."""

from __future__ import annotations

import json
import re
from urllib.parse import urlparse

import pytest
from chromium import require_chromium
from conftest import served_app

require_chromium()

from playwright.sync_api import expect  # noqa: E402

from specviz.limits import Limits  # noqa: E402

pytestmark = pytest.mark.browser
PROMPT = "the cat sat on the mat"  # greedy with the tiny pair: accepted, rejected, resampled and bonus tokens
KINDS = ("tok-accepted", "tok-rejected", "tok-resampled", "tok-bonus")
TIMEOUT_MS = 90_000
XSS = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def app_url(tiny_pair):
    yield from served_app(tiny_pair, Limits(max_new_tokens=64))


def _page(browser, width=1400, height=1000):
    page = browser.new_page(viewport={"width": width, "height": height}, accept_downloads=True)
    page.outside, page.dialogs = [], []
    page.on("request", lambda r: _note_outside(page, r.url))
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    return page


def _note_outside(page, url: str) -> None:
    if url.startswith(("http:", "https:", "ws:", "wss:")) and urlparse(url).hostname not in ("127.0.0.1", "localhost"):
        page.outside.append(url)


@pytest.fixture(scope="module")
def raced(browser, app_url, tmp_path_factory):
    """A race run from the keyboard (key R), and its two downloads: (page, json path, html path)."""
    page = _page(browser)
    page.goto(app_url, wait_until="load", timeout=TIMEOUT_MS)
    expect(page.locator("#sv-status")).to_contain_text("Ready", timeout=TIMEOUT_MS)
    page.get_by_label("Prompt", exact=True).fill(PROMPT)
    page.locator("body").click(position={"x": 5, "y": 5})  # out of the text box: keys act on the page
    page.keyboard.press("r")
    expect(page.locator("#sv-message .sv-note")).to_contain_text("Done.", timeout=TIMEOUT_MS)
    folder = tmp_path_factory.mktemp("downloads")
    paths = []
    for cls in ("sv-dl-json", "sv-dl-html"):
        button = page.locator(f".{cls}").first
        expect(button).to_be_visible(timeout=TIMEOUT_MS)
        with page.expect_download() as dl:
            button.click()
        paths.append(folder / dl.value.suggested_filename)
        dl.value.save_as(paths[-1])
    yield page, *paths
    page.close()


def _tokens(scope, cls: str) -> list[tuple[str, str | None]]:
    loc = scope.locator(f".{cls}")
    return [(loc.nth(i).inner_text(), loc.nth(i).get_attribute("title")) for i in range(loc.count())]


def test_the_exported_page_shows_the_same_tokens_colours_and_numbers_offline(browser, raced):
    live, _, html_path = raced
    assert html_path.suffix == ".html"
    page = _page(browser)
    page.route(re.compile(r"^(https?|wss?):"), lambda route: route.abort())  # offline: nothing may be fetched
    page.goto(html_path.as_uri(), wait_until="load")
    spec, ar = page.locator(".sv-pane-spec"), page.locator(".sv-pane-ar")
    for cls in KINDS:
        assert _tokens(spec, cls) == _tokens(live.locator("#sv-spec"), cls) != [], cls
        colour = "e => getComputedStyle(e).backgroundColor + getComputedStyle(e).textDecorationLine"
        assert spec.locator(f".{cls}").first.evaluate(colour) == live.locator(f"#sv-spec .{cls}").first.evaluate(colour)
    assert _tokens(ar, "tok-ar") == _tokens(live.locator("#sv-ar"), "tok-ar")
    assert page.locator("#sv-lane-spec .sv-stats").inner_text() == live.locator("#sv-spec-stats").inner_text()
    assert page.locator("#sv-lane-ar .sv-stats").inner_text() == live.locator("#sv-ar-stats").inner_text()
    # plotly ran from the inlined script: the race's four charts and the history of the settings tried, which a
    # page's race recording carries (the race above added its points)
    expect(page.locator(".js-plotly-plot")).to_have_count(5)
    assert page.locator(".js-plotly-plot .main-svg").count() >= 5
    history = page.locator(".js-plotly-plot").nth(4).inner_text()
    assert "gamma" in history and "temperature" in history  # the history's two x axes
    assert PROMPT in page.locator(".sv-settings").inner_text() and "recorded on" in page.inner_text("body")
    assert page.outside == [] and page.dialogs == []
    page.close()


def test_tokens_are_named_with_their_state_for_screen_readers(raced):
    live = raced[0]
    accepted = live.locator("#sv-spec").get_by_role("img", name=re.compile(r"^accepted: "))
    rejected = live.locator("#sv-spec").get_by_role("img", name=re.compile(r"^rejected, not in the text: "))
    assert accepted.count() == live.locator("#sv-spec .tok-accepted").count() > 0 and rejected.count() > 0


def _tab(page, name: str) -> None:
    """Open a tab; on a narrow screen gradio moves the last tabs into its "More tabs" menu."""
    page.get_by_role("tab").first.wait_for(timeout=TIMEOUT_MS)
    page.wait_for_timeout(200)  # gradio measures the tab bar once it is drawn
    tab = page.get_by_role("tab", name=name, exact=True)
    if tab.count() and tab.is_visible():
        tab.click()
    else:
        page.get_by_role("button", name="More tabs").click()
        page.locator(".overflow-dropdown button", has_text=name).click()


def _open_replay(page, app_url, path) -> None:
    page.goto(app_url, wait_until="load", timeout=TIMEOUT_MS)
    _tab(page, "Replay")
    page.locator("#sv-replay-upload input[type=file]").set_input_files(str(path))


def test_the_replay_tab_plays_a_download_back_round_by_round(browser, app_url, raced):
    live, json_path, _ = raced
    page = _page(browser)
    _open_replay(page, app_url, json_path)
    expect(page.locator("#sv-replay-banner")).to_contain_text("Replay of a recording", timeout=TIMEOUT_MS)
    expect(page.locator("#sv-replay-banner")).to_contain_text("recorded on")
    page.get_by_role("button", name="Next round ▶|").click()
    expect(page.locator("#sv-replay-note")).to_contain_text("1 of", timeout=TIMEOUT_MS)
    page.get_by_label("all at once").check()
    page.get_by_role("button", name="Play ▶").click()
    expect(page.locator("#sv-replay-note")).to_contain_text("Replay finished", timeout=TIMEOUT_MS)
    lanes = page.locator("#sv-replay-lanes")
    for cls in KINDS:
        assert _tokens(lanes.locator(".sv-pane-spec"), cls) == _tokens(live.locator("#sv-spec"), cls)
    assert page.outside == []
    page.close()


def test_a_hostile_or_broken_recording_stays_text_or_gets_one_sentence(browser, app_url, raced, tmp_path):
    data = json.loads(raced[1].read_text())
    data["tokens"] = {k: XSS for k in data["tokens"]}
    data["settings"]["prompt"] = "<script>alert(1)</script>"
    data["env"]["target"] = XSS
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps(data))
    page = _page(browser)
    _open_replay(page, app_url, hostile)
    expect(page.locator("#sv-replay-banner")).to_contain_text(XSS, timeout=TIMEOUT_MS)
    page.get_by_label("all at once").check()
    page.get_by_role("button", name="Play ▶").click()
    expect(page.locator("#sv-replay-note")).to_contain_text("Replay finished", timeout=TIMEOUT_MS)
    assert XSS in page.locator("#sv-replay-lanes .sv-pane-spec").inner_text()
    assert page.locator("#sv-replay-lanes img, #sv-replay-banner img, .sv-settings script").count() == 0
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**data, "lanes": {"spec": [{"type": "Start"}]}}))
    page.close()
    page = _page(browser)
    _open_replay(page, app_url, broken)
    expect(page.locator("#sv-replay-note .sv-error")).to_contain_text(
        "not a valid specviz recording", timeout=TIMEOUT_MS
    )
    page.wait_for_timeout(300)
    assert page.dialogs == []
    page.close()


@pytest.mark.parametrize("width,height", [(390, 844), (1280, 720)])
def test_no_horizontal_scroll_on_a_phone_or_a_projector(browser, app_url, width, height):
    page = _page(browser, width, height)
    page.goto(app_url + ("?present=1" if width == 1280 else ""), wait_until="load", timeout=TIMEOUT_MS)
    expect(page.locator("#sv-status")).to_be_visible(timeout=TIMEOUT_MS)
    if width == 1280:
        expect(page.locator("body.sv-present")).to_have_count(1, timeout=TIMEOUT_MS)
    for tab in ("Race", "Step through", "Learn", "Replay"):
        _tab(page, tab)
        page.wait_for_timeout(400)
        wide = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert wide <= 0, f"{tab} at {width} px scrolls sideways by {wide} px"
    page.close()
