"""The Learn tab: short guided experiments in predict-then-check form (specviz.teach.lessons).

The page asks a question; the student picks an answer; the app runs the experiment on the loaded pair (or shows
the run shipped in assets/recordings/lessons.json when no model can be loaded, marked as such), then shows the
measured answer and explains it with the numbers from the run.
"""

from __future__ import annotations

import html

import gradio as gr

from specviz.config import SpecvizError
from specviz.host import compute
from specviz.teach import lessons
from specviz.ui.common import UIContext, error_html, gpu, message

PAGE_BUDGET = lessons.Budget()
INTRO = (
    "Five short experiments. For each: **read the question, pick your prediction, then press Check**. The app runs "
    "the experiment on the models loaded here and tells you what it measured, and why."
)


def _question(ls: lessons.Lesson) -> str:
    return f"### {ls.title}\n{ls.question}"


def _source(outcome: lessons.Outcome) -> str:
    s = outcome.source
    where = s.get("gpu") or f"{s.get('cpu') or 'this machine'}, {s.get('cpu_count') or '?'} cores"
    models = f"target {s.get('target', '?')}, draft {s.get('draft', '?')}"
    if s.get("live"):
        return f"Measured just now on {where} ({models})."
    return (
        f"No model could be loaded here, so these numbers come from a recorded run on {where} ({models}) on "
        f"{s.get('recorded_at', 'an unknown date')}."
    )


def result_html(ls: lessons.Lesson, picked: int, outcome: lessons.Outcome, note: str = "") -> str:
    ok = picked == outcome.answer
    cls = "sv-learn-right" if ok else "sv-learn-wrong"
    parts = [
        f'<p class="sv-learn-verdict {cls}" role="status"><b>{html.escape(lessons.feedback(ls, picked, outcome))}</b></p>',
        f"<p>{html.escape(outcome.explanation)}</p>",
        f'<p class="sv-learn-source">{html.escape(_source(outcome))}</p>',
    ]
    if note:
        parts.insert(0, f'<p class="sv-learn-source">{html.escape(note)}</p>')
    return f'<div class="sv-learn-result sv-say">{"".join(parts)}</div>'


def check(ctx: UIContext, key: str, answer, budget: lessons.Budget = PAGE_BUDGET):
    """Yield the page's result while the experiment runs, then the measured answer explained."""
    try:
        ls = lessons.lesson(key)
        if answer not in ls.choices:
            raise SpecvizError("Pick a prediction first: guessing before looking is the point.")
        picked = ls.choices.index(answer)
        yield '<div class="sv-note" role="status">Running the experiment on the loaded models…</div>'
        try:
            p, q = ctx.pair()
        except Exception as err:  # no model here: the shipped run, clearly marked
            outcome = lessons.recorded(ls)
            if outcome is None:
                raise
            yield result_html(ls, picked, outcome, f"The models could not be loaded: {message(err)}")
            return
        yield result_html(ls, picked, compute.call(lessons.run, ls, p, q, budget))  # on the compute thread
    except Exception as err:
        yield error_html(err)


def build_learn_tab(ctx: UIContext) -> None:
    """The components and handlers of the Learn tab (called inside `with gr.Tab("Learn")`)."""
    gr.Markdown(INTRO)
    titles = [(ls.title, ls.key) for ls in lessons.LESSONS]
    first = lessons.LESSONS[0]
    pick_lesson = gr.Radio(titles, value=first.key, label="Experiment", elem_classes=["sv-learn-pick"])
    question = gr.Markdown(_question(first), elem_classes=["sv-learn-question"])
    answer = gr.Radio(list(first.choices), value=None, label="Your prediction", elem_classes=["sv-learn-choices"])
    go = gr.Button("Check my prediction ▶", variant="primary", elem_classes=["sv-key-run"])
    result = gr.HTML(elem_id="sv-learn-result", js_on_load=None)

    def on_pick(key):
        ls = lessons.lesson(key)
        return _question(ls), gr.Radio(list(ls.choices), value=None), ""

    @gpu
    def on_check(key, picked):
        yield from check(ctx, key, picked)

    pick_lesson.change(on_pick, pick_lesson, [question, answer, result], api_visibility="private", queue=False)
    go.click(on_check, [pick_lesson, answer], result, api_name="lesson", concurrency_id="models")
