"""render.py: the token HTML of the panes: classes, escaping, hover text, the legend."""

from __future__ import annotations

import math
import re

import pytest
from conftest import make_tokenizer

from specviz.events import Done, Round, Step
from specviz.view import render

NAN = float("nan")


@pytest.fixture(scope="module")
def pieces():
    return render.Pieces(make_tokenizer(64, chat=True))


def tid(pieces, ch: str) -> int:
    return pieces.tok.convert_tokens_to_ids(ch)


def make_round(pieces, drafted: str, n: int, correction: str, index: int = 0, greedy: bool = False) -> Round:
    ids = tuple(tid(pieces, c) for c in drafted)
    g = len(ids)
    corr = tid(pieces, correction)
    r = (NAN,) * g if greedy else tuple(0.1 if i < n else 0.9 for i in range(g))
    return Round(
        index=index,
        drafted=ids,
        q=(0.5,) * g,
        p=(0.25,) * g,
        accept_prob=(0.5,) * g,
        r=r,
        n=n,
        correction=corr,
        kind="bonus" if n == g else "resampled",
        tokens=ids[:n] + (corr,),
        draft_s=0.01,
        verify_s=0.02,
        elapsed_s=0.03,
    )


def count(html: str, cls: str) -> int:
    return len(re.findall(rf'class="tok {cls}[ "]', html))


def test_a_round_with_a_rejection(pieces):
    html = render.round_html(pieces, make_round(pieces, "abcd", 2, "x"), greedy=False)
    assert (count(html, "tok-accepted"), count(html, "tok-rejected"), count(html, "tok-resampled")) == (2, 1, 1)
    assert count(html, "tok-bonus") == 0
    # order on the page: a, b accepted, c struck out where it was rejected, then the target's x
    texts = re.findall(r">([^<>]+)</span>", html)
    assert texts == ["a", "b", "c", "x"]
    assert "draw r = 0.900 ≥ 0.500 → rejected" in html
    assert "min(1, p/q) = 0.500" in html and "q(x) = 0.500" in html and "p(x) = 0.250" in html
    assert "the draft&#x27;s 1 later proposal was thrown away too" in html


def test_a_round_fully_accepted_ends_with_a_bonus(pieces):
    html = render.round_html(pieces, make_round(pieces, "abc", 3, "d", index=1), greedy=False)
    assert (count(html, "tok-accepted"), count(html, "tok-rejected"), count(html, "tok-bonus")) == (3, 0, 1)
    assert 'class="sv-round sv-round-1"' in html  # alternating round shade
    assert "draw r = 0.100 &lt; 0.500 → accepted" in html


def test_greedy_hover_explains_the_rule(pieces):
    html = render.round_html(pieces, make_round(pieces, "ab", 1, "z", greedy=True), greedy=True)
    assert "greedy: accepted because it equals the target&#x27;s top token" in html
    assert "greedy: rejected because the target&#x27;s top token here is &#x27;z&#x27;" in html
    assert "nan" not in html.lower()


def test_a_correction_cut_by_the_budget_is_not_shown(pieces):
    rnd = make_round(pieces, "ab", 2, "c")
    cut = Round(**{**rnd.__dict__, "tokens": rnd.tokens[:2]})
    html = render.round_html(pieces, cut, greedy=False)
    assert count(html, "tok-accepted") == 2 and count(html, "tok-bonus") == 0


def test_model_text_is_escaped_and_newlines_are_visible(pieces):
    lt = pieces.tok.convert_tokens_to_ids("</s>")  # a special token whose text is markup
    nl = tid(pieces, "\n")
    html = render.ar_token_html(pieces, Step(0, lt, 0.5, 0.01, 0.01), greedy=False)
    assert "&lt;/s&gt;" in html and "</s>" not in html and "tok-special" in html
    html = render.ar_token_html(pieces, Step(1, nl, 1.0, 0.01, 0.02), greedy=True)
    assert "⏎<br>" in html and 'class="tok tok-ar"' in html
    rejected = render.round_html(pieces, make_round(pieces, "\n", 0, "a"), greedy=False)
    assert rejected.count("<br>") == 0  # a rejected newline never happened: no line break for it


def test_prompt_is_escaped():
    html = render.prompt_html('<img src=x onerror=alert(1)> & "<script>"')
    assert "<img" not in html and "<script>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt; &amp; &quot;&lt;script&gt;&quot;" in html


def test_pane_shows_clock_and_finish(pieces):
    running = render.pane_html("spec", "x", 1.234, None)
    assert "t = 1.23 s" in running and 'data-state="running"' in running and "sv-cursor" in running
    done = render.pane_html("ar", "x", 2.0, Done((1,), "eos", {}))
    assert "done at 2.00 s (end of text)" in done and "sv-cursor" not in done


def test_legend_names_every_kind_in_words():
    html = render.legend_html()
    for cls in ("tok-accepted", "tok-rejected", "tok-resampled", "tok-bonus", "sv-round"):
        assert cls in html
    for word in ("accepted", "rejected", "resampled", "bonus", "Hover", "q(x)", "p(x)", "min(1, p/q)"):
        assert word in html


def test_stats_are_escaped():
    html = render.stats_html([("<b>", "x & y")])
    assert "&lt;b&gt;" in html and "x &amp; y" in html


def test_nan_draw_never_printed(pieces):
    rnd = make_round(pieces, "ab", 1, "z")
    rnd = Round(**{**rnd.__dict__, "r": (math.nan, math.nan)})
    html = render.round_html(pieces, rnd, greedy=False)
    assert "nan" not in html.lower()


def test_a_tree_round_marks_kept_tokens_from_a_branch_other_than_the_first_choice(pieces):
    from specviz.events import TreeRound

    a, b, c, x = (tid(pieces, ch) for ch in "abcx")
    # root -> a (1st choice, turned down), b (2nd, kept); b -> c (1st, kept, a leaf): bonus x
    tree = TreeRound(
        tokens=(a, b, c),
        parents=(-1, -1, 1),
        ranks=(0, 1, 0),
        sources=("model",) * 3,
        p=(0.1, 0.5, 0.6),
        q=(0.4, 0.3, 0.5),
        accept_prob=(0.25, 1.0, 1.0),
        r=(0.7, 0.2, 0.3),
        status=("rejected", "kept", "kept"),
        path=(1, 2),
    )
    rd = Round(
        index=0,
        drafted=(b, c),
        q=(0.3, 0.5),
        p=(0.5, 0.6),
        accept_prob=(1.0, 1.0),
        r=(0.2, 0.3),
        n=2,
        correction=x,
        kind="bonus",
        tokens=(b, c, x),
        draft_s=0.01,
        verify_s=0.02,
        elapsed_s=0.03,
        tree=tree,
    )
    html = render.round_html(pieces, rd, greedy=False)
    assert count(html, "tok-accepted") == 2 and count(html, "tok-bonus") == 1
    branch = re.findall(r'class="tok tok-accepted tok-branch"[^>]*>([^<]+)<', html)
    assert branch == ["b"]  # only the kept 2nd choice carries the mark (and says so on hover and to readers)
    assert "from a branch: the draft&#x27;s guess number 2" in html
    assert rd.proposed == 3 and "tok-branch" in render.legend_html()
