"""The web app: `build_demo(ctx)` returns the gr.Blocks with the tabs Race, Step through, Pair check and About.

Gradio 6 takes the theme and CSS at launch, so launch with `demo.launch(**launch_kwargs())` (app.py does).
The default pair starts loading in a background thread when the demo is built; the page works meanwhile.
"""

from __future__ import annotations

import html
import logging
import socket
import threading
from pathlib import Path

import gradio as gr

from specviz.config import ASSETS, BUILTIN_DRAFT, BUILTIN_TARGET, SpecvizError
from specviz.models.loaded import LoadedModel, pair_backend
from specviz.ui.common import UIContext, default_context, message

log = logging.getLogger("specviz")

ABOUT = """
### What is speculative decoding?
A large language model writes one token per forward call, and each call must read all of its weights: on
most hardware the time goes into moving weights, not into arithmetic. **Speculative decoding**
(Leviathan et al. 2023, [arXiv 2211.17192](https://arxiv.org/abs/2211.17192); Chen et al. 2023,
[arXiv 2302.01318](https://arxiv.org/abs/2302.01318)) lets a small **draft** model q guess gamma tokens
cheaply; the large **target** p then scores all of them in *one* call.

Each guess x is kept with probability min(1, p(x)/q(x)). At the first rejection the target draws a
replacement from norm(max(0, p − q)); if every guess is kept, the same call gives one **bonus** token.
This rule makes the output follow the target's distribution *exactly*: only the speed changes. At
temperature 0 (greedy) a guess is kept exactly when it is the target's top token.

With acceptance rate α and cost ratio c (one draft call / one target call), one round costs gamma·c + 1
target calls' worth of time and yields (1 − α^(γ+1)) / (1 − α) tokens on average.

### The tabs
* **Race**: plain decoding against speculative decoding, live, on a fair common clock.
* **Step through**: one round at a time, with the probabilities behind each decision.
* **Pair check**: can two models be paired, and is it worth it?
"""


def launch_kwargs() -> dict:
    """Theme and CSS (Gradio 6 takes them at launch). System fonts only: the page needs no CDN."""
    theme = gr.themes.Default(
        primary_hue="blue",
        font=["system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif"],
        font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"],
    )
    return {"theme": theme, "css_paths": [Path(ASSETS / "style.css")]}


def serve_locally(demo: gr.Blocks) -> str:
    """Start `demo` in the background on 127.0.0.1, on a free port (tests, scripts); returns its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch_kwargs())
    return f"http://127.0.0.1:{port}/"


class Preloader:
    """Loads the default pair once in the background and says how far it got. `start` once the page is built: the
    load times its choices (a draft's dtype, int8 weights), which a thread building the page beside it would skew
    (it holds the GIL between the timed calls)."""

    def __init__(self, ctx: UIContext):
        self.ctx, self.state, self.text = ctx, "loading", "Loading the default models in the background…"
        self.detail = ""  # the technical detail behind a click: precision, kernels, threads
        self.thread = threading.Thread(target=self._run, name="specviz-preload", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def wait(self, timeout_s: float | None = None) -> str:
        """Block until the load is over (or timeout_s has passed); its state: "loading", "ready" or "error"."""
        self.thread.join(timeout_s)
        return self.state

    def _run(self) -> None:
        try:
            p, q = self.ctx.pair()
        except Exception as err:  # shown in the status line; a run will try again and say why
            if not isinstance(err, SpecvizError):  # not the visitor's doing: the operator needs the traceback
                log.exception("The default models could not be loaded")
            self.state, self.text = "error", f"The default models could not be loaded: {message(err)}"
            return
        self.state = "ready"
        device = p.device.type.upper()
        self.text = f"Ready. {_short(p.name)} checks the guesses of {_short(q.name)} on {device}." + expectation(p, q)
        self.detail = (
            f"Target p: {_short(p.name)} ({p.describe() if isinstance(p, LoadedModel) else p.precision}); "
            f"draft q: {_short(q.name)} ({q.describe()}); running on {device}, {pair_backend(p, q)}."
        )

    def html(self) -> str:
        """The status line; once loaded, the models in a few words with the technical detail a click away."""
        if not self.detail:
            return f'<div class="sv-status sv-status-{self.state}">{html.escape(self.text)}</div>'
        return (
            f'<div class="sv-status sv-status-{self.state}"><details><summary>{html.escape(self.text)}</summary>'
            f'<span class="sv-status-detail">{html.escape(self.detail)}</span></details></div>'
        )


# What a visitor may expect of the built-in pair on a CPU: the range of README.md's speed table (its source).
BUILTIN_EXPECTATION = (
    " On a 2-core CPU expect about 1.5-1.7× the speed of plain decoding at temperature 0, 1.2-1.4× when sampling."
)


def expectation(p, q) -> str:
    """The speed a visitor may expect, for the built-in pair on a CPU (measured there); nothing for other pairs."""
    builtin = p.name.endswith(BUILTIN_TARGET.split("/")[-1]) and q.name.endswith(BUILTIN_DRAFT.split("/")[-1])
    return BUILTIN_EXPECTATION if builtin and p.device.type == "cpu" else ""


# How often gradio's queue looks for an event to start when none waits, and for progress to send. Its defaults off
# Windows, 1 ms and 10 ms, keep its server thread waking a thousand times a second, idle or racing; Windows' own
# values, 50 and 100 ms, wake it a tenth as often. On two cores each wake-up takes a core from one of a model call's
# two threads, and the other then waits for it at the call's next barrier, so fewer wake-ups make both lanes faster.
# A click's event starts at most 50 ms later; streamed outputs are sent as they come, not polled.
QUEUE_POLL_S = 0.05
PROGRESS_POLL_S = 0.1


def calm_queue(demo: gr.Blocks) -> None:
    """Make `demo`'s queue poll at QUEUE_POLL_S and PROGRESS_POLL_S where it polls more often (after demo.queue)."""
    q = getattr(demo, "_queue", None)
    for name, most in (("sleep_when_free", QUEUE_POLL_S), ("progress_update_sleep_when_free", PROGRESS_POLL_S)):
        if isinstance(getattr(q, name, None), (int, float)):
            setattr(q, name, max(getattr(q, name), most))


def _short(name: str) -> str:
    path = Path(name)
    return path.name if name.startswith(("/", ".", "~")) else name


def build_demo(ctx: UIContext | None = None) -> gr.Blocks:
    """The whole app; queue with the deployment's concurrency limit. Launch with `launch_kwargs()`.

    The tabs are imported here, not guarded: a broken install fails at start-up with its ImportError.
    """
    from specviz.ui.learn import build_learn_tab
    from specviz.ui.pair import build_pair_tab
    from specviz.ui.present import build_present_controls
    from specviz.ui.race import build_race_tab
    from specviz.ui.replay import build_replay_tab
    from specviz.ui.step import build_step_tab

    ctx = ctx or default_context()
    loader = Preloader(ctx)
    with gr.Blocks(title="specviz: speculative decoding, visualised") as demo:
        with gr.Row(elem_classes=["sv-header"]):
            gr.Markdown("## specviz · speculative decoding, visualised")
            status = gr.HTML(loader.html(), elem_id="sv-status", js_on_load=None)
            build_present_controls()  # presentation mode and keys (ui/present.py)
        with gr.Tabs():
            with gr.Tab("Race"):
                build_race_tab(ctx)
            with gr.Tab("Step through"):
                build_step_tab(ctx)
            with gr.Tab("Pair check"):
                build_pair_tab(ctx)
            with gr.Tab("Learn"):
                build_learn_tab(ctx)
            with gr.Tab("Replay"):
                build_replay_tab(ctx)
            with gr.Tab("About"):
                gr.Markdown(ABOUT)
        timer = gr.Timer(1.0)

        def poll():
            return loader.html(), gr.Timer(active=loader.state == "loading")

        # queue=False: the status line must not wait behind a running race
        timer.tick(poll, None, [status, timer], api_name="status", show_progress="hidden", queue=False)
        demo.load(poll, None, [status, timer], api_visibility="private", show_progress="hidden", queue=False)
    demo.queue(default_concurrency_limit=ctx.limits.concurrency, max_size=ctx.limits.max_queue)
    calm_queue(demo)
    loader.start()
    demo.preloader = loader  # scripts that start a browser wait for it first (scripts/screenshot.py)
    return demo
