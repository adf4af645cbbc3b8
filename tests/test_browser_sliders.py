"""The Race tab's sliders in chromium: letting go of one races with no click on Run race, and each race adds a point
per lane to the history chart at the setting it ran with. Tiny pair, 127.0.0.1 only."""

from __future__ import annotations

import threading
import time

import pytest
from chromium import require_chromium
from conftest import served_app

require_chromium()

from playwright.sync_api import expect  # noqa: E402

from specviz.backends.local import CachedModel  # noqa: E402
from specviz.limits import Limits  # noqa: E402
from specviz.ui.inputs import TEMPERATURE_LABEL, number_box  # noqa: E402

pytestmark = pytest.mark.browser
TIMEOUT_MS = 90_000
# the history chart's points on its "by temperature" acceptance panel (xaxis x3), one list of x per drafter
POINTS_JS = """() => {
  const el = document.querySelector('#sv-plot-history .js-plotly-plot');
  if (!el || !el.data) return [];
  return el.data.filter(t => t.mode === 'markers' && t.xaxis === 'x3' && !(t.marker && t.marker.symbol === 'circle-open'))
    .map(t => Array.from(t.x));
}"""


@pytest.fixture(scope="module")
def app_url(tiny_pair):
    yield from served_app(tiny_pair, Limits(max_new_tokens=64))


@pytest.fixture
def page(browser, app_url):
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(app_url, wait_until="load", timeout=TIMEOUT_MS)
    expect(page.locator("#sv-status")).to_contain_text("Ready", timeout=TIMEOUT_MS)
    yield page
    page.close()


def release_temperature(page, value: str) -> None:
    """Type a temperature into the slider's box and leave it: gradio sends the slider's release."""
    box = page.locator(number_box(TEMPERATURE_LABEL))
    box.fill(value)
    box.blur()


def history_x(page) -> list[list[float]]:
    return page.evaluate(POINTS_JS)


def wait_points(page, n: int) -> list[list[float]]:
    page.wait_for_function(f"() => ({POINTS_JS})().some(xs => xs.length >= {n})", timeout=TIMEOUT_MS)
    return history_x(page)


def test_releasing_the_temperature_slider_races_and_three_moves_leave_three_points(page):
    page.get_by_label("Prompt", exact=True).fill("the cat sat on the mat")
    expect(page.locator("#sv-plot-history")).to_contain_text("Each race you run")  # a sentence, not empty axes
    release_temperature(page, "1")
    xs = wait_points(page, 1)  # no click on Run race
    assert xs == [[1.0]]
    for side in ("ar", "spec"):
        expect(page.locator(f'#sv-{side} .sv-pane[data-state="done"]')).to_be_visible(timeout=TIMEOUT_MS)
    # the lanes ran at temperature 1: each kept guess was kept by the draw r against min(1, p/q), not by argmax
    title = page.locator("#sv-spec .tok-accepted").first.get_attribute("title") or ""
    assert "greedy" not in title
    release_temperature(page, "0.5")
    wait_points(page, 2)
    release_temperature(page, "0")
    xs = wait_points(page, 3)
    assert xs == [[1.0, 0.5, 0.0]]  # one lane (one drafter): its three races at the temperatures they ran with
    title = page.locator("#sv-spec .tok-accepted").first.get_attribute("title") or ""
    assert "greedy" in title
    page.locator("#sv-history-clear").click()
    expect(page.locator("#sv-plot-history")).to_contain_text("Each race you run", timeout=TIMEOUT_MS)


def test_with_the_box_unticked_a_release_does_not_race(page):
    page.get_by_label("Race when a setting changes").uncheck()
    release_temperature(page, "0.7")
    page.wait_for_timeout(3000)
    assert history_x(page) == []
    expect(page.locator("#sv-spec .sv-pane")).not_to_have_attribute("data-state", "done")
    page.get_by_label("Race when a setting changes").check()
    release_temperature(page, "0.3")
    assert wait_points(page, 1) == [[0.3]]


class Slow:
    """Every forward call of the models sleeps `delay` seconds (a race then lasts seconds) and is counted."""

    def __init__(self):
        self.delay, self.calls, self.lock = 0.0, 0, threading.Lock()

    def wrap(self, feed):
        def slowed(runner, ids, last_only=False):
            with self.lock:
                self.calls += 1
            if self.delay:
                time.sleep(self.delay)
            return feed(runner, ids, last_only)

        return slowed


@pytest.fixture
def slow():
    mp, s = pytest.MonkeyPatch(), Slow()
    mp.setattr(CachedModel, "feed", s.wrap(CachedModel.feed))
    yield s
    mp.undo()


def test_a_release_cancels_the_running_race_and_quick_moves_collapse_into_the_last(page, slow):
    """A race slowed to last seconds: a second release cancels it (it adds no point); then thirty quick releases
    leave one race, at the last value, and then nothing computes."""
    page.get_by_label("Prompt", exact=True).fill("the cat sat on the mat")
    slow.delay = 0.03
    release_temperature(page, "1")
    expect(page.locator("#sv-spec .sv-round").first).to_be_visible(timeout=TIMEOUT_MS)  # running
    release_temperature(page, "0.5")
    assert wait_points(page, 1) == [[0.5]]  # the race at 1 was cancelled before it finished: no point
    for i in range(30):
        release_temperature(page, f"{0.05 * (i + 1):.2f}")
        page.wait_for_timeout(30)
    xs = wait_points(page, 2)
    page.wait_for_timeout(1500)
    assert xs == history_x(page) == [[0.5, 1.5]]
    settled = slow.calls
    page.wait_for_timeout(1500)
    assert slow.calls == settled, "a race kept computing after the last one finished"
