"""The benchmark on the tiny pair: every column, the theory formula, the identical-output check, the CLI."""

import json
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from specviz import load_model
from specviz.bench import measure as bench
from specviz.bench.cli import format_table
from specviz.bench.inputs import PROMPT_SETS, load_prompts
from specviz.bench.measure import run_bench
from specviz.bench.peers import hf_assistant
from specviz.config import SpecvizError
from specviz.events import Done
from specviz.theory import expected_speedup

PROMPTS = ["hello world", "the cat sat"]


def test_theory_formula_on_known_values():
    assert expected_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))  # 2.4011...
    assert expected_speedup(0.8, 4, 0.1) == pytest.approx(2.40114, abs=1e-5)
    assert expected_speedup(1.0, 3, 0.5) == pytest.approx(4 / 2.5)  # every proposal accepted
    assert expected_speedup(0.0, 5, 0.2) == pytest.approx(1 / 2)  # nothing accepted: pure overhead
    assert expected_speedup(0.6, 2, 0.0) == pytest.approx(1 + 0.6 + 0.36)  # a free draft: E[tokens per round]


def test_prompt_sets_load_by_name_and_by_path(tmp_path):
    everyday = load_prompts("everyday")
    assert "Tell me about gravity." in everyday and "Cite 20 famous people." in everyday
    for name in PROMPT_SETS:
        assert 8 <= len(load_prompts(name)) <= 40
    f = tmp_path / "mine.txt"
    f.write_text("one\n\n  two  \nthree\n")
    assert load_prompts(str(f), limit=2) == ["one", "two"]
    with pytest.raises(SpecvizError):
        load_prompts("no-such-set")


@pytest.fixture(scope="module")
def table(loaded_pair):
    p, q = loaded_pair
    return run_bench(p, q, PROMPTS, [1, 3], [0.0, 1.0], max_new_tokens=12, repeats=1)


def test_bench_produces_every_column_for_every_cell(table):
    assert len(table) == 4
    assert sorted(zip(table["temperature"], table["gamma"])) == [(0.0, 1), (0.0, 3), (1.0, 1), (1.0, 3)]
    text = ("identical", "forwards_agree", "differences", "note", "temperature", "config", "drafter", "policy")
    text += ("tree", "best_chain", "vs_best_chain", "tokens_per_call_vs_best_chain")  # the last two: tree rows only
    numeric = [c for c in table.columns if c not in text]
    assert not table[numeric].isna().any().any(), table[numeric].isna().sum()
    assert ((table["acceptance"] >= 0) & (table["acceptance"] <= 1)).all()
    assert ((table["tokens_per_call"] >= 1) & (table["tokens_per_call"] <= table["gamma"] + 1)).all()
    for _, r in table.iterrows():
        assert r["theory"] == pytest.approx(expected_speedup(r["alpha"], r["gamma"], r["c"]))
        assert r["acceptance"] <= r["alpha"] <= 1  # proposals after a rejection count only in acceptance
    greedy = table[table["temperature"] == 0]
    assert greedy["identical"].tolist() == [True, True] and (greedy["differences"] == "").all()
    assert table.loc[table["temperature"] > 0, "identical"].isna().all()  # sampled outputs need not match
    assert greedy["forwards_agree"].tolist() == [True, True]  # lean.py's forward and transformers' agree here
    assert "spec/hf_spec" in format_table(table)


def test_the_table_says_how_the_per_prompt_speedups_spread_and_which_prompt_was_slowest(table):
    import pandas as pd

    from specviz.bench.cli import spread_lines
    from specviz.bench.summary import _spread

    def runs(rates):  # one repeat, prompts 0, 1, 2
        return pd.DataFrame({"repeat": 0, "prompt": range(len(rates)), "tokens_per_s": rates})

    got = _spread(runs([30.0, 60.0, 36.0]), runs([20.0, 30.0, 30.0]))  # per prompt 1.5x, 2.0x, 1.2x
    assert got == pytest.approx(
        {"speedup_lowest": 1.2, "speedup_lowest_prompt": 2, "speedup_q1": 1.35, "speedup_q3": 1.75,
         "speedup_highest": 2.0}
    )  # fmt: skip
    prompts = ["a", "b", "Write a SQL query that returns the ten most recent orders from the table."]
    cell = {"temperature": 0.0, "config": "model, gamma 3", "prompts": 3, **got}
    (line,) = spread_lines(pd.DataFrame([cell, {**cell, "prompts": 1}]), prompts)  # one prompt: no spread to say
    assert line == (
        "  T=0 model, gamma 3: spec/ar per prompt 1.20x (prompt 2, 'Write a SQL query that returns the ten most "
        "rec…') · quartiles 1.35x-1.75x · highest 2.00x"  # a long prompt cut to 48 characters
    )
    for _, r in table.iterrows():  # the real runs: the median among its quartiles, the slowest one of the prompts
        assert r["speedup_lowest"] <= r["speedup_q1"] <= r["speedup_vs_ar"] <= r["speedup_q3"] <= r["speedup_highest"]
        assert r["speedup_lowest_prompt"] in range(len(PROMPTS))


def test_identical_check_catches_a_planted_difference(loaded_pair, monkeypatch, caplog):
    p, q = loaded_pair
    real = bench.speculative_decode

    def altered(*args, **kwargs):  # our speculative decoding, with its third token changed
        for ev in real(*args, **kwargs):
            if isinstance(ev, Done):
                t = list(ev.token_ids)
                t[2] = (t[2] + 1) % p.vocab_size
                ev = Done(tuple(t), ev.finish_reason, ev.stats)
            yield ev

    monkeypatch.setattr(bench, "speculative_decode", altered)
    with caplog.at_level(logging.WARNING, logger="specviz"):
        t = run_bench(p, q, PROMPTS, [2], [0.0], max_new_tokens=8, hf=False)
    assert t["identical"].tolist() == [False]
    assert "spec differs from ar at new token 2" in t["differences"].iloc[0]
    assert "GREEDY OUTPUTS DIFFER" in caplog.text


@pytest.fixture(scope="module")
def trimmed_draft(tiny_pair, tmp_path_factory):
    """The tiny draft with a trimmed vocabulary, like the built-in one: 40 of the 64 rows, mapped by a file."""
    src = tiny_pair[1]
    full = AutoModelForCausalLM.from_pretrained(src)
    keep = list(range(0, 64, 3)) + [1, 2, 4, 5, 7, 8, 10, 11, 13, 14, 16, 17, 19, 20]  # specials + chars
    keep = sorted(set(keep))
    cfg = full.config
    cfg.vocab_size = len(keep)
    small = LlamaForCausalLM(cfg)
    sd = full.state_dict()
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"][keep]
    sd["lm_head.weight"] = sd["lm_head.weight"][keep]
    small.load_state_dict(sd)
    out = tmp_path_factory.mktemp("trimmed") / "draft"
    small.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    (out / "specviz_vocab.json").write_text(json.dumps({"target_ids": keep}))
    return str(out)


def test_transformers_assisted_generation_runs_with_a_trimmed_vocabulary_draft(loaded_pair, trimmed_draft):
    p, _ = loaded_pair
    q = load_model(trimmed_draft, device="cpu")
    assert q.vocab_map is not None and q.vocab_size < p.vocab_size
    view = hf_assistant(q, p, 3)
    with torch.no_grad():
        logits = view(torch.tensor([[1, 5, 6, 7]])).logits
    assert logits.shape[-1] == p.vocab_size
    unmapped = sorted(set(range(p.vocab_size)) - set(q.vocab_map.tolist()))
    assert torch.isinf(logits[..., unmapped]).all()
    assert q.model.get_output_embeddings().weight.shape[0] == len(q.vocab_map)  # q itself is untouched
    t = run_bench(p, q, PROMPTS, [3], [0.0], max_new_tokens=16)
    assert t["identical"].tolist() == [True], t["differences"].iloc[0]
    assert t["hf_spec_tok_s"].notna().all()


def test_cli_writes_csv_json_and_html_plots(tiny_pair, tmp_path, monkeypatch, capsys):
    from specviz.__main__ import main

    monkeypatch.setenv("SPECVIZ_BENCH_PNG", "0")  # no browser in the unit tests
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS))
    csv, js, plots = tmp_path / "t.csv", tmp_path / "t.json", tmp_path / "plots"
    args = ["bench", "--target", tiny_pair[0], "--draft", tiny_pair[1], "--device", "cpu", "--prompts", str(prompts)]
    args += ["--gammas", "2", "--max-new-tokens", "6", "--csv", str(csv), "--json-out", str(js), "--plots", str(plots)]
    args += ["--results", str(tmp_path / "results")]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["machine"]["torch"] == torch.__version__ and out["machine"]["cpu"]
    before, after = out["machine"]["memory_gb_s"]  # the memory's speed at both ends of the run, read on this CPU
    assert 0.1 < before < 10_000 and 0.1 < after < 10_000
    assert out["table"][0]["identical"] is True
    saved = json.loads(js.read_text())
    assert len(saved["runs"]) == 2 * len(bench.METHODS)
    assert csv.read_text().startswith("temperature,config,drafter,gamma")
    assert (plots / "speedup.html").is_file() and (plots / "acceptance.html").is_file()
    (result,) = (tmp_path / "results").iterdir()  # the file benchmarks/make_performance.py reads
    r = json.loads(result.read_text())
    assert r["command"].startswith("python -m specviz ") and r["machine"]["cpu"] == out["machine"]["cpu"]
    assert r["commit"] and r["date"].endswith("UTC") and r["set"]["max_new_tokens"] == 6
    assert [row["config"] for row in r["rows"]] == [row["config"] for row in out["table"]]
    assert r["rows"][0]["speedup_vs_ar"] == out["table"][0]["speedup_vs_ar"] and r["rows"][0]["identical"] is True


def test_bench_rows_per_drafter_and_policy_with_both_transformers_peers(loaded_pair):
    p, q = loaded_pair
    prompts = ["the cat sat on the mat, the cat sat on the", "abc abc abc abc"]
    t = run_bench(p, q, prompts, [2, "auto"], [0.0], max_new_tokens=12, drafters=("lookup", "lookup+model"))
    assert t["config"].tolist() == ["lookup, gamma 2", "lookup, auto", "lookup+model, gamma 2", "lookup+model, auto"]
    assert t["identical"].tolist() == [True] * 4  # ours, transformers' assisted and prompt lookup: same tokens
    for col in ("hf_assist_tok_s", "hf_lookup_tok_s", "speedup_vs_best_peer", "hf_assist_vs_ar", "hf_lookup_vs_ar"):
        assert t[col].notna().all() and (t[col] > 0).all(), col
    lookup = t[t["drafter"] == "lookup"]
    assert (lookup["c"] == 0).all() and (lookup["drafted_per_call"] > 0).all()  # free guesses were made
    assert t.loc[t["gamma"] == "auto", "theory"].isna().all()  # no constant-gamma formula for a varying gamma


def test_bench_puts_token_trees_beside_the_best_chain(loaded_pair):
    p, q = loaded_pair
    t = run_bench(p, q, PROMPTS, [1, 3], [0.0], max_new_tokens=12, trees=("off", 6), hf=False)
    assert t["config"].tolist() == [
        "model, gamma 1",
        "model, gamma 1, tree 6",
        "model, gamma 3",
        "model, gamma 3, tree 6",
    ]
    assert t["identical"].tolist() == [True] * 4  # trees keep the output token for token
    chains, trees = t[t["tree"] == "off"], t[t["tree"] != "off"]
    best = chains.loc[chains["speedup_vs_ar"].idxmax(), "config"]
    assert (trees["best_chain"] == best).all() and trees["vs_best_chain"].notna().all()
    assert (trees["drafted_per_call"] > chains["drafted_per_call"].max()).all()  # more nodes checked per call
    for _, r in trees.iterrows():
        assert f"against the best chain ({best}" in r["note"] and "plain steps" in r["note"]
        assert 0 < r["tree_share"] <= 1 and f"{r['tree_share']:.0%} of its rounds branched" in r["note"]
    assert (chains["tree_share"] == 0).all()
    assert chains["vs_best_chain"].isna().all()
    assert "nodes/call" in format_table(t)


def test_cli_bench_sweeps_temperature_a_row_per_temperature(tiny_pair, tmp_path, monkeypatch, capsys):
    """`specviz bench --temperatures 0,0.7,1.3`: the table has each configuration at each temperature."""
    from specviz.__main__ import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS))
    args = ["bench", "--target", tiny_pair[0], "--draft", tiny_pair[1], "--device", "cpu", "--prompts", str(prompts)]
    args += ["--gammas", "2", "--max-new-tokens", "6", "--no-hf", "--temperatures", "0,0.7,1.3", "--json"]
    assert main(args) == 0
    table = json.loads(capsys.readouterr().out)["table"]
    assert sorted(r["temperature"] for r in table) == [0.0, 0.7, 1.3]
    assert all(0 <= r["acceptance"] <= 1 and r["speedup_vs_ar"] > 0 for r in table)
