"""A race lane drawn from vLLM's own speculative rounds (backends/served/steps.py), in the race's token colours.

The server returns, per verify step, how many guesses it drafted and how many the target kept, not the guesses it
turned down: a round here shows the kept guesses (accepted), then the token the target chose itself (bonus where it
kept every guess, else the token that replaced the first turned-down guess, whose text the server does not send).
The prefill's token opens the lane as a plain step. `lane_html` says so under the lane, and says where the counts
cannot place every token (steps that drafted nothing).
"""

from __future__ import annotations

import html
import json
import urllib.request

from specviz.backends.served.steps import ServerRun, server_rounds, speculative_metrics
from specviz.config import SpecvizError
from specviz.view.render import Pieces

NOTE = (
    "vLLM's own rounds, from the counts it returns with the reply (per verify step: guesses drafted, guesses kept); "
    "it does not return the guesses it turned down, so a round shows its kept guesses and the target's token only."
)


def _tok(cls: str, pieces: Pieces, token: int, title: str) -> str:
    return f'<span class="tok {cls}" title="{html.escape(title, quote=True)}">{pieces.html(token)}</span>'


def lane_html(run: ServerRun, tokenizer) -> str:
    """The server's rounds as the race draws a speculative lane, with the sentence on what the server omits."""
    pieces = Pieces(tokenizer)
    parts = []
    if run.first is not None:
        parts.append(_tok("tok-plain", pieces, run.first, "the prefill's token: one plain target step"))
    for i, r in enumerate(run.rounds):
        body = [_tok("tok-accepted", pieces, t, f"round {i + 1}: a guess the target kept") for t in r.kept]
        if r.added is not None:
            if r.accepted == r.drafted:
                cls, why = "tok-bonus", f"bonus: all {r.drafted} guesses kept"
            else:
                cls, why = (
                    "tok-resampled",
                    (f"the target's token: it turned down guess {r.accepted + 1} of {r.drafted} (not returned)"),
                )
            body.append(_tok(cls, pieces, r.added, f"round {i + 1}: {why}"))
        parts.append(
            f'<span class="sv-round sv-round-{i % 2}" data-round="{i + 1}" data-gamma="{r.drafted}" '
            f'data-kept="{r.accepted}">{"".join(body)}</span>'
        )
    note = NOTE
    if not run.exact:
        note += (
            f" {run.gaps} tokens came from steps that drafted nothing, which the counts do not place: the rounds are"
            " drawn as if those came last."
        )
    return f'<div class="sv-vllm-lane">{"".join(parts)}</div><p class="sv-warn">{html.escape(note)}</p>'


def server_run(url: str, model: str, prompt_ids: list[int], max_tokens: int, timeout_s: float = 300) -> ServerRun:
    """One greedy request to a vLLM server started with --per-request-spec-decode-metrics detailed: its rounds;
    one SpecvizError sentence where the server sends no counts."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0}
    body["return_token_ids"] = True
    req = urllib.request.Request(
        url.rstrip("/") + "/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        reply = json.load(r)
    counts = speculative_metrics(reply)
    if counts is None:
        raise SpecvizError(
            "The server sent no per-step speculative counts; start vLLM with speculative decoding and "
            "--per-request-spec-decode-metrics detailed."
        )
    return server_rounds(list(reply["choices"][0].get("token_ids") or ()), counts)
