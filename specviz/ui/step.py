"""The "Step through" tab: speculative decoding one draft/verify round at a time, for teaching.

Each visitor's run is a `teach.Stepper` (the engine's generator and KV caches), kept between clicks in a
`SessionStore` bounded by count, bytes and idle time (the gr.State holds only its key), so "Next round" costs
one round and a class opening the tab at once cannot exhaust memory. Beside it: the exactness panel (the output
follows p, not q) and a measured chart of the target's forward time for 1..gamma+1 tokens. Names as in the
papers: p target, q draft, gamma block size, n accepted count, r the uniform draw. All model and visitor text
is escaped.
"""

from __future__ import annotations

import logging
import threading

import gradio as gr

from specviz.api import encode_prompt
from specviz.config import DEFAULT_GAMMA, TEMPERATURE_MAX, TREE_AUTO_MAX, SamplingConfig, SpecvizError
from specviz.host import compute
from specviz.request import RunRequest
from specviz.teach.compute import (
    Stepper,
    StepSettings,
    forward_times,
    greedy_check,
    label,
    sample_check,
    timing_sentence,
)
from specviz.teach.plots import candidates_figure, exactness_figure, forward_time_figure
from specviz.ui.common import UIContext, error_html, gpu
from specviz.ui.keep import download_buttons, downloads, step_recording
from specviz.ui.sessions import SessionStore
from specviz.ui.step_html import (
    CSS,
    EXACT_HELP,
    EXPLAIN,
    START,
    TIME_HELP,
    TIP_JS,
    draws_html,
    greedy_html,
    sample_html,
    say_html,
    text_html,
    timing_html,
)
from specviz.view.render import Pieces

log = logging.getLogger("specviz")
LOSSY_LABEL = "w: verify against w·p + (1 − w)·q (1 = exact; lower keeps more guesses and drifts from p)"
LOSSY_NOTE = (
    "Relaxed verification (not exact), w = {w:.2f}: guesses are checked against a mix of p and q, so more are "
    "kept and the text no longer follows the target."
)
LOSSY_GREEDY = (
    "Relaxed verification changes nothing at temperature 0: a guess is kept only if it is the target's top choice."
)
STEP_TOKENS = 64  # the answer length in this view: enough to see a sentence form, short enough for a class
GREEDY_CHECK_TOKENS = 48


def _fail(err: Exception) -> str:
    """One sentence for the page; an unexpected error also goes to the server log with its traceback."""
    if not isinstance(err, SpecvizError):
        log.exception("step-through handler failed")
    return error_html(err)


def _html(**kw) -> gr.HTML:
    return gr.HTML(css_template=CSS, js_on_load=None, **kw)


TREES = ("off", "4", "8", "auto")  # the step-through's tree choices (a projector fits up to 8 nodes well)


def _settings(ctx: UIContext, prompt, gamma, temperature, seed, lossy=False, w=1.0, tree="off") -> StepSettings:
    if not isinstance(prompt, str) or not prompt.strip():
        raise SpecvizError("The prompt is empty; type something for the model to continue.")
    w = w if lossy is True else 1.0  # the lossy switch counts only when it is on
    if tree not in TREES and tree not in (None, ""):
        raise SpecvizError(f"tree must be one of {', '.join(TREES)}, not {tree!r}.")
    tokens = min(STEP_TOKENS, ctx.limits.max_new_tokens)
    cfg = RunRequest(
        drafter="model",
        gamma=gamma,
        tree=tree or "off",
        max_new_tokens=tokens,
        seed=seed,
        relaxed_w=1.0 if w is None else w,
        allow_lossy=True,
        temperature=temperature,
    ).spec
    ctx.limits.check_run(cfg.max_new_tokens, cfg.gamma)
    return StepSettings(
        prompt, cfg.gamma, cfg.sampling.temperature, cfg.seed, cfg.max_new_tokens, cfg.relaxed_w, cfg.tree
    )


def _prompt_ids(ctx: UIContext, p, prompt: str) -> list[int]:
    ids = encode_prompt(p, prompt)
    ctx.limits.check_prompt_tokens(len(ids))
    return ids


class Session:
    """One visitor's run; a lock so a double click cannot resume the engine's generator twice at once."""

    def __init__(self, stepper: Stepper, pieces: Pieces):
        self.stepper, self.pieces, self.lock = stepper, pieces, threading.Lock()
        self.closed = False

    def name(self, token_id: int) -> str:
        """A token as visible text: spaces as ␣, newlines as ⏎."""
        return label(self.pieces.text(token_id))

    @property
    def busy(self) -> bool:
        return self.lock.locked()

    def close(self) -> None:
        """Free the KV caches (the store calls this when the session is freed)."""
        with self.lock:
            self.closed = True
            compute.call(self.stepper.close)


def session_bytes(p, q, n_prompt: int, settings: StepSettings) -> int:
    """The most KV-cache memory one run holds: both models' caches at the run's full length."""
    nodes = settings.gamma if settings.tree == "off" else TREE_AUTO_MAX if settings.tree == "auto" else settings.tree
    tokens = n_prompt + settings.max_new_tokens + max(nodes, settings.gamma) + 1
    return p.kv_bytes(tokens) + q.kv_bytes(tokens)


def _seconds(s: int) -> str:
    return f"{s // 60} minute{'s' if s >= 120 else ''}" if s % 60 == 0 else f"{s} seconds"


def sessions(ctx: UIContext) -> SessionStore:
    lim = ctx.limits
    return SessionStore(lim.session_idle_s, lim.max_sessions, lim.session_memory_mb * 2**20)


def build_step_tab(ctx: UIContext) -> None:
    gr.Markdown("## Speculative decoding, one round at a time")
    with gr.Row(elem_id="sv-step-row"):  # in presentation mode the explanation goes below (assets/style.css)
        with gr.Column(scale=3):
            with gr.Row():
                prompt = gr.Textbox("Tell me about gravity.", label="Prompt", lines=1, scale=3)
                gamma = gr.Slider(
                    1, min(8, ctx.limits.max_gamma), value=DEFAULT_GAMMA, step=1, label="gamma: guesses per round"
                )
            with gr.Row():
                temperature = gr.Slider(0, TEMPERATURE_MAX, value=0.0, step=0.1, label="temperature (0 = greedy)")
                seed = gr.Number(0, label="seed", precision=0)
            with gr.Row(elem_classes=["sv-lossy-row"]):
                tree = gr.Dropdown(
                    list(TREES), value="off", label="token tree: guesses per round (depth ≤ gamma)", scale=1
                )
                lossy = gr.Checkbox(False, label="relaxed verification (not exact)", scale=1)
                w = gr.Slider(0, 1, value=1.0, step=0.05, label=LOSSY_LABEL, visible=False, scale=2)
            with gr.Row():
                nxt = gr.Button("Next round ▶", variant="primary", size="lg", scale=3, elem_classes=["sv-key-next"])
                reset = gr.Button("Reset", size="lg", scale=1)
            say = _html(value=START)
            text = _html()
            draws = gr.HTML(css_template=CSS, js_on_load=TIP_JS)  # a tree node's numbers on hover
            cands = gr.Plot(show_label=False, visible=False)
        with gr.Column(scale=2, min_width=320):
            _html(value=EXPLAIN)
    store = sessions(ctx)
    freed_note = (
        f"Your earlier run was freed (no click for {_seconds(ctx.limits.session_idle_s)}, or the server needed "
        "the room for other visitors), so this run starts over."
    )
    # the key of this visitor's run in `store`, never the run itself; a tab closed for an hour frees it
    session = gr.State(None, delete_callback=store.pop)
    step_dl = download_buttons()  # a finished session as a JSON recording and an HTML page

    gr.Markdown("## Is it really lossless? And why is it faster?")
    with gr.Row():
        with gr.Column():
            with gr.Row():
                n_draws = gr.Slider(300, 2000, value=1000, step=100, label="speculative draws (temperature > 0)")
                n_real = gr.Slider(0, 10, value=5, step=1, label="real end-to-end runs to cross-check")
            _html(value=EXACT_HELP)
            check = gr.Button("Check exactness", variant="primary")
            exact_say = _html()
            exact_plot = gr.Plot(show_label=False, visible=False)
        with gr.Column():
            _html(value=TIME_HELP)
            measure = gr.Button("Measure forward time", variant="primary")
            time_say = _html()
            time_plot = gr.Plot(show_label=False, visible=False)

    def start(prompt, settings: StepSettings) -> tuple[str, Session]:
        p, q = ctx.pair()
        ids = _prompt_ids(ctx, p, prompt)
        s = Session(compute.call(Stepper, p, q, ids, settings), Pieces(p.tokenizer))
        try:
            return store.add(s, session_bytes(p, q, len(ids), settings)), s
        except SpecvizError:
            s.close()
            raise

    @gpu
    def on_step(prompt, gamma, temperature, seed, lossy, w, tree, key: str | None):
        try:
            settings = _settings(ctx, prompt, gamma, temperature, seed, lossy, w, tree)
            s, note = store.get(key), ""
            if s is not None and s.stepper.settings != settings:
                store.pop(key)
                s, key, note = None, None, "The settings changed, so the run started over."
            for _ in range(2):  # a second pass only if the run was freed between `get` and taking its lock
                if s is None or s.closed:  # never started, or freed (idle, or to make room for others)
                    note = freed_note if key is not None else note
                    key, s = None, None
                    key, s = start(prompt, settings)
                if not s.lock.acquire(blocking=False):
                    raise SpecvizError("Still working on the previous round; wait a moment.")
                try:
                    if not s.closed:
                        rd = compute.call(s.stepper.advance)
                        break
                finally:
                    s.lock.release()
            else:  # freed twice in a row: the store is full of busier visitors
                raise SpecvizError("The step-through is too busy to keep your run right now; try again in a minute.")
            if rd is None:
                return key, say_html(s.stepper, s.pieces, None), gr.skip(), gr.skip(), gr.skip()
            fig = candidates_figure(rd, s.name, settings.temperature == 0)
            greedy = settings.temperature == 0
            if settings.relaxed_w < 1:
                lossy_note = LOSSY_GREEDY if greedy else LOSSY_NOTE.format(w=settings.relaxed_w)
                note = f"{note} {lossy_note}".strip()
            say = say_html(s.stepper, s.pieces, rd, note)
            text_now = text_html(s.pieces, s.stepper.rounds, greedy)
            seq = s.stepper.prompt_ids + s.stepper.output_ids[: len(s.stepper.output_ids) - len(rd.tokens)]
            draws = draws_html(rd, s.name, greedy, settings.relaxed_w, s.stepper.rounds, s.name(seq[-1]))
            return key, say, text_now, draws, gr.Plot(fig, visible=True)
        except Exception as err:
            return key, _fail(err), gr.skip(), gr.skip(), gr.skip()

    def on_reset(key: str | None):
        store.pop(key)
        return None, START, "", "", gr.Plot(None, visible=False)

    @gpu
    def on_exactness(prompt, gamma, temperature, seed, draws, real, lossy=False, w=1.0, tree="off"):
        try:
            st = _settings(ctx, prompt, gamma, temperature, seed, lossy, w, tree)
            p, q = ctx.pair()
            ids = _prompt_ids(ctx, p, prompt)
            pieces = Pieces(p.tokenizer)
            if st.temperature == 0:
                tokens = min(GREEDY_CHECK_TOKENS, st.max_new_tokens)
                gc = compute.call(greedy_check, p, q, ids, st.gamma, tokens, st.tree)
                return greedy_html(gc, pieces), gr.Plot(visible=False)
            draws, real = int(draws), int(real)
            if not (100 <= draws <= 2000 and 0 <= real <= 10):
                raise SpecvizError("Use 100 to 2000 draws and 0 to 10 real runs.")
            sampling = SamplingConfig(st.temperature)
            sc = compute.call(sample_check, p, q, ids, sampling, draws, real, st.seed, st.relaxed_w)
            return sample_html(sc), gr.Plot(exactness_figure(sc, lambda t: label(pieces.text(t))), visible=True)
        except Exception as err:
            return _fail(err), gr.skip()

    @gpu
    def on_measure(prompt, gamma):
        try:
            st = _settings(ctx, prompt, gamma, 0.0, 0)
            p, q = ctx.pair()
            ids = _prompt_ids(ctx, p, prompt)
            times = compute.call(forward_times, p, ids, st.gamma + 1, reps=5)
            t_draft = compute.call(forward_times, q, ids, 1, reps=5, vocab_size=p.vocab_size)[0]
            return timing_html(timing_sentence(times, t_draft)), gr.Plot(forward_time_figure(times), visible=True)
        except Exception as err:
            return _fail(err), gr.skip()

    outs = [session, say, text, draws, cands]
    step_ev = nxt.click(
        on_step,
        [prompt, gamma, temperature, seed, lossy, w, tree, session],
        outs,
        api_name="step",
        concurrency_id="models",
    )
    step_ev.then(
        lambda key: downloads(step_recording(ctx, store.get(key)), "step"),
        [session],
        list(step_dl),
        api_visibility="private",
    )
    reset.click(on_reset, session, outs, api_name="reset", queue=False)
    reset.click(lambda: downloads(None, ""), None, list(step_dl), api_visibility="private", queue=False)
    lossy.change(lambda on: gr.Slider(visible=on is True, value=0.5 if on else 1.0), lossy, w, queue=False)
    check.click(
        on_exactness,
        [prompt, gamma, temperature, seed, n_draws, n_real, lossy, w, tree],
        [exact_say, exact_plot],
        api_name="exactness",
        concurrency_id="models",
    )
    measure.click(on_measure, [prompt, gamma], [time_say, time_plot], api_name="forward_times", concurrency_id="models")
