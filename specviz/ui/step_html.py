"""HTML for the Step-through tab (no gradio): the explanation, the round's words, text, table and checks.

Every piece of model or visitor text goes through html.escape (tokens via render.Pieces or `quote`).
Colours are Okabe-Ito with a second cue (icons, hatching, line styles); fonts are large for projection.
"""

from __future__ import annotations

import html

from specviz.events import Round
from specviz.teach.compute import GreedyCheck, SampleCheck, Stepper, describe_round, describe_tree_round, label, prob
from specviz.ui.tree_html import TREE_LEGEND, ranks_html, tree_html
from specviz.view.render import Pieces, round_html

START = '<div class="sv-say">Press <b>Next round</b> to let the draft make its first guesses.</div>'
EXACT_HELP = (
    '<p class="sv-help">Uses the prompt and settings above. At temperature 0 it writes the answer twice, with '
    "speculative decoding and with the target alone, and compares them token by token. Above 0 it draws the first "
    "token of the answer many times and compares how often each token comes out with p and with q.</p>"
)
TIME_HELP = (
    '<p class="sv-help">Times one target forward pass over 1, 2, … gamma + 1 new tokens on this machine, after the '
    "prompt is cached: the shape of a verify pass.</p>"
)
EXPLAIN = """<div class="sv-explain">
<h3>What is happening?</h3>
<p><b>The draft (q)</b> is a small, fast model. Each round it <i>guesses</i> the next gamma tokens, one
after another.</p>
<p><b>One target pass checks every guess.</b> The big model (p) reads a whole sequence at once: given the
text plus the gamma guesses, one forward pass gives its probabilities at every guessed position, and one
more. On a GPU that pass takes about as long as writing a single token, so every kept guess is nearly free.</p>
<p><b>Why the answer does not change.</b> A guess x is kept with chance min(1, p(x)/q(x)); a random draw r
decides. So it is never kept more often than the target itself would pick it. At the first rejection the
target draws a replacement from the leftover max(0, p − q): the probability the draft offered too little
of. Together, every token comes out with exactly the target's probability p. At temperature 0 a guess is
kept only if it is the target's own top choice, so the text is the target's, word for word. The panel
below checks both claims with these models.</p>
<p><b>Reading the view.</b> ▶ the draft's guess, ↻ the target's replacement, ★ the free bonus token.
Blue solid bars: the target p. Orange hatched bars: the draft q. Green dotted bars: the leftover.</p>
</div>"""
CSS = """
.sv-explain { font-size: 18px; line-height: 1.55; }
.sv-explain h3 { font-size: 22px; margin: 0 0 8px; }
.sv-explain p { margin: 0 0 12px; }
.sv-say { font-size: 20px; line-height: 1.5; padding: 10px 14px; border-left: 6px solid #0072B2;
  background: rgba(0, 114, 178, 0.07); border-radius: 4px; }
.sv-say b { font-size: 22px; }
.sv-step-text { font-size: 22px; line-height: 2.1; white-space: pre-wrap; word-break: break-word;
  padding: 10px 14px; border: 1px solid #ccc; border-radius: 8px; min-height: 90px; }
.sv-now { outline: 3px solid #000; outline-offset: 2px; border-radius: 4px; }
.sv-old { color: inherit; }
.sv-legend-s { font-size: 17px; display: flex; flex-wrap: wrap; gap: 6px 20px; margin-top: 8px; }
.sv-draws { width: 100%; border-collapse: collapse; font-size: 19px; }
.sv-draws th, .sv-draws td { padding: 6px 8px; border-bottom: 1px solid #ddd; text-align: left; }
.sv-draws th { font-size: 16px; }
.sv-draws .num { font-variant-numeric: tabular-nums; }
.sv-track { position: relative; height: 22px; width: 180px; border: 2px solid #000; border-radius: 3px;
  background: #fff; display: inline-block; vertical-align: middle; }
.sv-zone { position: absolute; left: 0; top: 0; bottom: 0; background: repeating-linear-gradient(45deg,
  rgba(0, 158, 115, 0.55) 0 6px, rgba(0, 158, 115, 0.25) 6px 12px); }
.sv-r { position: absolute; top: -6px; bottom: -6px; width: 4px; margin-left: -2px; background: #000; }
.sv-kept td:last-child { color: #006b4f; font-weight: 700; }
.sv-rej td:last-child { color: #b34700; font-weight: 700; }
.sv-gone { opacity: 0.55; }
.sv-fix td { font-weight: 600; background: rgba(230, 159, 0, 0.12); }
.sv-out { font-size: 18px; line-height: 1.5; }
.sv-help { font-size: 17px; line-height: 1.45; margin: 0 0 6px; }
.sv-cap { font-size: 16px; margin: 6px 0 0; opacity: 0.85; }
.sv-out .sv-line { white-space: pre-wrap; border: 1px solid #ccc; border-radius: 6px; padding: 6px 10px; margin: 4px 0; }
.sv-tree { display: flex; align-items: center; overflow-x: auto; font-size: 18px; padding: 8px 2px; }
.sv-tree ul { list-style: none; margin: 0; padding: 0 0 0 22px; display: flex; flex-direction: column; }
.sv-tree li { display: flex; align-items: center; position: relative; margin: 0; padding: 3px 0; font-size: 18px; }
.sv-tree li::before { content: ""; position: absolute; left: -16px; top: 50%; width: 14px; border-top: 2px solid #999; }
.sv-tree li::after { content: ""; position: absolute; left: -16px; top: 0; bottom: 0; border-left: 2px solid #999; }
.sv-tree li:first-child::after { top: 50%; }
.sv-tree li:last-child::after { bottom: 50%; }
.sv-tree li:only-child::after { display: none; }
.sv-tree li.sv-t-on::before { border-top: 5px solid #009E73; margin-top: -2px; }
.sv-tn { display: inline-block; font-size: 18px; line-height: 1.3; padding: 2px 6px; border-radius: 6px; border: 2px solid #888; white-space: nowrap;
  cursor: help; background: #fff; color: #000; }
.sv-tn:hover, .sv-tn:focus { outline: 3px solid #000; outline-offset: 2px; }
.sv-tn sup { font-size: 0.6em; margin-left: 3px; opacity: 0.85; }
.sv-t-root { background: #eee; border-style: solid; font-style: italic; }
.sv-t-kept { border: 3px solid #009E73; background: rgba(0, 158, 115, 0.16); font-weight: 700; }
.sv-t-rejected { border: 2px dashed #D55E00; color: #a33f00; text-decoration: line-through 2px #D55E00; }
.sv-t-untested { border: 2px dotted #999; color: #666; opacity: 0.75; }
.sv-t-fix { border: 3px double #9a6a00; background: rgba(230, 159, 0, 0.30); font-weight: 700; }
.sv-t-bonus { border: 2px solid #a3527f; background: rgba(204, 121, 167, 0.28); font-weight: 700; }
.sv-tree-legend { font-size: 17px; display: flex; flex-wrap: wrap; gap: 6px 20px; margin: 4px 0 10px; }
.sv-ranks { border-collapse: collapse; font-size: 18px; margin-top: 6px; }
.sv-ranks th, .sv-ranks td { padding: 4px 10px; border-bottom: 1px solid #ddd; text-align: left; }
.sv-bar { display: inline-block; height: 14px; background: #0072B2; vertical-align: middle; margin-right: 6px;
  border: 1px solid #004a75; }
"""
# The tree's hover card: a node's numbers (its title) in large type beside it, on hover or keyboard focus, for a
# class reading a projector (a browser's own tooltip is small and slow). position: fixed, so the tree's scrolling
# box does not clip it; textContent, so no node text is parsed as HTML; the title moves to aria-label so the
# browser's tooltip does not show on top. Runs once per component (gradio's js_on_load, `element` its root).
TIP_JS = r"""
const card = () => {
  let c = document.getElementById('sv-tipcard');
  if (!c) {
    c = document.createElement('div');
    c.id = 'sv-tipcard';
    c.setAttribute('role', 'tooltip');
    document.body.appendChild(c);
  }
  return c;
};
const show = (n) => {
  if (n.title) { n.dataset.tip = n.title; n.setAttribute('aria-label', n.title); n.removeAttribute('title'); }
  if (!n.dataset.tip) return;
  const c = card();
  c.textContent = n.dataset.tip;
  c.style.display = 'block';
  const r = n.getBoundingClientRect(), w = c.offsetWidth, h = c.offsetHeight;
  const top = r.bottom + 8 + h <= window.innerHeight ? r.bottom + 8 : Math.max(4, r.top - h - 8);
  c.style.top = top + 'px';
  c.style.left = Math.max(4, Math.min(r.left, window.innerWidth - w - 4)) + 'px';
};
const hide = () => { const c = document.getElementById('sv-tipcard'); if (c) c.style.display = 'none'; };
const nodeOf = (e) => (e.target && e.target.closest ? e.target.closest('.sv-tn') : null);
element.addEventListener('mouseover', (e) => { const n = nodeOf(e); if (n) show(n); else hide(); });
element.addEventListener('mouseleave', hide);
element.addEventListener('focusin', (e) => { const n = nodeOf(e); if (n) show(n); });
element.addEventListener('focusout', hide);
"""
LEGEND = (
    '<div class="sv-legend-s"><span><span class="tok tok-accepted">kept</span> a guess the target kept</span>'
    '<span><span class="tok tok-rejected">no</span> a guess it rejected (not in the text)</span>'
    '<span><span class="tok tok-resampled">fix</span> the target\'s replacement</span>'
    '<span><span class="tok tok-bonus">free</span> the bonus token</span>'
    '<span><span class="sv-now">&nbsp;box&nbsp;</span> this round</span></div>'
)


def quote(text: str) -> str:
    """A token in quotes, spaces and newlines made visible, escaped."""
    return f"“{html.escape(label(text))}”"


def text_html(pieces: Pieces, rounds: list[Round], greedy: bool) -> str:
    """The answer so far: earlier rounds as plain text, this round coloured by each token's fate and boxed."""
    old = "".join(pieces.html(t) for r in rounds[:-1] for t in r.tokens)
    now = f'<span class="sv-now">{round_html(pieces, rounds[-1], greedy)}</span>' if rounds else ""
    return f'<div class="sv-step-text"><span class="sv-old">{old}</span>{now}</div>{LEGEND}'


def draws_html(
    rd: Round, name, greedy: bool, relaxed_w: float = 1.0, rounds: list[Round] | None = None, last: str = ""
) -> str:
    """One row per guess: q(x), p(x), the draw r against min(1, p/q), and what happened; then the target's token.
    A tree round shows its tree instead, and the chart of what was kept by depth and rank."""
    if rd.tree is not None:
        how = (
            "Temperature 0: at each branch the walk keeps the guess that is the target's top choice."
            if greedy
            else "At each branch the walk tests the guesses in order, keeping one with chance min(1, p/q); after a "
            "turned-down guess p becomes what is left, max(0, p − q), renormalised. Hover over a guess for its numbers."
        )
        return (
            tree_html(rd, name, greedy, last)
            + TREE_LEGEND
            + f'<p class="sv-cap">{how}</p>'
            + ranks_html(rounds or [rd], greedy)
        )
    g, n = len(rd.drafted), rd.n
    if greedy:
        head = "<th>#</th><th>draft's guess</th><th>target's top choice</th><th>result</th>"
    else:
        against = "p(x) target" if relaxed_w >= 1 else f"{relaxed_w:.2f}·p + {1 - relaxed_w:.2f}·q (not exact)"
        head = (
            f"<th>#</th><th>draft's guess x</th><th>q(x) draft</th><th>{against}</th>"
            "<th>keep if r &lt; min(1, p/q)</th><th>result</th>"
        )
    rows = []
    for i, x in enumerate(rd.drafted):
        if i < n:
            cls, result = "sv-kept", "✓ kept"
        elif i == n:
            cls, result = "sv-rej", "✗ rejected"
        else:
            cls, result = "sv-gone", "– thrown away"
        cells = f"<td>{i + 1}</td><td>{quote(name(x))}</td>"
        if greedy:
            top = rd.candidates[i].token_ids[0] if rd.candidates else (x if i < n else rd.correction)
            cells += f"<td>{quote(name(top)) if i <= n else '–'}</td>"
        elif i <= n:
            a, r = rd.accept_prob[i], rd.r[i]
            track = (
                f'<span class="sv-track" title="green: keep zone; black line: r"><span class="sv-zone" '
                f'style="width:{100 * a:.1f}%"></span><span class="sv-r" style="left:{100 * r:.1f}%"></span></span>'
            )
            sign = "&lt;" if r < a else "≥"
            cells += (
                f'<td class="num">{prob(rd.q[i])}</td><td class="num">{prob(rd.p[i])}</td>'
                f'<td class="num">{track}<br>r = {r:.2f} {sign} {prob(a) if a < 1 else "1"}</td>'
            )
        elif i == n + 1:
            cells += (
                f'<td colspan="3" rowspan="{len(rd.drafted) - i}">not examined: they came after a rejected guess</td>'
            )
        rows.append(f'<tr class="{cls}">{cells}<td>{result}</td></tr>')
    span = 3 if greedy else 5
    if len(rd.tokens) == n + 1:
        if n == g:
            how = "the target's top choice at the next position" if greedy else "drawn from p"
            fix = f"★ bonus token {quote(name(rd.correction))}: every guess was kept, so the same pass adds one more ({how})"
        else:
            how = "the target's own top choice" if greedy else "drawn from the leftover max(0, p − q)"
            fix = f"↻ in place of guess {n + 1}: {quote(name(rd.correction))}, {how}"
        rows.append(f'<tr class="sv-fix"><td></td><td colspan="{span}">{fix}</td></tr>')
    table = f'<table class="sv-draws"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    if greedy:
        return (
            table + '<p class="sv-cap">Temperature 0: a guess is kept exactly when it is the target\'s top choice.</p>'
        )
    return table + (
        '<p class="sv-cap">In each bar the green zone is the chance of keeping the guess, min(1, p/q), and the black '
        "line is the random draw r: the guess is kept when the line falls inside the green zone.</p>"
    )


def say_html(st: Stepper, pieces: Pieces, rd: Round | None, note: str = "") -> str:
    """What this round did, in plain words; and, once the answer is complete, how many passes it took."""
    parts = []
    if note:
        parts.append(f"<p>{html.escape(note)}</p>")
    if rd is not None and rd.tree is not None:
        text = describe_tree_round(rd, pieces.text, st.settings.temperature == 0)
        parts.append(f"<b>Round {rd.index + 1}.</b> {html.escape(text)}")
    elif rd is not None:
        text = describe_round(rd, [pieces.text(t) for t in (*rd.drafted, rd.correction)], st.settings.temperature == 0)
        parts.append(f"<b>Round {rd.index + 1}.</b> {html.escape(text)}")
    if st.done is not None:
        total, rounds = len(st.done.token_ids), len(st.rounds)
        why = "the model ended its answer" if st.done.finish_reason == "eos" else f"this view stops at {total} tokens"
        parts.append(
            f"<p><b>Done:</b> {why}. {total} tokens in {rounds} target passes "
            f"({total / max(rounds, 1):.2f} per pass; plain decoding needs one pass per token). Press Reset to start again.</p>"
        )
    return f'<div class="sv-say">{"".join(parts)}</div>'


def greedy_html(gc: GreedyCheck, pieces: Pieces) -> str:
    """Temperature 0: the two texts one above the other, and whether they are identical."""
    spec = "".join(pieces.html(t) for t in gc.spec_ids)
    ar = "".join(pieces.html(t) for t in gc.ar_ids)
    if gc.identical:
        head = (
            f"✓ <b>Identical.</b> At temperature 0, speculative decoding and the target alone wrote the same "
            f"{len(gc.ar_ids)} tokens, token for token."
        )
    else:
        i = gc.first_difference
        head = (
            f"✗ <b>They differ at token {i + 1}.</b> Exact greedy equality should hold; a near-tie between two "
            "tokens, broken differently by rounding in a batched pass, is the usual cause."
        )
    return (
        f'<div class="sv-say sv-out">{head}<div><b>Speculative (draft + target):</b></div><div class="sv-line">{spec}</div>'
        f'<div><b>Target alone:</b></div><div class="sv-line">{ar}</div></div>'
    )


def sample_html(sc: SampleCheck) -> str:
    """Temperature > 0: distances of the output to p and to q, the chance floor, and the real-run cross-check."""
    tv_pq = 0.5 * float((sc.p - sc.q).abs().sum())
    like_p = sc.tv_p <= 1.5 * sc.tv_noise + 0.01  # as close to p as perfect samples of p would be
    if sc.relaxed_w < 1:
        drift = (
            "✗ <b>The output drifted from" if not like_p else "⚠ <b>With these draws the output is hard to tell from"
        )
        verdict = (
            f'<span class="sv-lossy">Relaxed verification (not exact), w = {sc.relaxed_w:.2f}</span> '
            f"{drift} the target p.</b> A guess is kept {sc.acceptance:.0%} of the time here "
            f"(exact verification: {sc.exact_acceptance:.0%}): that is the speed it buys, and the price is the "
            "distance to p below."
        )
    elif like_p and tv_pq > 2 * sc.tv_noise:
        verdict = "✓ <b>The output follows the target p, not the draft q.</b>"
    elif like_p:
        verdict = (
            f"✓ <b>The output matches the target p.</b> Here p and q are close (distance {tv_pq:.3f}), too close "
            f"to tell apart with {sc.draws} draws; a higher temperature or another prompt shows more."
        )
    else:
        verdict = "✗ <b>The output is further from p than chance usually allows;</b> run it again with more draws."
    lines = [
        f"{verdict} {sc.draws} speculative draws of the first token: the draft proposes x from q; x is kept with "
        "chance min(1, p/q); otherwise a token is drawn from max(0, p − q).",
        f"Distance to the target p: <b>{sc.tv_p:.3f}</b> (perfect samples from p would show about {sc.tv_noise:.3f} "
        f"by chance). Distance to the draft q: <b>{sc.tv_q:.3f}</b>. (Total variation distance: 0 means identical, "
        "1 means no overlap.)",
    ]
    if sc.real:
        agree = sc.real_agree
        mark = "✓" if agree == len(sc.real) else "✗"
        lines.append(
            f"{mark} {agree} of {len(sc.real)} real runs of the engine (seeds {sc.real[0][0]}–{sc.real[-1][0]}) gave the "
            "same first token as this math replayed on the same p and q."
        )
    body = "".join(f"<p>{x}</p>" for x in lines)
    return f'<div class="sv-say sv-out">{body}</div>'


def timing_html(sentence: str) -> str:
    return f'<div class="sv-say">{html.escape(sentence)}</div>'
