"""The Race tab: plain decoding of the target p against speculative decoding, side by side, in up to three lanes.

All runs go through `engine.race` in one worker: the run that is behind on its own compute clock moves next,
so the panes stream on a common clock as if each had a machine of its own. The second speculative lane
(optional) races another drafter or gamma policy on the same clock. The gamma sweep is in sweep.py; the runs and their view in race_run.py.
"""

from __future__ import annotations

import gradio as gr

from specviz.config import DRAFTERS, GAMMA_POLICIES, TEMPERATURE_MAX
from specviz.ui.common import UIContext, gpu
from specviz.ui.history import add_race, build_history, empty, table
from specviz.ui.inputs import (
    NO_LANE,
    PAGE,
    RACE_INPUTS,
    SWEEP_INPUTS,
    TEMPERATURE_LABEL,
    TEMPERATURE_SWEEP_INPUTS,
    TREES,
    named,
)
from specviz.ui.keep import download_buttons, downloads, race_recording, sweep_recording, with_result
from specviz.ui.race_run import RaceView, examples, race_page
from specviz.ui.sweep import SWEEP_EMPTY, sweep_page
from specviz.ui.temperature import WHY, temperature_page
from specviz.view import plots, render
from specviz.view.history import history_figure
from specviz.view.temperature import temperature_figure

TIMING_NOTE = (
    "**How the race is timed.** All runs share one worker and take turns: the run that is behind on its own "
    "clock computes next. Each clock counts only that run's own model calls (prompt encoding included; the chat "
    "template's opening every prompt shares is encoded once, before any clock starts, for every lane), so the "
    "times, tokens/s and speedup are what identical machines starting together would show, even though "
    "the page may replay them a little slower. Same target, prompt, seed and sampling settings in every lane."
)


# The gate of a setting's move (build_race_tab): while "Race when a setting changes" is ticked, the move count + 1 once
# no other move came for MOVE_QUIET_MS, else the count unchanged (no change event, no race). Quick moves so collapse
# into the last, and two races are never submitted so close together that the cancel of the first misses it.
MOVE_QUIET_MS = 250
GATE_JS = f"""async (on, n) => {{
  const mine = (window.svMoveSeq = (window.svMoveSeq || 0) + 1);
  await new Promise((done) => setTimeout(done, {MOVE_QUIET_MS}));
  return on === true && mine === window.svMoveSeq ? (n || 0) + 1 : n;
}}"""


def build_race_tab(ctx: UIContext) -> None:
    """The components and handlers of the Race tab (called inside `with gr.Tab("Race")`)."""
    lim = ctx.limits
    gr.Markdown(
        "Two ways to get text from the same model. **Left:** the target model writes one token per call. "
        "**Right:** guesses come cheaply (from a small *draft* model, or copied from earlier text by *prompt "
        "lookup*), and the target checks them all in one call, keeping the good ones. The text on the right "
        "follows the target's own distribution exactly; only the speed changes."
    )
    with gr.Row(equal_height=True):
        prompt = gr.Textbox(label="Prompt", value=examples()[0], lines=2, max_lines=8, scale=5)
        with gr.Column(scale=1, min_width=160):
            run = gr.Button("Run race", variant="primary")
            stop = gr.Button("Stop", variant="stop")
            sweep = gr.Button("Sweep gamma", variant="secondary", size="sm")
            tsweep = gr.Button("Sweep temperature", variant="secondary", size="sm")
    gr.Examples([[e] for e in examples()], inputs=[prompt], label="Examples")
    with gr.Row():  # every control starts at the one set of defaults (inputs.PAGE, a RunRequest)
        drafter = gr.Dropdown(list(DRAFTERS), value=PAGE.drafter, label="guesses from (drafter)", scale=1)
        policy = gr.Dropdown(list(GAMMA_POLICIES), value=PAGE.gamma_policy, label="gamma policy", scale=1)
        gamma = gr.Slider(
            1,
            lim.max_gamma,
            value=min(PAGE.gamma, lim.max_gamma),
            step=1,
            scale=2,
            label="gamma: guesses per round (the most per round under confidence and auto)",
        )
        temperature = gr.Slider(0, TEMPERATURE_MAX, value=PAGE.temperature, step=0.05, scale=2, label=TEMPERATURE_LABEL)
        tree = gr.Dropdown(list(TREES), value=str(PAGE.tree), label="token tree (model drafters)", scale=1)
        with gr.Column(scale=1, min_width=140):
            auto = gr.Checkbox(True, label="Race when a setting changes", elem_id="sv-auto")
            moved = gr.Number(0, elem_id="sv-moved", elem_classes=["sv-hidden"], container=False, min_width=0)
    with gr.Accordion("Race a third lane (another drafter, policy or tree on the same clock)", open=False):
        with gr.Row():
            drafter2 = gr.Dropdown([NO_LANE, *DRAFTERS], value=NO_LANE, label="third lane: guesses from")
            policy2 = gr.Dropdown(list(GAMMA_POLICIES), value=PAGE.gamma_policy, label="third lane: gamma policy")
            tree2 = gr.Dropdown(list(TREES), value=str(PAGE.tree), label="third lane: token tree")
    with gr.Accordion("Advanced", open=False):
        with gr.Row():
            top_k = gr.Slider(0, 200, value=PAGE.top_k, step=1, label="top-k (0 = off)")
            top_p = gr.Slider(0, 1, value=PAGE.top_p, step=0.05, label="top-p (1 = off; must be above 0)")
            max_new = gr.Slider(
                1,
                lim.max_new_tokens,
                value=min(PAGE.max_new_tokens, lim.max_new_tokens),
                step=1,
                label="max new tokens",
            )
            seed = gr.Number(value=PAGE.seed, precision=0, minimum=0, label="seed")
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
        with gr.Column(visible=False) as lane3:
            spec2_pane = gr.HTML(elem_id="sv-spec2", js_on_load=None)
            spec2_stats = gr.HTML(elem_id="sv-spec2-stats", js_on_load=None)
    engine_pane = gr.HTML(elem_id="sv-vllm", js_on_load=None)  # a vLLM target's own rounds (race_run, vllm_lane)
    race_dl = download_buttons()  # a finished race as a JSON recording and a self-contained HTML page
    gr.Markdown(TIMING_NOTE, elem_classes=["sv-timing"])
    figs = view.figures()
    with gr.Row():
        fig_race = gr.Plot(figs[0], show_label=False, elem_id="sv-plot-race")
        fig_accept = gr.Plot(figs[1], show_label=False, elem_id="sv-plot-accept")
    with gr.Row():
        fig_hist = gr.Plot(figs[2], show_label=False, elem_id="sv-plot-hist")
        fig_share = gr.Plot(figs[3], show_label=False, elem_id="sv-plot-share")
    with gr.Row():
        fig_position = gr.Plot(figs[4], show_label=False, elem_id="sv-plot-position")
        fig_timeline = gr.Plot(figs[5], show_label=False, elem_id="sv-plot-timeline")
    history, fig_history, clear = build_history(lim.max_gamma)
    history_json = gr.JSON(visible=False)
    gr.Markdown(
        "### Which gamma is best?\n**Sweep gamma** races plain decoding once, then speculative decoding for each "
        "gamma on the current prompt, drafter and settings. Dots are measured; the dashed line is the paper's "
        "expected speedup (1 − α^(γ+1)) / ((1 − α)(γc + 1)) from the measured acceptance α and cost ratio c."
    )
    sweep_note = gr.HTML(js_on_load=None)
    sweep_plot = gr.Plot(plots.empty_figure(SWEEP_EMPTY), show_label=False, elem_id="sv-plot-sweep")
    sweep_dl = download_buttons()
    gr.Markdown(
        "### Why does acceptance fall above temperature 0?\n**Sweep temperature** runs the current prompt, drafter "
        "and gamma plain and speculative at temperatures 0, 0.3, 0.7, 1.0 and 1.3 (seeded). " + WHY
    )
    tsweep_note = gr.HTML(js_on_load=None)
    tsweep_plot = gr.Plot(temperature_figure([]), show_label=False, elem_id="sv-plot-temperature")
    tsweep_json = gr.JSON(visible=False)
    race_done, sweep_done = gr.State(None), gr.State(None)  # the last finished race's view / sweep's result

    # the edge: the inputs arrive in the order of inputs.RACE_INPUTS / SWEEP_INPUTS and are named there, once
    @gpu
    def on_race(*values):
        yield from with_result(race_page(ctx, named(RACE_INPUTS, values)))

    @gpu
    def on_temperature_sweep(*values):
        yield from temperature_page(ctx, named(TEMPERATURE_SWEEP_INPUTS, values))

    @gpu
    def on_sweep(*values):
        yield from with_result(sweep_page(ctx, named(SWEEP_INPUTS, values)))

    # concurrency_id "models": every handler that runs the models (all tabs) shares the one queue limit.
    # preprocess=False: the handlers get the raw values a client sent and check them all themselves,
    # so a bad value through the API (NaN, a string, out of range) gets one sentence in the page too.
    # New inputs and outputs go at the end, so API clients written for two lanes keep working; the gr.State
    # outputs (the finished race / sweep, for the downloads) are hidden from the API.
    outputs = [
        echo,
        ar_pane,
        spec_pane,
        ar_stats,
        spec_stats,
        message,
        fig_race,
        fig_accept,
        fig_hist,
        fig_share,
        spec2_pane,
        spec2_stats,
        fig_position,
        fig_timeline,
        engine_pane,
    ]
    by_name = dict(
        prompt=prompt,
        gamma=gamma,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        max_new_tokens=max_new,
        seed=seed,
        drafter=drafter,
        gamma_policy=policy,
        drafter2=drafter2,
        policy2=policy2,
        tree=tree,
        tree2=tree2,
    )
    inputs = [by_name[k] for k in RACE_INPUTS]
    race_ev = run.click(
        on_race, inputs, [*outputs, race_done], api_name="race", preprocess=False, concurrency_id="models"
    )
    sweep_ev = sweep.click(
        on_sweep,
        [by_name[k] for k in SWEEP_INPUTS],
        [sweep_plot, sweep_note, sweep_done],
        api_name="sweep",
        preprocess=False,
        concurrency_id="models",
    )
    tsweep_ev = tsweep.click(
        on_temperature_sweep,
        [by_name[k] for k in TEMPERATURE_SWEEP_INPUTS],
        [tsweep_plot, tsweep_note, tsweep_json],
        api_name="temperature_sweep",
        preprocess=False,
        concurrency_id="models",
    )
    private = {"api_visibility": "private", "queue": False}
    run.click(lambda: downloads(None, ""), None, list(race_dl), **private)
    sweep.click(lambda: downloads(None, ""), None, list(sweep_dl), **private)
    sweep_ev.then(lambda res: downloads(sweep_recording(ctx, res), "sweep"), [sweep_done], list(sweep_dl), **private)
    # Letting go of gamma or temperature, or choosing another drafter, policy or tree, races again through the same
    # handler and queue as Run race (same limits, same concurrency). A move first cancels a race a move started
    # (still running or waiting), then the gate (GATE_JS, in the browser) counts the move in `moved` while the checkbox
    # is ticked, and that change races; unticked, `moved` keeps its value: no race, and a button's race runs on.
    # Not gradio's always_last: a run it defers behind one that gets cancelled never starts (gradio 6.31); and cancels
    # hang on a component's event (on .success they never fire), hence the count.
    moves = [gamma.release, temperature.release, drafter.change, policy.change, tree.change]
    auto_ev = moved.change(
        on_race,
        inputs,
        [*outputs, race_done],
        preprocess=False,
        concurrency_id="models",
        cancels=[race_ev, sweep_ev, tsweep_ev],
        trigger_mode="multiple",
        api_visibility="private",
    )
    gr.on(moves, None, cancels=[auto_ev], api_visibility="private")  # registered first: it runs before the gate
    gr.on(
        moves, None, [auto, moved], [moved], js=GATE_JS, queue=False, show_progress="hidden", api_visibility="private"
    )
    run.click(None, cancels=[auto_ev], api_visibility="private")
    auto_ev.then(lambda: downloads(None, ""), None, list(race_dl), **private)

    # the history: each finished race (button or slider) adds its points; /history does the same for API clients
    # (a race already in is not added twice) and returns the points
    def on_history(view, hist):
        hist = add_race(hist, view)
        return hist, history_figure(table(hist), lim.max_gamma), table(hist)

    hist_outputs = [history, fig_history, history_json]
    for i, ev in enumerate((race_ev, auto_ev)):
        done = ev.then(
            on_history,
            [race_done, history],
            hist_outputs,
            api_name="history" if i == 0 else None,
            api_visibility="public" if i == 0 else "private",
            queue=False,
        )
        done.then(
            lambda view, hist: downloads(race_recording(ctx, view, table(hist)), "race"),
            [race_done, history],
            list(race_dl),
            **private,
        )
    clear.click(
        lambda: (empty(), history_figure([], lim.max_gamma), []),
        None,
        hist_outputs,
        api_name="clear_history",
        queue=False,
    )
    stop.click(None, cancels=[race_ev, sweep_ev, tsweep_ev, auto_ev])
    drafter2.change(lambda d: gr.Column(visible=d != NO_LANE), drafter2, lane3, queue=False, api_visibility="private")
