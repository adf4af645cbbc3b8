"""The Tally: one fold over a run's events, and every consumer showing the same numbers.

A property test draws random event streams (chains, token trees, rounds with no guess, corrections cut off at the
end, plain runs) and checks each consumer against a count written out literally here: the Tally, metrics, the
Race tab's lanes, a recording's exported lanes, the benchmark's table, the pair check's acceptance, the sweep and
the lessons. The engine's own Done.stats are checked against the same fold on real runs of the tiny pair.
"""

import math
import re

import pandas as pd
import pytest
from conftest import engine_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specviz.bench import measure as bench
from specviz.bench.inputs import Config
from specviz.bench.summary import summarise_runs
from specviz.config import SamplingConfig
from specviz.engine.loop import autoregressive_decode, race, speculative_decode
from specviz.engine.tally import Tally
from specviz.events import Done, Round, Start, Step, TreeRound
from specviz.pairs.measure import Acceptance
from specviz.recording import export, record
from specviz.request import RunRequest
from specviz.teach import lessons
from specviz.ui.race_run import RaceView
from specviz.ui.sweep import sweep_numbers
from specviz.view import metrics, render
from specviz.view.render import ACCEPTANCE_LABELS

seconds = st.floats(1e-4, 0.05, allow_nan=False)
ids = st.integers(5, 60)


class Tok:
    """Enough of a tokenizer for render.Pieces and record.make: token i reads "t{i}"."""

    all_special_ids: list[int] = []

    def decode(self, ids, skip_special_tokens=False) -> str:
        return "".join(f"t{i} " for i in ids)


def _chain(draw, index, greedy):
    k = draw(st.integers(0, 6))
    n = draw(st.integers(0, k))
    drafted, correction = tuple(draw(st.lists(ids, min_size=k, max_size=k))), draw(ids)
    kind = "plain" if k == 0 else "bonus" if n == k else "resampled"
    half = (0.5,) * k
    r = (math.nan,) * k if greedy else tuple(0.2 if i < n else 0.9 for i in range(k))
    return dict(
        index=index,
        drafted=drafted,
        q=half,
        p=half,
        accept_prob=half,
        r=r,
        n=n,
        correction=correction,
        kind=kind,
        tokens=drafted[:n] + (correction,),
        sources=("model",) * k,
    )


def _tree(draw, index, greedy):
    """A consistent token tree: a kept path 0 .. n-1, maybe one turned-down child of where the walk stopped, and
    a few untested nodes elsewhere (never under the stop node of a walk that ended at a leaf)."""
    n = draw(st.integers(0, 4))
    rejected = n == 0 or draw(st.booleans())
    parents = [i - 1 for i in range(n)] + ([n - 1] if rejected else [])
    allowed = list(range(-1, n)) if rejected else list(range(-1, n - 1))
    parents += draw(st.lists(st.sampled_from(allowed), max_size=3))
    N = len(parents)
    tokens = tuple(draw(st.lists(ids, min_size=N, max_size=N)))
    ranks = tuple(parents[:i].count(par) for i, par in enumerate(parents))
    status = tuple("kept" if i < n else "rejected" if rejected and i == n else "" for i in range(N))
    line = list(range(n)) + ([n] if rejected else [])
    half = (0.5,) * N
    tree = TreeRound(
        tokens=tokens,
        parents=tuple(parents),
        ranks=ranks,
        sources=("model",) * N,
        p=half,
        q=half,
        accept_prob=half,
        r=(math.nan,) * N,
        status=status,
        path=tuple(range(n)),
    )
    k, correction = len(line), draw(ids)
    r = (math.nan,) * k if greedy else tuple(0.2 if i < n else 0.9 for i in range(k))
    return dict(
        index=index,
        drafted=tuple(tokens[i] for i in line),
        q=(0.5,) * k,
        p=(0.5,) * k,
        accept_prob=(0.5,) * k,
        r=r,
        n=n,
        correction=correction,
        kind="resampled" if rejected else "bonus",
        tokens=tokens[:n] + (correction,),
        sources=("model",) * k,
        tree=tree,
    )


@st.composite
def spec_run(draw, greedy=True):
    """Start, 1-8 rounds (chains, trees, no-guess rounds; the last one's tokens maybe cut at EOS / the budget), Done."""
    prefill = draw(seconds)
    start = Start(
        mode="spec",
        prompt_ids=(1, 2, 3),
        gamma=6,
        temperature=0.0 if greedy else 0.7,
        prefill_s=prefill,
        drafter="model",
        gamma_policy="constant",
        calibration_s=draw(st.sampled_from([0.0, 0.25])),
    )
    events, elapsed, out = [start], prefill, []
    rounds = draw(st.integers(1, 8))
    for i in range(rounds):
        shape = draw(st.sampled_from([_chain, _chain, _tree]))(draw, i, greedy)
        if i == rounds - 1:  # a run's last round may be cut: EOS or the budget, accepted tokens included
            shape["tokens"] = shape["tokens"][: draw(st.integers(1, len(shape["tokens"])))]
        d, v = draw(seconds), draw(seconds)
        elapsed += d + v + draw(seconds)  # the loop's own work besides drafting and verifying
        calls = draw(st.integers(0, len(shape["drafted"]) + 1))
        events.append(Round(**shape, draft_s=d, verify_s=v, elapsed_s=elapsed, draft_calls=calls))
        out += events[-1].tokens
    events.append(Done(token_ids=tuple(out), finish_reason="length", stats={"mode": "spec", "wall_s": elapsed}))
    return events


@st.composite
def ar_run(draw):
    prefill = draw(seconds)
    events, elapsed = [Start(mode="ar", prompt_ids=(1, 2, 3), gamma=0, temperature=0.0, prefill_s=prefill)], prefill
    for i in range(draw(st.integers(1, 12))):
        f = draw(seconds)
        elapsed += f
        events.append(Step(index=i, token=draw(ids), p=1.0, forward_s=f, elapsed_s=elapsed))
    out = tuple(e.token for e in events[1:])
    return events + [Done(token_ids=out, finish_reason="length", stats={"mode": "ar", "wall_s": elapsed})]


def reference(*runs: list) -> dict:
    """The numbers of these runs pooled, counted literally from their events."""
    rounds = [e for evs in runs for e in evs if isinstance(e, Round)]
    steps = [e for evs in runs for e in evs if isinstance(e, Step)]
    starts = [e for evs in runs for e in evs if isinstance(e, Start)]
    dones = [e for evs in runs for e in evs if isinstance(e, Done)]
    new = sum(len(d.token_ids) for d in dones)
    accepted = sum(r.n for r in rounds)
    rejected = sum(1 for r in rounds if r.n < len(r.drafted))  # a correction cut off still had its rejection
    drafted = sum(len(r.tree.tokens) if r.tree else len(r.drafted) for r in rounds)
    calls = len(rounds) + len(steps)
    last = [max(e.elapsed_s for e in evs if isinstance(e, (Round, Step))) for evs in runs]
    prefill = sum(s.prefill_s for s in starts)
    draft_calls = sum(r.draft_calls for r in rounds)
    return {
        "new_tokens": new,
        "target_calls": calls,
        "drafted": drafted,
        "accepted": accepted,
        "rejected": rejected,
        "alpha": accepted / (accepted + rejected) if accepted + rejected else 0.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "tokens_per_call": new / calls,
        "drafted_per_call": drafted / calls,
        "wall_s": sum(last),
        "tokens_per_s": new / sum(last),
        "step_s": (sum(last) - prefill) / calls,
        "draft_call_s": sum(r.draft_s for r in rounds) / draft_calls if draft_calls else 0.0,
        "resampled": sum(1 for r in rounds if r.kind == "resampled" and len(r.tokens) == r.n + 1),
        "tree_rounds": sum(1 for r in rounds if r.tree is not None),
    }


def c_of(spec: dict, plain: dict) -> float:
    return spec["draft_call_s"] / plain["step_s"]


def shown(html: str) -> dict[str, str]:
    """The numbers under a pane: label -> value as shown."""
    return {k: v for v, k in re.findall(r'<div class="sv-stat"><b>([^<]*)</b><span>([^<]*)</span></div>', html)}


def page_numbers(ref: dict, plain: dict | None = None) -> dict[str, str]:
    """What the page must show for a speculative lane with these numbers, written out from the reference."""
    accepted, alpha = ACCEPTANCE_LABELS["tree" if ref["tree_rounds"] else "chain"]
    out = {
        "tokens": str(ref["new_tokens"]),
        "tokens/s": f"{ref['tokens_per_s']:.1f}",
        "target calls": str(ref["target_calls"]),
        accepted: f"{ref['acceptance_rate']:.0%}" if ref["drafted"] else "—",
        alpha: f"{ref['alpha']:.0%}" if ref["drafted"] else "—",
        "tokens per target call": f"{ref['tokens_per_call']:.2f}",
    }
    if plain is not None:
        out["speedup (tokens/s vs plain)"] = f"{ref['tokens_per_s'] / plain['tokens_per_s']:.2f}×"
    return out


def close(a, b) -> bool:
    return a == pytest.approx(b, rel=1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=spec_run(), spec2=spec_run(greedy=False), ar=ar_run())
def test_every_consumer_shows_the_same_numbers_on_random_streams(spec, spec2, ar):
    ref, ref2, plain = reference(spec), reference(spec2), reference(ar)
    both = reference(spec, spec2)

    # the Tally itself, folded event by event, pooled with +, rebuilt from its counts
    t, t2, t_ar = Tally.of(spec), Tally.of(spec2), Tally.of(ar)
    for key in (
        "new_tokens",
        "target_calls",
        "drafted",
        "accepted",
        "rejected",
        "alpha",
        "acceptance_rate",
        "tokens_per_call",
        "drafted_per_call",
        "tokens_per_s",
        "step_s",
        "draft_call_s",
        "resampled",
        "tree_rounds",
    ):
        assert close(getattr(t, key), ref[key]), key
        assert close(getattr(t + t2, key), both[key]) and close(getattr(Tally.of(spec + spec2), key), both[key]), key
        assert close(getattr(Tally.from_counts((t + t2).counts()), key), both[key]), key
    assert t.stats()["wall_s"] == pytest.approx(ref["wall_s"])
    assert close(t.c(t_ar), c_of(ref, plain)) and close((t + t2).c(t_ar), c_of(both, plain))

    # metrics: one run, and the lanes of a race
    s = metrics.summary(spec)
    for key in ("new_tokens", "target_calls", "drafted", "accepted", "rejected", "alpha", "acceptance_rate"):
        assert close(s[key], ref[key]), key
    assert close(s["tokens_per_target_call"], ref["tokens_per_call"]) and close(s["wall_s"], ref["wall_s"])
    merged = list(race(iter(ar), iter(spec), iter(spec2), names=("ar", "spec", "spec2")))
    by_side = metrics.summaries(merged)
    assert close(by_side["spec2"]["alpha"], ref2["alpha"]) and by_side["ar"]["new_tokens"] == plain["new_tokens"]

    # the Race tab's lanes, fed the race event by event
    view = RaceView("p", {"spec": RunRequest(), "spec2": RunRequest(drafter="model")})
    view.pieces = render.Pieces(Tok())
    for side, ev in merged:
        view.add(side, ev)
    ar_html, spec_html, spec2_html = view.stats()
    assert shown(spec_html) == page_numbers(ref, plain) and shown(spec2_html) == page_numbers(ref2, plain)
    assert shown(ar_html) == {
        "tokens": str(plain["new_tokens"]),
        "tokens/s": f"{plain['tokens_per_s']:.1f}",
        "target calls": str(plain["target_calls"]),
    }

    # a recording of that race, saved and loaded, as the Replay tab and the exported page show it
    rec = record.loads(record.make("race", {"prompt": "p"}, {"ar": ar, "spec": spec}, Tok(), {}).dumps())
    views = export.play_all(rec)
    assert shown(views["spec"].stats(views["ar"])) == page_numbers(ref, plain)
    assert shown(export.lanes_html(rec, views).split('id="sv-lane-spec"')[1]) == page_numbers(ref, plain)

    # the benchmark's table: two prompts, both speculative runs under one configuration
    cfg = Config("model", 6, "constant")
    rows = [bench.row(0.7, None, 0, i, "ar", bench.run_row(ar, 1.0)) for i in (0, 1)]
    rows += [bench.row(0.7, cfg, 0, i, "spec", bench.run_row(evs, 1.0)) for i, evs in enumerate((spec, spec2))]
    (cell,) = summarise_runs(pd.DataFrame(rows)).to_dict("records")
    two_plain = reference(ar, ar)
    for key, want in (
        ("acceptance", both["acceptance_rate"]),
        ("alpha", both["alpha"]),
        ("tokens_per_call", both["tokens_per_call"]),
        ("drafted_per_call", both["drafted_per_call"]),
        ("c", c_of(both, two_plain)),
    ):
        assert close(cell[key], want), key

    # the pair check's acceptance, the sweep and the lessons
    acc = Acceptance.of(Tally.of(spec), (), 0.0)
    assert (acc.accepted, acc.tested, acc.drafted, acc.rounds, acc.new_tokens) == (
        ref["accepted"],
        ref["accepted"] + ref["rejected"],
        ref["drafted"],
        ref["target_calls"],
        ref["new_tokens"],
    )
    assert close(acc.a, ref["alpha"])
    table, a, c = sweep_numbers({"ar": ar, "gamma = 1": spec, "gamma = 2": spec2})
    assert close(a, both["alpha"]) and close(c, c_of(both, plain))
    assert [r["acceptance"] for r in table] == pytest.approx([ref["acceptance_rate"], ref2["acceptance_rate"]])
    assert table[0]["speedup"] == pytest.approx(ref["tokens_per_s"] / plain["tokens_per_s"])
    n = lessons._numbers(spec)
    for key in ("new_tokens", "target_calls", "drafted", "accepted", "alpha", "acceptance_rate", "tokens_per_call"):
        assert close(n[key], ref[key]), key


def test_a_rejection_whose_correction_was_cut_off_counts_in_alpha():
    """The edge where the engine and the page once disagreed: the last round's guess was turned down, but the
    budget ran out before its correction. alpha counts the rejection; resampled counts emitted corrections."""
    start = Start(mode="spec", prompt_ids=(1,), gamma=2, temperature=0.0, prefill_s=0.01)
    half = (0.5, 0.5)
    kept = Round(
        index=0,
        drafted=(7, 8),
        q=half,
        p=half,
        accept_prob=half,
        r=(math.nan,) * 2,
        n=2,
        correction=9,
        kind="bonus",
        tokens=(7, 8, 9),
        draft_s=0.01,
        verify_s=0.01,
        elapsed_s=0.04,
        draft_calls=2,
    )
    cut = Round(
        index=1,
        drafted=(3, 4),
        q=half,
        p=half,
        accept_prob=half,
        r=(math.nan,) * 2,
        n=1,
        correction=5,
        kind="resampled",
        tokens=(3,),
        draft_s=0.01,
        verify_s=0.01,
        elapsed_s=0.07,
        draft_calls=2,
    )
    events = [start, kept, cut, Done(token_ids=(7, 8, 9, 3), finish_reason="length", stats={"wall_s": 0.07})]
    t = Tally.of(events)
    assert (t.accepted, t.rejected, t.resampled, t.bonus, t.new_tokens) == (3, 1, 0, 1, 4)
    assert t.alpha == 3 / 4 and t.acceptance_rate == 3 / 4 and t.round_tokens == (0, 1, 0, 1)
    assert metrics.summary(events)["alpha"] == 3 / 4


def test_c_is_zero_without_draft_calls_and_unknown_without_a_plain_step():
    free = Tally(rounds=3, drafted=6, draft_s=0.01, elapsed_s=1.0)  # lookup: it searched, but called no model
    plain = Tally(steps=4, prefill_s=0.2, elapsed_s=1.0)
    assert free.c(plain) == 0.0 and math.isnan(Tally(draft_calls=2, draft_s=0.1).c(Tally()))
    assert Tally(draft_calls=4, draft_s=0.2).c(plain) == pytest.approx(0.05 / 0.2)


@pytest.mark.parametrize(
    "options",
    [
        dict(gamma=3),  # chains, greedy; the budget cuts the last round
        dict(gamma=4, sampling=SamplingConfig(0.8), seed=3),
        dict(gamma=4, tree=6),  # token trees
        dict(gamma="auto", drafter="lookup+model"),  # lookup's free guesses, the auto policy
        dict(gamma=2, drafter="lookup"),  # no draft model: c is 0
    ],
)
def test_the_engine_s_done_stats_are_the_fold_of_its_own_events(loaded_pair, options):
    p, q = loaded_pair
    prompt = p.tokenizer("the cat sat on the mat, the cat sat")["input_ids"]
    for tokens in (7, 23):
        cfg = engine_config(max_new_tokens=tokens, **options)
        spec = list(speculative_decode(p, q, prompt, cfg))
        ar = list(autoregressive_decode(p, prompt, engine_config(max_new_tokens=tokens)))
        for events in (spec, ar):
            stats, t, ref = events[-1].stats, Tally.of(events), reference(events)
            assert {k: v for k, v in stats.items() if k != "mode"} == t.stats()
            for key in ("new_tokens", "target_calls", "drafted", "accepted", "rejected", "alpha", "resampled"):
                assert close(stats[key], ref[key]), key
            assert stats["wall_s"] == pytest.approx(ref["wall_s"])
        rounds = [e for e in spec if isinstance(e, Round)]
        assert spec[-1].stats["draft_calls"] == sum(r.draft_calls for r in rounds)
        if options.get("drafter") == "lookup":
            assert spec[-1].stats["draft_calls"] == 0 and Tally.of(spec).c(Tally.of(ar)) == 0.0
        if options.get("tree"):
            assert spec[-1].stats["tree_rounds"] > 0


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.integers(1, 200),
    prefills=st.tuples(st.floats(0, 2), st.floats(0, 2)),
    decodes=st.tuples(st.floats(0.01, 5), st.floats(0.01, 5)),
)
def test_a_decoding_speedup_with_the_prefill_counted_is_the_whole_runs_ratio(tokens, prefills, decodes):
    """tally.with_prefill turns a decoding speedup (prefills left out, as the pair check predicts) into a whole
    run's, as the race and the bench time one: given the decoding speedup two sets of equally long runs measured, it
    is their tokens-per-second ratio; with no prefill it is the speedup itself."""
    from specviz.engine.tally import with_prefill

    (pp, ps), (dp, ds) = prefills, decodes
    plain = Tally(runs=3, new_tokens=3 * tokens, prefill_s=3 * pp, elapsed_s=3 * (pp + dp))  # 3 runs of `tokens`
    spec = Tally(runs=2, new_tokens=2 * tokens, prefill_s=2 * ps, elapsed_s=2 * (ps + ds))
    decoding = spec.decode_tokens_per_s / plain.decode_tokens_per_s
    assert math.isclose(with_prefill(decoding, plain, spec), spec.tokens_per_s / plain.tokens_per_s, rel_tol=1e-9)
    bare = Tally(runs=1, new_tokens=tokens, elapsed_s=dp)
    assert math.isclose(with_prefill(1.7, bare, Tally(runs=1, new_tokens=tokens, elapsed_s=ds)), 1.7, rel_tol=1e-9)
    assert with_prefill(1.7, Tally(), spec) is None and with_prefill(1.7, plain, Tally()) is None
