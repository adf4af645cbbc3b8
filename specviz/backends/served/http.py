"""The wire to a served target: an OpenAI-compatible server's address, one HTTP client, its /metrics counters.

`is_url` and `base_url` say what counts as a server address and normalise it (limits.py compares the operator's
SPECVIZ_TARGET_URLS with them); `Client` sends JSON to the one URL the caller named, with a timeout per request,
never following a redirect or a proxy, and turns every failure into one SpecvizError sentence; `EngineSpec` and
`parse_spec_metrics` read vLLM's own speculative-decoding counters from its Prometheus text. What specviz asks the
server and why each answer is exact is served.py's.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from specviz.config import SpecvizError

TIMEOUT_S = 60.0  # one request; a CPU server's first request compiles for a few seconds


def is_url(name) -> bool:
    """Whether a target name is a served target's address (http:// or https://)."""
    return isinstance(name, str) and name.strip().lower().startswith(("http://", "https://"))


def base_url(url: str) -> str:
    """The OpenAI base ("http://host:port/v1") of a URL given with or without /v1; SpecvizError if malformed."""
    raw = url.strip()
    try:
        parts = urllib.parse.urlsplit(raw)
        port = parts.port  # raises on a port that is not a number
    except ValueError:
        raise SpecvizError(f"{raw[:80]} is not a valid server address; use http://HOST:PORT/v1.") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise SpecvizError(f"{raw[:80]} is not a valid server address; use http://HOST:PORT/v1.")
    if parts.username or parts.password:
        raise SpecvizError("A server address must not carry a user name or password.")
    path = parts.path.rstrip("/")
    path = path if path.endswith("/v1") else path + "/v1"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}{path}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # a redirect could point anywhere: it surfaces as an HTTP error instead


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def _server_message(body: bytes) -> str:
    """The server's own error message, short: vLLM sends {"error": {"message": ...}} or {"message": ...}."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
        err = data.get("error", data) if isinstance(data, dict) else data
        text = str(err.get("message") if isinstance(err, dict) and err.get("message") else err)
    except ValueError:
        pass
    line = next((x.strip() for x in text.splitlines() if x.strip()), "no message")
    return line[:200].rstrip(" .")


class Client:
    """HTTP to one server: JSON in and out, a timeout per request, no redirects, no proxies; errors as sentences."""

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S):
        self.base = base_url(url)
        self.root = self.base[: -len("/v1")]
        self.timeout_s = timeout_s

    def get(self, path: str) -> bytes:
        return self._send(urllib.request.Request(self.root + path, method="GET"))

    def post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.root + path, data=data, headers={"Content-Type": "application/json"})
        return self._json(self._send(req), path)

    def get_json(self, path: str) -> dict:
        return self._json(self.get(path), path)

    def _json(self, raw: bytes, path: str):
        try:
            return json.loads(raw)
        except ValueError:
            raise SpecvizError(
                f"The server at {self.base} sent {path} a reply that is not JSON, so it is not an OpenAI-compatible server."
            ) from None

    def _send(self, req: urllib.request.Request) -> bytes:
        where = self.base
        try:
            with _OPENER.open(req, timeout=self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            if 300 <= e.code < 400:
                raise SpecvizError(
                    f"The server at {where} answered with a redirect, which specviz does not follow."
                ) from None
            what = urllib.parse.urlsplit(req.full_url).path
            raise SpecvizError(
                f"The server at {where} answered {e.code} to {what}: {_server_message(e.read())}."
            ) from None
        except TimeoutError:
            raise SpecvizError(f"The server at {where} did not answer within {self.timeout_s:g} seconds.") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise SpecvizError(f"The server at {where} did not answer within {self.timeout_s:g} seconds.") from None
            raise SpecvizError(
                f"The server at {where} cannot be reached ({_reason(e.reason)}); check that it runs and the address."
            ) from None
        except (ConnectionError, OSError) as e:
            raise SpecvizError(f"The connection to the server at {where} failed ({_reason(e)}).") from None


def _reason(reason) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    text = str(getattr(reason, "strerror", None) or reason)
    return re.sub(r"\s+", " ", text)[:120].rstrip(" .") or type(reason).__name__


@dataclass(frozen=True)
class EngineSpec:
    """The engine's own speculative decoding, from its /metrics counters (cumulative since the server started)."""

    drafts: int  # rounds in which the engine drafted
    draft_tokens: int
    accepted: int
    accepted_per_pos: tuple[int, ...]  # accepted at draft position i (0-based)

    @property
    def acceptance_per_pos(self) -> tuple[float, ...]:
        """Of the engine's drafts, the share whose guess at position i was kept (vLLM: per_pos[i] / drafts)."""
        return tuple(a / self.drafts for a in self.accepted_per_pos) if self.drafts else ()

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per engine step while it speculates: 1 + accepted / drafts (vLLM's definition)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else 0.0


_METRIC = re.compile(r"^(vllm:spec_decode_[a-z_]+?)(?:_total)?(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)\s*$")


def parse_spec_metrics(text: str) -> EngineSpec | None:
    """The engine's speculative-decoding counters from Prometheus text; None when the server does not speculate."""
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                per_pos[int(pos.group(1))] = per_pos.get(int(pos.group(1)), 0.0) + value
        else:
            sums[name] = sums.get(name, 0.0) + value
    need = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    if not all(n in sums for n in need):
        return None
    drafts, tokens, accepted = (int(sums[n]) for n in need)
    positions = tuple(int(per_pos.get(i, 0)) for i in range(max(per_pos) + 1)) if per_pos else ()
    return EngineSpec(drafts=drafts, draft_tokens=tokens, accepted=accepted, accepted_per_pos=positions)
