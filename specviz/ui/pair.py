"""The "Pair check" tab: can this draft q serve this target p, and is it worth it? (specviz.pairs.check.check_pair)

The visitor picks a preset or types a hub id or folder (checked by the deployment's limits); the page shows
the verdict with its reasons, the measured acceptance a and cost ratio c, the expected speedup per gamma, and the
deploy card (pairs.deploy): the settings that reproduce the check's advice in vLLM, SGLang, llama.cpp and
transformers, one code block with a copy button per engine, each engine's constraints beside it.
"""

from __future__ import annotations

import html

import gradio as gr

from specviz.config import BUILTIN_DRAFT, BUILTIN_TARGET, CHECK_DRAFTERS, PRESETS, SpecvizError
from specviz.host import compute
from specviz.pairs.check import check_pair
from specviz.pairs.deploy import ENGINE_SOURCES
from specviz.pairs.measure import CHECK_GAMMA
from specviz.pairs.report import PairReport, memory_words
from specviz.teach.plots import speedup_figure
from specviz.ui.common import NO_QUANTIZE, UIContext, error_html, gpu

CUSTOM = "Custom (type the ids below)"
BADGES = {  # an icon and a word besides the colour (Okabe-Ito)
    "compatible": ("✓", "#009E73", "Compatible: worth pairing"),
    "not worth it": ("⚠", "#E69F00", "Works, but not worth it"),
    "incompatible": ("✗", "#D55E00", "Incompatible"),
}
CSS = """
.sv-verdict { font-size: 19px; line-height: 1.5; }
.sv-badge { display: inline-block; font-size: 24px; font-weight: 700; padding: 4px 14px; border-radius: 6px;
  border: 3px solid currentColor; margin-bottom: 6px; }
.sv-verdict ul { margin: 6px 0 6px 22px; }
.sv-nums { display: flex; flex-wrap: wrap; gap: 8px; margin: 10px 0; }
.sv-num { flex: 1 1 150px; padding: 6px 10px; border-radius: 6px; background: rgba(127, 127, 127, 0.12); }
.sv-num b { display: block; font-size: 26px; font-variant-numeric: tabular-nums; }
.sv-num span { font-size: 15px; }
.sv-warn { font-size: 16px; opacity: 0.9; }
.sv-card { font-size: 16px; }
.sv-card .sv-no { color: #D55E00; font-weight: 700; }
"""
ENGINES = tuple(ENGINE_SOURCES)  # the card's engines, in its order: one code block each
HELP = (
    "The check loads both models, compares their tokenizers id by id, times one step of each (the cost ratio "
    "c), and runs greedy speculative decoding on a few sample prompts to measure how often the target keeps "
    "the draft's guesses (the acceptance a). Hub models need internet access on the server."
)


def _preset(label: str):
    return next((p for p in PRESETS if p.label == label), None)


def _short(name: str) -> str:
    return {BUILTIN_TARGET: "built-in target", BUILTIN_DRAFT: "built-in draft"}.get(name, name)


def _num(value: str, caption: str) -> str:
    return f'<div class="sv-num"><b>{html.escape(value)}</b><span>{html.escape(caption)}</span></div>'


def report_html(r: PairReport) -> str:
    """Verdict, reasons, the measured numbers and any warnings; every name and sentence escaped."""
    icon, color, words = BADGES.get(r.verdict, ("?", "#000000", r.verdict))
    size = "a served target" if r.served else f"{r.param_ratio:.2g}× the target's size"
    head = (
        f'<span class="sv-badge" style="color:{color}">{icon} {html.escape(words)}</span>'
        f"<div>target p: <b>{html.escape(_short(r.target))}</b> "
        f"({html.escape('served' if r.served else memory_words(r.target_params, r.target_precision, r.target_memory_bytes))}) · "
        f"draft q: <b>{html.escape(_short(r.draft))}</b> "
        f"({html.escape(memory_words(r.draft_params, r.draft_precision, r.draft_memory_bytes))}; "
        f"{size}; {html.escape(r.device)})</div>"
    )
    reasons = "".join(f"<li>{html.escape(x)}</li>" for x in r.reasons)
    nums = ""
    if r.acceptance is not None and r.c is not None:
        acc = r.acceptance
        nums = (
            '<div class="sv-nums">'
            + "".join(
                [
                    _num(
                        f"{acc.a:.2f}",
                        f"acceptance a: {acc.accepted} of {acc.tested} judged guesses kept "
                        f"(95% interval {acc.low:.2f}–{acc.high:.2f}; {r.drafter} drafter, greedy, gamma "
                        f"{CHECK_GAMMA}, {r.prompts} prompts)",
                    ),
                    _num(
                        f"{r.c:.2f}",
                        f"cost ratio c: a draft step {r.draft_step_s * 1e3:.1f} ms, "
                        f"a target step {r.target_step_s * 1e3:.1f} ms",
                    ),
                    _num(f"{r.best_gamma}", "recommended gamma"),
                    _num(f"{r.best_speedup:.2f}×", "expected speedup at that gamma"),
                ]
                + (
                    [
                        _num(
                            f"{r.prefill_speedup:.2f}×",
                            f"the same with the prompt's prefill counted, as the race times a run of up to "
                            f"{r.max_new_tokens} tokens",
                        )
                    ]
                    if r.prefill_speedup is not None
                    else []
                )
                + (
                    [
                        _num(
                            f"{r.measured_speedup:.2f}×",
                            f"measured at gamma {CHECK_GAMMA} (the check's runs; "
                            f"expected there {r.speedups_measured[CHECK_GAMMA - 1]:.2f}×)",
                        )
                    ]
                    if r.measured_speedup is not None and r.speedups_measured
                    else []
                )
            )
            + "</div>"
        )
    if r.acceptance is not None and r.acceptance.by_kind:
        kinds = " · ".join(
            f"{html.escape(k.kind)} <b>{k.a:.2f}</b> ({k.low:.2f}–{k.high:.2f})" for k in r.acceptance.by_kind
        )
        nums += f'<p class="sv-kinds">Acceptance by kind of prompt (95% intervals): {kinds}</p>'
    if r.speedups_measured:
        v = r.verify_costs[r.best_gamma - 1]
        nums += (
            f'<p class="sv-warn">The prediction prices a round of each gamma from the rounds the check ran on this '
            f"machine, in single-token target steps: a verify over {r.best_gamma + 1} tokens {v:.2f}, drafting one "
            f"guess {r.draft_cost:.2f}, the work paid once a round (re-tokenising, the decode loop's own) "
            f"{r.round_overhead:.2f}, and a plain decoding step {r.plain_cost:.2f}. The textbook formula (a verify "
            f"costs one step, nothing else costs anything) gives {r.speedups[r.best_gamma - 1]:.2f}× at this gamma.</p>"
        )
    if r.translation:  # a draft with another tokenizer
        cost = (
            f" Re-tokenising cost {r.translate_cost:.2f} target steps a round." if r.translate_cost is not None else ""
        )
        nums += (
            f'<p class="sv-translation">Another tokenizer: the draft has <b>{r.coverage:.0%}</b> of the target\'s '
            f"vocabulary by string ({r.draft_share:.0%} of its own tokens are the target's). Greedy: "
            f"{html.escape(r.translation)}. At temperature above 0: {html.escape(r.sampling_translation)}.{cost}</p>"
        )
    if r.served and r.engine_step_s:
        nums += (
            f'<p class="sv-warn">Served target {html.escape(r.served)}: a one-token request takes '
            f"{r.target_step_s * 1e3:.1f} ms (the round trip and the engine's step; the engine's own step inside one "
            f"request is {r.engine_step_s * 1e3:.1f} ms), and each verify request recomputes the text so far "
            f"(prompt logprobs skip vLLM's prefix cache). With this draft here, one request per round: "
            f"{r.best_speedup:.2f}× at gamma {r.best_gamma}. If the engine drafted with it itself (no round trip "
            f"per round, textbook costs): {r.engine_speedup:.2f}× at gamma {r.engine_best_gamma}.</p>"
        )
    warn = ""
    if r.warnings:
        warn = (
            '<div class="sv-warn"><b>Worth knowing:</b><ul>'
            + "".join(f"<li>{html.escape(w)}</li>" for w in r.warnings)
            + "</ul></div>"
        )
    return f'<div class="sv-verdict">{head}<ul>{reasons}</ul>{nums}{warn}</div>'


def card_head_html(card: dict | None) -> str:
    """The card's headline and the command to run first (DeployCard.to_dict()); what to say where there is none."""
    if not card:
        return '<div class="sv-card">No deploy card: the check measured nothing to deploy.</div>'
    first = f"<br>First: <code>{html.escape(card['prepare'])}</code>" if card.get("prepare") else ""
    proven = f"<br>Proven: {html.escape(card['proven'])}." if card.get("proven") else ""
    expect = f"<br>Expect: {html.escape(card['expect'])}." if card.get("expect") else ""
    return f'<div class="sv-card"><b>Deploy it:</b> {html.escape(card["headline"])}.{first}{expect}{proven}</div>'


def engine_notes_html(engine: dict) -> str:
    """One engine's constraints, one sentence each, and whether it can run the pair as checked."""
    no = '<p class="sv-no">✗ cannot run this as checked</p>' if not engine["runs"] else ""
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in engine["notes"])
    return f'<div class="sv-card">{no}<ul>{notes}</ul></div>' if notes or no else ""


def card_updates(numbers: dict | None) -> list:
    """The card's components from the check's JSON (its "deploy" entry): the headline, then per engine its code
    block (a copy button on each) and its notes; all hidden where the check failed."""
    if not numbers:
        return [gr.HTML(visible=False)] + [gr.Code(visible=False), gr.HTML(visible=False)] * len(ENGINES)
    card = numbers.get("deploy")
    out: list = [gr.HTML(card_head_html(card), visible=True)]
    engines = {e["engine"]: e for e in (card or {}).get("engines", ())}
    for name in ENGINES:
        e = engines.get(name)
        if e is None:
            out += [gr.Code(visible=False), gr.HTML(visible=False)]
            continue
        label = f"{name} (option names as in {e['checked']})"
        out += [
            gr.Code(e["text"], language=e["language"], label=label, visible=True),
            gr.HTML(engine_notes_html(e), visible=True),
        ]
    return out


def build_pair_tab(ctx: UIContext) -> None:
    gr.Markdown("## Can these two models be paired?")
    gr.Markdown(HELP)
    first = PRESETS[0]
    with gr.Row():
        preset = gr.Dropdown([p.label for p in PRESETS] + [CUSTOM], value=first.label, label="Pair", scale=3)
        max_new = gr.Slider(8, min(64, ctx.limits.max_new_tokens), value=24, step=8, label="tokens per sample prompt")
        drafter = gr.Dropdown(list(CHECK_DRAFTERS), value="model", label="guesses from (drafter)", scale=1)
    with gr.Row():
        target = gr.Textbox(
            first.target,
            label="Target p: a Hugging Face id or a folder",
            max_lines=1,
            info="or a served target's address where the operator allows it: http://HOST:PORT/v1",
        )
        draft = gr.Textbox(first.draft, label="Draft q: a Hugging Face id or a folder", max_lines=1)
    with gr.Accordion("Advanced", open=False):
        quantize = gr.Dropdown(
            [NO_QUANTIZE, "4bit", "8bit"],
            value=ctx.quantize or NO_QUANTIZE,
            label="target weights: as saved, or 4-bit NF4 / 8-bit int8 with bitsandbytes (less memory; CPU too)",
        )
    run = gr.Button("Check pair", variant="primary", size="lg")
    verdict = gr.HTML(css_template=CSS, js_on_load=None)
    plot = gr.Plot(show_label=False, visible=False)
    card_head = gr.HTML(visible=False)
    card_parts = []
    for name in ENGINES:
        card_parts.append(gr.Code(label=name, interactive=False, buttons=["copy"], visible=False))
        card_parts.append(gr.HTML(visible=False))
    with gr.Accordion("All numbers", open=False):
        numbers = gr.JSON(show_label=False)

    def on_preset(label):
        p = _preset(label)
        return (p.target, p.draft) if p else (gr.skip(), gr.skip())

    @gpu
    def on_check(target, draft, max_new_tokens, drafter="model", quantize=None):
        try:
            n, _ = ctx.limits.check_run(max_new_tokens, 1)
            if drafter not in CHECK_DRAFTERS:
                raise SpecvizError(f"drafter must be one of {', '.join(CHECK_DRAFTERS)}, not {drafter!r}.")
            p, q = ctx.pair(target, draft, quantize)  # None (a client that does not send it): the default
            limit = ctx.limits.request_timeout_s  # the models are loaded: the measuring runs on the compute thread
            r = compute.call(check_pair, p, q, max_new_tokens=n, timeout_s=limit, drafter=drafter)
        except Exception as err:
            return error_html(err), gr.Plot(visible=False), None
        fig = None
        if r.speedups_measured:
            fig = speedup_figure(range(1, len(r.speedups_measured) + 1), r.speedups_measured, r.best_gamma)
        return report_html(r), gr.Plot(fig, visible=fig is not None), r.to_dict()

    preset.input(on_preset, preset, [target, draft], api_visibility="private", queue=False)
    for box in (target, draft):
        box.input(lambda: CUSTOM, None, preset, api_visibility="private", queue=False)
    run.click(
        on_check,
        [target, draft, max_new, drafter, quantize],
        [verdict, plot, numbers],
        api_name="check",
        concurrency_id="models",
    ).then(card_updates, numbers, [card_head, *card_parts], api_visibility="private", queue=False)
