"""Measure a draft q against the target p on held-out prompts: greedy acceptance alpha and cost ratio c.

alpha: the target's greedy reply to each held-out prompt is generated once (cached in --cache), then the
draft is teacher-forced on prompt + reply and we count draft argmax == target token. In greedy speculative
decoding the draft always predicts from a prefix the target wrote, so this IS the per-token acceptance.
A target token that has no row in the trimmed draft vocabulary counts as a miss.

c: the median time of one single-token cached forward (plain transformers, DynamicCache, float32) of q,
divided by the same for p.

--head FOLDER measures a feature-level head (specviz/models/head.py) instead: its first guess teacher-forced on the
target's true features, and c from one head step after a cached prefix. --head FOLDER --mix measures the draft and
the head together (drafter model+head, drafters_mix.py): the first guess of their mixture, and decoding with it.

--decode-gamma K (default 3) also decodes each held-out prompt greedily with specviz's engine at a constant
gamma K and reports the chained acceptance by position: alpha_1 (the first guess), alpha_2 (the second,
given the first was right), ... (theory.position_alphas over the rounds that reached each position). For a
head that is where its later guesses read its own predicted features. Expected speedup per round of gamma drafted tokens, if a verify costs one target
step (Leviathan et al. 2023, eq. 1 / theorem 3.8): (1 - alpha**(gamma+1)) / ((1 - alpha) * (gamma*c + 1)).

    nice -n 15 python -m specviz.training.eval_draft --draft assets/draft
    nice -n 15 python -m specviz.training.eval_draft --head assets/head
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specviz.backends.local import cache_kwargs
from specviz.request import RunRequest
from specviz.training.common import HELDOUT, ROOT, prompt_ids, read_heldout, target_folder


def load_draft(folder: str | Path):
    """The draft in the dtype the engine loads it in (float16 where this CPU runs it faster, kernels.draft_dtype;
    else float32) and the target id of each of its rows (a trimmed draft's specviz_vocab.json; else every id)."""
    from transformers import AutoModelForCausalLM

    from specviz.native.linear import draft_dtype

    folder = Path(folder)
    dtype = draft_dtype(torch.device("cpu")) or torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    vocab = folder / "specviz_vocab.json"
    if not vocab.is_file():  # a draft over the target's whole vocabulary: row i is token i
        return model, torch.arange(model.config.vocab_size)
    spec = json.loads(vocab.read_text())
    if spec.get("never_propose"):  # as the engine does: those rows get probability 0
        rows = torch.tensor(spec["never_propose"])
        model.get_output_embeddings().register_forward_hook(lambda m, i, out: out.index_fill(-1, rows, -torch.inf))
    return model, torch.tensor(spec["target_ids"])


def target_replies(target, tokenizer, prompts: list[str], cache: Path, max_new_tokens: int, batch_size: int):
    """The target's greedy reply ids for each prompt; generated once, then read back from `cache`."""
    done = json.loads(cache.read_text()) if cache.is_file() else {}
    key = lambda p: f"{max_new_tokens}\t{p}"  # noqa: E731
    todo = [p for p in prompts if key(p) not in done]
    for i in range(0, len(todo), batch_size):
        chunk = [prompt_ids(tokenizer, p) for p in todo[i : i + batch_size]]
        T = max(map(len, chunk))
        ids = torch.tensor([[2] * (T - len(x)) + x for x in chunk])  # (B, T) left-padded
        mask = torch.tensor([[0] * (T - len(x)) + [1] * len(x) for x in chunk])
        with torch.inference_mode():
            out = target.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=2
            )
        chunk = todo[i : i + batch_size]
        for p, row in zip(chunk, out[:, T:].tolist()):
            done[key(p)] = row[: row.index(2) + 1] if 2 in row else row  # up to <|im_end|> (eos), kept
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(done))
    return [done[key(p)] for p in prompts]


@torch.inference_mode()
def score(guess, target_ids: torch.Tensor, tokenizer, prompts: list[str], replies: list[list[int]]) -> dict:
    """Teacher-forced greedy acceptance on (prompt, target reply) pairs: guess(seq (T,), prompt length) gives the
    first guess at every reply position as target ids (R,); a reply token outside `target_ids` is a miss."""
    rows = set(target_ids.tolist())
    hits = total = oov = 0
    per_prompt = []
    for prompt, reply in zip(prompts, replies):
        p = prompt_ids(tokenizer, prompt)
        h = int((guess(torch.tensor(p + reply), len(p)) == torch.tensor(reply)).sum())
        hits, total = hits + h, total + len(reply)
        oov += sum(t not in rows for t in reply)
        per_prompt.append({"prompt": prompt, "alpha": h / len(reply), "tokens": len(reply)})
    return {"alpha": hits / total, "tokens": total, "oov_rate": oov / total, "per_prompt": per_prompt}


def row_lookup(target_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """target id -> the draft's row for it (row 0 for a target id it has no row for)."""
    lookup = torch.zeros(max(vocab_size, int(target_ids.max()) + 1), dtype=torch.long)
    lookup[target_ids] = torch.arange(len(target_ids))
    return lookup


def draft_guesser(draft, target_ids: torch.Tensor, vocab_size: int):
    """guess(seq (T,), prompt length) -> the draft's teacher-forced greedy first guess at every reply position, as
    target ids (R,); target tokens outside the draft's rows are read as row 0."""
    lookup = row_lookup(target_ids, vocab_size)

    def guess(seq: torch.Tensor, plen: int) -> torch.Tensor:
        logits = draft(lookup[seq][None]).logits[0]  # (T, N)
        return target_ids[logits[plen - 1 : -1].argmax(-1)]  # (R,) draft argmax as target ids

    return guess


@torch.inference_mode()
def rank_histogram(
    draft, target_ids: torch.Tensor, tokenizer, prompts: list[str], replies: list[list[int]], top: int = 8
) -> dict:
    """How often the target's greedy token is the draft's 1st, 2nd, ... choice (teacher-forced, greedy replies).

    This decides which token trees can pay: a runner-up leaf is worth its verify position only as often as the
    target's token is the draft's 2nd choice. Also the top-1 hit rate by the draft's top-1 probability (the
    confidence a dynamic tree expands by). A reply token outside the draft's rows has no rank ("oov").
    """
    lookup = row_lookup(target_ids, len(tokenizer))
    row_of = {t: i for i, t in enumerate(target_ids.tolist())}
    ranks = [0] * (top + 1)  # ranks[i]: rank i + 1; ranks[top]: beyond the top `top`
    oov = total = 0
    bins = [[0, 0] for _ in range(10)]  # by the draft's top-1 probability: [hits, count]
    second = [[0, 0] for _ in range(10)]  # by the draft's 2nd probability: [target is 2nd, count | top-1 missed]
    for prompt, reply in zip(prompts, replies):
        p = prompt_ids(tokenizer, prompt)
        seq = torch.tensor(p + reply)
        logits = draft(lookup[seq][None]).logits[0, len(p) - 1 : -1].float()  # (R, N)
        probs = torch.softmax(logits, -1)
        order = torch.argsort(logits, -1, descending=True)  # (R, N)
        for j, t in enumerate(reply):
            total += 1
            row = row_of.get(t)
            if row is None:
                oov += 1
                continue
            rank = int((order[j] == row).nonzero()[0, 0])
            ranks[min(rank, top)] += 1
            top2 = probs[j, order[j, :2]]
            b = min(int(top2[0] * 10), 9)
            bins[b][0] += rank == 0
            bins[b][1] += 1
            if rank > 0:
                b2 = min(int(top2[1] * 10), 9)
                second[b2][0] += rank == 1
                second[b2][1] += 1
    return {
        "tokens": total,
        "oov": oov / total,
        "rank_rates": [r / total for r in ranks],
        "top1_by_confidence": [(i / 10, h / n if n else None, n) for i, (h, n) in enumerate(bins)],
        "second_given_miss_by_q2": [(i / 10, h / n if n else None, n) for i, (h, n) in enumerate(second)],
    }


def acceptance(draft, target_ids: torch.Tensor, tokenizer, prompts: list[str], replies: list[list[int]]) -> dict:
    """Teacher-forced greedy acceptance of a draft model (its own rows: target_ids)."""
    return score(draft_guesser(draft, target_ids, len(tokenizer)), target_ids, tokenizer, prompts, replies)


@torch.inference_mode()
def ms_per_token(model, prompt: list[int], steps: int = 50, warmup: int = 5) -> float:
    """Median ms of one cached single-token forward, after a prefill of `prompt` (model-vocabulary ids)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(torch.tensor([prompt]), **cache_kwargs(model, cache), use_cache=True)
    tok = out.logits[:, -1:].argmax(-1)  # (1, 1)
    times = []
    for _ in range(steps + warmup):
        t = time.perf_counter()
        out = model(tok, **cache_kwargs(model, cache), use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times[warmup:])


def head_first_logits(head, target, seq: torch.Tensor, plen: int) -> torch.Tensor:
    """The head's teacher-forced first guess at every reply position, as logits over its rows (R, N): pairs (token
    j+1, the target's true feature j)."""
    f = target.model(seq[None]).last_hidden_state[0]  # (T, H)
    f_hat = head(seq[None, 1:], f[None, :-1], torch.arange(1, len(seq)))[0]  # (T-1, H): predicts seq[j+2]
    return head.logits(f_hat[plen - 2 : -1])


@torch.inference_mode()
def head_acceptance(head, target, tokenizer, prompts: list[str], replies: list[list[int]]) -> dict:
    """Teacher-forced first-guess acceptance of a head."""

    def guess(seq: torch.Tensor, plen: int) -> torch.Tensor:
        return head.target_ids[head_first_logits(head, target, seq, plen).argmax(-1)]  # (R,)

    return score(guess, head.target_ids, tokenizer, prompts, replies)


@torch.inference_mode()
def mix_acceptance(draft, target_ids, head, target, tokenizer, prompts, replies, w: float) -> dict:
    """Teacher-forced first guess of the mixture w * q_head + (1 - w) * q_draft (drafters_mix.py), each at T = 1;
    also each guesser's alone and how often one of the two is right ("apart")."""
    V = len(tokenizer)
    lookup = row_lookup(target_ids, V)
    apart = {"draft": 0, "head": 0, "either": 0}

    def guess(seq: torch.Tensor, plen: int) -> torch.Tensor:
        d, h = torch.zeros(len(seq) - plen, V), torch.zeros(len(seq) - plen, V)
        d[:, target_ids] = torch.softmax(draft(lookup[seq][None]).logits[0, plen - 1 : -1].float(), -1)
        h[:, head.target_ids] = torch.softmax(head_first_logits(head, target, seq, plen).float(), -1)
        truth = seq[plen:]
        hit_d, hit_h = d.argmax(-1) == truth, h.argmax(-1) == truth
        for key, hits in (("draft", hit_d), ("head", hit_h), ("either", hit_d | hit_h)):
            apart[key] += int(hits.sum())
        return ((1 - w) * d + w * h).argmax(-1)

    res = score(guess, torch.unique(torch.cat([target_ids, head.target_ids])), tokenizer, prompts, replies)
    res["apart"] = {key: hits / res["tokens"] for key, hits in apart.items()}
    return res


def decode_alphas(target_dir: Path, draft: str, head: str, prompts: list[str], gamma: int, max_new_tokens: int) -> dict:
    """Greedy speculative decoding of each prompt with specviz's engine at a constant gamma: the chained
    acceptance by position, the overall alpha and tokens per target call."""
    from specviz import load_model, load_pair
    from specviz.api import encode_prompt
    from specviz.engine.loop import speculative_decode
    from specviz.events import Done, Round
    from specviz.theory import alpha, position_alphas

    if head and draft:  # both: the mixture's first guess (drafters_mix.py)
        p, q = load_pair(str(target_dir), draft, device="cpu")
        cfg = RunRequest(drafter="model+head", gamma=gamma, tree="off", max_new_tokens=max_new_tokens, head=head).spec
    elif head:
        p, q = load_model(str(target_dir), device="cpu"), None
        cfg = RunRequest(drafter="head", gamma=gamma, tree="off", max_new_tokens=max_new_tokens, head=head).spec
    else:
        p, q = load_pair(str(target_dir), draft, device="cpu")
        cfg = RunRequest(drafter="model", gamma=gamma, tree="off", max_new_tokens=max_new_tokens).spec
    rounds, drafted, accepted, resampled, calls, new = [], 0, 0, 0, 0, 0
    for prompt in prompts:
        for ev in speculative_decode(p, q, encode_prompt(p, prompt), cfg):
            if isinstance(ev, Round):
                rounds.append(ev)
            elif isinstance(ev, Done):
                drafted, accepted = drafted + ev.stats["drafted"], accepted + ev.stats["accepted"]
                resampled += ev.stats["resampled"]
                calls, new = calls + ev.stats["target_calls"], new + len(ev.token_ids)
    pairs = [(len(r.drafted), r.n) for r in rounds if r.drafted]
    return {
        "gamma": gamma,
        "position_alphas": position_alphas(pairs),
        "alpha": alpha(accepted, resampled),
        "accepted_per_drafted": accepted / max(drafted, 1),
        "tokens_per_call": new / max(calls, 1),
    }


def speedup(alpha: float, c: float, gamma: int) -> float:
    if alpha >= 1.0:
        return (gamma + 1) / (gamma * c + 1)
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))


def main(argv: list[str] | None = None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", default=str(ROOT / "assets" / "draft"))
    ap.add_argument("--head", default="", help="measure this head folder instead of the draft")
    ap.add_argument("--mix", action="store_true", help="with --head: the draft and the head together (model+head)")
    ap.add_argument("--weight", type=float, default=None, help="--mix: the head's share (default config.HEAD_WEIGHT)")
    ap.add_argument("--decode-gamma", type=int, default=3, help="0 skips the decoding measurement")
    ap.add_argument("--decode-tokens", type=int, default=64, help="tokens per prompt in the decoding measurement")
    ap.add_argument("--target", default="", help="target folder; default: the built-in target")
    ap.add_argument("--prompts", default=str(HELDOUT))
    ap.add_argument("--cache", default=str(ROOT / "runs" / "heldout_target.json"), help="target replies cache")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8, help="target generation batch (left-padded)")
    ap.add_argument("--timing-steps", type=int, default=50, help="0 skips timing")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ranks", action="store_true", help="also the draft's rank histogram of the target's token")
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    target_dir = target_folder(args.target)

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    prompts = read_heldout(args.prompts)
    replies = target_replies(target, tokenizer, prompts, Path(args.cache), args.max_new_tokens, args.batch_size)
    if args.head:
        from specviz.engine.costs import head_calibration
        from specviz.models.head import load_head
        from specviz.models.loaded import LoadedModel

        head = load_head(args.head, LoadedModel(target, tokenizer, "target", torch.device("cpu"), torch.float32))
        if args.mix:
            from specviz.config import HEAD_WEIGHT

            draft, target_ids = load_draft(args.draft)
            w = HEAD_WEIGHT if args.weight is None else args.weight
            res = mix_acceptance(draft, target_ids, head, target, tokenizer, prompts, replies, w)
            print("first guess apart: " + ", ".join(f"{k} {v:.3f}" for k, v in res["apart"].items()))
        else:
            res = head_acceptance(head, target, tokenizer, prompts, replies)
    else:
        draft, target_ids = load_draft(args.draft)
        res = acceptance(draft, target_ids, tokenizer, prompts, replies)
    print(
        f"alpha (greedy acceptance, first guess, teacher-forced) = {res['alpha']:.3f} over {res['tokens']} tokens "
        f"of {len(prompts)} held-out prompts; target tokens outside the guesser's vocabulary: {res['oov_rate']:.3%}"
    )
    if args.ranks and not args.head:
        res["ranks"] = h = rank_histogram(draft, target_ids, tokenizer, prompts, replies)
        shares = ", ".join(f"{i + 1}: {r:.3f}" for i, r in enumerate(h["rank_rates"][:-1]))
        print(
            f"the target's token is the draft's choice number {shares}; beyond: {h['rank_rates'][-1]:.3f}; "
            f"outside its vocabulary: {h['oov']:.3f} ({h['tokens']} tokens)"
        )
        print(
            "top-1 right by the draft's top-1 probability: "
            + ", ".join(f"{b:.1f}+: {r:.2f} ({n})" for b, r, n in h["top1_by_confidence"] if n)
        )
        print(
            "after a top-1 miss, 2nd right by the draft's 2nd probability: "
            + ", ".join(f"{b:.1f}+: {r:.2f} ({n})" for b, r, n in h["second_given_miss_by_q2"] if n)
        )
    if args.timing_steps:
        p = prompt_ids(tokenizer, prompts[0])
        ms_q = 1000 * min(head_calibration(head, reps=args.timing_steps)[0]) if args.head else 0.0
        if args.mix or not args.head:  # a mixed first guess pays one head step and one draft step
            lookup = {t: i for i, t in enumerate(target_ids.tolist())}
            ms_q += ms_per_token(draft, [lookup.get(t, 0) for t in p], args.timing_steps)
        ms_p = ms_per_token(target, p, args.timing_steps)
        c = ms_q / ms_p
        res.update(ms_draft=ms_q, ms_target=ms_p, c=c)
        res["speedup"] = {g: speedup(res["alpha"], c, g) for g in range(1, 9)}
        best = max(res["speedup"], key=res["speedup"].get)
        print(
            f"draft {ms_q:.2f} ms/token, target {ms_p:.2f} ms/token, c = {c:.3f}; expected speedup "
            f"(verify = one target step) {res['speedup'][best]:.2f}x at gamma={best}"
        )
    if args.decode_gamma:
        draft_dir = args.draft if args.mix or not args.head else ""
        res["decode"] = decode_alphas(target_dir, draft_dir, args.head, prompts, args.decode_gamma, args.decode_tokens)
        d = res["decode"]
        print(
            f"greedy decoding at gamma {d['gamma']}: alpha {d['alpha']:.3f}, chained by position "
            + ", ".join(f"{a:.3f}" for a in d["position_alphas"])
            + f"; {d['tokens_per_call']:.2f} tokens per target call"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
