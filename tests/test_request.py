"""RunRequest: one frozen options object for a run, checked once, with the one set of defaults that the API, the
CLI, the page and recordings all start from."""

import dataclasses

import pytest

from specviz import RunRequest, SpecvizError, record_run, stream
from specviz.__main__ import _request, parser
from specviz.config import AUTO_GAMMA_MAX, DEFAULT_DRAFTER
from specviz.events import Start
from specviz.limits import Limits
from specviz.ui import build_demo
from specviz.ui.common import UIContext
from specviz.ui.inputs import PAGE, RACE_INPUTS, SWEEP_INPUTS, named, page_request
from specviz.ui.race_run import RaceView


@pytest.mark.parametrize(
    "options, match",
    [
        ({"mode": "fast"}, "Unknown mode 'fast'"),
        ({"gamma": 0}, "gamma must be a whole number from 1 to 16 or 'auto', not 0"),
        ({"temperature": 5}, "temperature must be between 0 and 2"),
        ({"raw": "yes"}, "raw and allow_lossy must be True or False"),
        ({"relaxed_w": 0.5}, "pass allow_lossy=True"),
        ({"drafter": "head", "tree": 4}, "Token trees grow from the draft model or prompt lookup"),
        ({"confidence": 1.0}, "confidence must be from 0 up to"),
    ],
)
def test_a_bad_value_is_one_sentence_when_the_request_is_built(options, match):
    with pytest.raises(SpecvizError, match=match) as e:
        RunRequest(**options)
    assert "\n" not in str(e.value) and str(e.value).endswith(".")


def test_unknown_options_are_named_and_changes_are_checked_again():
    with pytest.raises(SpecvizError, match="Unknown option 'gama' for generate"):
        RunRequest.of({"gama": 3}, "generate")
    req = RunRequest(gamma=3)
    with pytest.raises(SpecvizError, match="top_p must be above 0"):
        req.replace(top_p=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.gamma = 4


def test_gamma_auto_is_resolved_once_and_a_named_gamma_stays_constant():
    assert (RunRequest().gamma, RunRequest().gamma_policy) == (AUTO_GAMMA_MAX, "auto")
    assert (RunRequest(gamma=3).gamma, RunRequest(gamma=3).gamma_policy) == (3, "constant")
    assert RunRequest.default("gamma") == "auto" and RunRequest().spec == RunRequest(gamma="auto").spec
    auto3 = RunRequest().replace(gamma=3)  # the page: the auto policy with at most 3
    assert (auto3.gamma_policy, auto3.label) == ("auto", "lookup+model, auto ≤3, tree auto")


def test_the_api_the_cli_and_the_page_start_from_the_one_request(tiny_pair, loaded_pair):
    default = RunRequest()
    assert default.drafter == DEFAULT_DRAFTER and PAGE == default
    assert _request(parser().parse_args(["generate", "hi"])) == default  # the CLI names no default of its own
    given = _request(parser().parse_args(["generate", "hi", "--gamma", "3", "--temperature", "0.5"]))
    assert given == RunRequest(gamma=3, temperature=0.5) and given.gamma_policy == "constant"

    ctx = UIContext(limits=Limits(), device="cpu", default_target=tiny_pair[0], default_draft=tiny_pair[1])
    demo = build_demo(ctx)  # (its preloader loads the tiny pair)
    assert demo.preloader.wait(120) == "ready" and "Ready." in demo.preloader.html()
    fns = {f.api_name: f for f in (demo.fns.values() if isinstance(demo.fns, dict) else demo.fns)}
    race_values = named(RACE_INPUTS, [c.value for c in fns["race"].inputs])  # the page as it first shows
    assert page_request(ctx, race_values) == default and race_values["drafter2"] == "none"
    sweep_values = named(SWEEP_INPUTS, [c.value for c in fns["sweep"].inputs])
    assert page_request(ctx, sweep_values) == default
    assert RaceView().labels == {"spec": default.label}  # the empty page's lane names what a race will run

    p, q = loaded_pair
    start = next(iter(stream("hi", target=p, draft=q, max_new_tokens=2)))
    assert isinstance(start, Start)
    assert (start.drafter, start.gamma_policy, start.gamma) == (default.drafter, default.gamma_policy, default.gamma)


def test_a_recording_s_settings_are_the_request_that_ran(loaded_pair):
    """record_run's settings once came from SpecConfig's defaults (model, gamma 3, constant) plus what was given,
    while the run took the API's (lookup+model, auto): they are now the request itself."""
    p, q = loaded_pair
    rec = record_run("the cat sat", target=p, draft=q, max_new_tokens=6, temperature=0.5, seed=2)
    want = RunRequest(target=p, draft=q, max_new_tokens=6, temperature=0.5, seed=2)
    assert rec.settings == want.settings("the cat sat")
    assert rec.settings["target"] == p.name and all(
        isinstance(v, (str, int, float, bool)) for v in rec.settings.values()
    )
    start = next(ev for ev in rec.lanes["spec"] if isinstance(ev, Start))
    assert (start.drafter, start.gamma_policy, start.gamma, start.temperature) == (
        rec.settings["drafter"],
        rec.settings["gamma_policy"],
        rec.settings["gamma"],
        rec.settings["temperature"],
    )
