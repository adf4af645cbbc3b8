"""The deploy card (pairs.deploy): every engine's lines parse against that engine's own option names, transformers'
code runs as printed and decodes what plain greedy decoding does, and vLLM's JSON loads into vLLM's own
SpeculativeConfig (marked vllm: it needs .venv-vllm)."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from specviz import check_pair
from specviz.pairs.deploy import EXPORTED_DRAFT, deploy_card, with_card

ROOT = Path(__file__).resolve().parent.parent

# Option names as each engine's source spells them (pairs.deploy.ENGINE_SOURCES names the versions): the card may
# use only these. vLLM: fields of SpeculativeConfig; SGLang: launch_server's --speculative-* flags; llama.cpp:
# llama-server's draft options (aliases share a row).
VLLM_KEYS = {
    "method": str,
    "model": str,
    "num_speculative_tokens": int,
    "prompt_lookup_max": int,
    "prompt_lookup_min": int,
    "use_heterogeneous_vocab": bool,
    "draft_sample_method": str,
}
VLLM_METHODS = {"ngram", "draft_model", "medusa", "mlp_speculator", "suffix", "eagle", "eagle3", "mtp"}
SGLANG_FLAGS = {
    "--model-path": str,
    "--speculative-algorithm": ["EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NEXTN"],
    "--speculative-draft-model-path": str,
    "--speculative-num-steps": int,
    "--speculative-eagle-topk": int,
    "--speculative-num-draft-tokens": int,
    "--speculative-ngram-min-match-window-size": int,
    "--speculative-ngram-max-match-window-size": int,
    "--speculative-ngram-min-bfs-breadth": int,
    "--speculative-ngram-max-bfs-breadth": int,
}
LLAMACPP_FLAGS = {
    ("-m", "--model"): str,
    ("-md", "--model-draft"): str,
    ("--draft-max", "--draft", "--draft-n"): int,
    ("--draft-min", "--draft-n-min"): int,
    ("--draft-p-min",): float,
    ("-cd", "--ctx-size-draft"): int,
}


def _parser(flags: dict) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False, add_help=False)
    for names, kind in flags.items():
        names = names if isinstance(names, tuple) else (names,)
        if isinstance(kind, list):
            p.add_argument(*names, choices=kind)
        else:
            p.add_argument(*names, type=kind)
    return p


def _args(text: str, program: list[str]) -> list[str]:
    words = shlex.split(text.replace("\\\n", " "))
    assert words[: len(program)] == program, text
    return words[len(program) :]


def parse_vllm(text: str) -> dict:
    args = _args(text, ["vllm", "serve"])
    assert len(args) == 3 and args[1] == "--speculative-config", text
    spec = json.loads(args[2])
    for key, value in spec.items():
        assert key in VLLM_KEYS and isinstance(value, VLLM_KEYS[key]), (key, value)
    assert spec["method"] in VLLM_METHODS and spec["num_speculative_tokens"] >= 1
    return spec


def parse_sglang(text: str) -> argparse.Namespace:
    args = _args(text, ["python", "-m", "sglang.launch_server"])
    ns, unknown = _parser(SGLANG_FLAGS).parse_known_args(args)
    assert not unknown, unknown
    return ns


def parse_llamacpp(text: str) -> argparse.Namespace:
    ns, unknown = _parser(LLAMACPP_FLAGS).parse_known_args(_args(text, ["llama-server"]))
    assert not unknown, unknown
    return ns


def run_transformers(text: str, prompt: str) -> tuple[torch.Tensor, dict]:
    """The card's transformers code as printed (the prompt filled in); its namespace afterwards."""
    code = text.replace('tokenizer("...", ', f"tokenizer({prompt!r}, ")
    ns: dict = {}
    exec(compile(code, "<deploy card>", "exec"), ns)  # noqa: S102 - the card's own text is what is tested
    return ns["out"], ns


def plain_greedy(ns: dict, n: int = 64) -> torch.Tensor:
    return ns["target"].generate(**ns["inputs"], do_sample=False, max_new_tokens=n)


def permuted_draft(tiny_pair, folder: Path) -> str:
    """The tiny draft with another tokenizer: the same tokens under other ids (specviz and transformers both
    translate it through text)."""
    from conftest import make_tokenizer, word_tokenizer
    from transformers import LlamaForCausalLM

    base = make_tokenizer(64, chat=True)
    vocab = base.get_vocab()
    chars = [t for t, i in sorted(vocab.items(), key=lambda kv: kv[1]) if i >= 5]
    new = {t: i for t, i in vocab.items() if i < 5} | {t: 5 + k for k, t in enumerate(reversed(chars))}
    tok = word_tokenizer(new)
    tok.chat_template = base.chat_template
    model = LlamaForCausalLM.from_pretrained(tiny_pair[1])
    model.resize_token_embeddings(72, mean_resizing=False)  # another size too: transformers tells tokenizers apart so
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def reports(tiny_pair, tmp_path_factory):
    """Real checks of the tiny pair (model and lookup drafters, and a draft with another tokenizer); lookup+model
    is the model check's report with that drafter (the card reads the method from it)."""
    import dataclasses

    kw = dict(device="cpu", max_new_tokens=8, prompts=["hello world, hello world"])
    other = permuted_draft(tiny_pair, tmp_path_factory.mktemp("other") / "draft")
    model = check_pair(*tiny_pair, **kw)
    return {
        "model": model,
        "lookup": check_pair(*tiny_pair, drafter="lookup", **kw),
        "lookup+model": with_card(dataclasses.replace(model, drafter="lookup+model")),
        "translated": check_pair(tiny_pair[0], other, **kw),
    }


@pytest.mark.parametrize("kind", ["model", "lookup", "lookup+model", "translated"])
def test_every_engine_line_parses(reports, kind):
    rep = reports[kind]
    card = rep.card
    assert card is not None and card.gamma == rep.best_gamma
    assert [e.engine for e in card.engines] == ["vLLM", "SGLang", "llama.cpp", "transformers"]
    by = {e.engine: e for e in card.engines}
    k = rep.best_gamma

    spec = parse_vllm(by["vLLM"].text)
    assert spec["num_speculative_tokens"] == k
    sg = parse_sglang(by["SGLang"].text)
    assert sg.speculative_num_draft_tokens == k + 1
    cpp = parse_llamacpp(by["llama.cpp"].text)
    assert cpp.draft_max == k
    if kind == "lookup":
        assert spec == {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
        assert sg.speculative_algorithm == "NGRAM" and not by["llama.cpp"].runs
    else:
        assert spec["method"] == "draft_model" and spec["model"] == rep.draft
        assert sg.speculative_algorithm == "STANDALONE" and sg.speculative_num_steps == k
        assert cpp.model_draft == "DRAFT.gguf" and cpp.draft_p_min == 0.0
    if kind == "translated":
        assert spec["use_heterogeneous_vocab"] is True and not by["SGLang"].runs
        assert any("another tokenizer" in n for n in by["transformers"].notes)
    if kind == "lookup+model":
        assert all(any("no lookup-then-model" in n for n in by[e].notes) for e in by)
    text, js = rep.report(), json.dumps(rep.to_dict())
    assert card.text() in text and "--speculative-config" in text
    # what the engine's own counters should read at k: the check's acceptance per position, k shares, falling
    shares = rep.acceptance.kept_shares(k)
    assert len(shares) == k and all(1 >= x >= y >= 0 for x, y in zip(shares, shares[1:]))
    assert f"about {rep.acceptance.tokens_per_round(k):.2f} tokens a drafting round" in card.expect
    assert ", ".join(f"{x:.2f}" for x in shares) in card.expect and "expect:" in card.text()
    assert json.loads(js)["deploy"]["engines"][0]["engine"] == "vLLM"
    for e in card.engines:
        assert e.checked and all(n.endswith(".") and "\n" not in n for n in e.notes), e


def test_transformers_is_told_apart_where_it_would_take_another_tokenizer_for_the_same(reports, tiny_pair):
    import dataclasses

    from specviz.pairs.deploy import deploy_card

    rep = dataclasses.replace(reports["translated"], draft_vocab_rows=reports["translated"].target_vocab_rows)
    hf = deploy_card(rep).engines[3]
    assert not hf.runs and any("refuses assistant_tokenizer" in n for n in hf.notes)
    with pytest.raises(ValueError, match="assistant_tokenizer"):  # what transformers says, as the note says
        run_transformers(hf.text.replace(repr(rep.draft), repr(tiny_pair[1]), 2), "hello")


@pytest.mark.parametrize("kind", ["model", "lookup", "translated"])
def test_transformers_runs_the_card_as_printed_and_decodes_what_plain_greedy_does(reports, kind):
    """generate accepts every keyword of the card, and greedy assisted output is plain greedy output."""
    out, ns = run_transformers(reports[kind].card.engines[3].text, "hello world, hello world")
    assert torch.equal(out, plain_greedy(ns)), kind


def test_a_trimmed_draft_is_named_by_its_export_folder(fast_trimmed_report):
    card = fast_trimmed_report.card
    assert card.prepare.startswith(f"specviz export-draft {EXPORTED_DRAFT} --draft ")
    assert parse_vllm(card.engines[0].text)["model"] == EXPORTED_DRAFT


@pytest.fixture(scope="module")
def fast_trimmed_report(tiny_pair, tmp_path_factory):
    from conftest import make_model, make_tokenizer
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("trimmed") / "draft"
    full = LlamaForCausalLM.from_pretrained(tiny_pair[1])
    keep = list(range(53))
    draft = make_model(len(keep), seed=0)
    sd = full.state_dict()
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"][keep]
    sd["lm_head.weight"] = sd["lm_head.weight"][keep]
    draft.load_state_dict(sd)
    draft.save_pretrained(path)
    make_tokenizer(64, chat=True).save_pretrained(path)
    (path / "specviz_vocab.json").write_text(json.dumps({"target_ids": keep}))
    return check_pair(tiny_pair[0], str(path), device="cpu", max_new_tokens=8, prompts=["hello world"])


def test_an_incompatible_pair_has_no_card():
    from specviz.pairs.report import PairReport

    rep = PairReport.__new__(PairReport)
    object.__setattr__(rep, "best_gamma", None)
    object.__setattr__(rep, "acceptance", None)
    assert deploy_card(rep) is None


VLLM_LOAD = """
import json, sys
from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
target, spec = sys.argv[1], json.loads(sys.argv[2])
mc = ModelConfig(model=target, dtype="float32", max_model_len=256)
sc = SpeculativeConfig(target_model_config=mc, target_parallel_config=ParallelConfig(), **spec)
sc.verify_equal_vocab_size_if_draft_model()
print(json.dumps({"method": sc.method, "k": sc.num_speculative_tokens}))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("kind", ["model", "lookup"])
def test_vllm_loads_the_card_s_json_into_its_own_config(reports, kind, tiny_pair):
    python = ROOT / ".venv-vllm" / "bin" / "python"
    assert python.is_file(), "vLLM's CPU build (scripts/setup.sh --dev) is not installed"
    rep = reports[kind]
    spec = parse_vllm(rep.card.engines[0].text)
    out = subprocess.run(
        ["nice", "-n", "5", str(python), "-c", VLLM_LOAD, tiny_pair[0], json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"method": spec["method"], "k": rep.best_gamma}


def test_the_built_in_pair_s_card_says_where_it_was_proven(reports):
    import dataclasses

    from specviz.config import BUILTIN_DRAFT, BUILTIN_TARGET
    from specviz.ui.pair import card_head_html

    rep = dataclasses.replace(reports["model"], target=BUILTIN_TARGET, draft=BUILTIN_DRAFT, draft_trimmed=True)
    card = deploy_card(rep)
    assert "vLLM 0.32.0's CPU server ran this card" in card.proven and "proven:" in card.text()
    assert "Proven: vLLM" in card_head_html(card.to_dict())
    assert card.prepare.startswith(f"specviz export-draft {EXPORTED_DRAFT}")  # the built-in draft needs no --draft
    assert not deploy_card(reports["model"]).proven  # another pair: nothing proven
