"""The command line on the tiny pair: generate (--json, --compare), check, and a clean error for a bad folder."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specviz import generate
from specviz.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def models(tiny_pair) -> list[str]:
    return ["--target", tiny_pair[0], "--draft", tiny_pair[1], "--device", "cpu"]


def test_generate_json_matches_the_api(tiny_pair, capsys):
    code, out, _ = run(capsys, "generate", "hello world", *models(tiny_pair), "--max-new-tokens", "10", "--json")
    assert code == 0
    d = json.loads(out)  # stdout is exactly one JSON object
    ref = generate("hello world", target=tiny_pair[0], draft=tiny_pair[1], device="cpu", max_new_tokens=10)
    assert d["token_ids"] == list(ref.token_ids) and d["text"] == ref.text
    assert d["stats"]["mode"] == "spec" and d["stats"]["new_tokens"] == len(ref.token_ids)


def test_generate_text_output(tiny_pair, capsys):
    code, out, err = run(capsys, "generate", "hello world", *models(tiny_pair), "--max-new-tokens", "10")
    ref = generate("hello world", target=tiny_pair[0], draft=tiny_pair[1], device="cpu", max_new_tokens=10)
    assert code == 0 and out == ref.text + "\n"
    assert "acceptance" in err and "tokens/call" in err


def test_generate_compare_json(tiny_pair, capsys):
    argv = ["generate", "hello world", *models(tiny_pair), "--max-new-tokens", "12", "--compare"]
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0
    d = json.loads(out)
    assert set(d) == {"ar", "spec", "speedup"}
    assert d["ar"]["text"] == d["spec"]["text"]  # greedy: speculative decoding changes nothing but the time
    assert d["ar"]["stats"]["mode"] == "ar" and d["spec"]["stats"]["mode"] == "spec"
    assert d["speedup"] == pytest.approx(d["ar"]["stats"]["wall_s"] / d["spec"]["stats"]["wall_s"])
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "speedup" in out and "identical output: yes" in out


def test_check_text_and_json(tiny_pair, capsys):
    code, out, _ = run(capsys, "check", *models(tiny_pair), "--max-new-tokens", "8")
    assert code == 0
    assert "tokenizers  identical over 64 ids" in out and "verdict" in out and "gamma  8" in out
    # the deploy card closes the report: the four engines, each with the version its option names were read from
    assert "deploy      model drafter" in out and "--speculative-config" in out and "llama-server" in out
    assert "vLLM (checked against vLLM 0.32.0" in out and "transformers (checked against transformers" in out
    code, out, _ = run(capsys, "check", *models(tiny_pair), "--max-new-tokens", "8", "--json")
    d = json.loads(out)
    assert code == 0 and d["verdict"] in ("compatible", "not worth it")
    assert d["tokenizer"]["mismatches"] == 0 and len(d["speedups"]) == 16 and 0 < d["acceptance"]["a"] <= 1
    card = d["deploy"]
    assert card["gamma"] == d["best_gamma"] and [e["engine"] for e in card["engines"]] == [
        "vLLM",
        "SGLang",
        "llama.cpp",
        "transformers",
    ]


def test_user_errors_exit_2_with_one_line(tmp_path, capsys):
    code, out, err = run(capsys, "generate", "hi", "--target", str(tmp_path / "nope"), "--device", "cpu")
    assert code == 2 and out == ""
    assert err == f"error: The folder {tmp_path / 'nope'} does not exist.\n"
    code, _, err = run(capsys, "generate", "hi", "--gamma", "40", "--target", str(tmp_path / "nope"))
    assert code == 2 and err.strip() == "error: gamma must be a whole number from 1 to 16 or 'auto', not 40."
    code, _, err = run(capsys, "check", "--target", str(tmp_path / "nope"), "--draft", str(tmp_path / "nope"))
    assert code == 2 and err.startswith("error: The folder")


def test_missing_folder_in_a_real_process_has_no_traceback(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "specviz", "generate", "hi", "--target", str(tmp_path / "nope"), "--device", "cpu"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert lines == [f"error: The folder {tmp_path / 'nope'} does not exist."], r.stderr


def test_generate_with_a_token_tree(tiny_pair, capsys):
    code, out, _ = run(
        capsys,
        "generate",
        "hello world",
        *models(tiny_pair),
        "--tree",
        "6",
        "--drafter",
        "model",
        "--max-new-tokens",
        "16",
        "--compare",
        "--json",
    )
    d = json.loads(out)
    assert code == 0 and d["spec"]["text"] == d["ar"]["text"]  # greedy: the tree keeps the output
    assert d["spec"]["stats"]["tree_rounds"] > 0
    code, _, err = run(capsys, "generate", "hello", *models(tiny_pair), "--tree", "wide")
    assert code == 2 and err.strip() == "error: tree must be off, auto or a node budget from 1 to 32, not 'wide'."
