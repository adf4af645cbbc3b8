"""The Learn tab's lessons: each runs end to end on the tiny pair, answers from its numbers, and explains them."""

import re

import pytest

from specviz.limits import Limits
from specviz.teach import lessons
from specviz.ui.common import UIContext
from specviz.ui.learn import check

TINY = lessons.Budget(tokens=10, reps=1, draws=200)


@pytest.mark.parametrize("ls", lessons.LESSONS, ids=lambda ls: ls.key)
def test_each_lesson_runs_end_to_end_and_explains_its_numbers(ls, loaded_pair):
    p, q = loaded_pair
    out = lessons.run(ls, p, q, TINY)
    assert 0 <= out.answer < len(ls.choices) and out.source["live"] is True
    assert re.search(r"\d", out.explanation) and out.explanation.endswith(".")
    right, wrong = lessons.feedback(ls, out.answer, out), lessons.feedback(ls, (out.answer + 1) % len(ls.choices), out)
    assert right.startswith("✓") and wrong.startswith("✗") and ls.choices[out.answer] in wrong


def test_six_lessons_each_one_entry():
    keys = [ls.key for ls in lessons.LESSONS]
    assert len(keys) == len(set(keys)) == 6 and lessons.lesson("lookup").title.startswith("6.")
    with pytest.raises(lessons.SpecvizError, match="no lesson"):
        lessons.lesson("prompt-lookup")


def test_the_page_asks_for_a_prediction_first_then_measures(tiny_pair):
    ctx = UIContext(limits=Limits(), device="cpu")
    ctx.default_target, ctx.default_draft = tiny_pair
    ls = lessons.LESSONS[4]
    assert "Pick a prediction first" in list(check(ctx, ls.key, None, TINY))[-1]
    pages = list(check(ctx, ls.key, ls.choices[0], TINY))
    assert "Running the experiment" in pages[0] and "Measured just now" in pages[-1]
    assert "sv-learn-right" in pages[-1] or "sv-learn-wrong" in pages[-1]


def test_without_models_the_shipped_run_is_shown_and_marked(tmp_path, monkeypatch):
    numbers = {"tokens": 30, "identical": True, "first_difference": None, "draws": 1000}
    numbers |= {"tv_p": 0.02, "tv_q": 0.3, "tv_noise": 0.02}
    monkeypatch.setattr(lessons, "LESSONS_FILE", tmp_path / "lessons.json")
    env = {"cpu": "<b>CPU</b>", "cpu_count": 2, "target": "t", "draft": "d", "recorded_at": "2026-01-01"}
    lessons.save_recorded([lessons.Outcome("same", numbers, 0, "")], env)
    ctx = UIContext(limits=Limits(), device="cpu")
    ctx.default_target = ctx.default_draft = str(tmp_path / "missing")
    page = list(check(ctx, "same", "yes, token for token", TINY))[-1]
    assert "recorded run on &lt;b&gt;CPU&lt;/b&gt;" in page and "could not be loaded" in page and "✓" in page
