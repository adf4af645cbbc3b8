"""What every tab of the app shares: the deployment limits, model loading under them, and the GPU decorator."""

from __future__ import annotations

import functools
import html
import os
from dataclasses import dataclass, field

from specviz.backends.served.connect import ServedTarget, is_url, load_served_pair
from specviz.config import BUILTIN_DRAFT, BUILTIN_TARGET, SpecvizError
from specviz.limits import Limits
from specviz.models.loaded import QUANTIZE, LoadedModel, load_model, load_pair

NO_QUANTIZE = "none"  # the page's word for full-precision weights
HTML_EVERY_S = 0.1  # at most ~10 text updates a second, so the browser keeps up on long runs (race and sweep)


def gpu(fn):
    """ZeroGPU Spaces: `spaces.GPU` on functions that run the models, only where the package is installed."""
    try:
        import spaces  # type: ignore[import-not-found]
    except ImportError:
        return fn
    return spaces.GPU(fn)


def message(err: Exception) -> str:
    """One sentence for the page; never a traceback."""
    if isinstance(err, SpecvizError):
        return str(err)
    try:
        import torch

        if isinstance(err, torch.OutOfMemoryError):
            return "The server ran out of memory for this request; try fewer tokens or a smaller model."
    except ImportError:
        pass
    if isinstance(err, MemoryError):
        return "The server ran out of memory for this request; try fewer tokens or a smaller model."
    return f"Something went wrong on the server ({type(err).__name__}); the app keeps working, please try again."


def error_html(err: Exception | str) -> str:
    text = err if isinstance(err, str) else message(err)
    return f'<div class="sv-error" role="alert">{html.escape(text)}</div>'


def _env(name: str) -> str | None:
    return os.environ.get(name, "").strip() or None


@dataclass
class UIContext:
    limits: Limits = field(default_factory=Limits.from_env)
    device: str | None = None  # None: cuda, then mps, then cpu
    # The pair used when a visitor names none; set by the operator (not checked against limits):
    # a hub id or a folder, from SPECVIZ_TARGET / SPECVIZ_DRAFT, else the built-in pair.
    default_target: str | None = field(default_factory=lambda: _env("SPECVIZ_TARGET"))
    default_draft: str | None = field(default_factory=lambda: _env("SPECVIZ_DRAFT"))
    # The default target's weights: SPECVIZ_QUANTIZE=4bit (NF4) or 8bit (int8) with bitsandbytes, else as saved
    quantize: str | None = field(default_factory=lambda: quantize_choice(_env("SPECVIZ_QUANTIZE")))

    def pair(
        self, target: str | None = None, draft: str | None = None, quantize: str | None = None
    ) -> tuple[LoadedModel | ServedTarget, LoadedModel]:
        """The pair a visitor asked for (None or "" means the default), checked against the deployment's limits.
        quantize: the target's weights ("4bit", "8bit", "none"; None: this deployment's default).

        A load that takes longer than one request may ends this request with a sentence; it goes on loading, and
        the next visitor asking for the model gets it once it is ready. Models already loaded never wait for it.
        """
        t = self.limits.check_model(target or "") or self.default_target or BUILTIN_TARGET
        d = self.limits.check_model(draft or "") or self.default_draft or BUILTIN_DRAFT
        if is_url(t):  # an allowed served target (limits.check_url) or the operator's SPECVIZ_TARGET
            return load_served_pair(t, d, device=self.device, timeout_s=self.limits.request_timeout_s)
        quant = self.quantize if quantize is None else quantize_choice(quantize)
        return load_pair(t, d, device=self.device, quantize=quant, timeout_s=self.limits.request_timeout_s)

    def target(self, name: str | None = None) -> LoadedModel | ServedTarget:
        t = self.limits.check_model(name or "") or self.default_target or BUILTIN_TARGET
        if is_url(t):
            return load_served_pair(t, need_draft=False, device=self.device)[0]
        return load_model(t, device=self.device, quantize=self.quantize, timeout_s=self.limits.request_timeout_s)


def quantize_choice(value) -> str | None:
    """The target weights asked for: "4bit" or "8bit", None for "none" or nothing; else one SpecvizError."""
    if value in (None, "", NO_QUANTIZE):
        return None
    if value not in QUANTIZE:
        raise SpecvizError(f"quantize must be {NO_QUANTIZE}, 4bit or 8bit, not {str(value)[:40]!r}.")
    return value


@functools.cache
def default_context() -> UIContext:
    return UIContext()
