"""A race lane drawn from vLLM's own speculative rounds (backends/served/steps.py), in the race's token colours.

The server returns, per verify step, how many guesses it drafted and how many the target kept, not the guesses it
turned down: a round here shows the kept guesses (accepted), then the token the target chose itself (bonus where it
kept every guess, else the token that replaced the first turned-down guess, whose text the server does not send).
The prefill's token opens the lane as a plain step. `lane_html` says so under the lane, and says where the counts
cannot place every token (steps that drafted nothing).
"""

from __future__ import annotations

import html
import time

from specviz.backends.served.steps import ServerRun, reply_rounds
from specviz.config import SpecvizError
from specviz.request import RunRequest
from specviz.view.render import Pieces

TITLE = "vLLM's own speculative decoding of this prompt"


def titled(body: str) -> str:
    """The race's vLLM pane: its title, then `body` (HTML)."""
    return f'<div class="sv-vllm"><h4>{html.escape(TITLE)}</h4>{body}</div>'


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
        parts.append(_tok("tok-ar", pieces, run.first, "the prefill's token: one plain target step"))
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


def sampling_of(req: RunRequest) -> dict:
    """The race's sampling as vLLM's completion fields: temperature, and top-k, top-p and the seed where they bite."""
    out: dict = {"temperature": req.temperature}
    if req.temperature > 0:
        out |= {"seed": req.seed, "top_k": req.top_k or None, "top_p": req.top_p if req.top_p < 1 else None}
    return out


def engine_pane(target, prompt_ids: list[int], req: RunRequest, ours: tuple[int, ...] | None) -> str:
    """The race's vLLM lane: the server's own speculative decoding of the race's prompt with the race's sampling and
    budget, drawn from the counts its reply carries, and how its text compares with specviz's speculative lane
    (`ours`: that lane's token ids). A server that sends no counts, or fails, is one sentence in the pane."""
    t0 = time.monotonic()
    try:
        run = reply_rounds(target.client, target.model, prompt_ids, req.max_new_tokens, sampling_of(req))
    except SpecvizError as err:
        return titled(f'<p class="sv-warn">{html.escape(str(err))}</p>')
    wall = time.monotonic() - t0
    k = max((r.drafted for r in run.rounds), default=0)
    tokens = sum(len(r.tokens) for r in run.rounds)
    per_round = f"{tokens / len(run.rounds):.2f} tokens a round" if run.rounds else "no round drafted"
    head = (
        f"{len(run.token_ids)} tokens in {len(run.rounds)} verify steps of up to {k} guesses ({per_round}); "
        f"{wall:.2f} s for the request (the server's time and the round trip), not on the race's clock."
    )
    if k and (req.gamma_policy != "constant" or req.gamma != k):
        head += f" The server drafts up to {k} a round; set gamma to {k}, constant, to race the same rounds here."
    return titled(f"<p>{html.escape(head)} {html.escape(_same(run, ours, req))}</p>{lane_html(run, target.tokenizer)}")


def _same(run: ServerRun, ours: tuple[int, ...] | None, req: RunRequest) -> str:
    """One sentence: does the server's text equal specviz's speculative lane's?"""
    if ours is None:
        return ""
    if tuple(run.token_ids) == tuple(ours):
        return "Its text equals the speculative lane's, token for token."
    at = next((i for i, (a, b) in enumerate(zip(run.token_ids, ours)) if a != b), min(len(run.token_ids), len(ours)))
    why = (
        "two samples of the same distribution differ"
        if req.temperature > 0
        else "a near-tie that the two computations break differently, or a length the two stop at differently"
    )
    return f"Its text parts from the speculative lane's at token {at + 1}: {why}."
