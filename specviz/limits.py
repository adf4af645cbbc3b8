"""Limits for a shared deployment (a public Space, a classroom), read from environment variables.

| variable                     | default | meaning                                                        |
|------------------------------|---------|----------------------------------------------------------------|
| SPECVIZ_MAX_NEW_TOKENS       | 256     | most tokens one run may generate                               |
| SPECVIZ_MAX_PROMPT_TOKENS    | 1024    | longest prompt, in tokens after the chat template              |
| SPECVIZ_MAX_GAMMA            | 16      | largest gamma a visitor may pick (never above 16)              |
| SPECVIZ_MAX_SWEEP            | 8       | most gamma values in one sweep                                 |
| SPECVIZ_REQUEST_TIMEOUT_S    | 120     | wall-clock cap on one request, in seconds                      |
| SPECVIZ_CONCURRENCY          | 1       | requests that run the models at once (the rest queue)          |
| SPECVIZ_MAX_QUEUE            | 64      | requests waiting in the queue at most; past that, "queue full" |
| SPECVIZ_ALLOWED_MODELS       | (any)   | comma-separated hub ids visitors may load; "builtin" = built-in only |
| SPECVIZ_MODEL_DIRS           | (none)  | comma-separated folders whose sub-folders visitors may load    |
| SPECVIZ_TARGET_URLS          | (none)  | comma-separated served targets (http://HOST:PORT/v1) visitors may name |
| SPECVIZ_MAX_LOADED_MODELS    | 4       | models kept in memory (least recently used evicted)            |
| SPECVIZ_SESSION_IDLE_S       | 300     | a step-through session unused this long is freed               |
| SPECVIZ_MAX_SESSIONS         | 100     | step-through sessions kept at once (least recently used freed) |
| SPECVIZ_SESSION_MEMORY_MB    | 1024    | KV-cache memory all step-through sessions may hold together    |
| SPECVIZ_MALLOC_ARENAS        | 2       | glibc malloc arenas for the server's threads (app.py; memory.py) |
| SPECVIZ_TRIM_S               | 60      | seconds between heap trims and the server's memory log line     |

A value that is not a whole number, or is below 1, stops the app at start-up with a sentence naming the
variable: a typo in a security setting must not silently fall back to a default.

Model names a visitor types go through `Limits.check_model`: a hub id must be on the allowlist (when there is
one), and a folder must resolve (symlinks followed) to a sub-folder of one of SPECVIZ_MODEL_DIRS. The built-in
pair is always allowed. Visitors can never turn on trust_remote_code: nothing here or in the UI passes it.
A served target's address (served.py) must be one of SPECVIZ_TARGET_URLS, compared after normalising (scheme, host,
port, path), so nothing a visitor types reaches a host the operator did not list.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from specviz.backends.served.http import base_url, is_url
from specviz.config import BUILTIN_DRAFT, BUILTIN_TARGET, GAMMA_MAX, SpecvizError, env_int

T = TypeVar("T")

# A Hugging Face repo id: "name" or "owner/name", ASCII letters, digits, "-", "_", "."; no "..", no "--".
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?", re.ASCII)
_MAX_NAME = 300


def _list(name: str) -> tuple[str, ...] | None:
    raw = os.environ.get(name, "").strip()
    return tuple(s.strip() for s in raw.split(",") if s.strip()) if raw else None


def _whole(name: str, value) -> int:
    """A whole number from whatever the page or the API sent (int, float, numeric text); else SpecvizError."""
    if isinstance(value, bool) or value is None:
        raise SpecvizError(f"{name} must be a whole number, not {value!r}.")
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        raise SpecvizError(f"{name} must be a whole number, not {str(value)[:40]!r}.") from None
    if not math.isfinite(f) or f != int(f):
        raise SpecvizError(f"{name} must be a whole number, not {str(value)[:40]}.")
    return int(f)


@dataclass(frozen=True)
class Limits:
    max_new_tokens: int = 256
    max_prompt_tokens: int = 1024
    max_gamma: int = GAMMA_MAX
    max_sweep: int = 8
    request_timeout_s: int = 120
    concurrency: int = 1
    max_queue: int = 64
    max_loaded_models: int = 4
    allowed_models: tuple[str, ...] | None = None  # None: any hub id; the built-in pair is always allowed
    model_dirs: tuple[str, ...] | None = None  # None: visitors may not load local folders
    # Step-through sessions hold KV caches between clicks: a class opening the tab at once must not exhaust memory
    session_idle_s: int = 300
    max_sessions: int = 100
    session_memory_mb: int = 1024
    target_urls: tuple[str, ...] | None = None  # None: visitors may not name served targets (served.py)

    @classmethod
    def from_env(cls) -> Limits:
        return cls(
            max_new_tokens=env_int("SPECVIZ_MAX_NEW_TOKENS", 256),
            max_prompt_tokens=env_int("SPECVIZ_MAX_PROMPT_TOKENS", 1024),
            max_gamma=min(env_int("SPECVIZ_MAX_GAMMA", GAMMA_MAX), GAMMA_MAX),
            max_sweep=env_int("SPECVIZ_MAX_SWEEP", 8),
            request_timeout_s=env_int("SPECVIZ_REQUEST_TIMEOUT_S", 120),
            concurrency=env_int("SPECVIZ_CONCURRENCY", 1),
            max_queue=env_int("SPECVIZ_MAX_QUEUE", 64),
            max_loaded_models=env_int("SPECVIZ_MAX_LOADED_MODELS", 4),
            allowed_models=_list("SPECVIZ_ALLOWED_MODELS"),
            model_dirs=_list("SPECVIZ_MODEL_DIRS"),
            session_idle_s=env_int("SPECVIZ_SESSION_IDLE_S", 300),
            max_sessions=env_int("SPECVIZ_MAX_SESSIONS", 100),
            session_memory_mb=env_int("SPECVIZ_SESSION_MEMORY_MB", 1024),
            target_urls=_list("SPECVIZ_TARGET_URLS"),
        )

    # --- models ---------------------------------------------------------------------------------

    def check_model(self, name: str) -> str:
        """The model name a visitor typed, if this deployment allows it; else one clear SpecvizError.

        Returns "" (meaning: the built-in model), a built-in name, an allowed hub id, or the resolved
        absolute path of an allowed folder (symlinks already followed, so loading it cannot escape).
        """
        if name is None:
            return ""
        if not isinstance(name, str):
            raise SpecvizError("A model name must be text.")
        name = name.strip()
        if not name or name in (BUILTIN_TARGET, BUILTIN_DRAFT):
            return name
        if len(name) > _MAX_NAME or not name.isprintable():
            raise SpecvizError("That model name is not valid.")
        if is_url(name):
            return self.check_url(name)
        exists_here = os.path.lexists(name)  # transformers loads an existing folder before it asks the hub
        if _HUB_ID.fullmatch(name) and ".." not in name and "--" not in name and not exists_here:
            return self._check_hub_id(name)
        if exists_here or name.startswith((".", "~")) or "/" in name or "\\" in name:
            return self._check_folder(name)
        raise SpecvizError("That model name is not valid; use a Hugging Face id such as owner/name.")

    def check_url(self, url: str) -> str:
        """A served target's address, normalised, if it is one of SPECVIZ_TARGET_URLS; else one SpecvizError."""
        if not self.target_urls:
            raise SpecvizError("This deployment does not allow served targets.")
        try:
            base = base_url(url)
            allowed = {base_url(u) for u in self.target_urls}
        except SpecvizError:
            raise SpecvizError("That server address is not valid; use http://HOST:PORT/v1.") from None
        if base not in allowed:
            raise SpecvizError("This deployment does not allow that server; ask its operator for the list.")
        return base

    def _check_hub_id(self, name: str) -> str:
        if self.allowed_models is not None and name not in self.allowed_models:
            allowed = ", ".join(m for m in self.allowed_models if m != "builtin") or "the built-in pair only"
            raise SpecvizError(f"This deployment only allows these models: {allowed}.")
        return name

    def _check_folder(self, name: str) -> str:
        if not self.model_dirs:
            raise SpecvizError("This deployment does not allow loading local folders.")
        try:
            path = Path(name).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):  # a symlink loop, an unknown ~user, an unencodable name
            raise SpecvizError("That folder is outside the folders this deployment allows.") from None
        for root in self.model_dirs:
            root_path = Path(root).expanduser().resolve()
            if path != root_path and path.is_relative_to(root_path):
                if not path.is_dir():
                    raise SpecvizError(f"There is no model folder at {name}.")
                return str(path)
        raise SpecvizError("That folder is outside the folders this deployment allows.")

    # --- one request ----------------------------------------------------------------------------

    def check_run(self, max_new_tokens, gamma) -> tuple[int, int]:
        """(max_new_tokens, gamma) as whole numbers within this deployment's caps; else SpecvizError."""
        n = _whole("max new tokens", max_new_tokens)
        g = _whole("gamma", gamma)
        if n < 1:
            raise SpecvizError(f"max new tokens must be at least 1, not {n}.")
        if n > self.max_new_tokens:
            raise SpecvizError(f"max new tokens is capped at {self.max_new_tokens} here, not {n}.")
        if not 1 <= g <= self.max_gamma:
            raise SpecvizError(f"gamma must be a whole number from 1 to {self.max_gamma} here, not {g}.")
        return n, g

    def check_sweep(self, gammas: Iterable) -> tuple[int, ...]:
        """The distinct gamma values of a sweep, sorted, each and their number within the caps."""
        if isinstance(gammas, str):
            gammas = [g for g in re.split(r"[\s,;]+", gammas) if g]
        try:
            values = sorted({_whole("gamma", g) for g in gammas})
        except TypeError:
            raise SpecvizError("The sweep needs a list of gamma values, such as 1, 2, 4, 8.") from None
        if not values:
            raise SpecvizError("The sweep needs at least one gamma value, such as 1, 2, 4, 8.")
        if len(values) > self.max_sweep:
            raise SpecvizError(f"A sweep may try at most {self.max_sweep} gamma values here, not {len(values)}.")
        for g in values:
            if not 1 <= g <= self.max_gamma:
                raise SpecvizError(f"gamma must be a whole number from 1 to {self.max_gamma} here, not {g}.")
        return tuple(values)

    def check_prompt_tokens(self, n: int) -> None:
        if n > self.max_prompt_tokens:
            raise SpecvizError(f"The prompt is too long ({n} tokens; at most {self.max_prompt_tokens} here).")

    def within_time(self, items: Iterator[T], start: float | None = None) -> Iterator[T]:
        """`items` until the request's wall-clock cap, then one SpecvizError; the source is closed either way.

        Checked between items, so an engine stream stops within one round of the deadline. `start` is a
        time.monotonic() value taken when the request began (default: now).
        """
        deadline = (time.monotonic() if start is None else start) + self.request_timeout_s
        try:
            for item in items:
                yield item
                if time.monotonic() > deadline:
                    raise SpecvizError(
                        f"This request ran past the {self.request_timeout_s}-second limit here and was stopped; "
                        "try fewer tokens."
                    )
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
