"""The teacher-data prompt builder (specviz.training.build_prompts) and the teacher file helpers (specviz/training/teacher_io.py).

The generator itself (specviz.training.make_teacher_data: resuming, top-k) is tested in test_train.py, beside the
tiny chat target it runs on.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from specviz.bench.inputs import load_prompts
from specviz.training import build_prompts, teacher_io
from specviz.training.common import HeldOut, nearest_overlap, read_heldout
from specviz.training.topics import HELD_OUT_TOPICS, UNSEEN_TOPICS, topic_hits

ROOT = Path(__file__).resolve().parent.parent

KINDS = {
    "question",
    "howto",
    "advice",
    "creative",
    "list",
    "comparison",
    "reasoning",
    "code_write",
    "code_edit",
    "summarise",
    "rewrite",
    "answer_from_text",
}


@pytest.fixture(scope="module")
def built() -> list[dict]:
    return build_prompts.build(seed=0)


def test_builder_makes_over_5000_distinct_prompts_of_every_kind(built):
    prompts = [r["prompt"] for r in built]
    assert len(prompts) >= 5000
    assert len({build_prompts.norm_prompt(p) for p in prompts}) == len(prompts)
    kinds = {r["kind"] for r in built}
    assert KINDS <= kinds
    assert all(sum(r["kind"] == k for r in built) >= 300 for k in KINDS)
    assert (
        sum(len(r["prompt"]) > 300 for r in built if r["kind"] in {"summarise", "rewrite", "answer_from_text"}) > 1000
    )
    assert build_prompts.build(seed=0)[:50] == built[:50]  # seeded: the same set again
    first_kinds = {r["kind"] for r in built[:300]}  # shuffled: an early stop still covers every kind
    assert KINDS <= first_kinds


def test_builder_excludes_every_prompt_of_the_held_out_sets(built):
    held = build_prompts.HeldOut.from_dir(build_prompts.HELDOUT_DIR)
    assert len(held.exact) >= 50
    assert not any(held.blocks(r["prompt"]) for r in built)


def test_the_committed_prompt_file_has_no_prompt_of_any_held_out_or_benchmark_set():
    """A set added to assets/prompts after data/prompts.jsonl.gz was made (stories.txt) must not share prompts
    with it, or the teacher data would train on what the benchmark measures."""
    with gzip.open(ROOT / "data" / "prompts.jsonl.gz", "rt", encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f]
    held = build_prompts.HeldOut.from_dir(build_prompts.HELDOUT_DIR)
    assert len(prompts) >= 5000
    assert [p for p in prompts if held.blocks(p)] == []


def test_the_prompts_written_by_hand_and_their_replies_hold_no_held_out_prompt():
    """data/prompts_written.txt and the replies made for them: none of the held-out or benchmark sets, by text or by
    a pasted run of words, and none a near copy of one (the held-out prompts are what alpha is claimed on)."""
    from specviz.training.common import nearest_overlap

    written = [
        line.strip() for line in (ROOT / "data" / "prompts_written.txt").read_text().splitlines() if line.strip()
    ]
    replies = list(teacher_io.read_jsonl(ROOT / "data" / "teacher_written.jsonl.gz"))
    held = build_prompts.HeldOut.from_dir(build_prompts.HELDOUT_DIR)
    assert len(written) == len(set(written)) >= 300
    assert {r["prompt"] for r in replies} <= set(written) and len(replies) == 2 * len(written)
    assert [p for p in written if held.blocks(p)] == []
    overlap = nearest_overlap(written, held.prompts)
    # the nearest share a form, not a topic: "How can I improve my handwriting?" / "... my sleep?" (0.71),
    # "Write a Python function that flattens a nested list." / "... reverses a linked list." (0.60)
    assert max(overlap) < 0.75, [w for w, j in zip(written, overlap) if j >= 0.75]


def test_the_prompts_written_by_hand_keep_off_the_held_out_topics():
    assert topic_hits(read_heldout(ROOT / "data" / "prompts_written.txt"), HELD_OUT_TOPICS) == []
    topk = {
        teacher_io.reply_key(r)
        for part in teacher_io.topk_parts(ROOT / "data" / "teacher_written.jsonl.gz")
        for r in teacher_io.read_jsonl(part)
    }
    replies = {teacher_io.reply_key(r) for r in teacher_io.read_jsonl(ROOT / "data" / "teacher_written.jsonl.gz")}
    assert topk == replies  # every reply has its top-16 and no top-16 is left from a prompt taken out


def test_a_set_added_later_is_excluded_by_prompt_and_by_pasted_text(tmp_path, built):
    grounded = next(r["prompt"] for r in built if r["kind"] == "summarise")
    pasted = grounded.split(":", 1)[1].strip()  # the real paragraph under the instruction
    edit = next(r["prompt"] for r in built if r["kind"] == "code_edit")
    code = edit.split(":", 1)[1].strip()
    plain = next(r["prompt"] for r in built if r["kind"] == "howto")
    for f in (ROOT / "assets" / "prompts").glob("*.txt"):
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "grounded.txt").write_text(
        f"Answer from this text: {' '.join(pasted.split())}\n"  # the same text under another instruction
        f"add type hints to this function: {' '.join(code.split())}\n"  # folded onto one line
        f"  {plain.upper()}  \n"  # the same prompt, other case and spacing
    )
    again = build_prompts.build(seed=0, heldout_dir=tmp_path)
    prompts = {r["prompt"] for r in again}
    assert grounded not in prompts and edit not in prompts and plain not in prompts
    assert not any(pasted in p or code in p for p in prompts)
    assert len(again) >= 5000


def test_main_writes_the_prompt_file(tmp_path, capsys):
    out = tmp_path / "prompts.jsonl.gz"
    build_prompts.main(["--out", str(out), "--target-cache", str(tmp_path / "none.jsonl.gz")])
    rows = build_prompts.read_prompts(out)
    assert len(rows) >= 5000 and set(rows[0]) == {"prompt", "kind"}
    assert "answer_from_text" in capsys.readouterr().out


def test_reader_tolerates_a_cut_gzip_tail_and_repair_lets_appends_continue(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    teacher_io.append_jsonl(path, [{"a": 1}, {"a": 2}])
    teacher_io.append_jsonl(path, [{"a": 3}])
    whole = path.read_bytes()
    cut = gzip.compress(b'{"a": 4}\n{"a": 5}\n')[:-9]  # a member cut short by a kill (its lines are whole)
    path.write_bytes(whole + cut)
    assert [r["a"] for r in teacher_io.read_jsonl(path)][:3] == [1, 2, 3]  # no error; what was decoded is kept
    path.write_bytes(whole + cut[:15])  # cut inside the compressed data
    assert [r["a"] for r in teacher_io.read_jsonl(path)] == [1, 2, 3]
    assert teacher_io.repair_tail(path) > 0 and path.read_bytes() == whole
    teacher_io.append_jsonl(path, [{"a": 6}])
    assert [r["a"] for r in teacher_io.read_jsonl(path)] == [1, 2, 3, 6]
    with gzip.open(path, "rt") as f:  # and any gzip reader still reads it
        assert [json.loads(line)["a"] for line in f] == [1, 2, 3, 6]


def test_topk_encoding_round_trips_within_the_quantisation_step():
    g = torch.Generator().manual_seed(0)
    p = torch.randn(7, 49152, generator=g).mul(4).softmax(-1)
    top = p.topk(16, -1)
    ids, q = teacher_io.decode_topk(teacher_io.encode_topk(top.indices, top.values))
    assert torch.equal(ids, top.indices)
    keep = top.values > 1e-5
    assert torch.allclose(q[keep], top.values[keep], rtol=teacher_io.p8_error() + 1e-6, atol=0)


def test_topk_parts_roll_over_at_the_size_limit_and_list_in_order(tmp_path):
    out = tmp_path / "teacher.jsonl.gz"
    (tmp_path / "other.topk.000.jsonl.gz").write_bytes(b"x")  # another teacher file's part: not ours
    assert teacher_io.topk_parts(out) == []
    assert teacher_io.topk_part(out, 100) == tmp_path / "teacher.topk.000.jsonl.gz"
    for i in range(25):
        teacher_io.append_jsonl(teacher_io.topk_part(out, 100), [{"i": i, "pad": "y" * 40}])
    parts = teacher_io.topk_parts(out)
    assert [p.name for p in parts[:2]] == ["teacher.topk.000.jsonl.gz", "teacher.topk.001.jsonl.gz"]
    assert len(parts) > 3 and all(p.stat().st_size < 200 for p in parts)  # each stops one record past 100
    assert [r["i"] for p in parts for r in teacher_io.read_jsonl(p)] == list(range(25))
    assert teacher_io.topk_parts(tmp_path / "teacher.jsonl") == []  # plain files have their own parts


@pytest.fixture(scope="module")
def teacher_prompts() -> set[str]:
    """Every prompt the draft may have been trained on: the builder's, the written ones, those with replies."""
    prompts = set(read_heldout(ROOT / "data" / "prompts_written.txt"))
    for name in ("prompts.jsonl.gz", "teacher.jsonl.gz", "teacher_written.jsonl.gz"):
        prompts |= {r["prompt"] for r in teacher_io.read_jsonl(ROOT / "data" / name)}
    assert len(prompts) > 10_000
    return prompts


def test_no_teacher_prompt_touches_a_topic_of_the_unseen_set(teacher_prompts):
    assert sorted(load_prompts("unseen")) == sorted(UNSEEN_TOPICS)
    assert topic_hits(teacher_prompts, UNSEEN_TOPICS) == []
    # and the guard can fail: a teacher prompt on one of these topics is caught
    assert len(topic_hits(["how do hearing aids amplify sound?", "a story about two walruses"], UNSEEN_TOPICS)) == 2


def test_no_teacher_prompt_is_a_tuning_prompt(teacher_prompts):
    """assets/tuning_prompts.txt is where settings are chosen (policies, thresholds): a draft trained on its prompts
    guesses them better than new ones and flatters what is chosen there. None is a teacher prompt by its text or a run
    of 8 words, and none shares 3/4 of a teacher prompt's words (the held-out sets' bound). Until 1 Dec 2026 fifteen
    did: ten word for word (three the builder writes, "What is photosynthesis?", and seven from the written batches,
    "How do I descale a kettle?"), a story opening four builder prompts share, and four near copies ("Write a short
    poem about autumn leaves."); they were replaced by prompts on new ground."""
    tuning = read_heldout(ROOT / "assets" / "tuning_prompts.txt")
    assert len(tuning) == 48
    guard = HeldOut(tuning)
    assert sorted(p for p in teacher_prompts if guard.blocks(p)) == []
    near = nearest_overlap(tuning, sorted(teacher_prompts))
    assert max(near) < 0.75, [t for t, o in zip(tuning, near) if o >= 0.75]
    # and the guards can fail: a pasted tuning prompt and a near copy are caught
    assert guard.blocks(f"Answer briefly. {tuning[14]}")
    assert nearest_overlap([tuning[14].replace("?", " quickly?")], [tuning[14]])[0] >= 0.75


def test_no_tuning_prompt_is_a_prompt_the_benchmarks_measure_on():
    """Settings chosen on the tuning set are judged on the held-out sets (assets/prompts/): a prompt in both would
    grade a choice on the prompt it was chosen by. No tuning prompt is a measuring prompt by its text or a run of 8
    words, and none shares 0.7 of one's words. Until 1 Dec 2026 four were held-out prompts word for word ("Why do
    cats purr?", also in the everyday set) and five more were the same request reworded ("What should I pack for a
    weekend hiking trip?" against "... camping trip?", 0.80), with two more on the same task at 0.5-0.56 (a CSV file
    with pandas, the planets with a fact each); all eleven were replaced."""
    tuning = read_heldout(ROOT / "assets" / "tuning_prompts.txt")
    measured = sorted({p for f in (ROOT / "assets" / "prompts").glob("*.txt") for p in read_heldout(f)})
    assert len(tuning) == 48 and len(measured) >= 100
    guard = HeldOut(measured)
    assert [t for t in tuning if guard.blocks(t)] == []
    near = nearest_overlap(tuning, measured)
    assert max(near) < 0.7, [t for t, o in zip(tuning, near) if o >= 0.7]
    # and the guards can fail: a measured prompt pasted in and one reworded are caught
    assert guard.blocks(f"Please answer: {max(measured, key=len)}") and guard.blocks(measured[7])
    assert nearest_overlap(["What should I pack for a weekend hiking trip?"], measured)[0] >= 0.7
