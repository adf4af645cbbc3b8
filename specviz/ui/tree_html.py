"""HTML for a round's token tree in the Step-through tab (no gradio): the tree drawn for a class, its legend, and
the session's acceptance by depth and by the draft's rank. Model text goes through html.escape."""

from __future__ import annotations

import html

from specviz.events import Round
from specviz.teach.compute import prob, rank_words
from specviz.view.metrics import TREE_RANKS, tree_acceptance

TREE_LEGEND = (
    '<div class="sv-tree-legend"><span><span class="sv-tn sv-t-kept">✓ kept</span> on the accepted path</span>'
    '<span><span class="sv-tn sv-t-rejected">✗ no</span> turned down</span>'
    '<span><span class="sv-tn sv-t-untested">· not reached</span> never tested</span>'
    '<span><span class="sv-tn sv-t-fix">↻ fix</span> drawn where the walk stopped</span>'
    '<span><span class="sv-tn sv-t-bonus">★ free</span> the bonus after a leaf</span>'
    "<span><sup>2nd</sup> the draft's 2nd choice at that branch (above temperature 0: its 2nd draw)</span></div>"
)


def _node_title(rd: Round, i: int, name, greedy: bool) -> str:
    """Hover text of a tree node: which choice it was, p, q, min(1, p/q) as tested, r, and what happened."""
    t = rd.tree
    lines = [f"“{name(t.tokens[i])}”: {rank_words(t.ranks[i], t.sources[i], greedy)} here (depth {t.depths[i]})"]
    lines.append(f"p(x) = {prob(t.p[i])} target · q(x) = {prob(t.q[i])} draft" + (" (read at T = 1)" if greedy else ""))
    st, a, r = t.status[i], t.accept_prob[i], t.r[i]
    if not st:
        lines.append("not tested: the walk kept another guess before it, or never reached its branch")
    elif greedy:
        lines.append(
            "kept: it is the target's top choice here" if st == "kept" else "turned down: not the target's top choice"
        )
    else:
        lines.append(f"keep if r < min(1, p/q) = {prob(a) if a < 1 else '1'} (p as left by the siblings tested before)")
        lines.append(f"r = {r:.2f} → {'kept' if st == 'kept' else 'turned down'}")
    return "\n".join(lines)


def tree_html(rd: Round, name, greedy: bool, last: str = "") -> str:
    """The round's token tree: the text's last token as the root, each guess a node (hover: p, q, min(1, p/q), r),
    the accepted path in green, turned-down guesses struck through, and the token drawn where the walk stopped."""
    t = rd.tree
    kids: dict[int, list[int]] = {}
    for i, par in enumerate(t.parents):
        kids.setdefault(par, []).append(i)
    stop = t.path[-1] if t.path else -1
    emitted = len(rd.tokens) == rd.n + 1

    def node(i: int) -> str:
        st = t.status[i] or "untested"
        mark = {"kept": "✓", "rejected": "✗", "untested": "·"}[st]
        r = t.ranks[i]
        rank = f"<sup>{r + 1}{'nd' if r == 1 else 'rd' if r == 2 else 'th'}</sup>" if r else ""
        title = html.escape(_node_title(rd, i, name, greedy), quote=True)
        body = f'<span class="sv-tn sv-t-{st}" tabindex="0" title="{title}">{mark} {html.escape(name(t.tokens[i]))}{rank}</span>'
        return f'<li class="{"sv-t-on" if st == "kept" else ""}">{body}{children(i)}</li>'

    def children(u: int) -> str:
        items = [node(i) for i in kids.get(u, [])]
        if u == stop and emitted:  # where the walk stopped: the target's own token
            bonus = not kids.get(u)
            how = (
                ("the target's top choice" if greedy else "drawn from p")
                if bonus
                else ("the target's top choice" if greedy else "drawn from what was left of p")
            )
            what = "bonus: the branch ended with every guess kept" if bonus else "in place of the guesses turned down"
            cls, mark = ("sv-t-bonus", "★") if bonus else ("sv-t-fix", "↻")
            title = html.escape(f"“{name(rd.correction)}”: {what}; {how}", quote=True)
            items.append(
                f'<li class="sv-t-on"><span class="sv-tn {cls}" tabindex="0" title="{title}">{mark} '
                f"{html.escape(name(rd.correction))}</span></li>"
            )
        return f"<ul>{''.join(items)}</ul>" if items else ""

    root = f'<span class="sv-tn sv-t-root" title="the text so far ends here">…{html.escape(last)}</span>'
    return f'<div class="sv-tree" role="group" aria-label="this round\'s tree of guesses">{root}{children(-1)}</div>'


def ranks_html(rounds: list[Round], greedy: bool = True) -> str:
    """A chart of the session's tree rounds: how often a guess was kept, by depth and by its rank at the branch."""
    table = tree_acceptance(rounds)
    if table.empty:
        return ""
    cell = {(r.depth, r.rank): r for r in table.itertuples()}
    head = "<th>depth</th>" + "".join(f"<th>{w} {'choice' if greedy else 'draw'}</th>" for w in TREE_RANKS)
    rows = []
    for d in sorted(table["depth"].unique()):
        cells = []
        for j in range(len(TREE_RANKS)):
            r = cell.get((d, j))
            if r is None:
                cells.append("<td>–</td>")
                continue
            cells.append(
                f'<td><span class="sv-bar" style="width:{80 * r.share:.0f}px"></span>{r.share:.0%} of {r.tested}</td>'
            )
        rows.append(f"<tr><td>{d}</td>{''.join(cells)}</tr>")
    return (
        "<p class=\"sv-cap\"><b>Kept, by depth and by the draft's choice at the branch</b> (this run's tree rounds: "
        "of the guesses the target tested, the share it kept)</p>"
        f'<table class="sv-ranks"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
