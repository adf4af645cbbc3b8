"""The Python API: bad input is one quick SpecvizError; prompts go through the chat template unless raw."""

import time

import pytest

from specviz import Done, SpecvizError, Start, Step, encode_prompt, generate, load_pair, stream

MISSING = "/no/such/model/folder"  # arguments are checked first: a late check would say "does not exist"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": "  \n\t "}, "prompt is empty"),
        ({"prompt": None}, "must be text"),
        ({"prompt": "x" * 100_001}, "too long"),
        ({"gamma": 0}, "gamma must be a whole number from 1 to 16 or 'auto', not 0"),
        ({"gamma": 17}, "gamma must be a whole number from 1 to 16 or 'auto', not 17"),
        ({"gamma": 2.5}, "gamma must be a whole number, not 2.5"),
        ({"gamma": float("nan")}, "gamma must be a finite number"),
        ({"gamma": "x"}, "gamma must be a whole number from 1 to 16 or 'auto', not 'x'"),
        ({"temperature": -1}, "temperature must be between 0 and 2"),
        ({"temperature": 2.5}, "temperature must be between 0 and 2"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"top_k": -1}, "top_k must be 0"),
        ({"top_p": 0}, "top_p must be above 0 and at most 1"),
        ({"top_p": 1.5}, "top_p must be above 0 and at most 1"),
        ({"top_p": float("nan")}, "top_p must be a finite number"),
        ({"mode": "fast"}, "Unknown mode 'fast'"),
        ({"max_new_tokens": 0}, "max_new_tokens must be at least 1"),
        ({"seed": -1}, "seed must be a whole number"),
        ({"detail": -1}, "detail must be a whole number from 0"),
    ],
)
@pytest.mark.parametrize("call", ["generate", "stream"])
def test_bad_input_is_one_quick_sentence(kwargs, match, call):
    kwargs = {"prompt": "hello", "target": MISSING, "draft": MISSING, **kwargs}
    fn = generate if call == "generate" else stream
    t0 = time.perf_counter()
    with pytest.raises(SpecvizError, match=match) as e:
        fn(kwargs.pop("prompt"), **kwargs)
    assert time.perf_counter() - t0 < 0.5  # nothing was loaded
    assert "\n" not in str(e.value) and str(e.value).endswith(".")


def test_unknown_option_is_named():
    with pytest.raises(SpecvizError, match="Unknown option 'gama' for generate"):
        generate("hello", gama=3, target=MISSING)
    with pytest.raises(SpecvizError, match="Unknown option 'tempature' for stream"):
        stream("hello", tempature=1.0, target=MISSING)


def test_a_missing_model_is_reported_after_the_arguments_pass():
    with pytest.raises(SpecvizError, match="does not exist"):
        generate("hello", target=MISSING, draft=MISSING)


def test_chat_template_is_applied_unless_raw(loaded_pair):
    p, q = loaded_pair
    tok = p.tokenizer
    user, assistant = tok.convert_tokens_to_ids(["<|user|>", "<|assistant|>"])
    plain = tok("hi there", add_special_tokens=False)["input_ids"]
    chat = encode_prompt(p, "hi there")
    assert chat[0] == user and chat[-1] == assistant  # <|user|>hi there</s><|assistant|>
    assert chat[1 : 1 + len(plain)] == plain
    raw = encode_prompt(p, "hi there", raw=True)
    assert user not in raw and assistant not in raw and raw == tok("hi there")["input_ids"]

    start = next(iter(stream("hi there", target=p, draft=q, max_new_tokens=1)))
    assert list(start.prompt_ids) == chat
    start = next(iter(stream("hi there", target=p, draft=q, raw=True, max_new_tokens=1)))
    assert list(start.prompt_ids) == raw


def test_a_model_without_template_gets_the_raw_prompt(small_vocab_pair):
    p, q = load_pair(*small_vocab_pair, device="cpu")
    assert not getattr(p.tokenizer, "chat_template", None)
    assert encode_prompt(p, "abc") == encode_prompt(p, "abc", raw=True) == p.tokenizer("abc")["input_ids"]
    r = generate("abc", target=p, draft=q, max_new_tokens=4)
    assert len(r.token_ids) >= 1


@pytest.mark.parametrize("mode", ["spec", "ar"])
def test_stream_yields_start_first_and_done_last(loaded_pair, mode):
    p, q = loaded_pair
    events = list(stream("hello world", target=p, draft=q, mode=mode, max_new_tokens=12))
    assert isinstance(events[0], Start) and events[0].mode == mode
    assert isinstance(events[-1], Done)
    assert not any(isinstance(e, (Start, Done)) for e in events[1:-1])
    if mode == "ar":
        assert all(isinstance(e, Step) for e in events[1:-1])
    r = generate("hello world", target=p, draft=q, mode=mode, max_new_tokens=12)
    assert r.token_ids == events[-1].token_ids and r.finish_reason == events[-1].finish_reason
    assert r.text == p.tokenizer.decode(list(r.token_ids), skip_special_tokens=True)
