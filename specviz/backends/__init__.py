"""What runs a target for the engine: `base` (the one protocol the engine calls, `TargetRun`, and `Limits`), `local`
(a loaded model and its own KV cache, on transformers or the native forward) and `served` (a target in vLLM or
llama.cpp's server, the draft here). The engine and the drafters reach them only through this face: `open_run`,
`limits_of`, `eos_ids`, `keep_opening`. Imports models, native and the top-level modules; never drafters or the
engine.
"""

from __future__ import annotations

from specviz.backends.base import LOCAL, SERVED, DecidingRun, Limits, TargetRun
from specviz.backends.local import CachedModel, keep_opening
from specviz.backends.served.connect import open_served_run
from specviz.backends.served.target import ServedTarget, eos_ids

__all__ = ["DecidingRun", "Limits", "TargetRun", "eos_ids", "keep_opening", "limits_of", "open_run"]


def open_run(lm, V: int) -> TargetRun:
    """The run a decoding loop feeds for `lm`: its server's run for a served target, else a KV cache here."""
    if isinstance(lm, ServedTarget):
        return open_served_run(lm)
    return CachedModel(lm, V)


def limits_of(lm) -> Limits:
    """What `lm`'s kind of target can give the engine (base.Limits)."""
    return SERVED if isinstance(lm, ServedTarget) else LOCAL
