"""Drafts with another tokenizer to measure, offline (no hub here): the folders `check` and `bench` then take.

    python benchmarks/make_cross_pair.py tiny out/cross-tiny       # target/ and draft/: the tiny test pair
    python benchmarks/make_cross_pair.py builtin out/cross-builtin # draft/: a ▁-style draft for the built-in target
    python benchmarks/make_cross_pair.py builtin out/cross-phi3 --tokenizer phi3  # the same with Phi-3's tokenizer

`tiny` is tests/cross_pair.py's pair (a byte-level Ġ target and a SentencePiece-style ▁ draft, 2-layer Llamas
64 wide, trained seconds on generated sentences). `builtin` trains a ▁-style BPE tokenizer (byte fallback, its
own chat template and end of turn <|im_end|>) and a small Llama on the built-in target's own greedy replies in
data/teacher.jsonl.gz (prompts held out from assets/prompts, as for the built-in draft), each reply read after
the draft's own chat template; the built-in target (SmolLM2, byte-level Ġ, 49,152 tokens) is then the target.
`--tokenizer phi3` gives that draft Phi-3's real tokenizer instead (tests/data/phi3_tokenizer: Llama 2's
SentencePiece vocabulary of 32,000 tokens with Phi-3's chat tokens and template), or `--tokenizer DIR` any
tokenizer folder transformers reads.
Prints the folders written.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/ is reached as the namespace package `tests`


def teacher_texts(n: int) -> tuple[list[str], list[str]]:
    """(prompts, replies) of the first n replies in data/teacher.jsonl.gz, decoded with the target's tokenizer."""
    from transformers import AutoTokenizer

    from specviz.models.builtin import ensure_target

    tok = AutoTokenizer.from_pretrained(ensure_target())  # the built-in target's (converted on first use)
    prompts, replies = [], []
    with gzip.open(ROOT / "data" / "teacher.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            prompts.append(rec["prompt"])
            replies.append(tok.decode(rec["ids"], skip_special_tokens=True))
            if len(replies) >= n:
                break
    return prompts, replies


def builtin_draft(out: Path, replies: int, vocab: int, hidden: int, steps: int, tokenizer: str | None) -> str:
    from transformers import AutoTokenizer

    from tests.cross_pair import metaspace_tokenizer, phi3_tokenizer, save, train_lm

    prompts, texts = teacher_texts(replies)
    if tokenizer is None:
        tok = metaspace_tokenizer(prompts + texts, vocab)
    else:
        tok = phi3_tokenizer() if tokenizer == "phi3" else AutoTokenizer.from_pretrained(tokenizer)
    chats = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False) + r
        for p, r in zip(prompts, texts)
    ]
    return save(out / "draft", train_lm(tok, chats, seed=0, steps=steps, hidden=hidden), tok)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pair", choices=["tiny", "builtin"])
    ap.add_argument("out")
    ap.add_argument("--replies", type=int, default=3000, help="builtin: teacher replies trained on")
    ap.add_argument("--vocab", type=int, default=4000, help="builtin: the draft tokenizer's merges + alphabet")
    ap.add_argument("--hidden", type=int, default=128, help="builtin: the draft's width")
    ap.add_argument("--steps", type=int, default=1500, help="builtin: training steps (16 x 64 tokens each)")
    ap.add_argument("--tokenizer", default=None, help="builtin: phi3, or a tokenizer folder (default: train one)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.pair == "tiny":
        from tests.cross_pair import cross_pair

        print("\n".join(cross_pair(out)))
    else:
        print(builtin_draft(out, args.replies, args.vocab, args.hidden, args.steps, args.tokenizer))


if __name__ == "__main__":
    main()
