"""The Step-through and Pair-check tabs, driven through their named API endpoints with gradio_client."""

from pathlib import Path

import gradio as gr
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from specviz.limits import Limits
from specviz.models.translate import compare_tokenizers
from specviz.pairs.report import PairReport
from specviz.ui.common import UIContext
from specviz.ui.pair import build_pair_tab, report_html
from specviz.ui.step import build_step_tab
from specviz.ui.step_html import draws_html


@pytest.fixture(scope="module")
def client(tiny_pair):
    root = str(Path(tiny_pair[0]).parent)
    ctx = UIContext(
        limits=Limits(model_dirs=(root,)), device="cpu", default_target=tiny_pair[0], default_draft=tiny_pair[1]
    )
    with gr.Blocks() as demo:
        with gr.Tab("Step through"):
            build_step_tab(ctx)
        with gr.Tab("Pair check"):
            build_pair_tab(ctx)
    demo.queue()
    demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True)
    try:
        yield Client(demo.local_url, verbose=False)
    finally:
        demo.close()


def test_next_round_advances_one_round_per_click_and_reset_starts_over(client):
    say, text, draws, _ = client.predict("hello world", 3, 0.0, 0, api_name="/step")
    assert "Round 1." in say and "The draft guessed 3 tokens" in say
    assert 'class="sv-now"' in text and ("tok-resampled" in text or "tok-bonus" in text)
    assert "<table" in draws and "draft's guess" in draws
    say2, text2, _, _ = client.predict("hello world", 3, 0.0, 0, api_name="/step")
    assert "Round 2." in say2 and "sv-old" in text2
    client.predict(api_name="/reset")
    say3, *_ = client.predict("hello world", 3, 0.0, 0, api_name="/step")
    assert "Round 1." in say3


def test_changing_a_setting_starts_the_run_over_and_the_end_is_announced(client):
    client.predict(api_name="/reset")
    client.predict("the cat", 2, 1.0, 1, api_name="/step")
    say, *_ = client.predict("the cat", 4, 1.0, 1, api_name="/step")
    assert "Round 1." in say and "started over" in say and "The draft guessed 4 tokens" in say
    for _ in range(70):  # the view stops at 64 tokens at the latest
        say, *_ = client.predict("the cat", 4, 1.0, 1, api_name="/step")
        if "Done:" in say:
            break
    assert "Done:" in say and "Press Reset" in say


def test_a_token_tree_round_is_drawn_as_a_tree_with_its_walk(client):
    client.predict(api_name="/reset")
    seen_branch = False
    for i in range(8):  # until a round keeps a guess that was not the draft's first choice
        say, text, draws, _ = client.predict("once upon a time", 3, 0.0, 0, False, 1.0, "8", api_name="/step")
        assert f"Round {i + 1}." in say and "The draft grew a tree of" in say
        assert 'class="sv-tree"' in draws and "sv-t-root" in draws and "by depth and by the draft" in draws
        assert "sv-t-fix" in draws or "sv-t-bonus" in draws  # the token drawn where the walk stopped
        seen_branch |= "sup>2nd<" in draws
        if "sv-t-kept" in draws and "second choice" in say:
            break
    assert seen_branch  # a runner-up was drawn as such (its rank mark)
    with pytest.raises(AppError, match="not in the list of choices"):
        client.predict("once upon a time", 3, 0.0, 0, False, 1.0, "wide", api_name="/step")
    client.predict(api_name="/reset")


@pytest.mark.parametrize(
    "args, words",
    [
        (("   ", 3, 0.0, 0), "prompt is empty"),
        (("hi", 3, 0.0, -4), "seed must be"),
        (("hi", 3, 0.0, 2**70), "seed must be"),
    ],
)
def test_visitor_errors_are_one_sentence_in_the_page(client, args, words):
    say, *_ = client.predict(*args, api_name="/step")
    assert 'class="sv-error"' in say and words in say and "Traceback" not in say


def test_out_of_range_sliders_are_refused_by_gradio_and_the_app_keeps_serving(client):
    with pytest.raises(AppError, match="greater than maximum value 8"):
        client.predict("hi", 99, 0.0, 0, api_name="/step")
    client.predict(api_name="/reset")
    say, *_ = client.predict("hi", 2, 0.0, 0, api_name="/step")
    assert "Round 1." in say


def test_exactness_at_temperature_zero_compares_token_by_token(client):
    html, _ = client.predict("hello world", 4, 0.0, 0, 300, 0, api_name="/exactness")
    assert "Identical." in html and "token for token" in html


def test_exactness_above_zero_follows_p_and_cross_checks_real_runs(client):
    html, plot = client.predict("hello world", 4, 1.5, 3, 2000, 3, api_name="/exactness")
    assert "✓ <b>The output follows the target p" in html or "✓ <b>The output matches the target p" in html, html
    assert "3 of 3 real runs" in html and "Distance to the target p" in html
    assert plot is not None


def test_forward_time_sentence(client):
    html, plot = client.predict("hello world", 4, api_name="/forward_times")
    assert "one target pass over 5 tokens" in html and plot is not None


def test_pair_check_of_the_tiny_pair(client, tiny_pair):
    html, plot, numbers = client.predict(tiny_pair[0], tiny_pair[1], 8, api_name="/check")
    assert "sv-badge" in html and ("Compatible" in html or "not worth it" in html)
    assert numbers["tokenizer"]["compatible"] is True and len(numbers["speedups"]) == 16
    # the page names the costs its prediction used, the same numbers the API returns
    assert "The prediction prices a round of each gamma from the rounds the check ran" in html
    assert f"a plain decoding step {numbers['plain_cost']:.2f}" in html
    assert f"the decode loop's own) {numbers['round_overhead']:.2f}" in html
    assert f"{numbers['measured_speedup']:.2f}×" in html and "measured at gamma 4" in html


def test_unreachable_hub_model_gives_a_clear_sentence(client, tiny_pair):
    html, _, numbers = client.predict("HuggingFaceTB/SmolLM2-360M-Instruct", tiny_pair[1], 8, api_name="/check")
    assert 'class="sv-error"' in html and "could not be found" in html and numbers is None


def test_folders_outside_the_allowed_ones_are_refused(client):
    html, *_ = client.predict("/etc", "/tmp", 8, api_name="/check")
    assert 'class="sv-error"' in html and "outside the folders" in html


def test_model_and_visitor_text_is_escaped(tiny_pair):
    from specviz import load_pair

    p, _ = load_pair(*tiny_pair, device="cpu")
    t = compare_tokenizers(p.tokenizer, p.tokenizer)
    r = PairReport(
        "<script>x</script>",
        "<b>d</b>",
        "incompatible",
        ("<img src=x onerror=1>",),
        ("<i>w</i>",),
        t,
        "cpu",
        "float32",
        1,
        1,
        0,
        0,
        64,
        64,
        False,
    )
    out = report_html(r)
    assert "<script>" not in out and "<img" not in out and "&lt;script&gt;" in out and "<i>w" not in out
    from specviz.events import Round

    rd = Round(0, (5,), (0.5,), (0.2,), (0.4,), (0.9,), 0, 6, "resampled", (6,), 0.0, 0.0, 0.0)
    html = draws_html(rd, lambda t: "<svg onload=1>", greedy=False)
    assert "<svg" not in html and "&lt;svg␣onload=1&gt;" in html


def test_pair_check_shows_the_deploy_card_one_copyable_code_block_per_engine(client, tiny_pair):
    """The check's JSON carries the card; the page fills its headline, four code blocks (each with a copy button)
    and each engine's notes from it (a private step after /check, so the API keeps its three outputs)."""
    from specviz.ui.pair import ENGINES, card_updates

    ctx = UIContext(limits=Limits(model_dirs=(str(Path(tiny_pair[0]).parent),)), device="cpu")
    with gr.Blocks() as demo:
        build_pair_tab(ctx)
    codes = [c for c in demo.config["components"] if c["type"] == "code"]
    assert len(codes) == len(ENGINES) == 4 and all("copy" in c["props"]["buttons"] for c in codes)

    _, _, numbers = client.predict(tiny_pair[0], tiny_pair[1], 8, api_name="/check")
    card = numbers["deploy"]
    head, *parts = card_updates(numbers)
    assert "Deploy it:" in head.value and numbers["deploy"]["headline"].split(" (")[0] in head.value
    blocks, notes = parts[0::2], parts[1::2]
    assert [b.value for b in blocks] == [e["text"] for e in card["engines"]]
    assert [b.label.split(" (")[0] for b in blocks] == list(ENGINES)
    assert "vllm serve" in blocks[0].value and "--speculative-config" in blocks[0].value
    assert all(n.visible for n in notes) and "argmax" in notes[0].value
    hidden = card_updates(None)  # a failed check hides the card
    assert not any(getattr(x, "visible", True) for x in hidden)
