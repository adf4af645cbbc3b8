"""Does a call of k tokens compute what k one-token steps compute? Greedy speculative output equals plain greedy output
exactly where the target's argmax is the same both ways: a verify is one call of several tokens, the plain lane one
token a step. This script measures it on real text for a model folder, dtype by dtype and k by k, on any device.

    python benchmarks/call_vs_steps.py --model assets/draft --texts runs/texts.json --device cuda

--texts: a JSON list of token-id lists in the model's own ids (`--make-texts OUT` writes one from the teacher data,
mapped to the built-in draft's rows). Prints, per dtype and k: positions compared, those whose argmax differs, the
largest logit difference, and how many positions had a top-2 gap under it (the near ties a difference can flip).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_texts(out: str, n: int, length: int) -> None:
    """n teacher replies (prompt and reply ids), cut to `length`, in the built-in draft's rows (others dropped)."""
    rows = json.loads((ROOT / "assets/draft/specviz_vocab.json").read_text())["target_ids"]
    to_row = {t: r for r, t in enumerate(rows)}
    texts = []
    with gzip.open(ROOT / "data/teacher.jsonl.gz", "rt") as f:
        for line in f:
            ids = [to_row[t] for t in json.loads(line)["ids"] if t in to_row][:length]
            if len(ids) == length:
                texts.append(ids)
            if len(texts) == n:
                break
    Path(out).write_text(json.dumps(texts))
    print(f"{len(texts)} texts of {length} tokens -> {out}")


def logits_by(model, ids: torch.Tensor, start: int, k: int) -> torch.Tensor:
    """Logits for positions start.. of ids, fed after a prefill of ids[:start] in calls of k tokens each."""
    from transformers import DynamicCache

    from specviz.backends.local import cache_kwargs

    kw = cache_kwargs(model, DynamicCache())
    model(ids[:, :start], use_cache=True, **kw)
    outs = [model(ids[:, i : i + k], use_cache=True, **kw).logits[0].float() for i in range(start, ids.shape[1], k)]
    return torch.cat(outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "assets/draft"))
    ap.add_argument("--texts", default="")
    ap.add_argument("--make-texts", default="", help="write --n texts of --length tokens to this file and stop")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--length", type=int, default=160)
    ap.add_argument("--start", type=int, default=32, help="tokens prefilled before the compared positions")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--ks", default="2,4,8")
    a = ap.parse_args()
    if a.make_texts:
        return make_texts(a.make_texts, a.n, a.length)
    from transformers import AutoModelForCausalLM

    texts = json.loads(Path(a.texts).read_text())[: a.n]
    name = torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu"
    print(
        f"{a.model} on {a.device} ({name}), torch {torch.__version__}, {len(texts)} texts; steps of 1 against calls of k"
    )
    ks = [int(k) for k in a.ks.split(",")]
    for dtype in a.dtypes.split(","):
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, dtype)).to(a.device).eval()
        t0, n = time.perf_counter(), 0
        flips, ties, worst = dict.fromkeys(ks, 0), dict.fromkeys(ks, 0), dict.fromkeys(ks, 0.0)
        with torch.inference_mode():
            for ids in texts:
                x = torch.tensor([ids], device=a.device)
                steps = logits_by(model, x, a.start, 1)
                top2 = steps.topk(2, -1).values
                n += steps.shape[0]
                for k in ks:
                    calls = logits_by(model, x, a.start, k)
                    gap = (steps - calls).abs().max(-1).values
                    flips[k] += int((steps.argmax(-1) != calls.argmax(-1)).sum())
                    ties[k] += int((top2[:, 0] - top2[:, 1] <= gap).sum())
                    worst[k] = max(worst[k], float(gap.max()))
        for k in ks:
            print(
                f"{dtype:>9} k={k}: {n} positions, argmax differs at {flips[k]} ({flips[k] / n:.2%}), largest logit "
                f"difference {worst[k]:.3g}, top-2 gap within it at {ties[k]}",
                flush=True,
            )
        print(f"   ({time.perf_counter() - t0:.1f} s)")
        del model


if __name__ == "__main__":
    main()
