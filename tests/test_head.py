"""The feature-level head drafter (specviz/models/head.py): exactness, its cache after rejections, loading, and the
training pipeline (label_teacher.py --features -> train_head.py) on the tiny pair."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from test_drafters import PROMPTS

from specviz import Round, SpecvizError, generate
from specviz.drafters.model import HeadDrafter, make_drafter
from specviz.engine.loop import speculative_decode
from specviz.models.head import DraftHead, head_for, load_head
from specviz.native import library as native
from specviz.native.head import NativeHead
from specviz.request import RunRequest
from specviz.training import label_teacher, train_head

TRAIN_PROMPTS = [
    "hello world",
    "tell me a story",
    "abc abc",
    "what is 1 + 2?",
    "name a colour",
    "x = (1, 2)",
    "the cat sat",
    "why?",
    "count to five",
    "say hi",
    "write code",
    "a poem please",
]
TRAIN_ARGS: list[str] = []  # the fixture's train_head.py arguments (less --steps), for the resume test


@pytest.fixture(scope="module")
def trained_head(tiny_pair, loaded_pair, tmp_path_factory) -> Path:
    """A head trained by the project's own pipeline on the tiny target's greedy and sampled replies."""
    root = tmp_path_factory.mktemp("head")
    p, _ = loaded_pair
    rows = []
    for prompt in TRAIN_PROMPTS:
        for t in (0.0, 1.0):
            r = generate(prompt, target=p, mode="ar", max_new_tokens=40, temperature=t, seed=len(rows))
            rows.append({"prompt": prompt, "temperature": t, "ids": list(r.token_ids)})
    with gzip.open(root / "teacher.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    target_dir = tiny_pair[0]
    label_teacher.main(
        [
            "--data",
            str(root / "teacher.jsonl.gz"),
            "--out",
            str(root / "lab"),
            "--target",
            target_dir,
            "--features",
            "--threads",
            "1",
            "--topk",
            "4",
        ]
    )
    vocab = root / "vocab.json"
    vocab.write_text(json.dumps({"target_ids": list(range(p.vocab_size))}))
    args = [
        "--features",
        str(root / "lab" / "features"),
        "--data",
        str(root / "teacher.jsonl.gz"),
        "--vocab",
        str(vocab),
        "--out",
        str(root / "run"),
        "--target",
        target_dir,
        "--heldout",
        "",
        "--heldout-dir",
        "",
        "--minutes",
        "0",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "5",
        "--batch-size",
        "4",
        "--val-frac",
        "0.2",
        "--threads",
        "1",
    ]
    train_head.main(args + ["--steps", "150"])
    TRAIN_ARGS[:] = args
    return root / "run" / "final"


def test_training_learns_and_resumes(trained_head):
    log = [json.loads(x) for x in (trained_head.parent / "log.jsonl").read_text().splitlines()]
    accs = [r["acc"] for r in log if "acc" in r]
    assert accs[-1] > accs[0] + 0.2  # the first guess got much better than the target's-last-block init
    assert log[-1]["event"] == "checkpoint" and log[-1]["step"] == 150 and "val_acc" in log[-1]
    train_head.main(TRAIN_ARGS + ["--steps", "155"])  # five more steps, from state.pt
    log = [json.loads(x) for x in (trained_head.parent / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r].count(1) == 1 and log[-1]["step"] == 155


@pytest.mark.parametrize(
    "drafter, policy",
    [
        ("head", "constant"),
        ("head", "auto"),
        ("lookup+head", "constant"),
        ("lookup+head", "auto"),
        ("head", "confidence"),
    ],
)
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_output_equals_plain_greedy(loaded_pair, trained_head, drafter, policy, gamma):
    p, _ = loaded_pair
    drafted = accepted = rejected = 0
    for prompt in PROMPTS:
        ar = generate(prompt, target=p, mode="ar", max_new_tokens=40)
        sp = generate(
            prompt,
            target=p,
            draft=None,
            drafter=drafter,
            head=str(trained_head),
            gamma=gamma,
            gamma_policy=policy,
            confidence=0.1,
            max_new_tokens=40,
        )
        assert sp.token_ids == ar.token_ids, (prompt, drafter, policy, gamma)
        drafted, accepted, rejected = (
            drafted + sp.stats["drafted"],
            accepted + sp.stats["accepted"],
            rejected + sp.stats["resampled"],
        )
    assert drafted > 0 and 0 < accepted < drafted and rejected > 0  # guesses were kept and turned down


class Checked(HeadDrafter):
    """A head drafter that, at every proposal, recomputes the greedy guesses from scratch (a fresh cache fed every
    pair with the target's true features) and compares: the rolled-back cache must give the same guesses."""

    def __init__(self, head, V, target):
        super().__init__(head, V)
        self.target, self.checked = target, 0

    def propose(self, seq, ctx):
        prop = super().propose(seq, ctx)
        if prop.tokens.numel():
            with torch.no_grad():
                f_all = self.target.model(torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states[-1][0]
                fresh = HeadDrafter(self.head, self.V)
                fresh.begin(seq[:1], f_all)  # every true feature pending: fed in one call
                fresh.fed, fresh.pending = 0, f_all
                again = HeadDrafter.propose(fresh, seq, ctx)
            assert prop.tokens.tolist() == again.tokens.tolist(), (len(seq), prop.tokens, again.tokens)
            self.checked += 1
        return prop


@pytest.mark.parametrize("path", ["pytorch", "llama.c", "llama.c int8"])
def test_the_heads_cache_after_rejections_equals_a_recomputation(loaded_pair, trained_head, monkeypatch, path):
    p, _ = loaded_pair
    head = load_head(trained_head, p)
    if path != "pytorch":
        if native.library() is None:
            pytest.skip(f"no native kernel here: {native.why_not()}")
        monkeypatch.setenv("SPECVIZ_DRAFT_INT8", "1" if path.endswith("int8") else "0")
        head.native = NativeHead(head, p.lean)
        assert head.native.int8 == path.endswith("int8")
    resampled = 0
    for prompt in PROMPTS:
        ids = p.tokenizer(prompt)["input_ids"]
        drafter = Checked(head, p.vocab_size, p)
        events = list(
            speculative_decode(
                p, None, ids, RunRequest(drafter="model", gamma=4, tree="off", max_new_tokens=30).spec, drafter=drafter
            )
        )
        resampled += sum(e.kind == "resampled" for e in events if isinstance(e, Round))
        assert drafter.checked > 0
    assert resampled > 0


def test_save_and_load_give_the_same_guesses(loaded_pair, tmp_path):
    p, _ = loaded_pair
    head = DraftHead.from_target(p.model, list(range(3, p.vocab_size)))
    head.save(tmp_path / "h", dtype=torch.float32)
    again = load_head(tmp_path / "h", p)
    tok, f = torch.tensor([[5, 6, 7]]), torch.randn(1, 3, p.model.config.hidden_size)
    pos = torch.arange(1, 4)
    assert torch.allclose(head.logits(head(tok, f, pos)), again.logits(again(tok, f, pos)), atol=1e-5)
    assert again.rows.shape == (p.vocab_size - 3, p.model.config.hidden_size)


def test_missing_or_wrong_heads_are_one_sentence(loaded_pair, tmp_path):
    p, _ = loaded_pair
    with pytest.raises(SpecvizError, match="no draft head for this target"):
        head_for(p)  # the tiny target is not the built-in one, and no folder was given
    with pytest.raises(SpecvizError, match="no draft head for this target"):
        generate("hello", target=p, drafter="head", max_new_tokens=4)
    with pytest.raises(SpecvizError, match="needs a draft head"):
        make_drafter("head", None, p.vocab_size)
    with pytest.raises(SpecvizError, match="not a draft head folder"):
        generate("hello", target=p, drafter="head", head=str(tmp_path), max_new_tokens=4)
    narrow = DraftHead.from_target(p.model, list(range(8)))
    narrow.cfg["hidden"] = 16  # as if made for a narrower target
    narrow.save(tmp_path / "narrow")
    with pytest.raises(SpecvizError, match="made for another target"):
        generate("hello", target=p, drafter="head", head=str(tmp_path / "narrow"), max_new_tokens=4)


def test_the_built_in_head_is_found_for_the_built_in_target_only(loaded_pair, monkeypatch, tmp_path):
    from specviz import config
    from specviz.models import head as head_mod

    p, _ = loaded_pair
    DraftHead.from_target(p.model, list(range(p.vocab_size))).save(tmp_path / "builtin-head")
    monkeypatch.setattr(config, "BUILTIN_HEAD_DIR", tmp_path / "builtin-head")
    with pytest.raises(SpecvizError):
        head_for(p)  # a head exists, but this target is not the built-in one
    monkeypatch.setattr(p, "name", config.BUILTIN_TARGET)
    assert head_for(p) is head_for(p)  # loaded once, shared
    assert isinstance(head_mod.head_for(p), DraftHead)
    r = generate("hello", target=p, drafter="head", max_new_tokens=6)
    assert r.stats["drafted"] > 0


@pytest.mark.parametrize("mix", [False, True])
def test_eval_draft_measures_a_head(tiny_pair, trained_head, tmp_path, mix):
    """The head alone, or with the draft (--mix: the model+head drafter's first guess and its decoding)."""
    from specviz.training import eval_draft

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TRAIN_PROMPTS[:3] + ["an unseen prompt"]) + "\n")
    both = ["--mix", "--draft", tiny_pair[1]] if mix else []
    res = eval_draft.main(
        both
        + [
            "--target",
            tiny_pair[0],
            "--head",
            str(trained_head),
            "--prompts",
            str(prompts),
            "--cache",
            str(tmp_path / "cache.json"),
            "--max-new-tokens",
            "24",
            "--timing-steps",
            "3",
            "--decode-gamma",
            "3",
            "--decode-tokens",
            "24",
            "--threads",
            "1",
        ]
    )
    assert 0.2 < res["alpha"] <= 1.0 and res["tokens"] > 0 and res["c"] > 0
    d = res["decode"]
    assert 1 <= len(d["position_alphas"]) <= 3 and all(0 <= a <= 1 for a in d["position_alphas"])
    assert d["tokens_per_call"] > 1.0  # the trained head's guesses were kept often enough to save target calls


def test_unrolled_training_computes_what_decoding_computes(loaded_pair):
    """Training-time test (head_unroll.unrolled) must see at step s exactly what decoding's (s+1)-th guess of a
    round sees: the true pairs before the round in the cache, then the head's own predicted features."""
    from specviz.models.head import HeadCache
    from specviz.training.head_unroll import unrolled

    p, _ = loaded_pair
    head = DraftHead.from_target(p.model, list(range(p.vocab_size)))
    with torch.no_grad():
        torch.manual_seed(0)
        head.fc.weight.add_(0.3 * torch.randn_like(head.fc.weight))
        ids = torch.tensor([[1, 5, 9, 12, 7, 30, 2, 44, 8, 19, 3, 25]])
        feats = p.model.model(input_ids=ids).last_hidden_state
        T = ids.shape[1]
        steps = unrolled(head, ids, feats[:, : T - 1], 3)
        checked = 0
        for j in range(T - 4):
            cache = HeadCache()
            f = head(ids[:, 1 : j + 2], feats[:, : j + 1], torch.arange(1, j + 2), cache)[:, -1:]
            for s in range(3):
                if s:  # the guess before was the target's own token x_{j+1+s}
                    f = head(ids[:, j + 1 + s : j + 2 + s], f, torch.tensor([j + 1 + s]), cache)
                assert torch.allclose(f[0, 0], steps[s][0, j], atol=1e-5), (j, s)
                checked += 1
    assert checked == 3 * (T - 4)


def test_training_on_packed_tokens_with_chained_guesses(loaded_pair, trained_head, tmp_path):
    """--pack-tokens then --tokens (features from the target on the fly) with --unroll 2: it learns both
    guesses, reports the second's validation accuracy, and writes a head that loads."""
    root = trained_head.parent.parent
    common = [
        "--heldout",
        "",
        "--heldout-dir",
        "",
        "--val-frac",
        "0.2",
        "--target",
        TRAIN_ARGS[TRAIN_ARGS.index("--target") + 1],
    ]
    packed = tmp_path / "tok.npz"
    train_head.main(["--data", str(root / "teacher.jsonl.gz"), "--pack-tokens", str(packed), *common])
    vocab = TRAIN_ARGS[TRAIN_ARGS.index("--vocab") + 1]
    args = ["--tokens", str(packed), "--vocab", vocab, "--out", str(tmp_path / "run"), "--unroll", "2"]
    args += ["--minutes", "0", "--steps", "120", "--lr", "3e-3", "--warmup-steps", "5", "--batch-size", "4"]
    final = train_head.main(args + ["--threads", "1", *common])
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "acc2" in r]
    assert steps[-1]["acc"] > steps[0]["acc"] + 0.2 and steps[-1]["acc2"] > steps[0]["acc2"] + 0.2
    assert log[-1]["event"] == "checkpoint" and {"val_acc", "val_acc2", "val_greedy_acc2"} <= set(log[-1])
    rows = len(json.loads(Path(vocab).read_text())["target_ids"])
    assert load_head(final, loaded_pair[0]).rows.shape[0] == rows
    assert (tmp_path / "run" / "best" / "head.safetensors").is_file()

    # --init: a warm start from a trained head; at learning rate 0 its weights come back unchanged
    args = ["--tokens", str(packed), "--vocab", vocab, "--out", str(tmp_path / "warm"), "--init", str(trained_head)]
    warm = train_head.main(args + ["--minutes", "0", "--steps", "2", "--lr", "0", "--threads", "1", *common])
    from safetensors.torch import load_file

    before, after = load_file(str(trained_head / "head.safetensors")), load_file(str(warm / "head.safetensors"))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)

    from specviz.training.head_unroll import pack_tokens, read_tokens

    with gzip.open(root / "teacher.jsonl.gz", "rt") as f:
        replies = [json.loads(x) for x in f]
    counts = pack_tokens(tmp_path / "dup.npz", {"train": replies + replies[:3]}, loaded_pair[0].tokenizer)
    assert counts == {"train": len(replies)} == {"train": len(read_tokens(tmp_path / "dup.npz")["train"])}
