"""The head's training loss over several chained guesses, and its data as packed token files.

Training-time test (EAGLE-3: Li et al. 2025, arXiv 2503.01840): in decoding, the head's first guess of a round
reads the target's true feature, its later guesses read the head's own predicted features and attend to the
true pairs before the round plus the round's guessed pairs. Training with `steps` > 1 unrolls exactly that for
every position j at once: step s (0-based) feeds the pair (e(x_{j+1+s}), f^_{j+s}) at position j + 1 + s, whose
queries see the true pairs 0..j (step 0's keys, causal) and the pairs of steps 1..s at j alone (the diagonal),
and predicts F_{j+1+s} and so x_{j+2+s}. Step 0 is the one-guess loss the head trained with before. Tokens are
teacher-forced (the target's own), as a later guess only counts when the earlier ones were kept.

Packed token files (`pack_tokens`) hold each teacher reply as its prompt's chat-template ids plus the reply's
ids, so training can run where there is no tokenizer and compute the features with the target on the fly
(`target_features`): the way to train on a GPU with nothing but the target's weights and this file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def _shift(t: torch.Tensor, n: int, L: int) -> torch.Tensor:
    """t[:, n : n + L] along dim 1, zero-padded past the end."""
    out = t[:, n : n + L]
    if out.shape[1] < L:
        pad = torch.zeros((t.shape[0], L - out.shape[1], *t.shape[2:]), dtype=t.dtype, device=t.device)
        out = torch.cat([out, pad], dim=1)
    return out


def collate(items: list[dict], device) -> dict:
    """Right-padded ids (B, T), lengths and prompt lengths, and the features (B, T, H) where items have them."""
    T = max(len(it["ids"]) for it in items)
    ids = torch.zeros(len(items), T, dtype=torch.long)
    for b, it in enumerate(items):
        ids[b, : len(it["ids"])] = it["ids"]
    out = {
        "ids": ids.to(device),
        "lens": torch.tensor([len(it["ids"]) for it in items], device=device),
        "plens": torch.tensor([it["plen"] for it in items], device=device),
    }
    if items[0].get("feats") is not None:
        feats = torch.zeros(len(items), T, items[0]["feats"].shape[1])
        for b, it in enumerate(items):
            feats[b, : len(it["ids"])] = it["feats"].float()
        out["feats"] = feats.to(device)
    return out


@torch.no_grad()
def target_features(model, ids: torch.Tensor) -> torch.Tensor:
    """The target's last hidden state (after its final norm) at every position of right-padded ids (B, T, H)."""
    return model.model(input_ids=ids).last_hidden_state.float()


def unrolled(head, ids: torch.Tensor, f: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head's predicted features for `steps` chained guesses at every pair j of right-padded ids (B, T)
    with input features f (B, T - 1, H): out[s][:, j] is f^_{j+1+s}, as decoding computes it when a round
    starts after position j and the guessed tokens are the target's own."""
    L = ids.shape[1] - 1  # pair j = (x_{j+1}, F_j), j = 0 .. T - 2
    pos = torch.arange(1, L + 1, device=ids.device)
    causal = torch.ones(L, L, dtype=torch.bool, device=ids.device).tril()
    diag = torch.eye(L, dtype=torch.bool, device=ids.device)
    ks, vs, out = [], [], []
    for s in range(steps):
        x, q, k, v = head.pairs(_shift(ids, 1 + s, L), f, pos + s)
        ks.append(k)
        vs.append(v)
        mask = torch.cat([causal] + [diag] * s, dim=1)
        f = head.finish(x, head.attend(q, torch.cat(ks, 2), torch.cat(vs, 2), mask))
        out.append(f)
    return out


def unrolled_loss(head, b: dict, lookup: torch.Tensor, steps: int, noise: float, token_weight: float):
    """(loss, [first-guess accuracy, second given first, ...], [positions of each]) over the positions whose
    guess is a reply token.

    Each step's loss is the EAGLE paper's (SmoothL1 to the true next feature + token_weight x cross-entropy to
    the target's own distribution over the head's rows); the loss is their mean over the steps that have such
    positions. A step's accuracy is argmax == the target's token (a token outside the rows is a miss)."""
    ids, feats, lens, plens = b["ids"], b["feats"], b["lens"], b["plens"]
    L = ids.shape[1] - 1
    j = torch.arange(L, device=ids.device)
    f = feats[:, :L]
    if noise > 0:
        f = f + (torch.rand_like(f) * 2 - 1) * noise
    losses, accs, counts = [], [], []
    for s, f_hat in enumerate(unrolled(head, ids, f, steps)):
        t = j[None] + 2 + s  # the token this step's guess at j is for
        m = (t < lens[:, None]) & (t >= plens[:, None])
        if not bool(m.any()):
            break
        pred, true = f_hat[m], _shift(feats, 1 + s, L)[m]
        logp = head.logits(pred).log_softmax(-1)
        with torch.no_grad():
            p_true = head.logits(true).softmax(-1)  # the target's own distribution over the head's rows
        ce = -(p_true * logp).sum(-1).mean()
        losses.append(F.smooth_l1_loss(pred, true) + token_weight * ce)
        nxt = lookup[_shift(ids, 2 + s, L)][m]
        accs.append((logp.argmax(-1) == nxt).float().mean())
        counts.append(int(m.sum()))
    return torch.stack(losses).mean(), accs, counts


def pack_tokens(path: str | Path, splits: dict[str, list[dict]], tokenizer, max_len: int = 512) -> dict[str, int]:
    """Write {split: rows} (teacher rows: prompt, temperature, ids) as one .npz of prompt + reply ids, each reply
    once (by teacher_io.reply_key, as the cached-feature path loads them)."""
    from specviz.training.common import prompt_ids
    from specviz.training.teacher_io import reply_key

    prompts: dict[str, list[int]] = {}
    seen: set[str] = set()
    ids, offsets, plen, greedy, split = [], [0], [], [], []
    counts = {}
    for k, (name, rows) in enumerate(splits.items()):
        n = 0
        for r in rows:
            if r["prompt"] not in prompts:
                prompts[r["prompt"]] = prompt_ids(tokenizer, r["prompt"])
            seq, key = prompts[r["prompt"]] + list(r["ids"]), reply_key(r)
            if len(seq) > max_len or not r["ids"] or key in seen:
                continue
            seen.add(key)
            ids.extend(seq)
            offsets.append(len(ids))
            plen.append(len(prompts[r["prompt"]]))
            greedy.append(r.get("temperature") == 0)
            split.append(k)
            n += 1
        counts[name] = n
    if max(ids) >= 2**16:
        raise ValueError("pack_tokens stores ids as uint16; this vocabulary is larger")
    np.savez_compressed(
        path,
        ids=np.asarray(ids, dtype=np.uint16),
        offsets=np.asarray(offsets, dtype=np.int64),
        plen=np.asarray(plen, dtype=np.int32),
        greedy=np.asarray(greedy, dtype=bool),
        split=np.asarray(split, dtype=np.int8),
        names=np.asarray(list(splits)),
    )
    return counts


def read_tokens(path: str | Path) -> dict[str, list[dict]]:
    """{split: [{ids (T,) long, plen, greedy, feats None}]} from a pack_tokens file."""
    z = np.load(path)
    ids, off = torch.from_numpy(z["ids"].astype(np.int64)), z["offsets"]
    names = [str(n) for n in z["names"]]
    out: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(len(z["plen"])):
        item = {"ids": ids[off[i] : off[i + 1]], "plen": int(z["plen"][i]), "greedy": bool(z["greedy"][i])}
        out[names[int(z["split"][i])]].append({**item, "feats": None})
    return out


def length_batches(lengths: list[int], batch_size: int, rng) -> list[list[int]]:
    """Shuffled batches of item indices of similar length: shuffle, sort windows of 50 batches by length, cut,
    shuffle the batches."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    out = []
    w = 50 * batch_size
    for i in range(0, len(order), w):
        win = sorted(order[i : i + w], key=lambda k: lengths[k])
        out += [win[k : k + batch_size] for k in range(0, len(win), batch_size)]
    rng.shuffle(out)
    return [b for b in out if len(b) == batch_size] or out
