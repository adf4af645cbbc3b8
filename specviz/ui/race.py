"""The Race tab: plain decoding of the target p against speculative decoding with the draft q, side by side.

Both runs go through `engine.race` in one worker: the run that is behind on its own compute clock moves next,
so the two panes stream on a common clock as if each had a machine of its own. The gamma sweep measures
acceptance and speedup per gamma (sweep.py).
"""

from __future__ import annotations

import html
import time

import gradio as gr

from .. import plots, render
from ..api import encode_prompt
from ..config import ASSETS, TEMPERATURE_MAX, SamplingConfig, SpecConfig, SpecvizError
from ..engine import autoregressive_decode, race, speculative_decode
from ..events import Done, Round, Start, Step
from .common import UIContext, error_html, gpu

DEFAULT_GAMMA = 3  # the built-in pair's speedup is flat over gamma 1-3 and falls after; 3 shows longer rounds
HTML_EVERY_S = 0.1  # at most ~10 text updates a second, so the browser keeps up on long runs
PLOTS_EVERY_S = 0.5  # plots are heavier: about two a second
TIMING_NOTE = (
    "**How the race is timed.** Both runs share one worker and take turns: the run that is behind on its own "
    "clock computes next. Each clock counts only that run's own model calls (prompt encoding included), so the "
    "times, tokens/s and speedup are what two identical machines starting together would show, even though "
    "the page may replay them a little slower. Same target, prompt, seed and sampling settings on both sides."
)


def examples() -> list[str]:
    path = ASSETS / "examples.txt"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else ["def fibonacci(n):"]
    return [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]


def _note(text: str) -> str:
    return f'<div class="sv-note">{html.escape(text)}</div>'


def _check_text(prompt) -> str:
    if not isinstance(prompt, str):
        raise SpecvizError("The prompt must be text.")
    if not prompt.strip():
        raise SpecvizError("The prompt is empty; type something for the model to continue.")
    return prompt


def _config(ctx: UIContext, gamma, temperature, top_k, top_p, max_new_tokens, seed) -> SpecConfig:
    """Everything a visitor sends, checked: numbers, ranges, and this deployment's caps."""
    cfg = SpecConfig(gamma, max_new_tokens, seed, SamplingConfig(temperature, top_k, top_p))
    ctx.limits.check_run(cfg.max_new_tokens, cfg.gamma)
    return cfg


def _prepare(ctx: UIContext, prompt, cfg: SpecConfig):
    _check_text(prompt)
    p, q = ctx.pair()
    ids = encode_prompt(p, prompt)
    ctx.limits.check_prompt_tokens(len(ids))
    return p, q, ids


class RaceView:
    """What the page shows of one race, built up event by event."""

    def __init__(self, prompt: str = "", gamma: int = 4):
        self.prompt, self.gamma = prompt if isinstance(prompt, str) else "", gamma
        self.events: dict[str, list] = {"ar": [], "spec": []}
        self.body: dict[str, list[str]] = {"ar": [], "spec": []}
        self.done: dict[str, Done | None] = {"ar": None, "spec": None}
        self.clock = {"ar": 0.0, "spec": 0.0}
        self.pieces: render.Pieces | None = None
        self.greedy = True
        self._figs: tuple | None = None  # the last figures sent, sent again between plot refreshes

    def add(self, side: str, ev) -> None:
        self.events[side].append(ev)
        if isinstance(ev, Start):
            self.greedy = ev.temperature == 0.0
            self.clock[side] = ev.prefill_s
        elif isinstance(ev, Step):
            self.body[side].append(render.ar_token_html(self.pieces, ev, self.greedy))
            self.clock[side] = ev.elapsed_s
        elif isinstance(ev, Round):
            self.body[side].append(render.round_html(self.pieces, ev, self.greedy))
            self.clock[side] = ev.elapsed_s
        elif isinstance(ev, Done):
            self.done[side] = ev
            self.clock[side] = ev.stats["wall_s"]

    def pane(self, side: str, waiting: str = "") -> str:
        return render.pane_html(side, "".join(self.body[side]), self.clock[side], self.done[side], waiting)

    def _rate(self, side: str) -> tuple[int, float]:
        evs = self.events[side]
        n = sum(1 for e in evs if isinstance(e, Step)) + sum(len(e.tokens) for e in evs if isinstance(e, Round))
        return n, (n / self.clock[side] if self.clock[side] > 0 else 0.0)

    def stats(self) -> tuple[str, str]:
        n_ar, rate_ar = self._rate("ar")
        n_sp, rate_sp = self._rate("spec")
        rounds = [e for e in self.events["spec"] if isinstance(e, Round)]
        drafted, accepted = sum(len(r.drafted) for r in rounds), sum(r.n for r in rounds)
        ar = render.stats_html([(str(n_ar), "tokens"), (f"{rate_ar:.1f}", "tokens/s"), (str(n_ar), "target calls")])
        speedup = f"{rate_sp / rate_ar:.2f}×" if n_ar and n_sp else "—"
        spec = render.stats_html(
            [
                (str(n_sp), "tokens"),
                (f"{rate_sp:.1f}", "tokens/s"),
                (str(len(rounds)), "target calls"),
                (f"{accepted / drafted:.0%}" if drafted else "—", "guesses accepted"),
                (f"{n_sp / len(rounds):.2f}" if rounds else "—", "tokens per target call"),
                (speedup, "speedup (tokens/s vs plain)"),
            ]
        )
        return ar, spec

    def figures(self) -> tuple:
        rounds = plots.rounds_frame(self.events["spec"])
        return (
            plots.race_figure(self.events["ar"], self.events["spec"]),
            plots.acceptance_figure(rounds),
            plots.tokens_per_round_figure(rounds, self.gamma),
            plots.time_share_figure(self.events["ar"], self.events["spec"]),
        )

    def outputs(self, message: str = "", with_plots: bool = True, waiting: str = "") -> tuple:
        ar_stats, spec_stats = self.stats()
        # Between plot refreshes the last figures go out again: gr.skip() would make gradio 6 build a new
        # gr.Plot per update and keep it forever (tests/test_load.py measures this)
        if with_plots or self._figs is None:
            self._figs = self.figures()
        figs = self._figs
        prompt = render.prompt_html(self.prompt) if self.prompt.strip() else ""
        return (prompt, self.pane("ar", waiting), self.pane("spec", waiting), ar_stats, spec_stats, message, *figs)

    def summary(self) -> str:
        a, s = self.done["ar"], self.done["spec"]
        if not (a and s):
            return ""
        _, rate_ar = self._rate("ar")
        _, rate_sp = self._rate("spec")
        faster = rate_sp / rate_ar if rate_ar else 0.0
        if f"{faster:.2f}" == "1.00":
            word = "the same speed"
        elif faster > 1:
            word = "faster"
        else:
            word = "slower (the draft costs more than its guesses save here)"
        return _note(
            f"Done. Plain: {a.stats['new_tokens']} tokens in {a.stats['wall_s']:.2f} s. Speculative: "
            f"{s.stats['new_tokens']} tokens in {s.stats['wall_s']:.2f} s with {s.stats['target_calls']} target "
            f"call{'s' if s.stats['target_calls'] != 1 else ''}: {faster:.2f}×, {word}."
        )


def race_stream(ctx: UIContext, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed):
    """Yield the page's outputs while the two runs race (text every ~0.1 s, plots every ~0.5 s)."""
    view, start = RaceView(prompt if isinstance(prompt, str) else ""), time.monotonic()
    try:
        cfg = _config(ctx, gamma, temperature, top_k, top_p, max_new_tokens, seed)
        _check_text(prompt)
        view.gamma = cfg.gamma
        yield view.outputs(_note("Loading the models…"), waiting="waiting for the models…")
        p, q, ids = _prepare(ctx, prompt, cfg)
        view.pieces = render.Pieces(p.tokenizer)
        last_html = last_plots = 0.0
        # within_time: past the request cap it stops the race with one SpecvizError (caught below)
        stream = ctx.limits.within_time(
            race(autoregressive_decode(p, ids, cfg), speculative_decode(p, q, ids, cfg)), start
        )
        for side, ev in stream:
            view.add(side, ev)
            now = time.monotonic()
            if now - last_html >= HTML_EVERY_S or isinstance(ev, Done):
                with_plots = now - last_plots >= PLOTS_EVERY_S
                last_html, last_plots = now, now if with_plots else last_plots
                yield view.outputs(_note("Racing…"), with_plots=with_plots)
        yield view.outputs(view.summary())
    except Exception as err:  # one sentence in the page; the app keeps serving
        yield view.outputs(error_html(err))
    return view  # the finished view, for the downloads (ui/replay.py)


def build_race_tab(ctx: UIContext) -> None:
    """The components and handlers of the Race tab (called inside `with gr.Tab("Race")`)."""
    from .replay import download_buttons, downloads, race_recording, sweep_recording, with_result
    from .sweep import EMPTY_SWEEP, sweep_stream  # sweep.py uses this module's checks

    lim = ctx.limits
    gr.Markdown(
        "Two ways to get text from the same model. **Left:** the target model writes one token per call. "
        "**Right:** a small *draft* model guesses gamma tokens, and the target checks them all in one call, "
        "keeping the good guesses. The text on the right follows the target's own distribution exactly; "
        "only the speed changes."
    )
    with gr.Row(equal_height=True):
        prompt = gr.Textbox(label="Prompt", value=examples()[0], lines=2, max_lines=8, scale=5)
        with gr.Column(scale=1, min_width=160):
            run = gr.Button("Run race", variant="primary")
            stop = gr.Button("Stop", variant="stop")
            sweep = gr.Button("Sweep gamma", variant="secondary")
    gr.Examples([[e] for e in examples()], inputs=[prompt], label="Examples")
    with gr.Row():
        gamma = gr.Slider(
            1,
            lim.max_gamma,
            value=min(DEFAULT_GAMMA, lim.max_gamma),
            step=1,
            label="gamma: tokens the draft guesses per round",
        )
        temperature = gr.Slider(
            0, TEMPERATURE_MAX, value=0.0, step=0.05, label="temperature (0 = greedy: always the top token)"
        )
    with gr.Accordion("Advanced", open=False):
        with gr.Row():
            top_k = gr.Slider(0, 200, value=0, step=1, label="top-k (0 = off)")
            top_p = gr.Slider(0, 1, value=1.0, step=0.05, label="top-p (1 = off; must be above 0)")
            max_new = gr.Slider(
                1, lim.max_new_tokens, value=min(64, lim.max_new_tokens), step=1, label="max new tokens"
            )
            seed = gr.Number(value=0, precision=0, minimum=0, label="seed")
    message = gr.HTML(elem_id="sv-message", js_on_load=None)
    echo = gr.HTML(js_on_load=None)
    gr.HTML(render.legend_html(), js_on_load=None)
    view = RaceView()
    with gr.Row(equal_height=False):
        with gr.Column():
            ar_pane = gr.HTML(view.pane("ar", "Press Run race."), elem_id="sv-ar", js_on_load=None)
            ar_stats = gr.HTML(elem_id="sv-ar-stats", js_on_load=None)
        with gr.Column():
            spec_pane = gr.HTML(view.pane("spec", "Press Run race."), elem_id="sv-spec", js_on_load=None)
            spec_stats = gr.HTML(elem_id="sv-spec-stats", js_on_load=None)
    race_dl = download_buttons()  # a finished race as a JSON recording and a self-contained HTML page
    gr.Markdown(TIMING_NOTE, elem_classes=["sv-timing"])
    figs = view.figures()
    with gr.Row():
        fig_race = gr.Plot(figs[0], show_label=False, elem_id="sv-plot-race")
        fig_accept = gr.Plot(figs[1], show_label=False, elem_id="sv-plot-accept")
    with gr.Row():
        fig_hist = gr.Plot(figs[2], show_label=False, elem_id="sv-plot-hist")
        fig_share = gr.Plot(figs[3], show_label=False, elem_id="sv-plot-share")
    gr.Markdown(
        "### Which gamma is best?\n**Sweep gamma** races plain decoding once, then speculative decoding for each "
        "gamma on the current prompt and settings. Dots are measured; the dashed line is the paper's expected "
        "speedup (1 − α^(γ+1)) / ((1 − α)(γc + 1)) from the measured acceptance α and cost ratio c."
    )
    sweep_note = gr.HTML(js_on_load=None)
    sweep_plot = gr.Plot(plots.sweep_figure(EMPTY_SWEEP), show_label=False, elem_id="sv-plot-sweep")
    sweep_dl = download_buttons()
    race_done, sweep_done = gr.State(None), gr.State(None)  # the last finished race's view / sweep's result

    @gpu
    def on_race(prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed):
        yield from with_result(race_stream(ctx, prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed))

    @gpu
    def on_sweep(prompt, temperature, top_k, top_p, max_new_tokens, seed):
        yield from with_result(sweep_stream(ctx, prompt, temperature, top_k, top_p, max_new_tokens, seed))

    # concurrency_id "models": every handler that runs the models (all tabs) shares the one queue limit.
    # preprocess=False: the handlers get the raw values a client sent and check them all themselves,
    # so a bad value through the API (NaN, a string, out of range) gets one sentence in the page too
    outputs = [echo, ar_pane, spec_pane, ar_stats, spec_stats, message, fig_race, fig_accept, fig_hist, fig_share]
    inputs = [prompt, gamma, temperature, top_k, top_p, max_new, seed]
    race_ev = run.click(
        on_race, inputs, [*outputs, race_done], api_name="race", preprocess=False, concurrency_id="models"
    )
    sweep_ev = sweep.click(
        on_sweep,
        [prompt, *inputs[2:]],
        [sweep_plot, sweep_note, sweep_done],
        api_name="sweep",
        preprocess=False,
        concurrency_id="models",
    )
    private = {"api_visibility": "private", "queue": False}
    run.click(lambda: downloads(None, ""), None, list(race_dl), **private)
    sweep.click(lambda: downloads(None, ""), None, list(sweep_dl), **private)
    race_ev.then(
        lambda view, *a: downloads(race_recording(ctx, view, *a), "race"),
        [race_done, *inputs],
        list(race_dl),
        **private,
    )
    sweep_ev.then(
        lambda res, text: downloads(sweep_recording(ctx, res, text), "sweep"),
        [sweep_done, prompt],
        list(sweep_dl),
        **private,
    )
    stop.click(None, cancels=[race_ev, sweep_ev])
