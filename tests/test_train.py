"""Smoke tests of the draft tooling (specviz.training.train_draft, specviz.training.make_teacher_data) on tiny models.

A tiny random Llama "target" and a word-level tokenizer with the target's special tokens (0 <|endoftext|>,
1 <|im_start|>, 2 <|im_end|>) and a chat template are built in a fixture, so nothing touches the network.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from specviz.training import common, draft_rows, make_teacher_data, teacher_io, train_draft

WORDS = [f"w{i}" for i in range(40)] + ["hello", "world", "tell", "me", "about", "cats", "dogs", "write", "a", "poem"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"
)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    """A tiny random LlamaForCausalLM + word-level tokenizer saved like the converted target."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("target")
    vocab = {t: i for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "user", "assistant", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<|endoftext|>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
    )
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    hf.chat_template = TEMPLATE
    hf.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def fake_teacher(path: Path, tokenizer) -> list[dict]:
    """Learnable replies: each prompt's reply counts up through a few words from a prompt-dependent start."""
    rows = []
    ids = [tokenizer.convert_tokens_to_ids(w) for w in WORDS[:40]]
    for k, prompt in enumerate(["hello world", "tell me about cats", "tell me about dogs", "write a poem"]):
        for temp in (0.0, 1.0, 1.0):
            reply = [ids[(3 * k + j) % 40] for j in range(12)] + [2]
            rows.append({"prompt": prompt, "temperature": temp, "ids": reply})
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return rows


def test_prompt_ids_use_the_chat_template(target_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    ids = train_draft.prompt_ids(tok, "hello world")
    assert tok.convert_ids_to_tokens(ids) == [
        "<|im_start|>",
        "user",
        "hello",
        "world",
        "<|im_end|>",
        "<|im_start|>",
        "assistant",
    ]


def test_train_saves_a_loadable_draft_and_resumes(tmp_path, target_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    rows = fake_teacher(tmp_path / "teacher.jsonl.gz", tok)
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("Write a poem\n")  # matches "write a poem" (case-insensitive): must not be trained on
    args = [
        "--data",
        str(tmp_path / "teacher.jsonl.gz"),
        "--out",
        str(tmp_path / "run"),
        "--target",
        str(target_dir),
        "--heldout",
        str(heldout),
        "--layers",
        "1",
        "--batch-size",
        "4",
        "--minutes",
        "0",
        "--steps",
        "40",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "2",
        "--propose-rows",
        "5",
        "--val-frac",
        "0.4",
        "--min-count",
        "1",
        "--threads",
        "1",
    ]
    cfg = train_draft.parse_args(args)
    final = train_draft.train(cfg, log=lambda *a: None)

    # the folder loads as a plain causal LM and carries the tokenizer and the vocabulary map
    draft = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    target_ids = json.loads((final / "specviz_vocab.json").read_text())["target_ids"]
    assert target_ids[0] == 0 and target_ids[:3] == [0, 1, 2]
    assert len(target_ids) == len(set(target_ids)) == draft.config.vocab_size
    assert draft.config.tie_word_embeddings
    assert (final / "tokenizer.json").is_file() and (final / "chat_template.jinja").is_file()
    # every reply token of the training split has a row; the held-out prompt was never trained on
    train_rows, val_rows, dropped = train_draft.split_rows(rows, ["Write a poem"], cfg)
    assert dropped == 3 and all(r["prompt"] != "write a poem" for r in train_rows + val_rows)
    seen = {t for r in train_rows for t in r["ids"]}
    assert seen <= set(target_ids)
    assert not (set(rows[-1]["ids"]) - seen) & set(target_ids[3:])
    # it may propose the rows of the 5 reply tokens most frequent in its training split, no others
    blocked = json.loads((final / "specviz_vocab.json").read_text())["never_propose"]
    assert blocked == draft_rows.never_propose((r["ids"] for r in train_rows), target_ids, 5)
    assert len(target_ids) - len(blocked) == 5 and 0 in blocked

    # the embedding rows started from the target's (hidden sizes match), and training lowered the loss
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert losses[-1] < 0.5 * losses[0]
    assert log[-1]["event"] == "checkpoint" and log[-1]["step"] == 40

    # re-running with a larger step budget resumes from state.pt instead of starting over
    resumed = [a if a != "40" else "45" for a in args]  # the same run, five more steps
    train_draft.train(train_draft.parse_args(resumed), log=lambda *a: None)
    meta = json.loads((tmp_path / "run" / "final" / "train_meta.json").read_text())
    assert meta["step"] == 45
    # the validation prompt ("hello world") shares no word with a training prompt: its greedy reply is novel, and
    # the novel figure is measured on it alone
    assert {r["prompt"] for r in val_rows} == {"hello world"}
    assert meta["val_novel_greedy_acc"] == meta["val_greedy_acc"] and meta["val_novel_greedy_loss"] > 0
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r].count(1) == 1  # step 1 was logged once: no restart


def test_a_draft_proposes_the_rows_of_its_most_frequent_reply_tokens(tmp_path):
    ids = [0, 1, 2, 10, 11, 12, 13]  # row r reads target id ids[r]
    replies = [[12, 12, 2], [13, 12, 2, 10]]  # 12 three times, 2 twice, 13 and 10 once
    assert draft_rows.never_propose(replies, ids, 3) == [0, 1, 4, 6]  # kept: 12, 2, then 10 (the lower row of a tie)
    assert draft_rows.never_propose(replies, ids, 0) == draft_rows.never_propose(replies, ids, 6) == [0]
    (tmp_path / "specviz_vocab.json").write_text(json.dumps({"target_ids": ids, "never_propose": [0]}))
    data = tmp_path / "replies.jsonl"
    data.write_text("".join(json.dumps({"prompt": "p", "ids": r}) + "\n" for r in replies))
    draft_rows.main(["--draft", str(tmp_path), "--teacher", str(data), "--keep", "2"])
    spec = json.loads((tmp_path / "specviz_vocab.json").read_text())
    assert spec == {"target_ids": ids, "never_propose": [0, 1, 3, 4, 6]}


def test_a_head_keeps_the_rows_of_its_most_frequent_reply_tokens(tmp_path):
    """A head has no catch-all row and computes only its target_ids rows: the rows it drops leave that list."""
    ids = [0, 1, 2, 10, 11, 12, 13]
    replies = [[12, 12, 0], [13, 12, 0, 10]]  # 12 three times, 0 twice, 13 and 10 once
    assert draft_rows.never_propose(replies, ids, 3, catch_all=False) == [1, 2, 4, 6]  # kept: 12, 0, 10
    assert draft_rows.never_propose(replies, ids, 7, catch_all=False) == []
    cfg = {"hidden": 8, "target_ids": ids}
    (tmp_path / "specviz_head.json").write_text(json.dumps(cfg))
    data = tmp_path / "replies.jsonl"
    data.write_text("".join(json.dumps({"prompt": "p", "ids": r}) + "\n" for r in replies))
    draft_rows.main(["--head", str(tmp_path), "--teacher", str(data), "--keep", "2"])
    assert json.loads((tmp_path / "specviz_head.json").read_text()) == {"hidden": 8, "target_ids": [0, 12]}


def test_pca_init_when_the_draft_is_narrower(tmp_path, target_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    fake_teacher(tmp_path / "t.jsonl.gz", tok)
    cfg = train_draft.TrainConfig(
        data=[str(tmp_path / "t.jsonl.gz")],
        out=str(tmp_path / "run"),
        target=str(target_dir),
        heldout="",
        layers=1,
        hidden=16,
        heads=2,
        intermediate=32,
        steps=2,
        minutes=0,
        batch_size=2,
        min_count=1,
        threads=1,
    )
    final = train_draft.train(cfg, log=lambda *a: None)
    assert AutoModelForCausalLM.from_pretrained(final).config.hidden_size == 16


def test_make_teacher_data_is_resumable_and_skips_heldout(tmp_path, target_dir):
    prompts = make_teacher_data.builtin_prompts(0)
    heldout = tmp_path / "heldout.txt"
    heldout.write_text(prompts[1] + "\n")
    out = tmp_path / "teacher.jsonl.gz"
    args = [
        "--out",
        str(out),
        "--n-prompts",
        "3",
        "--temperatures",
        "0",
        "1.0",
        "--max-new-tokens",
        "5",
        "--batch-size",
        "2",
        "--target",
        str(target_dir),
        "--heldout",
        str(heldout),
        "--threads",
        "1",
    ]
    make_teacher_data.main(args)
    with gzip.open(out, "rt") as f:
        first = [json.loads(line) for line in f]
    assert len(first) == 6
    assert {r["prompt"] for r in first} == {prompts[0], prompts[2], prompts[3]}  # prompts[1] is held out
    assert all(1 <= len(r["ids"]) <= 5 and r["temperature"] in (0.0, 1.0) for r in first)

    make_teacher_data.main(args)  # nothing left to do: no duplicates
    make_teacher_data.main([*args[:3], "4", *args[4:]])  # one more prompt: only its 2 replies are added
    with gzip.open(out, "rt") as f:
        again = [json.loads(line) for line in f]
    assert again[:6] == first and len(again) == 8
    assert {r["prompt"] for r in again[6:]} == {prompts[4]}


def test_builtin_prompts_are_many_distinct_and_exclude_the_heldout_set():
    prompts = make_teacher_data.builtin_prompts(0)
    assert len(prompts) == len(set(prompts)) >= 600
    heldout = {train_draft.norm_prompt(p) for p in train_draft.read_heldout(train_draft.HELDOUT)}
    assert len(heldout) >= 30
    assert not heldout & {train_draft.norm_prompt(p) for p in prompts}


def test_make_teacher_data_resumes_after_a_kill_and_stores_the_targets_topk(tmp_path, target_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = ["hello world", "tell me about cats", "tell me about dogs", "write a poem", "w1 w2 w3", "w4 w5"]
    pfile = tmp_path / "prompts.jsonl.gz"
    with gzip.open(pfile, "wt") as f:
        f.writelines(json.dumps({"prompt": p, "kind": "k" + str(i % 2)}) + "\n" for i, p in enumerate(prompts))
    held = tmp_path / "held"
    held.mkdir()
    (held / "later.txt").write_text("TELL me about dogs\n")  # a held-out set: never generated for
    out = tmp_path / "teacher.jsonl.gz"
    args = [
        "--out",
        str(out),
        "--prompts",
        str(pfile),
        "--temperatures",
        "0",
        "1.0",
        "--max-new-tokens",
        "6",
        "--batch-size",
        "2",
        "--window",
        "2",
        "--topk",
        "4",
        "--target",
        str(target_dir),
        "--heldout-dir",
        str(held),
        "--threads",
        "1",
        "--topk-part-mb",
        "0.0002",
    ]

    # 1. a run killed in its third batch, after its top-k write: the files end with a half-written member
    real, calls = make_teacher_data.generate_batch, []

    def dies_in_third_batch(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            for f in (teacher_io.topk_parts(out)[-1], out):
                f.write_bytes(f.read_bytes() + gzip.compress(b'{"prompt": "hello world", "tempera')[:-6])
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(make_teacher_data, "generate_batch", dies_in_third_batch)
    with pytest.raises(KeyboardInterrupt):
        make_teacher_data.main(args)
    assert len(list(teacher_io.read_jsonl(out))) == 4  # two whole batches survive, the cut tail is skipped
    monkeypatch.setattr(make_teacher_data, "generate_batch", real)

    # 2. the resumed run repairs the tails and adds exactly what is missing
    make_teacher_data.main(args)
    rows = list(teacher_io.read_jsonl(out))
    with gzip.open(out, "rt") as f:  # still a valid gzip file
        assert [json.loads(line) for line in f] == rows
    keys = sorted((r["prompt"], r["temperature"]) for r in rows)
    assert keys == sorted((p, t) for p in prompts if p != "tell me about dogs" for t in (0.0, 1.0))
    assert {r["kind"] for r in rows} == {"k0", "k1"}
    make_teacher_data.main(args)  # nothing left: no duplicates
    assert len(list(teacher_io.read_jsonl(out))) == len(rows)

    # 3. every reply has a top-k record equal to the target's own softmax, teacher-forced on prompt + reply
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    parts = teacher_io.topk_parts(out)  # 210-byte parts: a new one after every batch
    assert len(parts) >= 5 and [p.name for p in parts][:2] == ["teacher.topk.000.jsonl.gz", "teacher.topk.001.jsonl.gz"]
    tops = {(r["prompt"], r["temperature"], tuple(r["ids"])): r for p in parts for r in teacher_io.read_jsonl(p)}
    for r in rows:
        ids, p = teacher_io.decode_topk(tops[(r["prompt"], r["temperature"], tuple(r["ids"]))])
        prompt = train_draft.prompt_ids(tok, r["prompt"])
        with torch.no_grad():
            logits = model(torch.tensor([prompt + r["ids"]])).logits[0, len(prompt) - 1 : -1]  # (T, V)
        ref = logits.softmax(-1).topk(4, -1)
        assert ids.shape == (len(r["ids"]), 4)
        assert torch.equal(ids, ref.indices)
        assert torch.allclose(p, ref.values, rtol=teacher_io.p8_error() + 1e-6, atol=3e-6)
        if r["temperature"] == 0.0:  # greedy: each reply token is the target's argmax, as in HF generate
            assert r["ids"] == ids[:, 0].tolist()
            hf = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=2)
            assert r["ids"] == hf[0, len(prompt) :].tolist()[: len(r["ids"])]


def test_label_teacher_gives_the_targets_topk_and_features_and_resumes(tmp_path, target_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specviz.training import label_teacher

    tok = AutoTokenizer.from_pretrained(target_dir)
    rows = fake_teacher(tmp_path / "teacher.jsonl.gz", tok)
    argv = [
        "--data",
        str(tmp_path / "teacher.jsonl.gz"),
        "--out",
        str(tmp_path / "lab"),
        "--target",
        str(target_dir),
        "--topk",
        "4",
        "--features",
        "--threads",
        "1",
        "--batch-tokens",
        "64",
    ]
    assert label_teacher.main(argv) == 0
    top_file = tmp_path / "lab" / f"{label_teacher.label_name(tmp_path / 'teacher.jsonl.gz')}.topk.jsonl.gz"
    recs = {teacher_io.reply_key(r): r for r in teacher_io.read_jsonl(top_file)}
    assert set(recs) == {teacher_io.reply_key(r) for r in rows}  # every distinct reply once (duplicates once)

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    row = rows[5]
    p = train_draft.prompt_ids(tok, row["prompt"])
    with torch.no_grad():
        probs = target(torch.tensor([p + row["ids"]])).logits[0, len(p) - 1 : -1].softmax(-1)  # (R, V)
    ids, pk = teacher_io.decode_topk(recs[teacher_io.reply_key(row)])
    assert ids.shape == (len(row["ids"]), 4)
    assert torch.equal(ids[:, 0], probs.argmax(-1))
    assert torch.allclose(pk, probs.gather(1, ids), rtol=0.03, atol=1e-6)

    shards = sorted((tmp_path / "lab" / "features").glob("shard-*.pt"))
    feats = {k: (s, f) for sh in shards for d in [torch.load(sh)] for k, s, f in zip(d["keys"], d["ids"], d["feats"])}
    seq, f = feats[teacher_io.reply_key(row)]
    assert seq == p + row["ids"] and f.shape == (len(seq), target.config.hidden_size) and f.dtype == torch.bfloat16
    logits = target.lm_head(f.float())  # the features are the final (normed) hidden states: logits = E f
    assert torch.equal(logits[len(p) - 1 : -1].argmax(-1), probs.argmax(-1))

    # a second run finds everything labelled and adds nothing
    assert label_teacher.main(argv) == 0
    assert len(list(teacher_io.read_jsonl(top_file))) == len(recs)
    assert len(list((tmp_path / "lab" / "features").glob("shard-*.pt"))) == len(shards)


def test_soft_labels_and_starting_from_an_earlier_draft(tmp_path, target_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specviz.training import label_teacher

    tok = AutoTokenizer.from_pretrained(target_dir)
    fake_teacher(tmp_path / "t.jsonl.gz", tok)
    label_teacher.main(
        [
            "--data",
            str(tmp_path / "t.jsonl.gz"),
            "--out",
            str(tmp_path / "lab"),
            "--target",
            str(target_dir),
            "--topk",
            "4",
            "--threads",
            "1",
        ]
    )
    topk = next((tmp_path / "lab").glob("*.topk.jsonl.gz"))
    base = [
        "--data",
        str(tmp_path / "t.jsonl.gz"),
        "--target",
        str(target_dir),
        "--heldout",
        "",
        "--layers",
        "1",
        "--batch-size",
        "4",
        "--minutes",
        "0",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "2",
        "--val-frac",
        "0",
        "--min-count",
        "1",
        "--threads",
        "1",
    ]
    first = train_draft.train(
        train_draft.parse_args(base + ["--out", str(tmp_path / "a"), "--steps", "10"]), log=lambda *a: None
    )

    lines = []
    cfg = train_draft.parse_args(
        base
        + [
            "--out",
            str(tmp_path / "b"),
            "--steps",
            "30",
            "--topk",
            str(topk),
            "--soft-weight",
            "0.7",
            "--init",
            str(first),
        ]
    )
    train_draft.train(cfg, log=lines.append)
    assert any("12 with soft labels" in x for x in lines) and any("started from" in x for x in lines)
    log_a, log_b = ([json.loads(x) for x in (tmp_path / r / "log.jsonl").read_text().splitlines()] for r in "ab")
    first_a, first_b = (next(r for r in log if r.get("step") == 1 and "acc" in r) for log in (log_a, log_b))
    assert first_b["acc"] > first_a["acc"]  # it starts where the first draft stopped, not from the target's init
    losses = [r["loss"] for r in log_b if "loss" in r]
    assert losses[-1] < losses[0]

    # start_from copies the blocks and the rows of shared tokens; a token the old draft lacked keeps its init
    old = AutoModelForCausalLM.from_pretrained(first, dtype=torch.float32)
    old_ids = json.loads((first / "specviz_vocab.json").read_text())["target_ids"]
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    new_ids = old_ids[:-1] + [len(tok) - 1] if len(tok) - 1 not in old_ids else old_ids
    new_ids = sorted(set(new_ids) - set(train_draft.SPECIAL_IDS))
    new_ids = list(train_draft.SPECIAL_IDS) + new_ids
    cfg1 = train_draft.TrainConfig(layers=1)
    draft = train_draft.build_draft(target, new_ids, cfg1)
    train_draft.start_from(draft, new_ids, first)
    E_old, E_new = old.model.embed_tokens.weight, draft.model.embed_tokens.weight
    for i, t in enumerate(new_ids):
        if t in old_ids:
            assert torch.allclose(E_new[i], E_old[old_ids.index(t)].float(), atol=1e-2)
    assert torch.equal(draft.lm_head.weight, draft.model.embed_tokens.weight)
    for k, v in old.model.layers[0].state_dict().items():
        assert torch.allclose(draft.model.layers[0].state_dict()[k], v.float())


def test_rows_new_to_the_earlier_draft_follow_its_map_of_the_shared_rows(tmp_path, target_dir):
    """An earlier draft whose rows are a linear map A of their init: a token it lacked starts at its init row
    times A (on the trained scale), not at the raw init row."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    all_ids = list(train_draft.SPECIAL_IDS) + sorted(
        set(range(target.config.vocab_size)) - set(train_draft.SPECIAL_IDS)
    )
    old_ids = all_ids[:-3]  # the earlier draft lacked the last three tokens
    H = target.config.hidden_size
    assert len(old_ids) > H  # enough shared rows for the fit to be determined
    cfg = train_draft.TrainConfig(layers=1)
    old = train_draft.build_draft(target, old_ids, cfg)
    A = 0.5 * torch.eye(H) + 0.05 * torch.randn(H, H, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        old.model.embed_tokens.weight.copy_(old.model.embed_tokens.weight @ A)
    old.save_pretrained(tmp_path / "old")
    (tmp_path / "old" / "specviz_vocab.json").write_text(json.dumps({"target_ids": old_ids}))

    draft = train_draft.build_draft(target, all_ids, cfg)
    init = draft.model.embed_tokens.weight.detach().clone()
    train_draft.start_from(draft, all_ids, tmp_path / "old")
    E = draft.model.embed_tokens.weight
    assert torch.allclose(E[-3:], init[-3:] @ A, atol=1e-4)  # the new rows, mapped
    assert not torch.allclose(E[-3:], init[-3:], atol=1e-2)  # (the raw init would differ)
    assert torch.allclose(E[:-3], old.model.embed_tokens.weight, atol=1e-6)  # the shared rows, copied
    assert torch.equal(draft.lm_head.weight, E)


def test_a_draft_grown_by_a_block_starts_out_guessing_as_the_earlier_one(tmp_path, target_dir):
    """--layers above the --init draft's: the earlier blocks are copied, the new one comes after them as the target's
    block of its index with its output projections zeroed, so the logits equal the earlier draft's; and a draft
    with fewer blocks than the earlier one is refused."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    ids = list(train_draft.SPECIAL_IDS) + sorted(set(range(target.config.vocab_size)) - set(train_draft.SPECIAL_IDS))
    old = train_draft.build_draft(target, ids, train_draft.TrainConfig(layers=1))
    with torch.no_grad():  # an earlier draft that training moved away from the target's init
        for p in old.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    old.save_pretrained(tmp_path / "old")
    (tmp_path / "old" / "specviz_vocab.json").write_text(json.dumps({"target_ids": ids}))

    grown = train_draft.build_draft(target, ids, train_draft.TrainConfig(layers=2))
    train_draft.start_from(grown, ids, tmp_path / "old")
    x = torch.randint(0, len(ids), (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(grown(x).logits, old(x).logits, atol=1e-5)
    new = grown.model.layers[1]
    assert not new.self_attn.o_proj.weight.any() and not new.mlp.down_proj.weight.any()
    assert torch.equal(new.self_attn.q_proj.weight, target.model.layers[1].self_attn.q_proj.weight)  # trainable
    for k, v in old.model.layers[0].state_dict().items():
        assert torch.equal(grown.model.layers[0].state_dict()[k], v)

    grown.train()  # the zeroed projections get gradients, so the new block does learn
    grown(x, labels=x).loss.backward()
    assert new.self_attn.o_proj.weight.grad.abs().sum() > 0 and new.mlp.down_proj.weight.grad.abs().sum() > 0

    grown.save_pretrained(tmp_path / "grown")
    (tmp_path / "grown" / "specviz_vocab.json").write_text(json.dumps({"target_ids": ids}))
    smaller = train_draft.build_draft(target, ids, train_draft.TrainConfig(layers=1))
    with pytest.raises(ValueError, match="2 blocks, more than this draft's 1"):
        train_draft.start_from(smaller, ids, tmp_path / "grown")


def test_a_prompt_s_nearest_overlap_finds_the_sibling_a_template_wrote():
    pool = [
        "Write a short story about a magic paintbrush on the first day of winter.",
        "Explain tunnels in simple terms.",
    ]
    sibling = "Write a short story about a magic paintbrush who comes alive in winter."
    near, same, new, none = common.nearest_overlap([sibling, pool[1].upper(), "Cite 20 famous people.", ""], pool)
    # {write a short story about magic paintbrush winter}: 8 shared of 17 distinct words
    assert near == pytest.approx(8 / 17) and near >= train_draft.NOVEL_BELOW
    assert same == 1.0 and new == 0.0 and none == 0.0
    assert common.nearest_overlap(["Tell me about cats."], []) == [0.0]


def test_the_novel_figure_is_measured_on_the_novel_prompts_greedy_replies_alone(tmp_path, target_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    rows = fake_teacher(tmp_path / "teacher.jsonl.gz", tok)
    prompts = {r["prompt"]: train_draft.prompt_ids(tok, r["prompt"]) for r in rows}
    cfg = train_draft.TrainConfig(layers=1)
    ids = train_draft.build_vocab(rows, prompts, cfg)
    lookup = torch.zeros(len(tok), dtype=torch.long)
    lookup[torch.tensor(ids)] = torch.arange(len(ids))
    draft = train_draft.build_draft(AutoModelForCausalLM.from_pretrained(target_dir), ids, cfg)
    val = train_draft.encode(rows, prompts, lookup, 64)
    novel = train_draft.encode([r for r in rows if r["prompt"] == "hello world"], prompts, lookup, 64)
    both = train_draft.evaluate(draft, val, "cpu", 4, novel)
    alone = train_draft.evaluate(draft, novel, "cpu", 4)
    assert both["val_novel_greedy_loss"] == pytest.approx(alone["val_greedy_loss"])
    assert both["val_novel_greedy_acc"] == pytest.approx(alone["val_greedy_acc"])
    assert both["val_greedy_loss"] != pytest.approx(alone["val_greedy_loss"])  # the other prompts' replies differ
    assert "val_novel_greedy_loss" not in train_draft.evaluate(draft, val, "cpu", 4)  # no novel prompt, no figure


def test_split_rows_drops_prompts_that_share_a_passage_with_a_prompt_set(tmp_path):
    sets = tmp_path / "sets"
    sets.mkdir()
    (sets / "grounded.txt").write_text("Summarise: the quick brown fox jumps over the lazy dog near the river bank\n")
    rows = [
        {"prompt": "Rewrite: the quick brown fox jumps over the lazy dog near a tree", "ids": [5]},
        {"prompt": "Tell me about foxes", "ids": [5]},
    ]
    cfg = train_draft.TrainConfig(heldout_dir=str(sets), val_frac=0)
    train, val, dropped = train_draft.split_rows(rows, [], cfg)
    assert dropped == 1 and [r["prompt"] for r in train] == ["Tell me about foxes"] and val == []
