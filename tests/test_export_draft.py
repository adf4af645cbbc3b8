"""`specviz export-draft`: a trimmed draft written with the target's full vocabulary proposes, at temperature 0,
exactly what specviz's drafter proposes with the trimmed one, in specviz and in transformers as an engine loads it."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import make_model, make_tokenizer
from transformers import AutoModelForCausalLM, LlamaForCausalLM

import specviz
from specviz import SpecvizError
from specviz.__main__ import main
from specviz.models.export import EXPORT_NOTE, export_draft
from specviz.models.loaded import load_model

V = 64
KEEP = [0, *range(3, 40), *range(44, 60)]  # the target ids the draft keeps (row i -> KEEP[i]); 1, 2, 40-43, 60-63 not
BLOCKED = [0, 7]  # rows it must never propose (row 0: the catch-all for ids it lacks, as the built-in draft's)
PROMPTS = ["hello world, hello world", "abc def abc", "the quick brown fox"]


@pytest.fixture(scope="module")
def trimmed(tiny_pair, tmp_path_factory):
    """(target folder, trimmed draft folder): the tiny pair's draft with only KEEP's rows, two of them blocked."""
    path = tmp_path_factory.mktemp("trimmed") / "draft"
    full = LlamaForCausalLM.from_pretrained(tiny_pair[1])
    draft = make_model(len(KEEP), seed=0)
    sd = full.state_dict()
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"][KEEP]
    sd["lm_head.weight"] = sd["lm_head.weight"][KEEP] * 3.0  # sharper: its logits are often all negative
    draft.load_state_dict(sd)
    draft.save_pretrained(path)
    make_tokenizer(V, chat=True).save_pretrained(path)
    (path / "specviz_vocab.json").write_text(json.dumps({"target_ids": KEEP, "never_propose": BLOCKED}))
    return tiny_pair[0], str(path)


@pytest.fixture(scope="module")
def exported(trimmed, tmp_path_factory):
    return str(export_draft(tmp_path_factory.mktemp("export") / "out", trimmed[1], target=trimmed[0]))


def drafted(target: str, draft: str, prompt: str, gamma: int = 4) -> list[tuple[int, ...]]:
    rounds = specviz.stream(
        prompt, target=target, draft=draft, gamma=gamma, temperature=0, max_new_tokens=24, device="cpu", tree="off"
    )
    return [ev.drafted for ev in rounds if isinstance(ev, specviz.events.Round)]


def test_the_export_is_a_standard_full_vocabulary_folder(exported, trimmed):
    cfg = json.loads(open(os.path.join(exported, "config.json")).read())
    assert cfg["vocab_size"] == V and cfg["tie_word_embeddings"] is False
    assert not os.path.exists(os.path.join(exported, "specviz_vocab.json"))
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert model.get_output_embeddings().weight.shape[0] == V == model.get_input_embeddings().weight.shape[0]
    note = json.loads(open(os.path.join(exported, EXPORT_NOTE)).read())
    assert note == {"draft": trimmed[1], "target_vocab_size": V, "kept_rows": len(KEEP), "filled_rows": V - len(KEEP)}


@pytest.mark.parametrize("prompt", PROMPTS)
def test_specviz_drafts_the_same_tokens_with_the_export(trimmed, exported, prompt):
    ours = drafted(trimmed[0], trimmed[1], prompt)
    assert ours and drafted(trimmed[0], exported, prompt) == ours


def test_transformers_argmax_of_the_export_is_specviz_s_greedy_proposal(trimmed, exported):
    """At every position of real text: the export's argmax over all V ids (as vLLM and llama.cpp draft) is the
    trimmed draft's argmax over the ids it may propose (specviz's q)."""
    q = load_model(trimmed[1], device="cpu", dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    allowed = q.proposable
    checked = 0
    for prompt in PROMPTS:
        out = specviz.generate(prompt, target=trimmed[0], mode="ar", max_new_tokens=24, device="cpu")
        ids = torch.tensor(q.tokenizer(prompt)["input_ids"] + list(out.token_ids))
        with torch.no_grad():
            ours = q.to_target_logits(q.model(q.rows_of(ids)[None]).logits[0], V)  # (T, V), -inf where not kept
            theirs = hf(ids[None]).logits[0]  # (T, V)
        want = allowed[ours[:, allowed].argmax(-1)]
        assert torch.equal(theirs.argmax(-1), want)
        checked += len(ids)
    assert checked > 50


def test_a_filled_row_never_wins_the_argmax_even_where_every_kept_logit_is_negative():
    """The fill (the mean of the proposable rows) against hidden states chosen so all kept logits are below 0,
    where an all-zero row (logit 0) would win every time."""
    from specviz.models.export import full_vocabulary

    g = torch.Generator().manual_seed(0)
    N, H, Vt = 40, 16, 100
    head = torch.randn(N, H, generator=g) + 2.0  # rows sharing a direction: h along -1 makes every logit negative
    embed = torch.randn(N, H, generator=g)
    ids = torch.randperm(Vt, generator=g)[:N]
    blocked = torch.tensor([0, 3])
    emb, out = full_vocabulary(embed, head, ids, blocked, Vt)
    allowed = torch.ones(N, dtype=torch.bool)
    allowed[blocked] = False
    h = torch.randn(500, H, generator=g) - 3.0  # (T, H)
    kept = h @ head[allowed].T  # (T, N - 2)
    assert (kept.max(-1).values < 0).float().mean() > 0.9  # the case that matters
    assert torch.equal((h @ out.T).argmax(-1), ids[allowed][kept.argmax(-1)])
    lacking = torch.tensor(sorted(set(range(Vt)) - set(ids.tolist())))
    assert torch.equal(emb[ids], embed) and bool((emb[lacking] == embed[0]).all())  # as LoadedModel.input_map reads


def test_an_unwritable_or_unsuitable_folder_is_one_sentence_before_anything_loads(tmp_path, trimmed, monkeypatch):
    import specviz.models.hub as hub

    monkeypatch.setattr(hub, "read_model", lambda *a, **k: pytest.fail("a model was loaded"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(SpecvizError, match="is a file"):
        export_draft(tmp_path / "file", trimmed[1])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "other.txt").write_text("x")
    with pytest.raises(SpecvizError, match="is not empty"):
        export_draft(tmp_path / "full", trimmed[1])
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: a folder under a file cannot be made by anyone
            bad = tmp_path / "file" / "sub"
        else:
            bad = locked / "sub"
        with pytest.raises(SpecvizError, match="cannot be written"):
            export_draft(bad, trimmed[1])
    finally:
        locked.chmod(0o700)
    with pytest.raises(SpecvizError, match="has its full vocabulary already"):
        export_draft(tmp_path / "new", trimmed[0])


def test_the_command_line_writes_it_and_says_so(trimmed, tmp_path, capsys):
    assert main(["export-draft", str(tmp_path / "cli"), "--draft", trimmed[1], "--target", trimmed[0]]) == 0
    assert f"{V - len(KEEP)} filled" in capsys.readouterr().out
    assert main(["export-draft", str(tmp_path / "cli" / "config.json" / "x"), "--draft", trimmed[1]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.real
def test_the_built_in_draft_exported_drafts_as_specviz_does(tmp_path):
    from specviz.config import BUILTIN_TARGET

    folder = str(export_draft(tmp_path / "builtin"))
    assert json.loads(open(os.path.join(folder, "config.json")).read())["vocab_size"] == 49152
    for prompt in ("Tell me about gravity.", "def fibonacci(n):"):
        assert drafted(BUILTIN_TARGET, folder, prompt) == drafted(BUILTIN_TARGET, None, prompt)
