"""The filter for a batch of prompts written by hand (specviz/training/prompt_filter.py, specviz.training.filter_prompts):
each rule drops a candidate made to break it, a novel one is kept, the reasons are said, and the script writes the
kept ones where it is told to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specviz.training import build_prompts
from specviz.training.common import HELDOUT_DIR, norm_prompt, read_heldout, read_prompts
from specviz.training.prompt_filter import COMMITTED, WRITTEN, Dropped, Pools, filter_prompts
from specviz.training.topics import HELD_OUT_TOPICS, UNSEEN_TOPICS, topic_hits

ROOT = Path(__file__).resolve().parent.parent
NOVEL = "How did medieval bell founders tune a church bell?"
WALRUS = "Write a limerick about a walrus who loves jazz."


@pytest.fixture(scope="module")
def built() -> list[str]:
    return [r["prompt"] for r in build_prompts.build(seed=0)]  # 3 s on the 2-core Zen 3: once for the module


@pytest.fixture(scope="module")
def pools(built) -> Pools:
    return Pools.load(built=built)


def clean(prompt: str, pools: Pools) -> bool:
    """No topic word, no held-out prompt: the rules tried before the builder's."""
    named = topic_hits([prompt], HELD_OUT_TOPICS) + topic_hits([prompt], UNSEEN_TOPICS)
    return not named and not pools.held.blocks(prompt)


def test_a_novel_prompt_is_kept(pools):
    assert filter_prompts([NOVEL], pools) == ([NOVEL], [])


def test_a_prompt_naming_a_topic_word_of_the_unseen_or_held_out_sets_is_dropped(pools):
    kept, dropped = filter_prompts([WALRUS, NOVEL, "How do I patch a bicycle inner tube?"], pools)
    assert kept == [NOVEL]
    assert dropped == [
        Dropped(prompt=WALRUS, reason="topic", detail="names 'walrus'"),
        Dropped(prompt="How do I patch a bicycle inner tube?", reason="topic", detail="names 'bicycle'"),
    ]


def test_a_held_out_prompt_is_dropped_by_its_text_and_by_a_pasted_run_of_8_words(pools):
    verbatim = "Write a thank-you note to my neighbour for watering my plants."
    assert verbatim in read_heldout(HELDOUT_DIR / "heldout.txt")
    pasted = "Draft a thank-you note to my neighbour for feeding the goldfish while I was away."  # 8 words in a row
    kept, dropped = filter_prompts([f"  {verbatim.upper()} ", pasted, NOVEL], pools)
    assert kept == [NOVEL]
    assert [(d.reason, d.detail) for d in dropped] == [
        ("held-out", "is a prompt of assets/prompts/"),
        ("held-out", "shares a run of 8 words with a prompt of assets/prompts/"),
    ]


def test_a_prompt_the_builder_writes_now_or_wrote_into_the_committed_file_is_dropped(pools, built):
    committed = [r["prompt"] for r in read_prompts(COMMITTED)]
    now, before = {norm_prompt(p) for p in built}, {norm_prompt(p) for p in committed}
    # the target's own prompts are in the committed file only; the builder's pasted texts differ between machines
    only_before = next(p for p in committed if norm_prompt(p) not in now and clean(p, pools))
    only_now = [p.lower() for p in built if norm_prompt(p) not in before and clean(p, pools)][:1]
    kept, dropped = filter_prompts([*only_now, NOVEL, " ".join(only_before.split()).upper()], pools)
    assert kept == [NOVEL]
    assert [d.reason for d in dropped] == ["built"] * (1 + len(only_now))
    one = next(p for p in built if clean(p, pools))  # and the builder's own list alone is enough
    assert [d.reason for d in filter_prompts([one], Pools.load(committed=None, built=[one]))[1]] == ["built"]


def test_a_near_copy_of_a_written_held_out_or_tuning_prompt_is_dropped_unless_the_bound_is_looser(pools):
    written = "What does an air traffic controller do?"
    assert written in read_heldout(WRITTEN)
    near = "What does an air traffic controller do all day?"  # 7 of 9 distinct words shared: 0.78
    kept, dropped = filter_prompts([near, "Why is Sydney not the capital of Australia?"], pools)  # 8 of 11: 0.73
    assert kept == []
    assert [d.reason for d in dropped] == ["overlap", "overlap"]
    assert dropped[0].detail == f"0.78 with written {written!r}"
    # in assets/prompts/heldout.txt and assets/tuning_prompts.txt both: the first pool is named
    assert dropped[1].detail == "0.73 with held-out 'What is the capital of Australia and why is it not Sydney?'"
    assert filter_prompts([near], pools, max_overlap=0.8)[0] == [near]  # under a looser bound it stays


def test_in_one_batch_the_first_of_two_near_identical_prompts_is_kept(pools):
    first = "How is a pipe organ's wind supply kept steady?"
    kept, dropped = filter_prompts([first, "How is the wind supply of a pipe organ kept steady?", first, NOVEL], pools)
    assert kept == [first, NOVEL]
    assert [(d.reason, d.detail) for d in dropped] == [
        ("batch", f"0.75 with {first!r}"),
        ("batch", "a copy of one kept before it"),
    ]


def test_every_written_prompt_passes_the_topic_and_held_out_rules(tmp_path):
    written = read_heldout(WRITTEN)
    pools = Pools.load(tmp_path / "none.txt", committed=None, built=[])
    kept, dropped = filter_prompts(written, pools)
    assert len(written) >= 2000 and len(kept) + len(dropped) == len(written)
    assert [d for d in dropped if d.reason in {"topic", "held-out"}] == []
    # and the same pools can fail a prompt: a topic word and a held-out prompt are caught
    verbatim = "Write a thank-you note to my neighbour for watering my plants."
    kept, caught = filter_prompts([NOVEL, WALRUS, verbatim], pools)
    assert kept == [NOVEL] and [d.reason for d in caught] == ["topic", "held-out"]


def run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "specviz.training.filter_prompts", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_script_appends_the_kept_prompts_says_why_it_dropped_the_others_and_refuses_append_with_out(tmp_path):
    drafts = tmp_path / "drafts.txt"
    drafts.write_text(f"{NOVEL}\n\n{WALRUS}\n  Who exactly was the author of this batch?\n{NOVEL}\n")
    written = tmp_path / "written.txt"
    written.write_text("Who was the author of this batch?")  # no newline at the end
    done = run("--candidates", str(drafts), "--written", str(written), "--append")
    assert done.returncode == 0, done.stderr
    assert written.read_text() == f"Who was the author of this batch?\n{NOVEL}\n" and done.stdout == ""
    err = done.stderr.splitlines()
    assert f"topic    {WALRUS}  <- names 'walrus'" in err
    assert (
        "overlap  Who exactly was the author of this batch?  <- 0.88 with written 'Who was the author of this batch?'"
        in err
    )
    assert f"batch    {NOVEL}  <- a copy of one kept before it" in err
    assert "dropped topic        1" in err and "dropped batch        1" in err and "kept                 1 of 4" in err

    out = tmp_path / "kept.txt"
    refused = run("--candidates", str(drafts), "--written", str(written), "--append", "--out", str(out))
    assert refused.returncode == 2 and "not both" in refused.stderr
    assert not out.exists() and written.read_text() == f"Who was the author of this batch?\n{NOVEL}\n"
