"""Train specviz's built-in draft q for the target p (SmolLM2-135M-Instruct) from the target's own replies.

The draft is a plain transformers LlamaForCausalLM over a TRIMMED vocabulary: only the target tokens that
occur in the teacher data (plus the special tokens and the chat template's tokens). Row i of the draft is
target token id `target_ids[i]` (saved in specviz_vocab.json; row 0 is target id 0, which is also where
unknown input tokens go). The engine scatters q's N-way distribution into the target's 49152-way vocabulary.

Why it looks the way it does (measured on a 2-core CPU, float32, one cached token per call):
  * a draft's cost per token is dominated by reading its weights (memory bound) plus ~1 ms of per-call
    framework overhead, so c = ms(q) / ms(p) is roughly params(q) / params(p) + overhead: a 30 MB-ish draft
    with few layers and a trimmed output layer is what fits under c = 0.1;
  * the target's width (576) lets us START from the target itself: its embedding rows (tied, so also the
    output layer), its first blocks and its final norm. That init is far better than a random one.
    When --hidden differs from the target's, the embedding is a PCA projection of the target's rows and
    the blocks start random;
  * the loss is next-token cross-entropy on the reply tokens only (the prompt is context). On sampled
    replies this is an unbiased estimate of the cross-entropy to p itself, so argmax q -> argmax p.
    With --topk (the target's top-k probabilities at each reply position, from make_teacher_data.py or
    label_teacher.py) a share --soft-weight of it is the cross-entropy to p's top k itself (renormalised):
    the same target with far less noise, the cheapest known improvement over hard labels for a distilled draft;
  * --init starts from an earlier draft folder (its blocks, norm and the embedding rows of the tokens both
    vocabularies share), so more data continues a draft instead of starting over; with --layers above its
    count the extra blocks come after its own, starting out as no-ops (draft_model.start_from).

Usage (the shipped draft; see assets/draft/MODEL_CARD.md for the exact command):
    nice -n 15 python -m specviz.training.train_draft --data /path/teacher.jsonl.gz --out runs/draft --minutes 90
Re-running the same command resumes from <out>/state.pt. A usable draft folder is written to
<out>/latest every --ckpt-minutes (atomically), and to <out>/final at the end.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from specviz.training.common import (
    HELDOUT,
    HeldOut,
    nearest_overlap,
    norm_prompt,
    prompt_ids,
    read_heldout,
    target_folder,
)
from specviz.training.draft_model import TOKENIZER_FILES, build_draft, save_draft, start_from  # noqa: F401 (TOKENIZER_FILES)
from specviz.training.draft_rows import KEEP, never_propose
from specviz.training.teacher_io import decode_topk, read_jsonl, reply_key

NOVEL_BELOW = 0.4  # a validation prompt whose nearest training prompt overlaps less (common.nearest_overlap) is novel
SPECIAL_IDS = (0, 1, 2)  # <|endoftext|> (also the row for unknown tokens), <|im_start|>, <|im_end|> (= eos)


@dataclass
class TrainConfig:
    data: list[str] = field(default_factory=list)  # teacher JSONL(.gz) files: {"prompt","temperature","ids"}
    topk: list[str] = field(default_factory=list)  # top-k soft-label files (teacher_io format) for those replies
    soft_weight: float = 0.5  # share of the loss that is cross-entropy to the top-k (where a reply has it)
    init: str = ""  # a draft folder to start from instead of the target's first blocks
    out: str = "runs/draft"  # work folder: state.pt, log.jsonl, latest/, final/
    target: str = ""  # target folder; "" = the built-in target (converted on first use)
    heldout: str = str(HELDOUT)  # prompts never trained on (exact text match, case-insensitive)
    heldout_dir: str = str(HELDOUT.parent)  # and every prompt set here (exact, or sharing a run of 8 words)
    # --- shape: None = the target's value (needed to copy the target's blocks) ---
    layers: int = 2  # each block costs ~1 ms/token on 2 CPU cores at width 576; 2 is what fits c <= 0.1
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    intermediate: int | None = None
    init_from_target: bool = True  # copy embedding rows, the first `layers` blocks and the final norm
    # --- vocabulary: the output layer is the largest single cost, so keep only tokens seen often enough ---
    min_count: int = 3  # a reply token must occur this often in the teacher data to get a row
    max_vocab: int = 0  # >0: also cap the number of rows (most frequent kept)
    propose_rows: int = KEEP  # rows it may guess: the most frequent reply tokens (draft_rows.py); 0: all
    # --- optimisation ---
    batch_size: int = 16  # sequences per step (a sequence is prompt + reply, ~200 tokens)
    max_len: int = 256  # longer sequences are cut (the teacher replies stop at 160 tokens)
    lr: float = 6e-4  # peak; the init is pretrained, so lower than a from-scratch run would use
    min_lr_frac: float = 0.1  # cosine decays to lr * min_lr_frac
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    steps: int = 0  # 0 = no step limit; the schedule then follows the time budget
    minutes: float = 60.0  # wall-clock budget; the cosine schedule runs on max(step, time) progress
    ckpt_minutes: float = 10.0  # how often a usable draft folder is written
    val_frac: float = 0.04  # share of distinct prompts kept out for validation loss / acceptance
    threads: int = 2  # torch.set_num_threads on CPU
    seed: int = 0
    save_dtype: str = "bfloat16"  # halves the file; the engine loads it as float32
    device: str = ""  # "" = cuda if available else cpu


# --- data -----------------------------------------------------------------------------------------


def read_teacher(paths: list[str]) -> list[dict]:
    """Every reply in the teacher files; a file still being written (a cut-off last gzip member) is fine."""
    return [row for p in paths for row in read_jsonl(p)]


def build_vocab(rows: list[dict], prompts: dict[str, list[int]], cfg: TrainConfig) -> list[int]:
    """target_ids for the draft's rows: specials first (row i = target i for i < 3), then by target id."""
    counts = collections.Counter(t for r in rows for t in r["ids"])
    keep = [t for t, n in counts.most_common() if n >= cfg.min_count]
    if cfg.max_vocab:
        keep = keep[: cfg.max_vocab]
    always = set(SPECIAL_IDS) | {t for ids in prompts.values() for t in ids}  # template + prompt tokens
    rest = sorted((set(keep) | always) - set(SPECIAL_IDS))
    return list(SPECIAL_IDS) + rest


def split_rows(rows: list[dict], heldout: list[str], cfg: TrainConfig) -> tuple[list[dict], list[dict], int]:
    """Drop held-out prompts (those listed, and any that `build_prompts.HeldOut` blocks for the prompt sets in
    cfg.heldout_dir); put a fixed share of distinct prompts aside for validation."""
    sets = HeldOut.from_dir(cfg.heldout_dir) if cfg.heldout_dir else HeldOut([])
    banned = {norm_prompt(p) for p in heldout}
    blocked = {p: norm_prompt(p) in banned or sets.blocks(p) for p in {r["prompt"] for r in rows}}
    kept = [r for r in rows if not blocked[r["prompt"]]]
    distinct = sorted({r["prompt"] for r in kept})
    random.Random(cfg.seed).shuffle(distinct)
    val_prompts = set(distinct[: max(1, int(len(distinct) * cfg.val_frac))]) if cfg.val_frac > 0 else set()
    train = [r for r in kept if r["prompt"] not in val_prompts]
    val = [r for r in kept if r["prompt"] in val_prompts]
    return train, val, len(rows) - len(kept)


def read_soft(paths: list[str]) -> dict[str, dict]:
    """Top-k records by reply (teacher_io.reply_key)."""
    return {reply_key(r): r for p in paths for r in read_jsonl(p)}


def encode(
    rows: list[dict],
    prompts: dict[str, list[int]],
    lookup: torch.Tensor,
    max_len: int,
    soft: dict[str, dict] | None = None,
) -> list[tuple]:
    """Each row -> (draft rows (T,), index of the first reply token, temperature, soft labels or None).
    Unknown tokens become row 0; soft labels are (rows (R, K), probabilities (R, K)) over the kept reply."""
    out = []
    for r in rows:
        p = prompts[r["prompt"]]
        seq = torch.tensor((p + r["ids"])[:max_len], dtype=torch.long)
        if seq.numel() <= len(p):
            continue
        labels = None
        if soft and (rec := soft.get(reply_key(r))) is not None:
            ids, probs = decode_topk(rec)
            R = seq.numel() - len(p)
            labels = (lookup[ids[:R]], probs[:R])
        out.append((lookup[seq], len(p), r.get("temperature", 1.0), labels))
    return out


def make_batch(items: list[tuple], device) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
    """Right-padded (B, T) inputs, a (B, T) mask of positions whose NEXT token is a reply token, and the soft
    labels of those positions in mask order: (rows (M, K), probabilities (M, K), has (M,)) or None."""
    T = max(x.numel() for x, *_ in items)
    ids = torch.zeros(len(items), T, dtype=torch.long)
    mask = torch.zeros(len(items), T, dtype=torch.bool)
    for b, (x, start, *_) in enumerate(items):
        ids[b, : x.numel()] = x
        mask[b, start - 1 : x.numel() - 1] = True  # position t predicts token t+1
    soft = None
    if any(it[3] is not None for it in items):
        K = next(it[3][0].shape[1] for it in items if it[3] is not None)
        rows, probs, has = [], [], []
        for x, start, _, labels in items:
            R = x.numel() - start
            if labels is None:
                rows.append(torch.zeros(R, K, dtype=torch.long))
                probs.append(torch.zeros(R, K))
                has.append(torch.zeros(R, dtype=torch.bool))
            else:
                rows.append(labels[0])
                probs.append(labels[1])
                has.append(torch.ones(R, dtype=torch.bool))
        soft = tuple(torch.cat(t).to(device) for t in (rows, probs, has))
    return ids.to(device), mask.to(device), soft


# --- training -------------------------------------------------------------------------------------


def progress_at(step: int, elapsed: float, steps: int, minutes: float) -> float:
    """How far a run is, 0..1: by step count or wall-clock minutes, whichever is further (0 = no limit)."""
    return max(step / steps if steps else 0.0, elapsed / (60 * minutes) if minutes else 0.0)


def lr_at(progress: float, step: int, cfg) -> float:
    """Linear warm-up over cfg.warmup_steps, then cosine from cfg.lr down to cfg.lr * cfg.min_lr_frac (cfg: a
    TrainConfig, or train_head.py's arguments, which have the same three fields)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * cos)


def reply_loss(
    draft, ids: torch.Tensor, mask: torch.Tensor, soft: tuple | None = None, soft_weight: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy over reply positions only; the output layer runs on those positions alone.

    Where `soft` labels exist, a share `soft_weight` of a position's loss is the cross-entropy to the target's
    top-k (renormalised), the rest the cross-entropy to the token the target produced. Accuracy is against
    that token.
    """
    h = draft.model(input_ids=ids).last_hidden_state  # (B, T, H)
    targets = ids[:, 1:][mask[:, :-1]]  # (M,) the next token at each masked position
    logits = draft.lm_head(h[:, :-1][mask[:, :-1]]).float()  # (M, N)
    logp = logits.log_softmax(-1)
    loss = -logp.gather(1, targets[:, None])[:, 0]  # (M,)
    if soft is not None and soft_weight > 0:
        rows, probs, has = soft
        probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-9)
        soft_ce = -(probs * logp.gather(1, rows)).sum(-1)  # (M,)
        loss = torch.where(has, (1 - soft_weight) * loss + soft_weight * soft_ce, loss)
    return loss.mean(), (logits.argmax(-1) == targets).float().mean()


@torch.no_grad()
def evaluate(draft, val: list[tuple], device, batch_size: int, novel: list[tuple] = ()) -> dict:
    """Validation loss on all held-aside replies, and greedy acceptance on the greedy (temperature 0) ones, and on
    the greedy ones of `novel` prompts (no near sibling in the training split: NOVEL_BELOW), the stricter figure: what
    a prompt unlike the trained ones gets. Acceptance counts a miss where the target's token has no row in the draft
    (it maps to row 0)."""
    draft.eval()
    out = {}
    greedy = [("val_greedy", [v for v in val if v[2] == 0.0]), ("val_novel_greedy", [v for v in novel if v[2] == 0.0])]
    for name, items in (("val", val), *greedy):
        tot_loss = tot_hit = n = 0.0
        for i in range(0, len(items), batch_size):
            ids, mask, _ = make_batch(items[i : i + batch_size], device)
            loss, acc = reply_loss(draft, ids, mask)
            m = int(mask[:, :-1].sum())
            tot_loss, tot_hit, n = tot_loss + loss.item() * m, tot_hit + acc.item() * m, n + m
        if n:
            out[f"{name}_loss"], out[f"{name}_acc"] = tot_loss / n, tot_hit / n
    draft.train()
    return out


def train(cfg: TrainConfig, log=print) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    target_dir = target_folder(cfg.target)

    # 1. data: prompts through the chat template, held-out prompts removed, a validation split
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    rows = read_teacher(cfg.data)
    train_rows, val_rows, n_banned = split_rows(rows, read_heldout(cfg.heldout), cfg)
    prompts = {p: prompt_ids(tokenizer, p) for p in {r["prompt"] for r in rows}}
    state_path = out / "state.pt"
    state = torch.load(state_path, weights_only=False) if state_path.is_file() else None
    if state is not None:
        target_ids = state["target_ids"]  # the vocabulary is fixed once training has started
    else:
        target_ids = build_vocab(train_rows, prompts, cfg)
    blocked = never_propose((r["ids"] for r in train_rows), target_ids, cfg.propose_rows)
    lookup = torch.zeros(max(len(tokenizer), max(target_ids) + 1), dtype=torch.long)  # target id -> row
    lookup[torch.tensor(target_ids)] = torch.arange(len(target_ids))
    soft = read_soft(cfg.topk) if cfg.topk else None
    train_items = encode(train_rows, prompts, lookup, cfg.max_len, soft)
    val_items = encode(val_rows, prompts, lookup, cfg.max_len)
    val_prompts = sorted({r["prompt"] for r in val_rows})
    overlap = nearest_overlap(val_prompts, sorted({r["prompt"] for r in train_rows}))
    novel = {p for p, j in zip(val_prompts, overlap) if j < NOVEL_BELOW}
    novel_items = encode([r for r in val_rows if r["prompt"] in novel], prompts, lookup, cfg.max_len)
    n_tok = sum(x.numel() - s for x, s, *_ in train_items)
    n_soft = sum(1 for it in train_items if it[3] is not None)
    log(
        f"data: {len(train_items)} train replies ({n_tok} reply tokens; {n_soft} with soft labels), "
        f"{len(val_items)} val ({len(novel_items)} of them to {len(novel)} novel prompts), {n_banned} held-out dropped; "
        f"vocab {len(target_ids)} rows"
    )

    # 2. model + optimiser (fresh from the target, or resumed)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    draft = build_draft(target, target_ids, cfg)
    del target
    if cfg.init and state is None:
        start_from(draft, target_ids, Path(cfg.init))
        log(f"started from {cfg.init}")
    decay = [p for n, p in draft.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in draft.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    step, elapsed = 0, 0.0
    rng = random.Random(cfg.seed)
    if state is not None:
        draft.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, elapsed = state["step"], state["elapsed"]
        rng.setstate(state["rng"])
        log(f"resumed at step {step} after {elapsed / 60:.1f} min")
    draft.to(device).train()
    n_params = sum(p.numel() for p in draft.parameters())
    log(f"draft: {cfg.layers} layers x {draft.config.hidden_size}, {n_params / 1e6:.2f}M params, device {device}")

    def checkpoint(name: str, metrics: dict) -> None:
        meta = {"step": step, "minutes": round(elapsed / 60, 2), "config": asdict(cfg), **metrics}
        save_draft(draft, target_ids, blocked, target_dir, out / name, cfg, meta)
        state = {"model": draft.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed}
        state.update(rng=rng.getstate(), target_ids=target_ids, config=asdict(cfg))
        torch.save(state, out / "state.tmp")
        (out / "state.tmp").replace(state_path)
        with open(out / "log.jsonl", "a") as f:
            f.write(json.dumps({"event": "checkpoint", **meta}) + "\n")

    # 3. the loop: shuffled epochs of batches, lr from max(step, time) progress, periodic checkpoints
    order: list[int] = []
    last_ckpt, t0 = elapsed, time.time() - elapsed
    ema = None
    while True:
        elapsed = time.time() - t0
        progress = progress_at(step, elapsed, cfg.steps, cfg.minutes)
        if progress >= 1.0:
            break
        if len(order) < cfg.batch_size:
            order = list(range(len(train_items)))
            rng.shuffle(order)
        batch = [train_items[order.pop()] for _ in range(cfg.batch_size)]
        ids, mask, soft_batch = make_batch(batch, device)
        lr = lr_at(progress, step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        loss, acc = reply_loss(draft, ids, mask, soft_batch, cfg.soft_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 20 == 0 or step == 1:
            rec = {"step": step, "min": round(elapsed / 60, 2), "lr": lr, "loss": loss.item(), "ema": ema}
            rec["acc"] = acc.item()
            log(json.dumps(rec))
            with open(out / "log.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
        if elapsed - last_ckpt >= 60 * cfg.ckpt_minutes:
            metrics = evaluate(draft, val_items, device, cfg.batch_size, novel_items)
            log(f"checkpoint at step {step}: {metrics}")
            elapsed = time.time() - t0
            checkpoint("latest", {"train_loss_ema": ema, **metrics})
            last_ckpt = elapsed

    # 4. final: evaluate, save the last state and the draft folder
    metrics = evaluate(draft, val_items, device, cfg.batch_size, novel_items)
    log(f"final at step {step}: {metrics}")
    checkpoint("latest", {"train_loss_ema": ema, **metrics})
    save_draft(
        draft, target_ids, blocked, target_dir, out / "final", cfg, {"step": step, "train_loss_ema": ema, **metrics}
    )
    return out / "final"


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "data":
            ap.add_argument(flag, nargs="+", required=True, help="teacher JSONL(.gz) files")
        elif f.name == "topk":
            ap.add_argument(flag, nargs="+", default=[], help="top-k soft-label files for those replies")
        elif f.type == "bool":
            ap.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        elif "int | None" in str(f.type):
            ap.add_argument(flag, type=int, default=None)
        else:
            kind = {"int": int, "float": float, "str": str}[str(f.type)]
            ap.add_argument(flag, type=kind, default=f.default)
    return TrainConfig(**vars(ap.parse_args(argv)))


def main(argv: list[str] | None = None) -> Path:
    return train(parse_args(argv))


if __name__ == "__main__":
    main()
