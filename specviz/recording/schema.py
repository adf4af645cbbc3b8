"""The file format of a recording: events <-> JSON by their dataclass fields, the JSON Schema built from the
same annotations, and a validator for the part of JSON Schema that schema uses (no dependency).

Events are serialised generically, class name and dataclass fields, so a field added to an event in
specviz/events.py flows through, into the schema too, without this module changing. `validate` gives one
sentence naming the place of the first problem: an uploaded recording is data from a stranger.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing

from specviz import events as events_module
from specviz.config import SpecvizError
from specviz.events import Event

FORMAT = "specviz-recording"
VERSION = 1
KINDS = ("race", "step", "sweep", "run")
MAX_BYTES = 8_000_000  # a 256-token race is ~100 kB; a step-through session with candidates ~1 MB
MAX_ITEMS = 50_000  # any one list: events of a lane, token ids, candidates ...
MAX_STRING = 200_000  # any one string (a prompt is at most 100,000 characters)
MAX_KEYS = 100_000  # any one object (the token table is the largest)
MAX_LANES = 16


class RecordingError(SpecvizError):
    """A recording that cannot be read; the message is one sentence."""


# --- events <-> JSON, generically ------------------------------------------------------------------


def _event_classes() -> dict[str, type]:
    """Every dataclass defined in specviz.events, by name: the types a recording may carry."""
    return {
        name: obj
        for name, obj in vars(events_module).items()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == events_module.__name__
    }


def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls, vars(events_module))


def to_json(value):
    """An event (or any value inside one) as plain JSON data; NaN and infinities become null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__, **{f.name: to_json(getattr(value, f.name)) for f in event_fields(value)}}
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def event_fields(obj) -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in dataclasses.fields(obj) if f.init)


def from_json(data: dict) -> Event:
    """The event dataclass back from `to_json`'s data (validated first by `loads`); null floats become NaN."""
    cls = _event_classes()[data["type"]]
    hints = _hints(cls)
    return cls(**{k: _build(v, hints[k]) for k, v in data.items() if k != "type"})


def _build(value, hint):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if value is None:
        return math.nan if hint is float else None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_json(value)
    if origin is tuple:
        return tuple(_build(v, args[0]) for v in value)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _build(value, inner[0]) if len(inner) == 1 else value
    if hint is float:
        return float(value)
    return value


# --- the schema, from the same annotations -----------------------------------------------------------

_SCALAR = {"type": ["string", "number", "boolean", "null"], "maxLength": MAX_STRING}
_FLAT = {"type": "object", "maxProperties": 200, "additionalProperties": _SCALAR}


def _type_schema(hint) -> dict:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
    if hint is float:
        return {"type": ["number", "null"]}  # null: NaN (the draw r of a greedy round) or an infinity
    if hint is str:
        return {"type": "string", "maxLength": MAX_STRING}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return {"$ref": f"#/$defs/{hint.__name__}"}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin is tuple:
        return {"type": "array", "maxItems": MAX_ITEMS, "items": _type_schema(args[0])}
    if hint is dict or origin is dict:
        return _FLAT
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(a) for a in args]}
    if hint is type(None):
        return {"type": "null"}
    return _SCALAR  # an annotation this module does not know yet: any JSON scalar


def _class_schema(cls: type) -> dict:
    hints = _hints(cls)
    props = {"type": {"const": cls.__name__}}
    required = ["type"]
    for f in event_fields(cls):
        props[f.name] = _type_schema(hints[f.name])
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def schema() -> dict:
    """The JSON Schema of a recording file, built from the event dataclasses (so it follows their fields)."""
    classes = _event_classes()
    defs = {name: _class_schema(cls) for name, cls in classes.items()}
    lane_events = [{"$ref": f"#/$defs/{n}"} for n in ("Start", "Round", "Step", "Done") if n in classes]
    lane_events += [
        {"$ref": f"#/$defs/{n}"}
        for n in classes
        if n not in ("Start", "Round", "Step", "Done", "Candidates", "TreeRound")
    ]
    defs["Event"] = {"oneOf": lane_events}
    table_row = {"type": "object", "maxProperties": 50, "additionalProperties": _SCALAR}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "specviz recording",
        "type": "object",
        "required": ["format", "version", "kind", "settings", "env", "lanes", "tokens"],
        "additionalProperties": False,
        "properties": {
            "format": {"const": FORMAT},
            "version": {"const": VERSION},
            "kind": {"enum": list(KINDS)},
            "settings": _FLAT,
            "env": _FLAT,
            "lanes": {
                "type": "object",
                "minProperties": 1,
                "maxProperties": MAX_LANES,
                "propertyNames": {"maxLength": 40},
                "additionalProperties": {
                    "type": "array",
                    "minItems": 2,
                    "maxItems": MAX_ITEMS,
                    "items": {"$ref": "#/$defs/Event"},
                },
            },
            "tokens": {
                "type": "object",
                "maxProperties": MAX_KEYS,
                "propertyNames": {"maxLength": 9, "pattern": "^[0-9]+$"},
                "additionalProperties": {"type": "string", "maxLength": 1000},
            },
            "special": {"type": "array", "maxItems": 1000, "items": {"type": "integer", "minimum": 0}},
            "texts": {
                "type": "object",
                "maxProperties": MAX_LANES,
                "additionalProperties": {"type": "string", "maxLength": MAX_STRING},
            },
            "extra": {
                "type": "object",
                "maxProperties": 50,
                "additionalProperties": {"anyOf": [_SCALAR, {"type": "array", "maxItems": 100, "items": table_row}]},
            },
        },
        "$defs": defs,
    }


# --- a validator for the part of JSON Schema that schema() uses ------------------------------------------

_JSON_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_WORDS = {
    "object": "an object",
    "array": "a list",
    "string": "text",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def _where(path: list) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "the file"


def _fail(path: list, what: str) -> RecordingError:
    return RecordingError(f"This is not a valid specviz recording: {_where(path)} {what}.")


def validate(data, sch: dict | None = None) -> None:
    """Raise RecordingError (one sentence naming the place) unless `data` fits the recording schema."""
    root = sch or schema()
    try:
        _check(data, root, root, [])
    except RecursionError:
        raise RecordingError("This is not a valid specviz recording: it is nested far too deeply.") from None


def _check(v, s: dict, root: dict, path: list) -> None:
    if "$ref" in s:
        return _check(v, root["$defs"][s["$ref"].rsplit("/", 1)[1]], root, path)
    if "oneOf" in s:  # the events: chosen by their "type" field
        names = [alt["$ref"].rsplit("/", 1)[1] for alt in s["oneOf"]]
        kind = v.get("type") if isinstance(v, dict) else None
        if kind not in names:
            raise _fail(path, f"must be an event ({', '.join(names)})")
        return _check(v, root["$defs"][kind], root, path)
    if "anyOf" in s:
        for alt in s["anyOf"]:
            try:
                return _check(v, alt, root, path)
            except RecordingError:
                continue
        raise _fail(path, "has a value of the wrong kind")
    if "const" in s and v != s["const"]:
        raise _fail(path, f"must be {json.dumps(s['const'])}")
    if "enum" in s and v not in s["enum"]:
        raise _fail(path, f"must be one of {', '.join(json.dumps(e) for e in s['enum'])}")
    if "type" in s:
        allowed = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(_JSON_TYPES[t](v) for t in allowed):
            raise _fail(path, f"must be {' or '.join(_WORDS[t] for t in allowed)}")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if v < s.get("minimum", -math.inf) or v > s.get("maximum", math.inf):
            raise _fail(path, "is out of range")
    if isinstance(v, str) and len(v) > s.get("maxLength", MAX_STRING):
        raise _fail(path, "is too long")
    if isinstance(v, list):
        if not s.get("minItems", 0) <= len(v) <= s.get("maxItems", MAX_ITEMS):
            raise _fail(path, f"has {len(v)} items, outside what a recording holds")
        for i, item in enumerate(v):
            _check(item, s.get("items", {}), root, path + [i])
    if isinstance(v, dict):
        _check_object(v, s, root, path)


def _check_object(v: dict, s: dict, root: dict, path: list) -> None:
    if not s.get("minProperties", 0) <= len(v) <= s.get("maxProperties", MAX_KEYS):
        raise _fail(path, f"has {len(v)} entries, outside what a recording holds")
    for key in s.get("required", ()):
        if key not in v:
            raise _fail(path, f"lacks the field {json.dumps(key)}")
    props, extra = s.get("properties", {}), s.get("additionalProperties", True)
    names = s.get("propertyNames", {})
    for key, item in v.items():
        if len(key) > names.get("maxLength", 1000) or not re.fullmatch(names.get("pattern", ".*"), key, re.S):
            raise _fail(path, f"has a key that is not allowed ({json.dumps(key[:40])})")
        if key in props:
            _check(item, props[key], root, path + [key])
        elif extra is False:
            raise _fail(path, f"has a field a recording does not have ({json.dumps(key[:40])})")
        elif isinstance(extra, dict):
            _check(item, extra, root, path + [key])
