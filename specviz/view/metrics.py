"""Events -> pandas: one row per round (speculative) or step (autoregressive), and the summary numbers.

The rows are per round, for the plots; a run's totals (acceptance, alpha, tokens per call ...) are its
tally.Tally's, which `summary` returns with the run's mode and finish reason. Pandas stays out of the engine.
Names as in the papers: n is the accepted count of a round, gamma its block size.

`events` may be one run's stream (Start, Round|Step ..., Done) or the (side, event) pairs of `engine.race`.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from specviz.engine.tally import Tally
from specviz.events import Done, Event, Round, Start, Step
from specviz.theory import accepted_histogram as theory_histogram
from specviz.theory import position_alphas

COLUMNS = (
    "side",  # "spec" or "ar" (the Start's mode, or the side race() gave)
    "index",  # round / step number, from 0
    "tokens",  # tokens this row added to the output
    "n",  # accepted proposals (spec); 0 for ar
    "gamma",  # proposals drafted (spec; for a tree, the walked line: its accepted path and the child turned down)
    "kind",  # "bonus" | "resampled" (spec) | "step" (ar)
    "draft_s",  # drafting time of the round; 0 for ar
    "verify_s",  # the target call plus accept/resample (spec); the forward and sampling (ar)
    "other_s",  # the rest of the row's compute: rollback, bookkeeping, the detail view
    "row_s",  # the row's whole compute (elapsed_s minus the previous row's)
    "elapsed_s",  # cumulative compute of the run, prefill included
    "token_ids",  # tuple of the ids the row added
    "planned",  # the most the gamma policy allowed this round (spec); 0 for ar
    "stop",  # why the round's proposal ended: gamma | budget | confidence | no match | match end ("" for ar)
    "source",  # which drafter proposed the round's guesses: model | lookup ("" when none, and for ar)
    "nodes",  # tokens the target checked for guesses: a tree's nodes, else gamma (0 for ar)
)


def _pairs(events: Iterable) -> Iterable[tuple[str | None, Event]]:
    for item in events:
        if isinstance(item, tuple) and len(item) == 2 and (item[0] is None or isinstance(item[0], str)):
            yield item
        else:
            yield None, item


def rounds_frame(events: Iterable) -> pd.DataFrame:
    """One row per Round or Step, in stream order; columns as in COLUMNS."""
    rows, mode, last = [], {}, {}
    for side, ev in _pairs(events):
        if isinstance(ev, Start):
            mode[side] = ev.mode
            last[side] = ev.prefill_s
            continue
        if not isinstance(ev, (Round, Step)):
            continue
        name = side or mode.get(side) or ("spec" if isinstance(ev, Round) else "ar")
        row_s = ev.elapsed_s - last.get(side, 0.0)
        last[side] = ev.elapsed_s
        if isinstance(ev, Round):
            rows.append(
                (
                    name,
                    ev.index,
                    len(ev.tokens),
                    ev.n,
                    len(ev.drafted),
                    ev.kind,
                    ev.draft_s,
                    ev.verify_s,
                    max(row_s - ev.draft_s - ev.verify_s, 0.0),
                    row_s,
                    ev.elapsed_s,
                    ev.tokens,
                    ev.planned,
                    ev.stop,
                    ev.sources[0] if ev.sources else "",
                    ev.proposed,
                )
            )
        else:
            rows.append(
                (
                    name,
                    ev.index,
                    1,
                    0,
                    0,
                    "step",
                    0.0,
                    ev.forward_s,
                    max(row_s - ev.forward_s, 0.0),
                    row_s,
                    ev.elapsed_s,
                    (ev.token,),
                    0,
                    "",
                    "",
                    0,
                )
            )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def summaries(events: Iterable) -> dict[str, dict]:
    """Summary numbers per side: {"spec": {...}, "ar": {...}} (see `summary` for the keys)."""
    tallies: dict = {}
    names, dones = {}, {}
    for side, ev in _pairs(events):
        if isinstance(ev, Start):
            names[side] = (side or ev.mode, ev.mode)
            tallies[side] = Tally()
        elif isinstance(ev, Done):
            dones[side] = ev
        if side in tallies:
            tallies[side].add(ev)
    return {
        name: {"mode": mode, **tallies[s].stats(), "finish_reason": dones[s].finish_reason if s in dones else None}
        for s, (name, mode) in names.items()
    }


def summary(events: Iterable) -> dict:
    """One run's numbers: mode, the Tally's (tally.Tally.stats: new_tokens, target_calls, drafted, accepted,
    rejected, acceptance_rate, alpha, tokens_per_target_call, prefill_s, draft_s, verify_s, other_s, wall_s,
    tokens_per_s, decode_tokens_per_s ...) and finish_reason. For the pairs of `race`, use `summaries`."""
    by_side = summaries(events)
    if len(by_side) != 1:
        raise ValueError(f"summary() takes one run; these events hold {sorted(by_side)}: use summaries().")
    return next(iter(by_side.values()))


def acceptance_by_position(frame: pd.DataFrame) -> pd.Series:
    """Conditional acceptance alpha_k at draft positions k = 1, 2, ... of one spec run (see theory.position_alphas):
    of the rounds that reached position k, the share accepted there."""
    spec = frame[frame["gamma"] > 0]
    rates = position_alphas(zip(spec["gamma"], spec["n"]))
    return pd.Series(rates, index=pd.RangeIndex(1, len(rates) + 1, name="position"), name="acceptance", dtype=float)


def accepted_histogram(frame: pd.DataFrame) -> pd.Series:
    """How many rounds accepted n = 0 .. gamma proposals (rounds that proposed something)."""
    spec = frame[frame["gamma"] > 0]
    counts = theory_histogram(zip(spec["gamma"], spec["n"]))
    return pd.Series(counts, index=pd.RangeIndex(len(counts), name="n"), name="rounds", dtype=int)


TREE_RANKS = ("1st", "2nd", "3rd+")  # the draft's choice at a branch; later ones are few and pooled


def tree_acceptance(events: Iterable) -> pd.DataFrame:
    """A run's token trees: of the guesses the walk tested, how many it kept, by depth (1: the root's children)
    and by the draft's rank at the branch (0 its first choice, 1 its second, 2 its third or later). One row per
    (depth, rank) tested, sorted; columns depth, rank, tested, kept, share. Empty for a run without trees."""
    tested: dict[tuple[int, int], int] = {}
    kept: dict[tuple[int, int], int] = {}
    for _, ev in _pairs(events):
        t = ev.tree if isinstance(ev, Round) else None
        if t is None:
            continue
        for i, (depth, status) in enumerate(zip(t.depths, t.status)):
            if status:  # never tested: the walk kept an earlier sibling or never reached the branch
                key = (depth, min(t.ranks[i], len(TREE_RANKS) - 1))
                tested[key] = tested.get(key, 0) + 1
                kept[key] = kept.get(key, 0) + (status == "kept")
    rows = [(d, j, n, kept[(d, j)], kept[(d, j)] / n) for (d, j), n in sorted(tested.items())]
    return pd.DataFrame(rows, columns=["depth", "rank", "tested", "kept", "share"])
