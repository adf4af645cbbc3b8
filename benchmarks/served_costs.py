"""What one request costs a served target (vLLM's OpenAI-compatible server), by the length of the text so far:
a plain one-token request (what the plain lane sends) against a verify of k guesses (the text plus k tokens as a
token-id prompt with prompt logprobs, what a speculative round sends). Greedy, `max_tokens: 1`; the sizes are
interleaved within each repetition and the first repetition only warms up. Prints a markdown table of medians.

    python benchmarks/served_costs.py http://127.0.0.1:8000/v1 [--lengths 40,400,1000] [--guesses 1,4,8] [--reps 3]

Only for a server you run yourself: the text is token ids --first-id, --first-id + 1, ... (1000 by default).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.backends.served.http import Client  # noqa: E402  (the served lane's own HTTP: no redirects, errors as sentences)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url", help="the server's address, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--lengths", default="40,400,1000", help="tokens of text before the guesses")
    ap.add_argument("--guesses", default="1,4,8", help="guesses a verify request carries")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (one more warms up)")
    ap.add_argument("--first-id", type=int, default=1000, help="the text's first token id (any real ids will do)")
    args = ap.parse_args()
    client = Client(args.url, timeout_s=120)
    model = client.get_json("/v1/models")["data"][0]["id"]
    guesses = [int(k) for k in args.guesses.split(",")]
    print("| text so far | plain one-token request | " + " | ".join(f"verify of {k}" for k in guesses) + " |")
    print("|---" * (2 + len(guesses)) + "|")
    for n in (int(x) for x in args.lengths.split(",")):
        times: dict[int, list[float]] = {k: [] for k in [0, *guesses]}
        for rep in range(args.reps + 1):
            for k in times:
                body = {
                    "model": model,
                    "prompt": list(range(args.first_id, args.first_id + n + k)),
                    "max_tokens": 1,
                    "temperature": 0,
                }
                if k:
                    body["prompt_logprobs"] = 1
                t = time.perf_counter()
                client.post("/v1/completions", body)
                if rep:
                    times[k].append(time.perf_counter() - t)
        cells = [f"{1000 * statistics.median(v):,.0f} ms" for v in times.values()]
        print(f"| {n} tokens | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
