"""Tiny models with different tokenizers, built offline for the cross-tokenizer tests (tests/test_translate.py).

Two BPE tokenizers trained here with the `tokenizers` library on the same few pages of generated text: one
byte-level (a space is Ġ, as GPT-2, Llama 3, Qwen, SmolLM), one SentencePiece-style (a space is ▁, unknown
characters fall back to bytes, as Llama 2 and Mistral), with different merges, sizes, special tokens and chat
templates. The tiny Llama models are trained a few seconds on that text, so a draft agrees with a target often
enough for accepted and rejected guesses both to happen.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PHI3 = Path(__file__).parent / "data" / "phi3_tokenizer"  # a real tokenizer (no weights): see its README

ADJ = "red green small big old young quick lazy happy quiet bright dark".split()
NOUN = "fox dog cat bird horse river tree house garden child teacher farmer".split()
VERB = "sees likes follows finds watches helps meets paints carries hears".split()
TEMPLATE_P = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TEMPLATE_Q = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    """A few pages of simple sentences: structure a tiny model learns in seconds."""
    r = random.Random(seed)
    out = []
    for _ in range(n):
        s = f"the {r.choice(ADJ)} {r.choice(NOUN)} {r.choice(VERB)} the {r.choice(ADJ)} {r.choice(NOUN)}"
        if r.random() < 0.3:
            s += f" {r.randint(2, 99)} times"
        out.append(s + ("." if r.random() < 0.8 else "!\n"))
    return out


def bytelevel_tokenizer(lines: list[str], vocab: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (Ġ for a space); </s> ends a turn."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    t.train_from_iterator(
        lines,
        trainers.BpeTrainer(vocab_size=vocab, special_tokens=special, initial_alphabet=alphabet, show_progress=False),
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=t,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    tok.chat_template = TEMPLATE_P
    return tok


def metaspace_tokenizer(lines: list[str], vocab: int) -> PreTrainedTokenizerFast:
    """SentencePiece-style BPE (▁ for a space) with byte fallback; <|im_end|> ends a turn."""
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")  # no ▁ after a special token
    chars = sorted(set("".join(lines)) | set("abcdefghijklmnopqrstuvwxyz0123456789 .,!?'\n:()"))
    t.train_from_iterator(
        lines,
        trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=chars,
            show_progress=False,
        ),
    )
    spec = json.loads(t.to_str())  # every byte as an ordinary token, for the text no merge covers
    for b in range(256):
        spec["model"]["vocab"].setdefault(f"<0x{b:02X}>", len(spec["model"]["vocab"]))
    spec["model"]["byte_fallback"] = True
    t = Tokenizer.from_str(json.dumps(spec))
    t.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=t, unk_token="<unk>", eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"]
    )
    tok.chat_template = TEMPLATE_Q
    return tok


def useless_tokenizer() -> PreTrainedTokenizerFast:
    """Whole Greek words and nothing else: English text comes back as <unk>."""
    words = "άλφα βήτα γάμμα δέλτα έψιλον ζήτα ήτα θήτα".split()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def train_lm(tok, texts: list[str], seed: int, steps: int = 150, hidden: int = 64) -> LlamaForCausalLM:
    """A 2-layer Llama trained `steps` steps of next-token prediction on `texts` (a few seconds on a CPU)."""
    torch.manual_seed(seed)
    eos = tok.eos_token_id
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    ids = [i for text in texts for i in tok(text, add_special_tokens=False)["input_ids"] + [eos]]
    data = torch.tensor(ids)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, os.cpu_count() or 1))  # the suite runs on one; a 32,064-row output layer trains
    try:  # on both cores in 0.5 s a step, not 0.9 (Phi-3's tokenizer, a 2-core Zen 1)
        for _ in range(steps):
            starts = torch.randint(0, len(data) - 65, (16,), generator=g)
            x = torch.stack([data[s : s + 65] for s in starts.tolist()])
            loss = model(input_ids=x, labels=x).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def save(path, model, tok) -> str:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def replies(lines: list[str]) -> list[str]:
    """The corpus as replies of one to three sentences (train_lm ends each with the end-of-turn token)."""
    r, text, i = random.Random(1), [], 0
    while i < len(lines):
        n = r.randint(1, 3)
        text.append(" ".join(lines[i : i + n]))
        i += n
    return text


def cross_pair(root) -> tuple[str, str]:
    """(target_dir, draft_dir): a byte-level target and a ▁-style draft, trained on the same text."""
    lines = corpus()
    p_tok, q_tok = bytelevel_tokenizer(lines, 360), metaspace_tokenizer(lines, 170)
    text = replies(lines)
    return (
        save(root / "target", train_lm(p_tok, text, seed=0), p_tok),
        save(root / "draft", train_lm(q_tok, text, seed=1), q_tok),
    )


def phi3_tokenizer():
    """Phi-3's own tokenizer: Llama 2's SentencePiece vocabulary (▁, byte fallback, a dummy prefix space, digits
    one by one) with Phi-3's chat tokens and template, 32,064 tokens."""
    return AutoTokenizer.from_pretrained(PHI3)


def phi3_draft(root) -> str:
    """A tiny draft with Phi-3's real tokenizer, trained on cross_pair's text: a draft as a user would bring one,
    whose vocabulary was not made for the target's."""
    tok = phi3_tokenizer()
    return save(root / "phi3-draft", train_lm(tok, replies(corpus()), seed=1), tok)
