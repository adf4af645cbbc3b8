"""specviz: see, teach and judge speculative decoding.

import specviz
r = specviz.generate("Tell me about gravity.")          # the built-in pair, greedy, speculative
r.text, r.stats["acceptance_rate"]
for event in specviz.stream("What is AI?", mode="ar"):  # Start, Step..., Done
    ...
"""

from specviz.api import Result, encode_prompt, generate, stream
from specviz.config import SamplingConfig, SpecConfig, SpecvizError
from specviz.engine.loop import autoregressive_decode, race, speculative_decode
from specviz.events import Candidates, Done, Round, Start, Step
from specviz.models.loaded import LoadedModel, load_model, load_pair
from specviz.request import RunRequest

__all__ = [
    "Candidates",
    "Done",
    "LoadedModel",
    "Result",
    "Round",
    "RunRequest",
    "SamplingConfig",
    "SpecConfig",
    "SpecvizError",
    "Start",
    "Step",
    "autoregressive_decode",
    "check_pair",
    "encode_prompt",
    "export_html",
    "generate",
    "load_model",
    "load_pair",
    "load_recording",
    "race",
    "record_run",
    "speculative_decode",
    "stream",
]


def check_pair(*args, **kwargs):
    """See specviz.pairs.check.check_pair (imported lazily: it measures with the models)."""
    from specviz.pairs.check import check_pair as _check

    return _check(*args, **kwargs)


def record_run(prompt: str, modes: tuple[str, ...] = ("ar", "spec"), **options):
    """Run and record: see specviz.recording.record.run (a Recording: .save(path), .dumps(); export with export_html)."""
    from specviz.recording.record import run

    return run(prompt, modes, **options)


def load_recording(path):
    """A recording file, validated (see specviz.recording.record.load)."""
    from specviz.recording.record import load

    return load(path)


def export_html(recording, path) -> None:
    """Write a recording as one self-contained HTML page that opens offline (see specviz.recording.export)."""
    from specviz.recording.export import write_html

    write_html(recording, path)
