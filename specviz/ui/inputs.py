"""One validation path for what a visitor sends to the Race tab and its sweep: text, numbers, choices, caps.

Every value is checked here (raw API values included: handlers run with preprocess=False), so a bad value
gets the same one sentence from the page and from the API.
"""

from __future__ import annotations

import html

from ..api import encode_prompt
from ..config import AUTO_GAMMA_MAX, DRAFTERS, GAMMA_POLICIES, SamplingConfig, SpecConfig, SpecvizError
from .common import UIContext

NO_LANE = "none"  # the third lane's drafter when there is no third lane


def note(text: str) -> str:
    return f'<div class="sv-note">{html.escape(text)}</div>'


def check_text(prompt) -> str:
    if not isinstance(prompt, str):
        raise SpecvizError("The prompt must be text.")
    if not prompt.strip():
        raise SpecvizError("The prompt is empty; type something for the model to continue.")
    return prompt


def _choice(name: str, value, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise SpecvizError(f"{name} must be one of {', '.join(choices)}, not {value!r}.")
    return value


TREES = ("off", "4", "8", "auto")  # the page's token-tree choices (the API takes any budget SpecConfig does)


def run_config(
    ctx: UIContext, gamma, temperature, top_k, top_p, max_new_tokens, seed, drafter="model", policy="constant",
    tree="off",
) -> SpecConfig:  # fmt: skip
    """Everything a visitor sends for one run, checked: numbers, ranges, choices, and this deployment's caps.

    gamma is the slider's value; with policy "auto" (or gamma "auto") it is the most a round may propose (and a
    token tree's depth).
    """
    drafter = _choice("drafter", drafter, DRAFTERS)
    policy = _choice("gamma policy", policy, GAMMA_POLICIES)
    if isinstance(gamma, str) and gamma.strip().lower() == "auto":
        gamma, policy = min(AUTO_GAMMA_MAX, ctx.limits.max_gamma), "auto"
    sampling = SamplingConfig(temperature, top_k, top_p)
    cfg = SpecConfig(gamma=gamma, max_new_tokens=max_new_tokens, seed=seed, sampling=sampling, drafter=drafter,
                     gamma_policy=policy, tree=tree if tree not in (None, "") else "off")  # fmt: skip
    ctx.limits.check_run(cfg.max_new_tokens, cfg.gamma)
    return cfg


def lane_drafter(value) -> str | None:
    """The third lane's drafter, or None for no third lane."""
    if value in (None, "", NO_LANE):
        return None
    return _choice("the third lane's drafter", value, DRAFTERS)


def prepare(ctx: UIContext, prompt, cfg: SpecConfig):
    """The pair and the prompt's ids, within the caps."""
    check_text(prompt)
    p, q = ctx.pair()
    ids = encode_prompt(p, prompt)
    ctx.limits.check_prompt_tokens(len(ids))
    return p, q, ids
