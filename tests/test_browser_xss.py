"""Hostile text in a real browser (Debian's chromium): `<script>`, `<img onerror>` and `<svg onload>` typed as a
prompt or carried by a model folder's name must show as text and never run.

A payload that ran would open an alert (caught by the dialog handler) or leave an element in the page.
"""

from __future__ import annotations

import shutil

import pytest
from chromium import require_chromium
from conftest import served_app

require_chromium()

from playwright.sync_api import expect  # noqa: E402

from specviz.limits import Limits  # noqa: E402

pytestmark = pytest.mark.browser
TIMEOUT_MS = 90_000
PAYLOAD = '<script>alert(1)</script><img src=x onerror=alert(2)>"><svg onload=alert(3)>'
INJECTED = "script:not([src]), img[onerror], svg[onload], [onerror], [onload]"
BAD_FOLDER = "<img src=x onerror=alert(4)>"  # a folder inside the allowed one, holding no model
MODEL_FOLDER = "<svg onload=alert(5)>"  # a folder inside the allowed one, holding the tiny target


@pytest.fixture(scope="module")
def models(tiny_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("xss-models")
    (root / BAD_FOLDER).mkdir()
    shutil.copytree(tiny_pair[0], root / MODEL_FOLDER)
    shutil.copytree(tiny_pair[1], root / "draft")
    return root


@pytest.fixture(scope="module")
def app_url(tiny_pair, models):
    yield from served_app(tiny_pair, Limits(max_new_tokens=32, model_dirs=(str(models),)))


@pytest.fixture(scope="module")
def page(browser, app_url):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.goto(app_url, wait_until="load", timeout=TIMEOUT_MS)
    return page


def _clean(page) -> None:
    page.wait_for_timeout(300)  # an onerror/onload handler would have fired by now
    assert page.dialogs == [], f"a payload ran: {page.dialogs}"
    found = (
        page.locator(".gradio-container")
        .locator(INJECTED)
        .evaluate_all("els => els.map(e => e.outerHTML.slice(0, 80))")
    )
    assert found == [], f"injected elements in the page: {found}"


def test_script_img_and_svg_in_the_prompt_show_as_text(page):
    page.get_by_label("Prompt", exact=True).fill(PAYLOAD)
    page.get_by_role("button", name="Run race").click()
    for side in ("ar", "spec"):
        expect(page.locator(f'#sv-{side} .sv-pane[data-state="done"]')).to_be_visible(timeout=TIMEOUT_MS)
    assert page.locator(".sv-prompt-text").inner_text() == PAYLOAD
    _clean(page)


def test_model_folder_names_show_as_text_in_errors_and_reports(page, models):
    page.get_by_role("tab", name="Pair check").click()
    target = page.get_by_label("Target p: a Hugging Face id or a folder")
    draft = page.get_by_label("Draft q: a Hugging Face id or a folder")
    draft.fill(str(models / "draft"))
    target.fill(str(models / BAD_FOLDER))  # refused: the error sentence names the folder
    page.get_by_role("button", name="Check pair").click()
    expect(page.locator(".sv-error")).to_contain_text(BAD_FOLDER, timeout=TIMEOUT_MS)
    _clean(page)
    target.fill(str(models / MODEL_FOLDER))  # loads: the verdict names the folder
    page.get_by_role("button", name="Check pair").click()
    expect(page.locator(".sv-verdict")).to_contain_text(MODEL_FOLDER, timeout=TIMEOUT_MS)
    _clean(page)
