"""Train a feature-level draft head (EAGLE-style, specviz/models/head.py) on the target's features.

Data, either way: the feature shards of `python -m specviz.training.label_teacher --features` (the target's last hidden state at every
position of prompt + reply, computed once) and the teacher files they came from (for the prompts: held-out
and benchmark prompts are dropped, and a share of distinct prompts is kept aside for validation).

For a sequence x with features F, the head reads the pairs (e(x_{j+1}), F_j) and predicts F_{j+1}. The loss
at each position whose prediction yields a reply token is the EAGLE paper's: SmoothL1(f^, F_{j+1}) plus
--token-weight (0.1) x the cross-entropy of the head's logits to the target's own distribution there,
softmax(E[rows] F_{j+1}) (soft labels come free with the features). Uniform noise of +-`--noise` on the
input features (EAGLE's) makes later guesses, which read the head's own predicted feature, less fragile.

    nohup nice -n 19 python -m specviz.training.train_head --features runs/labels/features \
        --data /work/shared/data/smollm2-teacher/teacher.jsonl.gz ... --vocab assets/draft/specviz_vocab.json \
        --out runs/head --minutes 40 --threads 1 &

Re-running resumes from <out>/state.pt; a usable head folder is written to <out>/latest every
--ckpt-minutes (and to <out>/best when its validated first guess is the best so far) and to <out>/final at
the end. `--init FOLDER` starts from a trained head's weights with a fresh schedule. Validation reports the teacher-forced acceptance of the
first guess (argmax == the target's token) on the held-aside greedy replies.

Or a packed token file and the target itself, which computes the features batch by batch (the way to use a
GPU: nothing to cache, nothing but the target's weights and this file to bring), with the chained guesses of
decoding trained too (`--unroll 3`: training-time test, head_unroll.py):

    python -m specviz.training.train_head --pack-tokens runs/head_tokens.npz --data data/teacher.jsonl.gz ...
    python -m specviz.training.train_head --tokens runs/head_tokens.npz --unroll 3 --batch-size 64 --lr 6e-4 ...
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

import torch

from specviz.models.head import HEAD_CONFIG, HEAD_WEIGHTS, DraftHead
from specviz.training.common import HELDOUT, ROOT, read_heldout, target_folder
from specviz.training.head_unroll import (
    collate,
    length_batches,
    pack_tokens,
    read_tokens,
    target_features,
    unrolled_loss,
)
from specviz.training.teacher_io import read_jsonl, reply_key
from specviz.training.train_draft import TrainConfig, lr_at, progress_at, split_rows


def load_sequences(feature_dir: Path, rows_by_key: dict[str, dict]) -> list[dict]:
    """Every labelled sequence whose reply is in `rows_by_key`, once: ids, prompt length, features (T, H) bf16."""
    seqs, seen = [], set()
    for shard in sorted(Path(feature_dir).glob("shard-*.pt")):
        d = torch.load(shard)
        for key, ids, plen, f in zip(d["keys"], d["ids"], d["prompt_len"], d["feats"]):
            if key in rows_by_key and key not in seen:
                seen.add(key)
                row = rows_by_key[key]
                seqs.append({"ids": torch.tensor(ids), "plen": plen, "feats": f, "greedy": row.get("temperature") == 0})
    return seqs


@torch.no_grad()
def evaluate(head, items, lookup, device, batch_size: int, steps: int = 1, target=None) -> dict:
    """Teacher-forced acceptance of each chained guess on greedy replies (the target's argmax), loss on all:
    val_acc is the first guess's, val_acc2 the second's given the first, ..."""
    head.eval()
    out = {}
    for name, its in (("val", items), ("val_greedy", [it for it in items if it["greedy"]])):
        tot_l, tot_a, n = 0.0, [0.0] * steps, [0] * steps
        for i in range(0, len(its), batch_size):
            b = batch_of(its[i : i + batch_size], device, target)
            loss, accs, counts = unrolled_loss(head, b, lookup, steps, 0.0, 0.1)
            tot_l += loss.item() * counts[0]
            for s, (a, m) in enumerate(zip(accs, counts)):
                tot_a[s], n[s] = tot_a[s] + a.item() * m, n[s] + m
        if n[0]:
            out[f"{name}_loss"], out[f"{name}_acc"] = tot_l / n[0], tot_a[0] / n[0]
            out.update({f"{name}_acc{s + 1}": t / m for s, (t, m) in enumerate(zip(tot_a, n)) if s and m})
    head.train()
    return out


def init_from(head: DraftHead, folder: Path) -> None:
    """Load a saved head's weights into `head` (a warm start); its rows must be the same."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / HEAD_CONFIG).read_text())
    if cfg["target_ids"] != head.cfg["target_ids"]:
        raise SystemExit(f"--init {folder}: that head has other output rows than --vocab gives.")
    head.load_state_dict({k: v.float() for k, v in load_file(str(folder / HEAD_WEIGHTS)).items()})


def batch_of(items: list[dict], device, target=None) -> dict:
    """A padded batch; its features computed by `target` where the items carry none (packed token files)."""
    b = collate(items, device)
    if "feats" not in b:
        b["feats"] = target_features(target, b["ids"])
    return b


def main(argv: list[str] | None = None) -> Path:
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--features", default="", help="feature shards folder (label_teacher.py --features)")
    ap.add_argument("--data", nargs="+", default=[], help="the teacher files those features came from")
    ap.add_argument("--tokens", default="", help="a --pack-tokens file: features computed by the target on the fly")
    ap.add_argument("--pack-tokens", default="", help="write --data's train/val split to this .npz file and stop")
    ap.add_argument("--unroll", type=int, default=1, help="chained guesses trained per position (training-time test)")
    ap.add_argument("--init", default="", help="start from this head folder's weights (same rows), a fresh schedule")
    ap.add_argument(
        "--vocab",
        default=str(ROOT / "assets" / "draft" / "specviz_vocab.json"),
        help="the head's output rows: a specviz_vocab.json (target_ids)",
    )
    ap.add_argument("--out", default=str(ROOT / "runs" / "head"))
    ap.add_argument("--target", default="", help="target folder; default: the built-in target")
    ap.add_argument("--heldout", default=str(HELDOUT))
    ap.add_argument("--heldout-dir", default=str(HELDOUT.parent))
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--token-weight", type=float, default=0.1)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--ckpt-minutes", type=float, default=10.0)
    ap.add_argument("--val-frac", type=float, default=0.04)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.tokens and not (args.data and (args.features or args.pack_tokens)):
        ap.error("give --tokens FILE, or --data with --features (cached features) or --pack-tokens FILE")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True  # a GPU's float32 products in TF32 (no effect on a CPU)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # 1. data: the replies of the teacher files, held-out prompts dropped, a validation split by prompt
    dropped = 0
    if args.data:
        rows = [r for p in args.data for r in read_jsonl(p)]
        cfg = TrainConfig(heldout_dir=args.heldout_dir, val_frac=args.val_frac, seed=args.seed)
        train_rows, val_rows, dropped = split_rows(rows, read_heldout(args.heldout) if args.heldout else [], cfg)
    if args.pack_tokens:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(target_folder(args.target))
        counts = pack_tokens(args.pack_tokens, {"train": train_rows, "val": val_rows}, tok)
        print(f"packed {counts} sequences ({dropped} held-out replies dropped) into {args.pack_tokens}", flush=True)
        return Path(args.pack_tokens)
    if args.tokens:
        packed = read_tokens(args.tokens)
        train, val = packed["train"], packed["val"]
    else:
        by_key = lambda rs: {reply_key(r): r for r in rs}  # noqa: E731
        train, val = (
            load_sequences(Path(args.features), by_key(train_rows)),
            load_sequences(Path(args.features), by_key(val_rows)),
        )
    target_ids = json.loads(Path(args.vocab).read_text())["target_ids"]
    target = AutoModelForCausalLM.from_pretrained(target_folder(args.target), dtype=torch.float32)
    feats_by = target.to(device).eval() if args.tokens else None  # computes the features where none are cached
    lookup = torch.full((target.get_output_embeddings().weight.shape[0],), -1, dtype=torch.long, device=device)
    lookup[torch.tensor(target_ids, device=device)] = torch.arange(len(target_ids), device=device)
    n_tok = sum(len(s["ids"]) - s["plen"] for s in train)
    print(
        f"data: {len(train)} train sequences ({n_tok} reply tokens), {len(val)} val, {dropped} held-out "
        f"replies dropped; {len(target_ids)} output rows",
        flush=True,
    )

    # 2. the head (from the target's last block) and its optimiser, or the saved state
    head = DraftHead.from_target(target, target_ids)
    if args.init:
        init_from(head, Path(args.init))
    head = head.to(device)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, elapsed, rng, best = 0, 0.0, random.Random(args.seed), -1.0
    state_path = out / "state.pt"
    if state_path.is_file():
        st = torch.load(state_path, weights_only=False)
        head.load_state_dict(st["head"])
        opt.load_state_dict(st["opt"])
        step, elapsed = st["step"], st["elapsed"]
        rng.setstate(st["rng"])
        best = st.get("best", best)
        print(f"resumed at step {step} after {elapsed / 60:.1f} min", flush=True)
    head.train()

    def checkpoint(name: str, metrics: dict) -> None:
        """Write the head to <out>/latest, and to <out>/best when its first guess is the best validated so far."""
        nonlocal best
        meta = {"step": step, "minutes": round(elapsed / 60, 2), "args": vars(args), **metrics}
        score = metrics.get("val_greedy_acc", metrics.get("val_acc", 0.0))
        for folder in [name] + (["best"] if score > best else []):
            stage = out / f"{folder}.tmp"
            if stage.exists():
                shutil.rmtree(stage)
            head.save(stage)
            (stage / "train_meta.json").write_text(json.dumps(meta, indent=1))
            if (out / folder).exists():
                shutil.rmtree(out / folder)
            stage.rename(out / folder)
        best = max(best, score)
        torch.save(
            {
                "head": head.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "elapsed": elapsed,
                "rng": rng.getstate(),
                "best": best,
            },
            out / "state.tmp",
        )
        (out / "state.tmp").replace(state_path)
        with open(out / "log.jsonl", "a") as f:
            f.write(json.dumps({"event": "checkpoint", **meta}) + "\n")

    # 3. the loop: shuffled epochs, warm-up then cosine decay over max(step, time) progress
    batches: list[list[int]] = []
    lengths = [len(s["ids"]) for s in train]
    t0, last_ckpt, ema = time.time() - elapsed, elapsed, None
    while True:
        elapsed = time.time() - t0
        progress = progress_at(step, elapsed, args.steps, args.minutes)
        if progress >= 1.0:
            break
        if not batches:
            batches = length_batches(lengths, args.batch_size, rng)
        b = batch_of([train[k] for k in batches.pop()], device, feats_by)
        lr = lr_at(progress, step, args)
        for g in opt.param_groups:
            g["lr"] = lr
        loss, accs, _ = unrolled_loss(head, b, lookup, args.unroll, args.noise, args.token_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 20 == 0 or step == 1:
            rec = {
                "step": step,
                "min": round(elapsed / 60, 2),
                "lr": lr,
                "loss": loss.item(),
                "ema": ema,
                "acc": accs[0].item(),
                **{f"acc{s + 1}": a.item() for s, a in enumerate(accs) if s},
            }
            print(json.dumps(rec), flush=True)
            with open(out / "log.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
        if elapsed - last_ckpt >= 60 * args.ckpt_minutes:
            metrics = evaluate(head, val, lookup, device, args.batch_size, args.unroll, feats_by)
            print(f"checkpoint at step {step}: {metrics}", flush=True)
            elapsed = time.time() - t0
            checkpoint("latest", {"train_loss_ema": ema, **metrics})
            last_ckpt = elapsed

    metrics = evaluate(head, val, lookup, device, args.batch_size, args.unroll, feats_by)
    print(f"final at step {step}: {metrics}", flush=True)
    checkpoint("latest", {"train_loss_ema": ema, **metrics})
    if (out / "final").exists():
        shutil.rmtree(out / "final")
    shutil.copytree(out / "latest", out / "final")
    return out / "final"


if __name__ == "__main__":
    main()
