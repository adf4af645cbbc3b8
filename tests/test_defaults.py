"""One set of defaults: a run asked for with no options through the API, the CLI, the page and the bench is one
and the same request (request.RunRequest's defaults), and the engine's configuration of it (SpecConfig) is the
same too. No run starts: each surface's request is taken where it is built."""

from __future__ import annotations

import dataclasses

from specviz import api
from specviz.__main__ import _request, parser
from specviz.bench.cli import base_request
from specviz.request import RunRequest
from specviz.ui import build_demo
from specviz.ui.common import UIContext
from specviz.ui.inputs import RACE_INPUTS, named, page_request


def _api_request(monkeypatch) -> RunRequest:
    """What `generate(prompt)` builds, caught where it would start decoding."""
    monkeypatch.setattr(api, "result", lambda prompt, req: req)
    return api.generate("Hi")


def _page_request(tiny_pair) -> RunRequest:
    """The /race handler's first lane from the values the built page's controls start at (the tiny pair as the
    deployment's, so nothing else loads)."""
    ctx = UIContext(device="cpu")
    ctx.default_target, ctx.default_draft = tiny_pair
    demo = build_demo(ctx)
    fns = demo.fns.values() if isinstance(demo.fns, dict) else demo.fns
    (race,) = [f for f in fns if getattr(f, "api_name", None) == "race"]
    values = named(RACE_INPUTS, [c.value for c in race.inputs])
    return page_request(ctx, values)


def test_no_options_give_one_request_everywhere(monkeypatch, tiny_pair):
    by_api = _api_request(monkeypatch)
    by_cli = _request(parser().parse_args(["generate", "Hi"]))
    by_page = _page_request(tiny_pair)
    by_bench = base_request(parser().parse_args(["bench"]))
    assert by_api == RunRequest()
    assert by_cli == by_api
    assert by_page == by_api
    assert by_bench == by_api
    # compare=False on `spec`: the engine's configuration, compared here field by field
    assert {r.spec for r in (by_api, by_cli, by_page, by_bench)} == {RunRequest().spec}


def test_the_defaults_are_what_users_get():
    """The one set: lookup guesses, then the draft model; the auto gamma policy; token trees where they pay."""
    r = RunRequest()
    assert (r.drafter, r.gamma_policy, r.tree, r.temperature, r.mode) == ("lookup+model", "auto", "auto", 0.0, "spec")
    fields = {f.name for f in dataclasses.fields(r.spec)} - {"sampling"}
    assert {name: getattr(r.spec, name) for name in fields} == {name: getattr(r, name) for name in fields}
