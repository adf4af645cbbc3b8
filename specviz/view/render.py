"""Events -> HTML for the race panes: every token escaped, every speculative token coloured by its fate.

Names as in the papers: p the target, q the draft, gamma the block size, n the accepted count, r the draw.
Classes the page (and the tests) rely on: `tok-ar` (plain side), `tok-accepted`, `tok-rejected`,
`tok-resampled`, `tok-bonus` (speculative side); each round is wrapped in `sv-round`.
No gradio import: the UI calls these functions and puts the strings in gr.HTML components.
"""

from __future__ import annotations

import html
import math

from specviz.engine.tally import Tally
from specviz.events import Done, Round, Step

NEWLINE = "⏎"
TAB = "⇥"


class Pieces:
    """Readable, escaped text of single tokens of one tokenizer (cached: a run repeats many tokens)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        self._cache: dict[tuple[int, bool], str] = {}

    def text(self, token_id: int) -> str:
        """The token as plain text a person can read (newline and tab as symbols, empty as ∅); not escaped."""
        raw = self.tok.decode([token_id], skip_special_tokens=False)
        shown = raw.replace("\r", "␍").replace("\t", TAB).replace("\n", NEWLINE)
        return shown if shown else "∅"

    def html(self, token_id: int, breaks: bool = True) -> str:
        """Escaped HTML; with `breaks` a newline also breaks the line (not for rejected tokens: they never happened)."""
        key = (token_id, breaks)
        if key not in self._cache:
            out = html.escape(self.text(token_id))
            if breaks:
                out = out.replace(NEWLINE, NEWLINE + "<br>")
            self._cache[key] = out
        return self._cache[key]

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special


SOURCES = {
    "model": "proposed by the draft model q",
    "lookup": "proposed by prompt lookup: copied from what followed the same words earlier (a free guess)",
    "head": "proposed by the draft head: one small block reading the target's own last hidden state",
    "model+head": "proposed by the draft model and the head together (a first guess from both, the rest the draft's)",
}
STATES = {  # what a screen reader says before a speculative token's text (its accessible name)
    "tok-accepted": "accepted",
    "tok-rejected": "rejected, not in the text",
    "tok-resampled": "resampled",
    "tok-bonus": "bonus",
    "tok-plain": "plain step",
}


def _span(
    cls: str, body: str, title: str, special: bool = False, text: str = "", source: str = "", branch: int = 0
) -> str:
    extra = (" tok-special" if special else "") + (f" src-{source}" if source == "lookup" else "")
    extra += " tok-branch" if branch else ""
    name = ""
    if cls in STATES and text:  # the state in the accessible name, not only in the colour
        how = " (a free guess from prompt lookup)" if source == "lookup" else ""
        how += f" (from a branch: the draft's guess number {branch + 1} there)" if branch else ""
        name = f' role="img" aria-label="{html.escape(f"{STATES[cls]}: {text}{how}", quote=True)}"'
    return f'<span class="tok {cls}{extra}" title="{html.escape(title, quote=True)}"{name}>{body}</span>'


def _source(rnd: Round, i: int) -> str:
    return rnd.sources[i] if i < len(rnd.sources) else ""


def ar_token_html(pieces: Pieces, step: Step, greedy: bool) -> str:
    how = "greedy: the target's top token" if greedy else f"sampled from the target: p(x) = {step.p:.3f}"
    title = f"step {step.index + 1} · {pieces.text(step.token)}\n{how}\none target forward call ({step.forward_s * 1000:.0f} ms)"
    return _span("tok-ar", pieces.html(step.token), title, pieces.is_special(step.token))


def _draft_title(rnd: Round, i: int, greedy: bool, accepted: bool, shown: str, top: str = "") -> str:
    head = f"round {rnd.index + 1}, proposal {i + 1} of {len(rnd.drafted)}: {shown}"
    if _source(rnd, i) in SOURCES:
        head += f"\n{SOURCES[_source(rnd, i)]}"
    if i < len(rnd.origins) and rnd.origins[i]:  # a draft with another tokenizer: what it wrote in its own tokens
        head += f"\ntranslated from the draft's own tokens: {rnd.origins[i]}"
    if greedy:
        why = (
            "greedy: accepted because it equals the target's top token"
            if accepted
            else f"greedy: rejected because the target's top token here is {top or 'a different one'}"
        )
        return f"{head}\n{why}"
    q, p, a, r = rnd.q[i], rnd.p[i], rnd.accept_prob[i], rnd.r[i]
    verdict = f"draw r = {r:.3f} < {a:.3f} → accepted" if accepted else f"draw r = {r:.3f} ≥ {a:.3f} → rejected"
    if math.isnan(r):
        verdict = "accepted" if accepted else "rejected"
    return (
        f"{head}\nq(x) = {q:.3f}  (draft's probability)\np(x) = {p:.3f}  (target's probability)\n"
        f"acceptance probability min(1, p/q) = {a:.3f}\n{verdict}"
    )


def round_html(pieces: Pieces, rnd: Round, greedy: bool) -> str:
    """One round: accepted drafts, then the rejected proposal (struck through), then the target's token."""
    parts = []
    n, emitted = rnd.n, len(rnd.tokens)
    tree = rnd.tree
    for i, token in enumerate(rnd.tokens[:n]):
        title = _draft_title(rnd, i, greedy, True, pieces.text(token))
        rank = tree.ranks[tree.path[i]] if tree is not None else 0  # a token tree: its rank at the branch
        if rank:
            title += f"\nfrom a branch: the draft's guess number {rank + 1} here, not its first (a token tree)"
        parts.append(
            _span(
                "tok-accepted",
                pieces.html(token),
                title,
                pieces.is_special(token),
                pieces.text(token),
                _source(rnd, i),
                rank,
            )
        )
    if emitted == n + 1:  # the target's own token was emitted (not cut off by EOS or the budget)
        token = rnd.tokens[n]
        if rnd.kind == "plain":
            why = {
                "no match": "prompt lookup found no earlier occurrence of the last words",
                "confidence": "the draft was not confident enough to guess",
            }.get(rnd.stop, "nothing was proposed")
            title = f"round {rnd.index + 1}: {pieces.text(token)}\nno guess this round ({why}): one plain target step"
            parts.append(_span("tok-plain", pieces.html(token), title, pieces.is_special(token), pieces.text(token)))
        elif n < len(rnd.drafted):
            rejected = rnd.drafted[n]
            title = _draft_title(rnd, n, greedy, False, pieces.text(rejected), repr(pieces.text(token)))
            later = len(rnd.drafted) - n - 1
            if later:
                plural = "s were" if later > 1 else " was"
                title += f"\n(the draft's {later} later proposal{plural} thrown away too)"
            parts.append(
                _span(
                    "tok-rejected",
                    pieces.html(rejected, breaks=False),
                    title,
                    False,
                    pieces.text(rejected),
                    _source(rnd, n),
                )
            )
            how = (
                "greedy: the target's top token here"
                if greedy
                else "sampled from the target's corrected distribution norm(max(0, p − q))"
            )
            title = f"round {rnd.index + 1}: {pieces.text(token)}\nresampled: replaces the rejected proposal\n{how}"
            parts.append(
                _span("tok-resampled", pieces.html(token), title, pieces.is_special(token), pieces.text(token))
            )
        else:
            title = (
                f"round {rnd.index + 1}: {pieces.text(token)}\nbonus: all {n} proposals were accepted, and the "
                "same target call already scored the next position, so this token is free"
            )
            parts.append(_span("tok-bonus", pieces.html(token), title, pieces.is_special(token), pieces.text(token)))
    ms = (rnd.draft_s + rnd.verify_s) * 1000
    return (
        f'<span class="sv-round sv-round-{rnd.index % 2}" data-round="{rnd.index + 1}" '
        f'data-gamma="{len(rnd.drafted)}" data-stop="{html.escape(rnd.stop, quote=True)}" '
        f'data-ms="{ms:.0f}">{"".join(parts)}</span>'
    )


def _finish_text(done: Done | None) -> str:
    if done is None:
        return ""
    return "end of text" if done.finish_reason == "eos" else "token limit"


def pane_html(side: str, body: str, clock_s: float, done: Done | None, waiting: str = "", label: str = "") -> str:
    """A whole pane: a header with the side's own clock, the tokens, and a finish line when done.

    side: "ar", "spec" or "spec2" (a second speculative lane); label: the lane's configuration, e.g. "lookup, auto".
    """
    title = "Plain decoding (target only)" if side == "ar" else f"Speculative ({label or 'draft + target'})"
    state = f"done at {clock_s:.2f} s ({_finish_text(done)})" if done else f"t = {clock_s:.2f} s"
    cursor = "" if done else '<span class="sv-cursor" aria-hidden="true"></span>'
    empty = f'<span class="sv-waiting">{html.escape(waiting)}</span>' if waiting and not body else ""
    status = "done" if done else "running"
    return (
        f'<div class="sv-pane sv-pane-{side}" data-state="{status}">'
        f'<div class="sv-pane-head"><span>{html.escape(title)}</span><span class="sv-clock">{state}</span></div>'
        f'<div class="sv-text">{empty}{body}{cursor}</div></div>'
    )


def prompt_html(prompt: str) -> str:
    """The visitor's prompt, echoed as text (escaped: a <script> prompt shows as text)."""
    return f'<div class="sv-prompt"><b>Prompt</b> <span class="sv-prompt-text">{html.escape(prompt)}</span></div>'


def plain_stat_items(t: Tally) -> list[tuple[str, str]]:
    """The numbers under a plain pane (the race, a replay, an exported page), from the lane's Tally."""
    return [(str(t.new_tokens), "tokens"), (f"{t.tokens_per_s:.1f}", "tokens/s"), (str(t.target_calls), "target calls")]


ACCEPTANCE_LABELS = {  # (accepted / drafted, alpha) under a lane of chains and of token trees
    "chain": ("guesses accepted", "α: kept of those checked"),
    "tree": ("of all tree guesses kept (branches not taken count)", "α: kept of those the target checked"),
}


def spec_stat_items(t: Tally) -> list[tuple[str, str]]:
    """The numbers under a speculative pane (the race, a replay, an exported page), from the lane's Tally. A lane
    that ran token trees names its two acceptance figures apart: a tree guesses several tokens per position, so
    the share of all its guesses kept is far below alpha, the share kept of those the target ruled on."""
    accepted, alpha_label = ACCEPTANCE_LABELS["tree" if t.tree_rounds else "chain"]
    return [
        (str(t.new_tokens), "tokens"),
        (f"{t.tokens_per_s:.1f}", "tokens/s"),
        (str(t.target_calls), "target calls"),
        (f"{t.acceptance_rate:.0%}" if t.drafted else "—", accepted),
        (f"{t.alpha:.0%}" if t.judged else "—", alpha_label),
        (f"{t.tokens_per_call:.2f}" if t.target_calls else "—", "tokens per target call"),
    ]


def speedup_item(t: Tally, plain: Tally) -> tuple[str, str]:
    """A speculative lane's tokens per second over the plain lane's (each on its own compute clock)."""
    ok = t.new_tokens and plain.new_tokens and plain.tokens_per_s
    return (f"{t.tokens_per_s / plain.tokens_per_s:.2f}×" if ok else "—", "speedup (tokens/s vs plain)")


def stats_html(items: list[tuple[str, str]]) -> str:
    """Numbers under a pane: (value, label) pairs."""
    cells = "".join(
        f'<div class="sv-stat"><b>{html.escape(v)}</b><span>{html.escape(k)}</span></div>' for v, k in items
    )
    return f'<div class="sv-stats">{cells}</div>'


LEGEND = (
    ("tok-accepted", "word", "accepted", "the draft guessed it and the target agreed: it came almost for free"),
    (
        "tok-rejected",
        "word",
        "rejected",
        "the draft guessed it, the target said no (crossed out: it is not in the text)",
    ),
    ("tok-resampled", "word", "resampled", "the target's own choice in place of the rejected guess"),
    ("tok-bonus", "word", "bonus", "every guess in the round was accepted, so the target adds one more token free"),
    (
        "tok-accepted src-lookup",
        "word",
        "from prompt lookup",
        "a free guess copied from earlier text (drafter: lookup)",
    ),
    ("tok-plain", "word", "plain step", "no guess this round (nothing to look up, or the draft was unsure)"),
    (
        "tok-accepted tok-branch",
        "word",
        "from a branch",
        "with a token tree: a kept guess that was not the draft's first guess at its branch",
    ),
)


def legend_html() -> str:
    """What the colours and marks mean, in words; the marks differ in shape too, not only in colour."""
    items = "".join(
        f'<li><span class="tok {cls}">{sample}</span> <b>{name}</b>: {html.escape(text)}</li>'
        for cls, sample, name, text in LEGEND
    )
    rounds = (
        '<li><span class="sv-round sv-round-0"><span class="tok tok-accepted">one</span></span>'
        '<span class="sv-round sv-round-1"><span class="tok tok-accepted">round</span></span> '
        "<b>rounds</b>: each shaded block is one round, i.e. one call of the big target model</li>"
    )
    return (
        f'<div class="sv-legend"><ul>{items}{rounds}</ul>'
        "<p>Hover over a token to see the draft's probability q(x), the target's p(x), the chance "
        "min(1, p/q) of keeping it and the random draw r that decided. A draft with another tokenizer than the "
        "target's writes in its own tokens; its text is translated into the target's, and the hover shows the "
        "draft's own tokens each guess came from.</p></div>"
    )
