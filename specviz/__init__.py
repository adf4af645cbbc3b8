"""specviz: see, teach and judge speculative decoding.

import specviz
r = specviz.generate("Tell me about gravity.")          # the built-in pair, greedy, speculative
r.text, r.stats["acceptance_rate"]
for event in specviz.stream("What is AI?", mode="ar"):  # Start, Step..., Done
    ...
"""

from .api import Result, encode_prompt, generate, stream
from .config import SamplingConfig, SpecConfig, SpecvizError
from .engine import autoregressive_decode, race, speculative_decode
from .events import Candidates, Done, Round, Start, Step
from .models import LoadedModel, load_model, load_pair

__all__ = [
    "Candidates",
    "Done",
    "LoadedModel",
    "Result",
    "Round",
    "SamplingConfig",
    "SpecConfig",
    "SpecvizError",
    "Start",
    "Step",
    "autoregressive_decode",
    "check_pair",
    "encode_prompt",
    "generate",
    "load_model",
    "load_pair",
    "race",
    "speculative_decode",
    "stream",
]


def check_pair(*args, **kwargs):
    """See specviz.pairs.check_pair (imported lazily: it measures with the models)."""
    from .pairs import check_pair as _check

    return _check(*args, **kwargs)
