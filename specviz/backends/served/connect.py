"""A served target: p runs in a serving engine, the draft q runs here (the rounds and what is exact: served_run.py).

Two engines: vLLM's OpenAI-compatible server (token ids in and out: `ServedRun`) and llama-cpp-python's (text in,
tokens named by their text: `llamacpp.LlamaCppRun`, greedy only in the spec lane). `connect` tells them apart by
their tokenize endpoints, once per address, with every check made then; `open_served_run` gives the run the engine
feeds (backends.open_run picks it for a served target).
Requests go only to the URL the caller named (the page allows only the operator's SPECVIZ_TARGET_URLS, limits.py);
redirects and proxies are never followed. Every failure a user can cause is one SpecvizError sentence.

Here: `connect`, `open_served_run`, `load_served_pair` and the engine's own numbers (`engine_spec`, `engine_step_s`). The
wire (addresses, the HTTP client, the /metrics parser) is served_http.py's, `ServedTarget` served_target.py's and
`ServedRun` served_run.py's; their public names are importable from here too.
"""

from __future__ import annotations

import threading
import time

import torch

from specviz.backends.served import llamacpp
from specviz.backends.served.http import TIMEOUT_S, Client, EngineSpec, base_url, is_url, parse_spec_metrics  # noqa: F401 (base_url, is_url: importable from here, as before served_http.py)
from specviz.backends.served.run import ServedRun  # noqa: F401 (importable from here, as before served_run.py)
from specviz.backends.served.target import PROBE_TEXT, ServedTarget, check_tokenizer, load_tokenizer
from specviz.config import SpecvizError


def open_served_run(t: ServedTarget) -> ServedRun:
    """The run the engine feeds for a served target: a ServedRun, or LlamaCppRun for llama-cpp-python's server."""
    return llamacpp.LlamaCppRun(t) if t.engine == llamacpp.ENGINE else ServedRun(t)


# --- connecting: once per (address, tokenizer, device), every check made then -------------------------------

_CONNECTIONS: dict[tuple, ServedTarget] = {}
_LOCK = threading.Lock()


def connect(url: str, tokenizer: str | None = None, device=None, timeout_s: float = TIMEOUT_S) -> ServedTarget:
    """The served target at `url` (http://HOST:PORT/v1), checked once per connection and reused.

    tokenizer: a hub id or folder for p's tokenizer (default: the server's model name, as /v1/models gives it).
    The checks: the server answers, names a model, that model's tokenizer loads here and splits a probe text as the
    server's own /tokenize does, and /v1/completions returns prompt logprobs for a token-id prompt.
    """
    from specviz.models.loaded import _resolve_device

    client = Client(url, timeout_s)
    dev = _resolve_device(device)
    key = (client.base, tokenizer or "", str(dev))
    with _LOCK:
        known = _CONNECTIONS.get(key)
    if known is not None:
        return known
    target = _connect(client, url.strip(), tokenizer, dev)
    with _LOCK:
        _CONNECTIONS[key] = target
    return target


def forget_connections() -> None:
    """Drop the checked connections (a restarted server is checked again on the next use)."""
    with _LOCK:
        _CONNECTIONS.clear()


def _connect(client: Client, name: str, tokenizer: str | None, dev: torch.device) -> ServedTarget:
    data = client.get_json("/v1/models")
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict) or not models[0].get("id"):
        raise SpecvizError(
            f"The server at {client.base} lists no model at /v1/models; is it an OpenAI-compatible server?"
        )
    info = models[0]
    model = str(info["id"])
    source = tokenizer or str(info.get("root") or model)
    tok, vocab_size, eos = load_tokenizer(source, model, tokenizer is not None)
    engine, theirs = _probe_tokenize(client, model)
    target = ServedTarget(
        name=name,
        client=client,
        model=model,
        tokenizer=tok,
        vocab_size=vocab_size,
        eos=eos,
        device=dev,
        max_model_len=int(info.get("max_model_len") or 0),
        engine=engine,
    )
    check_tokenizer(target, source, theirs)
    _check_prompt_logprobs(target)
    return target


def _probe_tokenize(client: Client, model: str) -> tuple[str, object]:
    """(engine, the server's token ids of PROBE_TEXT): vLLM's /tokenize, else llama-cpp-python's own endpoint
    (llamacpp.py); a server with neither gets the /tokenize request's sentence."""
    try:
        data = client.post("/tokenize", {"model": model, "prompt": PROBE_TEXT, "add_special_tokens": False})
    except SpecvizError:
        theirs = llamacpp.probe_tokens(client, PROBE_TEXT)
        if theirs is None:
            raise
        return llamacpp.ENGINE, theirs
    return "vllm", data.get("tokens") if isinstance(data, dict) else None


def _check_prompt_logprobs(t: ServedTarget) -> None:
    """One token-id request with prompt logprobs: the server must send a logprob and rank for each prompt token."""
    ids = t.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"][:6]
    run = open_served_run(t)
    run._set(ids[:-2])
    logits = run.feed(torch.tensor(ids[-2:]))  # (2, V)
    scored = logits[0, ids[-1]] if t.engine == "vllm" else logits[0].max()  # llama-cpp-python: its top tokens
    if not torch.isfinite(scored):
        raise SpecvizError(f"The server at {t.url} sent no logprob for a prompt token; specviz needs them.")


def engine_spec(target: ServedTarget) -> EngineSpec | None:
    """What the engine's own speculative decoding measured so far (GET /metrics); None when it does not speculate."""
    if target.engine != "vllm":  # llama-cpp-python's server has no /metrics
        return None
    return parse_spec_metrics(target.client.get("/metrics").decode("utf-8", "replace"))


def load_served_pair(
    url: str | ServedTarget,
    draft=None,
    *,
    tokenizer: str | None = None,
    need_draft: bool = True,
    device=None,
    dtype=None,
    quantize: str | None = None,
    timeout_s: float | None = None,
):
    """(p served at `url`, q loaded here or None): the served counterpart of models.load_pair.

    The draft runs on this machine's device (float16 where this CPU runs it faster, as load_pair does); a draft
    whose vocabulary cannot serve p is refused with load_pair's sentence.
    """
    from specviz.config import BUILTIN_DRAFT
    from specviz.models.loaded import _resolve_device, load_model, locate, vocab_gap
    from specviz.native.linear import draft_dtype

    if quantize:
        raise SpecvizError("Quantisation applies to a target loaded here; a served target is quantised by its server.")
    if need_draft or draft is not None:
        locate(draft or BUILTIN_DRAFT)  # before the server is asked anything
    p = url if isinstance(url, ServedTarget) else connect(url, tokenizer, device=device)
    if not need_draft and draft is None:
        return p, None
    q_dtype = dtype if dtype not in (None, "", "auto") else draft_dtype(_resolve_device(p.device)) or dtype
    q = load_model(draft or BUILTIN_DRAFT, device=p.device, dtype=q_dtype, timeout_s=timeout_s)
    gap = vocab_gap(p, q)
    if gap:
        raise SpecvizError(gap)
    return p, q


def engine_step_s(target: ServedTarget, prompt_ids: list[int], n: int = 16, reps: int = 3) -> float:
    """Seconds of one decoding step inside the engine, without a round trip: a request generating n tokens
    against one generating 1 (same prompt, greedy, EOS ignored), interleaved, medians; (t_n - t_1) / (n - 1)."""
    import statistics

    def timed(tokens: int) -> float:
        body = {
            "model": target.model,
            "prompt": prompt_ids,
            "max_tokens": tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        }
        if target.engine != "vllm":  # text in; its end of turn kept out by a logit bias (it has no ignore_eos)
            body = llamacpp.step_body(target, prompt_ids, tokens)
        t0 = time.perf_counter()
        target.client.post("/v1/completions", body)
        return time.perf_counter() - t0

    timed(n)  # warm-up
    one, many = [], []
    for _ in range(reps):
        one.append(timed(1))
        many.append(timed(n))
    return max((statistics.median(many) - statistics.median(one)) / (n - 1), 1e-6)
