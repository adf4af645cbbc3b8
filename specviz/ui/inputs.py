"""One validation path for what a visitor sends to the Race tab and its sweep: text, numbers, choices, caps.

The page's values become request.RunRequest objects here, by name (RACE_INPUTS and SWEEP_INPUTS hold the one
order gradio sends them in), with the page's defaults those of RunRequest (PAGE). Every value is checked here (raw
API values included: handlers run with preprocess=False), so a bad value gets the same one sentence from the page
and from the API.
"""

from __future__ import annotations

import html

from specviz.api import encode_prompt
from specviz.config import AUTO_GAMMA_MAX, DRAFTERS, GAMMA_POLICIES, SpecvizError
from specviz.request import RunRequest
from specviz.ui.common import UIContext

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
PAGE = RunRequest()  # the page's controls start at the one set of defaults (gamma "auto": the auto policy, ≤ 8)
TEMPERATURE_LABEL = "temperature (0 = greedy: always the top token)"  # the Race tab's slider


def number_box(label: str) -> str:
    """The CSS selector of the number box gradio puts beside the slider labelled `label` (for browser scripts)."""
    return f'input[type=number][aria-label="number input for {label}"]'


# The Race tab's inputs in the order its /race endpoint takes them (API clients send them so: new ones go at the
# end), and the sweep's: the one place that knows the positions; handlers read the values by these names.
RACE_INPUTS = (
    "prompt",
    "gamma",
    "temperature",
    "top_k",
    "top_p",
    "max_new_tokens",
    "seed",
    "drafter",
    "gamma_policy",
    "drafter2",
    "policy2",
    "tree",
    "tree2",
)
SWEEP_INPUTS = ("prompt", "temperature", "top_k", "top_p", "max_new_tokens", "seed", "drafter")
TEMPERATURE_SWEEP_INPUTS = (
    "prompt",
    "gamma",
    "top_k",
    "top_p",
    "max_new_tokens",
    "seed",
    "drafter",
    "gamma_policy",
    "tree",
)


def named(names: tuple[str, ...], values) -> dict:
    """The page's values, in the order of `names`, by name (a client may send fewer: the rest take PAGE's)."""
    return dict(zip(names, values))


def page_request(ctx: UIContext, values: dict) -> RunRequest:
    """One lane's request from the page's named values, checked: choices, numbers and ranges (RunRequest); a value
    not sent takes the page's default (PAGE). gamma "auto" means the auto policy with this deployment's most."""
    drafter = _choice("drafter", values.get("drafter", PAGE.drafter), DRAFTERS)
    policy = _choice("gamma policy", values.get("gamma_policy", PAGE.gamma_policy), GAMMA_POLICIES)
    gamma = values.get("gamma", min(PAGE.gamma, ctx.limits.max_gamma))
    if isinstance(gamma, str) and gamma.strip().lower() == "auto":
        gamma, policy = min(AUTO_GAMMA_MAX, ctx.limits.max_gamma), "auto"
    tree = values.get("tree", PAGE.tree)
    given = {k: values[k] for k in ("temperature", "top_k", "top_p", "max_new_tokens", "seed") if k in values}
    return PAGE.replace(
        drafter=drafter, gamma_policy=policy, gamma=gamma, tree=tree if tree not in (None, "") else "off", **given
    )


def race_requests(ctx: UIContext, values: dict) -> dict[str, RunRequest]:
    """The race's speculative lanes, "spec" and (when a third lane is asked for) "spec2": the second is the first
    with its own drafter, gamma policy and tree."""
    lanes = {"spec": page_request(ctx, values)}
    second = lane_drafter(values.get("drafter2"))
    if second is not None:
        third = {
            **values,
            "drafter": second,
            "gamma_policy": values.get("policy2", PAGE.gamma_policy),
            "tree": values.get("tree2", PAGE.tree),
        }
        lanes["spec2"] = page_request(ctx, third)
    return lanes


def check_caps(ctx: UIContext, req: RunRequest) -> None:
    """This deployment's caps on a run (limits.Limits): its tokens and gamma."""
    ctx.limits.check_run(req.max_new_tokens, req.gamma)


def lane_drafter(value) -> str | None:
    """The third lane's drafter, or None for no third lane."""
    if value in (None, "", NO_LANE):
        return None
    return _choice("the third lane's drafter", value, DRAFTERS)


def prepare(ctx: UIContext, prompt, req: RunRequest):
    """The pair and the prompt's ids, within the caps."""
    check_text(prompt)
    check_caps(ctx, req)
    p, q = ctx.pair()
    ids = encode_prompt(p, prompt)
    ctx.limits.check_prompt_tokens(len(ids))
    return p, q, ids
