"""Teacher-force the target over existing teacher replies: its top-k soft labels and (optionally) its features.

Teacher files made before soft labels existed (`/work/shared/data/smollm2-teacher*/`, or any file of
`{"prompt", "temperature", "ids"}` lines) carry only the sampled tokens. One batched forward of the target
over prompt + reply gives, at every reply position t, the distribution ids[t] was drawn from:
  * `<out>/<name>.topk.jsonl.gz`: the top-k records of `teacher_io` (the same format make_teacher_data.py
    writes beside its own replies), for `train_draft.py --topk`;
  * with --features, `<out>/features/shard-NNNNN.pt`: the target's last hidden state (after its final norm,
    so logits = E @ f) at every position of prompt + reply, bfloat16, for `train_head.py`. About 1.2 KB per
    token.

Resumable: replies already in the top-k file are skipped, and each batch is written whole (features first,
then its top-k lines), so a kill loses at most one batch. Niced and single-file per input, e.g.

    nohup nice -n 19 python -m specviz.training.label_teacher --data /work/shared/data/smollm2-teacher/teacher.jsonl.gz \
        /work/shared/data/smollm2-teacher-2/teacher.jsonl.gz data/teacher.jsonl.gz --out runs/labels --features &
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from specviz.training.common import ROOT, prompt_ids, target_folder
from specviz.training.teacher_io import append_jsonl, encode_topk, read_jsonl, repair_tail, reply_key


def label_name(path: str | Path) -> str:
    """/x/smollm2-teacher-2/teacher.jsonl.gz -> smollm2-teacher-2.teacher (unique across the usual inputs)."""
    p = Path(path)
    stem = p.name.split(".")[0]
    return f"{p.parent.name}.{stem}"


def batches(items: list[tuple], max_tokens: int) -> list[list[tuple]]:
    """Length-sorted batches of (key, row, seq) whose padded size stays under max_tokens."""
    items = sorted(items, key=lambda x: len(x[2]))
    out, cur = [], []
    for it in items:
        if cur and len(it[2]) * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur = []
        cur.append(it)
    return out + [cur] if cur else out


@torch.inference_mode()
def label_batch(model, batch: list[tuple], k: int, device) -> tuple[list[torch.Tensor], list[dict]]:
    """One right-padded forward: the features (T_i, H) of each sequence and each reply's top-k record."""
    T = max(len(s) for _, _, s in batch)
    ids = torch.full((len(batch), T), 2, dtype=torch.long)
    for b, (_, _, s) in enumerate(batch):
        ids[b, : len(s)] = torch.tensor(s)
    h = model.model(input_ids=ids.to(device)).last_hidden_state  # (B, T, H); causal: padding never looks back
    W = model.get_output_embeddings().weight
    feats, tops = [], []
    for b, (_, row, s) in enumerate(batch):
        f = h[b, : len(s)]
        feats.append(f.to("cpu", torch.bfloat16))
        start = len(s) - len(row["ids"])  # position start-1 predicts ids[0]
        probs = (f[start - 1 : len(s) - 1] @ W.T).float().softmax(-1)  # (R, V)
        top = probs.topk(k, -1)
        rec = {"prompt": row["prompt"], "temperature": row.get("temperature", 1.0), "ids": row["ids"]}
        tops.append({**rec, **encode_topk(top.indices.cpu(), top.values.cpu())})
    return feats, tops


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="+", required=True, help="teacher JSONL(.gz) files")
    ap.add_argument("--out", default=str(ROOT / "runs" / "labels"))
    ap.add_argument("--target", default="", help="target folder; default: the built-in target")
    ap.add_argument("--topk", type=int, default=16)
    ap.add_argument("--features", action="store_true", help="also store the target's features (for a head)")
    ap.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per forward")
    ap.add_argument("--max-len", type=int, default=512, help="longer prompt + reply sequences are skipped")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="label at most this many replies per file (0: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    target_dir = target_folder(args.target)
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device).eval()
    out = Path(args.out)
    (out / "features").mkdir(parents=True, exist_ok=True)
    shard = len(list((out / "features").glob("shard-*.pt")))
    for path in args.data:
        top_file = out / f"{label_name(path)}.topk.jsonl.gz"
        repair_tail(top_file)
        done = {reply_key(r) for r in read_jsonl(top_file)}
        rows = list(read_jsonl(path))[: args.limit or None]
        prompts = {p: prompt_ids(tok, p) for p in {r["prompt"] for r in rows}}
        todo, seen = [], set(done)
        for r in rows:
            key, seq = reply_key(r), prompts[r["prompt"]] + r["ids"]
            if key not in seen and len(seq) <= args.max_len:
                todo.append((key, r, seq))
                seen.add(key)
        n_tok, t0 = 0, time.time()
        print(f"{path}: {len(rows)} replies, {len(done)} already labelled, {len(todo)} to go", flush=True)
        for i, batch in enumerate(batches(todo, args.batch_tokens)):
            feats, tops = label_batch(model, batch, args.topk, device)
            if args.features:
                tmp = out / "features" / f"shard-{shard:05d}.tmp"
                torch.save(
                    {
                        "keys": [k for k, _, _ in batch],
                        "ids": [s for _, _, s in batch],
                        "prompt_len": [len(s) - len(r["ids"]) for _, r, s in batch],
                        "feats": feats,
                    },
                    tmp,
                )
                tmp.replace(out / "features" / f"shard-{shard:05d}.pt")
                shard += 1
            append_jsonl(top_file, tops)
            n_tok += sum(len(s) for _, _, s in batch)
            if i % 10 == 0:
                print(f"  batch {i}: {n_tok} tokens, {n_tok / (time.time() - t0):.0f} tok/s", flush=True)
        print(f"{path}: done, {n_tok} tokens in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
