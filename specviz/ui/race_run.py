"""A race's runs and what the Race tab shows of them, without the components: `race_stream` (plain decoding and up
to two speculative lanes on one clock; a vLLM target's own speculative decoding of the prompt after them, drawn by
vllm_lane.py), `RaceView` (the panes, numbers and figures a race's events make) and
`race_page` (a visitor's values checked, then the race streamed as the tab's outputs). The components and their
wiring are race.py's.
"""

from __future__ import annotations

import time

from specviz.backends.served.connect import EngineSpec, ServedTarget, engine_spec
from specviz.config import ASSETS
from specviz.engine.loop import autoregressive_decode, race, speculative_decode
from specviz.engine.tally import Tally
from specviz.events import Done, Round, Start, Step
from specviz.host import compute
from specviz.models.head import head_backend
from specviz.request import RunRequest
from specviz.theory import position_alphas
from specviz.ui import vllm_lane
from specviz.ui.common import HTML_EVERY_S, UIContext, error_html
from specviz.ui.inputs import PAGE, check_caps, note, prepare, race_requests
from specviz.view import metrics, plots, render

PLOTS_EVERY_S = 0.5  # plots are heavier: about two a second
SPEC_LANES = ("spec", "spec2")


def examples() -> list[str]:
    path = ASSETS / "examples.txt"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else ["def fibonacci(n):"]
    return [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]


class RaceView:
    """What the page shows of one race, built up event by event. Lanes: "ar", "spec" and maybe "spec2".

    `requests` are the speculative lanes' RunRequests as they ran (a recording's settings are the first's)."""

    def __init__(self, prompt: str = "", requests: dict[str, RunRequest] | None = None):
        self.prompt = prompt if isinstance(prompt, str) else ""
        self.requests = requests or {"spec": PAGE}
        self.gamma = self.requests["spec"].gamma
        self.labels = {k: r.label for k, r in self.requests.items()}
        self.lanes = ("ar", *(k for k in SPEC_LANES if k in self.labels))
        self.events: dict[str, list] = {k: [] for k in ("ar", *SPEC_LANES)}
        self.body: dict[str, list[str]] = {k: [] for k in self.events}
        self.done: dict[str, Done | None] = dict.fromkeys(self.events)
        self.clock = dict.fromkeys(self.events, 0.0)
        self.tally = {k: Tally() for k in self.events}  # each lane's counts, folded as its events come
        self.pieces: render.Pieces | None = None
        self.greedy = True
        self.translation: dict[str, str] = {}  # lane -> how a draft with another tokenizer's guesses were translated
        self._figs: tuple | None = None  # the last figures sent, sent again between plot refreshes
        self.engine = ""  # a vLLM target's own speculative decoding of the prompt (vllm_lane.engine_pane), or ""

    def add(self, side: str, ev) -> None:
        self.events[side].append(ev)
        self.tally[side].add(ev)
        if isinstance(ev, Start):
            self.greedy = ev.temperature == 0.0
            self.clock[side] = ev.prefill_s
            if ev.translation:
                self.translation[side] = ev.translation
            tree = self.requests[side].tree if side in self.requests else "off"
            if str(tree) != "off" and not ev.tree:  # trees asked for, chains run (run_setup.runs_chains)
                self.labels[side] = self.labels[side].replace(f", tree {tree}", ", trees off")
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
        label = self.labels.get(side, "")
        if side in self.translation:  # which exact method ran: text, intersection or match (translate.py)
            label += f" · draft's guesses translated: {self.translation[side].split(':')[0]}"
        return render.pane_html(side, "".join(self.body[side]), self.clock[side], self.done[side], waiting, label)

    def _spec_stats(self, side: str) -> str:
        if side not in self.lanes:
            return ""
        t = self.tally[side]
        items = render.spec_stat_items(t) + [render.speedup_item(t, self.tally["ar"])]
        return render.stats_html(items + self._served_items(side))

    def _served_items(self, side: str) -> list[tuple[str, str]]:
        """A served target (served.py): how it decided ("approximate: top-20" where it is not exact) and, once
        the lane is done, the share of its time spent waiting on requests (both lanes pay the same round trip)."""
        start = next((e for e in self.events[side] if isinstance(e, Start)), None)
        if start is None or not start.verify:
            return []
        items = [(start.verify.removeprefix("served "), "served target")]
        done = self.done[side]
        if done is not None and done.stats.get("wall_s"):
            items.append((f"{done.stats['request_s'] / done.stats['wall_s']:.0%}", "of the time in requests"))
        return items

    def stats(self) -> tuple[str, str, str]:
        ar = render.stats_html(render.plain_stat_items(self.tally["ar"]) + self._served_items("ar"))
        return ar, self._spec_stats("spec"), self._spec_stats("spec2")

    def figures(self) -> tuple:
        ev, labels = self.events, {"ar": "plain", **self.labels}
        if not any(ev[k] for k in self.lanes):  # before the first event: a sentence per chart, not empty axes
            return tuple(plots.empty_figure(s, plots.HEIGHT) for s in plots.RACE_EMPTY)
        spec2 = ev["spec2"] if "spec2" in self.lanes else None
        frames = {self.labels[k]: plots.rounds_frame(ev[k]) for k in self.lanes if k != "ar"}
        first = next(iter(frames.values()))
        trees = metrics.tree_acceptance(ev["spec"])  # token trees: kept by depth and rank, in place of kept per round
        return (
            plots.race_figure(ev["ar"], ev["spec"], spec2, labels),
            plots.tree_figure(trees) if len(trees) else plots.acceptance_figure(first),
            plots.tokens_per_round_figure(first, self.gamma),
            plots.time_share_figure(ev["ar"], ev["spec"], spec2, labels),
            plots.position_figure(frames),
            plots.gamma_timeline_figure(frames),
        )

    def outputs(self, message: str = "", with_plots: bool = True, waiting: str = "") -> tuple:
        """The values of the /race outputs, in order (the first ten as before lanes existed, then the rest)."""
        ar_stats, spec_stats, spec2_stats = self.stats()
        # Between plot refreshes the last figures go out again: gr.skip() would make gradio 6 build a new
        # gr.Plot per update and keep it forever (tests/test_load.py measures this)
        if with_plots or self._figs is None:
            self._figs = self.figures()
        f = self._figs
        prompt = render.prompt_html(self.prompt) if self.prompt.strip() else ""
        panes = (self.pane("ar", waiting), self.pane("spec", waiting))
        spec2 = self.pane("spec2", waiting) if "spec2" in self.lanes else ""
        return (prompt, *panes, ar_stats, spec_stats, message, *f[:4], spec2, spec2_stats, *f[4:], self.engine)

    def summary(self, engine: EngineSpec | None = None, heads: tuple[str, ...] = ()) -> str:
        """The closing sentences; with `engine` (a served target's own speculative decoding, from its /metrics)
        its acceptance per position and mean accepted length beside this draft's alpha_k; `heads`: how each
        draft head that ran computed here (head_native.describe)."""
        if not all(self.done[k] for k in self.lanes):
            return ""
        a = self.tally["ar"]
        rate_ar = a.tokens_per_s
        parts = [f"Done. Plain: {a.new_tokens} tokens in {a.elapsed_s:.2f} s."]
        for k in self.lanes[1:]:
            t = self.tally[k]
            faster = t.tokens_per_s / rate_ar if rate_ar else 0.0
            word = "the same speed" if f"{faster:.2f}" == "1.00" else "faster" if faster > 1 else "slower"
            calls = t.target_calls
            parts.append(
                f"Speculative ({self.labels[k]}): {t.new_tokens} tokens in {t.elapsed_s:.2f} s with "
                f"{calls} target call{'s' if calls != 1 else ''}: {faster:.2f}×, {word}."
            )
        if any(self.tally[k].tokens_per_s < rate_ar for k in self.lanes[1:]):
            parts.append("Slower means the guesses cost more than they saved here.")
        for how in dict.fromkeys(self.translation.values()):
            parts.append(f"The draft has another tokenizer than the target; its guesses were translated by {how}.")
        for how in dict.fromkeys(heads):
            parts.append(f"The draft head ran on {how}.")
        if any(self.labels[k].endswith(", trees off") for k in self.translation):
            parts.append("Token trees are off for a draft with another tokenizer: its guesses ran as chains.")
        elif not self.greedy and any(self.labels[k].endswith(", trees off") for k in self.lanes[1:]):
            parts.append("Token trees on auto grow at temperature 0 only: here the guesses ran as chains.")
        if engine is not None and engine.drafts:
            rounds = [(len(e.drafted), e.n) for e in self.events["spec"] if isinstance(e, Round) and e.drafted]
            ours = ", ".join(f"{x:.2f}" for x in position_alphas(rounds)) or "none drafted"
            per_pos = ", ".join(f"{x:.2f}" for x in engine.acceptance_per_pos)
            parts.append(
                f"The engine's own speculative decoding since it started: acceptance by position {per_pos}, mean "
                f"accepted length {engine.mean_accepted_length:.2f} over {engine.drafts} drafts; this draft's "
                f"alpha_k by position: {ours}."
            )
        return note(" ".join(parts))


def race_page(ctx: UIContext, values: dict):
    """The /race handler's body: the page's values, by name (inputs.RACE_INPUTS), become the lanes' RunRequests;
    a bad value is one sentence in the page. Returns the finished view, as `race_stream` does."""
    try:
        requests = race_requests(ctx, values)
    except Exception as err:  # one sentence in the page; the app keeps serving
        view = RaceView(values.get("prompt", ""))
        yield view.outputs(error_html(err))
        return view
    return (yield from race_stream(ctx, values.get("prompt"), requests))


def race_stream(ctx: UIContext, prompt, requests: dict[str, RunRequest]):
    """Race plain decoding against the speculative lanes `requests` ("spec" and maybe "spec2"; the plain lane
    shares the first's sampling, budget and seed); yield the page's outputs meanwhile (text every ~0.1 s, plots
    every ~0.5 s). Returns the finished view, for the downloads (ui/replay.py)."""
    view, start = RaceView(prompt if isinstance(prompt, str) else "", requests), time.monotonic()
    try:
        for req in requests.values():
            check_caps(ctx, req)
        yield view.outputs(note("Loading the models…"), waiting="waiting for the models…")
        first = requests["spec"]
        p, q, ids = prepare(ctx, prompt, first)
        view.pieces = render.Pieces(p.tokenizer)
        last_html = last_plots = 0.0
        plain = first.replace(mode="ar").spec
        runs = [
            autoregressive_decode(p, ids, plain),
            *(speculative_decode(p, q, ids, r.spec) for r in requests.values()),
        ]
        # on the one compute thread (specviz/host/compute.py); within_time: past the request cap it stops the race
        # with one SpecvizError (caught below)
        stream = ctx.limits.within_time(compute.iterate(race(*runs, names=("ar", *requests))), start)
        for side, ev in stream:
            view.add(side, ev)
            now = time.monotonic()
            if now - last_html >= HTML_EVERY_S or isinstance(ev, Done):
                with_plots = now - last_plots >= PLOTS_EVERY_S
                last_html, last_plots = now, now if with_plots else last_plots
                yield view.outputs(note("Racing…"), with_plots=with_plots)
        heads = tuple(head_backend(p, r.head) for r in requests.values() if r.drafter.endswith("head"))
        engine = engine_spec(p) if isinstance(p, ServedTarget) else None  # None: no engine that speculates itself
        summary = view.summary(engine, heads)
        if engine is not None:  # a vLLM server that speculates: its own rounds of the same prompt, drawn
            view.engine = vllm_lane.titled("<p>Asking the server…</p>")
            yield view.outputs(summary)
            ours = view.done["spec"].token_ids if view.done["spec"] else None
            view.engine = vllm_lane.engine_pane(p, ids, first, ours)
        yield view.outputs(summary)
    except Exception as err:  # one sentence in the page; the app keeps serving
        yield view.outputs(error_html(err))
    return view  # the finished view, for the downloads (ui/keep.py)
