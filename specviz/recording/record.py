"""Recordings: a finished run kept as data, to replay, share or export with no model loaded.

A `Recording` holds the settings, the environment (models, machine, date), every event of every lane with its
timing, and the text of every token the events mention (so a replay needs no tokenizer). Kinds:
"race" (plain and speculative lanes on a fair common clock), "step" (a step-through session), "sweep" (one plain
lane and one speculative lane per gamma, with the sweep's table) and "run" (the CLI's generate).

The file format (events <-> JSON, the schema, its validator) is specviz/recording/schema.py: `loads` validates a file
against it before anything is built, since a recording uploaded by a visitor is data from a stranger. Sizes are
capped, and every string it carries is escaped where it is shown (render.py, export.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from specviz.config import ASSETS, SpecvizError
from specviz.events import Done, Event, Round, Start, Step
from specviz.recording.schema import (
    FORMAT,
    KINDS,
    MAX_BYTES,
    VERSION,
    RecordingError,
    event_fields,
    from_json,
    to_json,
    validate,
)

RECORDINGS_DIR = ASSETS / "recordings"
TOKEN_FIELDS = frozenset({"drafted", "tokens", "token", "correction", "token_ids", "prompt_ids"})


# --- the recording ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recording:
    """One finished run as data. Each lane's events are on that lane's own compute clock (seconds)."""

    kind: str  # one of KINDS
    settings: dict  # prompt, gamma, temperature, top_k, top_p, max_new_tokens, seed, ... (flat)
    env: dict  # target, draft, device, cpu, gpu, versions, recorded_at (flat)
    lanes: dict[str, tuple[Event, ...]]  # lane name -> Start, Round | Step ..., Done
    tokens: dict[int, str]  # the text of every token the events mention: a replay needs no tokenizer
    special: tuple[int, ...] = ()  # the tokenizer's special ids among them
    extra: dict = field(default_factory=dict)  # kind-specific numbers (the sweep's table, alpha and c)
    texts: dict = field(default_factory=dict)  # lane -> its output decoded whole (bytes split across tokens join)

    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "kind": self.kind,
            "settings": to_json(self.settings),
            "env": to_json(self.env),
            "lanes": {name: [to_json(ev) for ev in evs] for name, evs in self.lanes.items()},
            "tokens": {str(k): v for k, v in self.tokens.items()},
            "special": list(self.special),
            "extra": to_json(self.extra),
            "texts": dict(self.texts),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.dumps(), encoding="utf-8")
        return path

    @property
    def recorded_on(self) -> str:
        """The machine in a few words: the GPU if there was one, else the CPU and its cores."""
        e = self.env
        if e.get("gpu"):
            return str(e["gpu"])
        cores = f", {e['cpu_count']} cores" if e.get("cpu_count") else ""
        return f"{e.get('cpu') or 'an unknown machine'}{cores}"

    def done(self, lane: str) -> Done | None:
        return next((ev for ev in self.lanes.get(lane, ()) if isinstance(ev, Done)), None)

    def text(self, lane: str) -> str:
        """The lane's output as text (special tokens left out), as the tokenizer decoded it when recorded."""
        if lane in self.texts:
            return self.texts[lane]
        d = self.done(lane)
        ids = d.token_ids if d else ()
        return "".join(self.tokens.get(t, "") for t in ids if t not in set(self.special))

    def result(self, lane: str):
        """The lane as `specviz.generate` returns a run: token ids, text, stats, finish reason."""
        from specviz.api import Result

        d = self.done(lane)
        return Result(d.token_ids, self.text(lane), d.stats, d.finish_reason)


def loads(text: str | bytes) -> Recording:
    """A Recording from JSON text, validated against `schema()`; RecordingError with one sentence otherwise."""
    if len(text) > MAX_BYTES:
        raise RecordingError(f"This recording is too large ({len(text):,} bytes; at most {MAX_BYTES:,}).")
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise RecordingError("This file is not a specviz recording: it is not valid JSON text.") from None
    validate(data)
    try:
        lanes = {name: tuple(from_json(ev) for ev in evs) for name, evs in data["lanes"].items()}
    except (TypeError, ValueError) as err:  # a value the schema allows but an event's own checks refuse
        raise RecordingError(f"This recording holds an event specviz cannot rebuild ({type(err).__name__}).") from None
    for name, evs in lanes.items():
        if not isinstance(evs[0], Start) or not isinstance(evs[-1], Done):
            raise RecordingError(f"This is not a valid specviz recording: lane {name!r} must run from Start to Done.")
    return Recording(
        kind=data["kind"],
        settings=data["settings"],
        env=data["env"],
        lanes=lanes,
        tokens={int(k): v for k, v in data["tokens"].items()},
        special=tuple(data.get("special", ())),
        extra=data.get("extra", {}),
        texts=data.get("texts", {}),
    )


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def load(path: str | Path) -> Recording:
    """Read and validate a recording file (at most MAX_BYTES)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError:
        raise RecordingError(f"The recording {path.name} could not be read.") from None
    return loads(raw)


def shipped() -> dict[str, Path]:
    """The recordings that come with specviz (assets/recordings), by file name."""
    return {p.name: p for p in sorted(RECORDINGS_DIR.glob("*.json")) if p.name != "lessons.json"}


# --- making one --------------------------------------------------------------------------------------


def token_ids(evs: Iterable) -> set[int]:
    """Every token id the events mention (fields named in TOKEN_FIELDS, nested dataclasses included)."""
    out: set[int] = set()
    for ev in evs:
        for f in event_fields(ev):
            v = getattr(ev, f.name)
            if f.name in TOKEN_FIELDS:
                out.update(v if isinstance(v, tuple) else [v])
            elif isinstance(v, tuple) and v and dataclasses.is_dataclass(v[0]):
                out |= token_ids(v)
    return out


def environment(target=None, draft=None, settings: dict | None = None) -> dict:
    """The models, the machine and the date: what a reader needs to judge the recorded times (and, where
    `settings` ran a head drafter, how the head computed: head_native.py's choice)."""
    from specviz.bench.machine import machine_info

    info = machine_info()
    keys = (
        "cpu",
        "cpu_id",
        "cpu_vector",
        "cpu_count",
        "gpu",
        "load_avg_1min",
        "torch",
        "transformers",
        "python",
        "platform",
    )
    env = {k: info.get(k) for k in keys}  # the load: a shared machine's times are slower than its best
    if target is not None:
        env |= {"target": target.name, "target_params": target.n_params, "device": target.device.type}
    if draft is not None:
        env |= {"draft": draft.name, "draft_params": draft.n_params}
    if target is not None and draft is not None:  # the per-machine choices (kernels.py): they set the recorded times
        from specviz.models.loaded import pair_backend, pair_dtypes

        env |= {"dtypes": pair_dtypes(target, draft), "backend": pair_backend(target, draft)}
    if target is not None:  # how the prompt was encoded (runtime.keep_opening): it sets the recorded prefill
        from specviz.backends.local import opening_note

        env["prompt_encoding"] = opening_note(target)
    if target is not None and str((settings or {}).get("drafter", "")).endswith("head"):
        from specviz.models.head import head_backend

        env["head_backend"] = head_backend(target, settings.get("head") or "")
    env["recorded_at"] = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    return env


def make(kind: str, settings: dict, lanes: dict[str, Iterable[Event]], tokenizer, env: dict, extra=None) -> Recording:
    """A Recording of finished lanes; `tokenizer` gives the text of every token they mention."""
    if kind not in KINDS:
        raise SpecvizError(f"Unknown recording kind {kind!r}; use one of {', '.join(KINDS)}.")
    lanes = {name: tuple(evs) for name, evs in lanes.items()}
    ids = sorted(set().union(*(token_ids(evs) for evs in lanes.values())))
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    text = {i: tokenizer.decode([i], skip_special_tokens=False) for i in ids}
    done = {name: next((ev for ev in evs if isinstance(ev, Done)), None) for name, evs in lanes.items()}
    texts = {name: tokenizer.decode(list(d.token_ids), skip_special_tokens=True) for name, d in done.items() if d}
    special_ids = tuple(i for i in ids if i in special)
    return Recording(kind, dict(settings), dict(env), lanes, text, special_ids, extra or {}, texts)


def settings_of(prompt: str, cfg) -> dict:
    """A run's settings, flat: the prompt and every field of its SpecConfig (sampling fields inlined)."""
    out: dict = {"prompt": prompt}
    for k, v in dataclasses.asdict(cfg).items():
        out |= v if isinstance(v, dict) else {k: v}
    return out


def keep(events: Iterable[Event], into: list) -> Iterator[Event]:
    """Pass events through, keeping each in `into` (to record a run while it is shown)."""
    for ev in events:
        into.append(ev)
        yield ev


class RecordedTokenizer:
    """The recorded token table behind the two calls render.Pieces makes of a tokenizer."""

    def __init__(self, rec: Recording):
        self.table, self.all_special_ids = rec.tokens, list(rec.special)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return "".join(self.table.get(int(i), "?") for i in ids if int(i) not in skip)


# --- playing one back ------------------------------------------------------------------------------


def clock_of(ev: Event, before: float) -> float:
    """A lane's own clock once `ev` is out: the compute so far (Start: the prompt encoding)."""
    if isinstance(ev, Start):
        return ev.prefill_s
    if isinstance(ev, Done):
        return float(ev.stats.get("wall_s", before)) if isinstance(ev.stats, dict) else before
    return getattr(ev, "elapsed_s", before)


def timeline(rec: Recording) -> Iterator[tuple[float, str, Event]]:
    """(seconds since the replay began, lane, event) in the order the page showed them.

    A race's lanes ran side by side, interleaved by `engine.race` on their own clocks; they are interleaved
    again by the same function, so the order is the recorded one. Other kinds ran one lane after another.
    """
    if rec.kind == "race" and "ar" in rec.lanes:
        from specviz.engine.loop import race

        clock = dict.fromkeys(rec.lanes, 0.0)
        for lane, ev in race(*(iter(evs) for evs in rec.lanes.values()), names=tuple(rec.lanes)):
            clock[lane] = clock_of(ev, clock[lane])
            yield clock[lane], lane, ev
        return
    offset = 0.0
    for lane, evs in rec.lanes.items():
        t = 0.0
        for ev in evs:
            t = clock_of(ev, t)
            yield offset + t, lane, ev
        offset += t


def rounds_of(rec: Recording) -> list[list[tuple[float, str, Event]]]:
    """The timeline cut into steps of one Round or Step each (Start and Done ride with their neighbours)."""
    steps: list[list] = [[]]
    for item in timeline(rec):
        steps[-1].append(item)
        if isinstance(item[2], (Round, Step)):
            steps.append([])
    if not steps[-1]:
        steps.pop()
    elif len(steps) > 1:  # trailing Done events join the last round
        steps[-2].extend(steps.pop())
    return steps


# --- the Python API and the CLI --------------------------------------------------------------------


def run(prompt: str, modes: tuple[str, ...] = ("ar", "spec"), **options) -> Recording:
    """Decode `prompt` and record it: both modes raced on a fair common clock ("race"), or one mode ("run").

    Options as in `specviz.generate` (target, draft, gamma, temperature, ..., device); they are checked before a
    model is loaded (see `run_request`).
    """
    from specviz.request import RunRequest

    if "mode" in options:
        raise SpecvizError("Give the modes to record as modes=('ar', 'spec'), not mode.")
    return run_request(prompt, tuple(modes), RunRequest.of(options, "record_run"))


def run_request(prompt: str, modes: tuple[str, ...], req) -> Recording:
    """Run the request `req` (request.RunRequest) in `modes` and record it; its settings are `req`'s."""
    from specviz.api import check_text, decode, load_for
    from specviz.engine.loop import race

    if modes not in (("spec",), ("ar",), ("ar", "spec")):
        raise SpecvizError("modes must be ('spec',), ('ar',) or ('ar', 'spec').")
    check_text(prompt)
    p, q = load_for(req.replace(mode=modes[-1]))  # a draft model only where a speculative lane needs one
    runs = {mode: decode(p, q, prompt, req.replace(mode=mode)) for mode in modes}
    if len(modes) == 2:
        merged = list(race(runs["ar"], runs["spec"]))
        lanes = {m: [ev for side, ev in merged if side == m] for m in modes}
    else:
        lanes = {modes[0]: list(runs[modes[0]])}
    settings = req.settings(prompt)
    return make("race" if len(modes) == 2 else "run", settings, lanes, p.tokenizer, environment(p, q, settings))
