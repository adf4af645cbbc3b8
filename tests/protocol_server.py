"""A small HTTP server that speaks the part of vLLM's OpenAI-compatible protocol specviz uses, for the tests.

NOT the real engine (tests/test_vllm.py runs that): a real socket and real HTTP on 127.0.0.1, backed by a tiny
transformers model from conftest.py, so the client's arithmetic can be checked against p computed exactly (a
chi-square over a vocabulary of 8) and every kind of broken server can be played on purpose (`fault`).

It follows vLLM's field names and shapes as read from its source (entrypoints/openai/completion/protocol.py):
token-id `prompt`, `max_tokens`, `n` (child i seeded with seed + i), `temperature`/`top_k`/`top_p`, `seed`,
`prompt_logprobs` (first entry null, then {"id": {"logprob", "rank", "decoded_token"}} with the prompt's own token
always present, -1 for every token), `logprobs` at the generated position (raw log-probabilities, keys
"token_id:N" with `return_tokens_as_token_ids`), `return_token_ids`; GET /v1/models, POST /tokenize, GET /metrics.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

FAULTS = ("500", "slow", "no_prompt_logprobs", "no_token_ids", "redirect", "tokenize_differs", "not_json")


class ProtocolServer:
    """serve(model_dir) on a free port; `.url` is its /v1 base; `.fault` plays one broken server at a time."""

    def __init__(self, model_dir: str, metrics: str = ""):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = model_dir
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.metrics = metrics
        self.fault: str | None = None
        self.slow_s = 2.0
        self.requests = 0
        self._lock = threading.Lock()  # one forward at a time, as the tiny model is shared
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # --- the engine's side ---------------------------------------------------------------------------

    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """(L, V) raw log-probabilities after each prefix of ids (row j predicts token j + 1)."""
        with self._lock, torch.no_grad():
            return torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), -1)

    @staticmethod
    def _sample(lp: torch.Tensor, body: dict, seed: int | None) -> int:
        t = float(body.get("temperature", 1.0) or 0.0)
        if t == 0.0:
            return int(lp.argmax())
        x = lp / t
        k = int(body.get("top_k") or 0)
        if 0 < k < x.numel():
            x = x.masked_fill(x < torch.topk(x, k).values[-1], -torch.inf)
        top_p = float(body.get("top_p", 1.0))
        if top_p < 1.0:
            sx, order = torch.sort(x, descending=True)
            sp = torch.softmax(sx, -1)
            drop = torch.cumsum(sp, -1) - sp >= top_p
            x[order[drop]] = -torch.inf
        g = torch.Generator()
        g.manual_seed(seed if seed is not None else int(torch.randint(2**31, (1,))))
        return int(torch.multinomial(torch.softmax(x, -1), 1, generator=g))

    def completion(self, body: dict) -> dict:
        ids = [int(i) for i in body["prompt"]]
        lp = self.logprobs(ids)  # (L, V)
        V = lp.shape[1]
        pk = body.get("prompt_logprobs")
        prompt_lp = None
        if pk is not None and self.fault != "no_prompt_logprobs":
            prompt_lp = [None]
            for j in range(1, len(ids)):
                row = lp[j - 1]
                top = torch.topk(row, V if pk == -1 else pk).indices.tolist() if pk else []
                entry = {}
                for t in [ids[j], *top]:
                    rank = int((row > row[t]).sum()) + 1
                    entry[str(t)] = {
                        "logprob": float(row[t]),
                        "rank": rank,
                        "decoded_token": self.tokenizer.decode([t]),
                    }
                prompt_lp.append(entry)
        choices = []
        seed = body.get("seed")
        for i in range(int(body.get("n", 1))):
            token = self._sample(lp[-1], body, None if seed is None else seed + i)
            more, seq = [], [*ids, token]
            for _ in range(int(body.get("max_tokens", 1)) - 1):  # greedy after the first, as a timing load
                more.append(int(self.logprobs(seq)[-1].argmax()))
                seq.append(more[-1])
            k = body.get("logprobs")
            choice = {"index": i, "text": self.tokenizer.decode([token]), "finish_reason": "length"}
            if k is not None:
                top = torch.topk(lp[-1], V if k == -1 else k).indices.tolist() if k else []
                choice["logprobs"] = {
                    "token_logprobs": [float(lp[-1, token])],
                    "tokens": [f"token_id:{token}"],
                    "top_logprobs": [{f"token_id:{t}": float(lp[-1, t]) for t in [token, *top]}],
                }
            if body.get("return_token_ids") and self.fault != "no_token_ids":
                choice["token_ids"] = [token, *more]
                choice["prompt_token_ids"] = ids
            choice["prompt_logprobs"] = prompt_lp
            choices.append(choice)
        return {"object": "text_completion", "model": self.model_dir, "choices": choices}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body, ctype: str = "application/json", headers: dict | None = None):
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(raw)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def _faulty(self) -> bool:
                server.requests += 1
                if server.fault == "slow":
                    time.sleep(server.slow_s)
                if server.fault == "500":
                    self._send(500, {"error": {"message": "The engine fell over", "code": 500}})
                    return True
                if server.fault == "redirect":
                    self._send(307, b"", headers={"Location": "http://198.51.100.7/v1/completions"})
                    return True
                if server.fault == "not_json":
                    self._send(200, b"<html>hello</html>", ctype="text/html")
                    return True
                return False

            def do_GET(self):
                if self._faulty():
                    return
                if self.path == "/v1/models":
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": server.model_dir, "root": server.model_dir, "max_model_len": 512}],
                        },
                    )
                elif self.path == "/metrics":
                    self._send(200, server.metrics.encode(), ctype="text/plain")
                else:
                    self._send(404, {"error": {"message": "Not Found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self._faulty():
                    return
                if self.path == "/tokenize":
                    ids = server.tokenizer(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))
                    ids = list(ids["input_ids"])
                    if server.fault == "tokenize_differs":
                        ids = ids[::-1]
                    self._send(200, {"count": len(ids), "max_model_len": 512, "tokens": ids})
                elif self.path == "/v1/completions":
                    if not isinstance(body.get("prompt"), list):
                        self._send(400, {"error": {"message": "this test server takes token-id prompts only"}})
                        return
                    self._send(200, server.completion(body))
                else:
                    self._send(404, {"error": {"message": "Not Found"}})

        return Handler
