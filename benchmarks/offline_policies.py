"""Two questions about guessing answered offline, from the target's greedy replies to the held-out prompts
(BENCHMARKS.md, 27 Nov 2026):

1. How often the draft, the head and the two together guess the target's next token (teacher-forced: each guess
   made from the true text, the head from the target's true features): the draft, the head, the average of their
   distributions, their product, and the surer of the two.
2. What auto's choice of k is worth when its verify-cost curve is off: `policies.Auto` runs on the draft's
   teacher-forced hits (a chain's guesses are right or wrong where they are made from the true text), each round
   paid in target steps at the curve the loop pays (--loop), the k chosen from that curve or from each --believe
   curve (and told a draft call costs --believe-c, where given). Prints tokens per step, i.e. the speedup at
   those costs.

    python benchmarks/offline_policies.py [--c 0.065] [--loop 1,1.022,...] [--believe "1,1.03,...;1,..."] [--believe-c 0.025]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specviz, from any folder

from specviz.drafters.policies import Auto  # noqa: E402
from specviz.models.builtin import ensure_target  # noqa: E402
from specviz.models.head import load_head  # noqa: E402
from specviz.models.loaded import LoadedModel  # noqa: E402
from specviz.training.common import HELDOUT, ROOT, prompt_ids, read_heldout  # noqa: E402
from specviz.training.eval_draft import load_draft, target_replies  # noqa: E402

LOOP = "1,1.022,1.015,1.135,1.146,1.137,1.174,1.174,1.36"  # the loop's verify of 0 .. 8 guesses, 27 Nov 02:20 UTC
BELIEVED = "1,1.027,1.015,1.062,0.992,1.073,1.046,1.077,1.246;1,1.010,1.007,1.033,1.146,1.063,1.017,1.043,1.377"


def curve(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def speed(hits: list[list[bool]], believed: list[float], loop: list[float], c: float, told_c: float) -> float:
    """Tokens per target step of auto (deciding by `believed` and `told_c`) over the replies, paid at `loop` and
    c a guess."""
    tokens = steps = 0.0
    for hit in hits:
        policy, i = Auto(8, believed, told_c), 0
        while i < len(hit):
            k = min(policy.k("model"), len(hit) - i - 1)
            n = next((j for j in range(k) if not hit[i + j]), k)
            if k:
                policy.update("model", k, n, 0.0, 0.0)
            tokens, steps, i = tokens + min(n + 1, len(hit) - i), steps + k * c + loop[k], i + n + 1
    return tokens / steps


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--c", type=float, default=0.065, help="a draft call, in target steps")
    ap.add_argument("--loop", default=LOOP)
    ap.add_argument("--believe", default=BELIEVED, help="curves auto decides by, ';' between them")
    ap.add_argument("--believe-c", type=float, default=0.0, help="the draft call's cost auto is told (0: --c)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_target()
    tok = AutoTokenizer.from_pretrained(folder)
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = read_heldout(HELDOUT)
    replies = target_replies(target, tok, prompts, ROOT / "runs" / "heldout_target.json", 128, 8)
    draft, d_ids = load_draft(ROOT / "assets" / "draft")
    head = load_head(ROOT / "assets" / "head", LoadedModel(target, tok, "target", torch.device("cpu"), torch.float32))
    V = target.config.vocab_size
    rows = torch.zeros(V, dtype=torch.long)
    rows[d_ids] = torch.arange(len(d_ids))
    right = dict.fromkeys(["draft", "head", "average", "product", "surer"], 0)
    hits, total = [], 0
    for prompt, reply in zip(prompts, replies):
        ids = prompt_ids(tok, prompt)
        seq, y, n = torch.tensor(ids + reply), torch.tensor(reply), len(ids)
        q = torch.zeros(len(reply), V)
        q[:, d_ids] = torch.softmax(draft(rows[seq][None]).logits[0, n - 1 : -1].float(), -1)
        f = target.model(seq[None]).last_hidden_state[0]
        g = head(seq[None, 1:], f[None, :-1], torch.arange(1, len(seq)))[0]
        h = torch.zeros(len(reply), V)
        h[:, head.target_ids] = torch.softmax(head.logits(g[n - 2 : -1]).float(), -1)
        surer = torch.where(q.max(-1).values >= h.max(-1).values, q.argmax(-1), h.argmax(-1))
        guesses = {"draft": q.argmax(-1), "head": h.argmax(-1), "average": (q + h).argmax(-1),
                   "product": (q.clamp_min(1e-9).log() + h.clamp_min(1e-9).log()).argmax(-1), "surer": surer}  # fmt: skip
        for name, guess in guesses.items():
            right[name] += int((guess == y).sum())
        hits.append((guesses["draft"] == y).tolist())
        total += len(reply)
    print(f"{len(prompts)} held-out prompts, {total} reply tokens; the target's next token guessed (teacher-forced): "
          + ", ".join(f"{k} {v / total:.3f}" for k, v in right.items()))  # fmt: skip
    loop = curve(args.loop)
    print(f"auto with the loop's own curve and c: {speed(hits, loop, loop, args.c, args.c):.3f} tokens a step")
    for text in args.believe.split(";"):
        believed = curve(text)
        print(f"auto believing {text}: {speed(hits, believed, loop, args.c, args.c):.3f} tokens a step")
    if args.believe_c:
        told = speed(hits, loop, loop, args.c, args.believe_c)
        print(
            f"auto with the loop's curve, told c {args.believe_c:g} (the loop pays {args.c:g}): {told:.3f} tokens a step"
        )


if __name__ == "__main__":
    main()
