"""Drafts with another tokenizer: what a draft q's guesses mean to a target p whose vocabulary differs.

The drafter that uses this (drafters.TranslatingDrafter) works in text: the draft reads the reply so far
re-encoded with its own tokenizer, proposes in its own tokens, and its new text is encoded with the target's
tokenizer after a window of the target's own recent tokens, so that merges across the boundary come out as
the target would write them. The target verifies its own tokens as usual, so greedy output is the target's
greedy output token for token ("text"). For sampling (T > 0) two exact ways (Timor et al. 2025, arXiv
2502.05202; transformers' UniversalSpeculativeDecodingGenerator and vLLM do the first):

- token-level intersection ("intersection"): q is restricted to the draft's tokens whose strings the target
  also has (after mapping the space marker: Ġ in byte-level BPE, ▁ in SentencePiece-style vocabularies),
  renormalised, and checked by standard rejection sampling against p;
- where q over the target's tokens is not known ("match"): a guess is kept with probability p(x), the chance
  that the target's own draw at that position is x, and at a miss the target's token is drawn from p without x.
  That is speculative sampling with q a point mass on the guess (as for prompt lookup), so exact as well.

Each model sees the prompt through its own chat template: the visitor's message is recovered from the target's
prompt and formatted again for the draft. Tokens only one vocabulary has (<|im_end|> vs <|eot_id|>) are never
guessed as such: the draft's end of turn becomes the target's, any other special token ends the guess.
Whether a draft needs any of this is compare_tokenizers' answer: every token id the same token to both (at most
1% of ids differ), the rule the pair check reports by.
p is the target, q the draft (as everywhere in specviz).
"""

from __future__ import annotations

import functools
import re
import weakref
from dataclasses import dataclass

import torch

WINDOW = 8  # target tokens before a guess re-encoded with it, so merges across the boundary come out right
MIN_SHARED = 0.5  # sampling uses the intersection when at least this share of the draft's vocabulary is shared
MIN_WRITABLE = 0.5  # a draft whose tokenizer writes back fewer of the target's tokens than this is refused
WRITABLE_SAMPLE = 1000  # target tokens tried, spread over its vocabulary
METHODS = {
    "text": "re-tokenised text (greedy: exact, the target's own greedy output)",
    "intersection": "token-level intersection (q restricted to the shared tokens, rejection sampling: exact)",
    "match": "a guess kept with the chance the target draws it (exact; q over the target's tokens unknown)",
}
MAX_MISMATCH_FRACTION = 0.01  # a few renamed special tokens (Llama 3 vs 3.1) are fine; a different tokenizer is not
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
_SENTINEL = "\x00specviz-message\x00"
_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte-fallback tokens


def space_marker(tok) -> str | None:
    """The character a vocabulary writes a leading space with: "Ġ" (byte-level BPE), "▁" (SentencePiece style),
    " " (kept as is), or None when a space is a token of its own or dropped."""
    ids = tok("a b", add_special_tokens=False)["input_ids"]
    last = tok.convert_ids_to_tokens(ids[-1:])[0] if ids else ""
    return last[0] if len(last) == 2 and last.endswith("b") else None


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's alphabet back to bytes: it writes each byte as one printable character."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


def token_bytes(tok) -> dict[int, bytes]:
    """The bytes each ordinary token stands for (special and added tokens left out): the key by which two
    vocabularies are compared, so "Ġthe" (byte-level) and "▁the" (SentencePiece) are the same token b" the"."""
    marker, added = space_marker(tok), set(getattr(tok, "added_tokens_decoder", {}) or ())
    skip = added | set(getattr(tok, "all_special_ids", ()) or ())
    out: dict[int, bytes] = {}
    if marker == "Ġ":  # byte-level: every character is one byte
        dec = _byte_decoder()
        for s, i in tok.get_vocab().items():
            if i not in skip and all(c in dec for c in s):
                out[i] = bytes(dec[c] for c in s)
        return out
    for s, i in tok.get_vocab().items():
        if i in skip:
            continue
        m = _BYTE.fullmatch(s)
        out[i] = bytes([int(m.group(1), 16)]) if m else (s.replace(marker, " ") if marker else s).encode()
    return out


def token_text(tok) -> dict[int, str]:
    """The text of each ordinary token that is whole UTF-8 (a byte-level piece of a character is left out)."""
    out = {}
    for i, b in token_bytes(tok).items():
        try:
            out[i] = b.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return out


@dataclass(frozen=True)
class SharedVocabulary:
    """The draft's tokens whose strings the target also has: one draft row for each shared target id."""

    q_rows: torch.Tensor  # (S,) draft rows, ascending
    p_ids: torch.Tensor  # (S,) the target's id for each
    target_tokens: int  # the target's ordinary tokens (special and added ones left out)
    draft_tokens: int

    @property
    def coverage(self) -> float:
        """The share of the target's vocabulary the draft has, by string."""
        return len(self.p_ids) / self.target_tokens if self.target_tokens else 0.0

    @property
    def draft_share(self) -> float:
        """The share of the draft's vocabulary the target has: what q keeps under the intersection."""
        return len(self.q_rows) / self.draft_tokens if self.draft_tokens else 0.0


def shared_vocabulary(p_tok, q_tok, q_rows: int) -> SharedVocabulary:
    """Match the two vocabularies by the bytes each token stands for; q_rows: the draft's output rows."""
    p_bytes, q_bytes = token_bytes(p_tok), token_bytes(q_tok)
    by_bytes: dict[bytes, int] = {}
    for i, b in sorted(p_bytes.items()):
        by_bytes.setdefault(b, i)
    rows, ids, used = [], [], set()
    for row, b in sorted(q_bytes.items()):
        i = by_bytes.get(b)
        if i is not None and i not in used and row < q_rows:
            rows.append(row)
            ids.append(i)
            used.add(i)
    long = torch.long
    return SharedVocabulary(torch.tensor(rows, dtype=long), torch.tensor(ids, dtype=long), len(p_bytes), len(q_bytes))


class Translator:
    """Text between the target's tokenizer (p) and the draft's (q). Built once per pair (`translator`)."""

    def __init__(self, p_tok, q_tok):
        self.p_tok, self.q_tok = p_tok, q_tok

    # --- prompts -------------------------------------------------------------------------------

    def _message(self, text: str) -> str | None:
        """The visitor's message inside a prompt the target's chat template wrapped, else None."""
        tpl = getattr(self.p_tok, "chat_template", None)
        if not tpl:
            return None
        try:
            shell = self.p_tok.apply_chat_template(
                [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=True
            )
        except Exception:  # a template that wants other roles or arguments: the text goes over as it is
            return None
        head, _, tail = shell.partition(_SENTINEL)
        if _SENTINEL in shell and text.startswith(head) and text.endswith(tail) and len(text) >= len(head + tail):
            return text[len(head) : len(text) - len(tail)]
        return None

    def draft_prompt(self, prompt_ids: list[int]) -> list[int]:
        """The draft's own ids for the target's prompt: the message through the draft's chat template when the
        target's wrapped it, else the prompt's text with the draft's own special tokens (its BOS, say)."""
        message = self._message(self.p_tok.decode(prompt_ids, skip_special_tokens=False))
        if message is not None and getattr(self.q_tok, "chat_template", None):
            try:
                text = self.q_tok.apply_chat_template(
                    [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
                )
                ids = self.q_tok(text, add_special_tokens=False)["input_ids"]
                if ids:
                    return ids
            except Exception:  # the draft's template refuses a plain user turn: fall back to the text
                pass
        text = message if message is not None else self.p_tok.decode(prompt_ids, skip_special_tokens=True)
        ids = self.q_tok(text)["input_ids"]
        if ids:
            return ids
        first = getattr(self.q_tok, "bos_token_id", None)
        first = first if first is not None else getattr(self.q_tok, "eos_token_id", None)
        return [first if first is not None else 0]

    # --- the reply -----------------------------------------------------------------------------

    def reply_text(self, p_ids: list[int]) -> str:
        """The target's reply so far as text, without special tokens and without a character cut in half."""
        return self.p_tok.decode(p_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False).rstrip("\ufffd")

    def to_draft(self, text: str) -> list[int]:
        return self.q_tok(text, add_special_tokens=False)["input_ids"] if text else []

    def draft_text(self, q_ids: list[int]) -> str:
        return self.q_tok.decode(q_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def new_text(self, q_before: list[int], q_guess: list[int]) -> str:
        """What the draft's guess adds to its reply, as text (a trailing half character held back)."""
        before, after = self.draft_text(q_before), self.draft_text(q_before + q_guess)
        return after[len(before) :].rstrip("\ufffd") if after.startswith(before) else ""

    def to_target(self, p_ids: list[int], text: str) -> list[int]:
        """Target ids that continue `p_ids` (the text so far, prompt included) with `text`.

        The last WINDOW target tokens are decoded and encoded again together with the text; the tokens that
        start at the old end are the guess. Where the target would have merged its last token with the new
        text (its "Hel" + "lo"), the text is encoded on its own. [] when neither writes exactly `text`.
        """
        if not text:
            return []
        window = p_ids[-WINDOW:]
        head = self.p_tok.decode(window, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        enc = self.p_tok(head + text, add_special_tokens=False, return_offsets_mapping=True)
        cut, ids, offsets = len(head), enc["input_ids"], enc["offset_mapping"]
        start = next((i for i, (a, _) in enumerate(offsets) if a >= cut), len(ids))
        clean = start == 0 or offsets[start - 1][1] <= cut  # no token straddles the old end
        for guess in ([ids[start:]] if clean else []) + [self.p_tok(text, add_special_tokens=False)["input_ids"]]:
            whole = self.p_tok.decode(window + guess, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            if guess and whole == head + text:
                return guess
        return []

    def origins(self, p_ids: list[int], tokens: list[int], q_reply: list[int], q_guess: list[int]) -> tuple[str, ...]:
        """For each target token of a translated guess, the draft's own tokens whose text it covers ("▁Hel·lo")."""
        window = p_ids[-WINDOW:]

        def ends(decode, before: list[int], new: list[int]) -> list[int]:
            base = len(decode(before))
            return [len(decode(before + new[: i + 1])) - base for i in range(len(new))]

        p_decode = functools.partial(self.p_tok.decode, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        p_end, q_end = ends(p_decode, window, tokens), ends(self.draft_text, q_reply, q_guess)
        names = self.q_tok.convert_ids_to_tokens(q_guess)
        out, start = [], 0
        for end in p_end:
            mine = [n for n, a, b in zip(names, [0, *q_end], q_end) if a < end and b > start]
            out.append("·".join(mine) or "∅")
            start = end
        return tuple(out)

    def shared(self, q_rows: int) -> SharedVocabulary:
        """The shared tokens (see `shared_vocabulary`), computed once per pair and draft size."""
        memo = self.__dict__.setdefault("_shared", {})
        if q_rows not in memo:
            memo[q_rows] = shared_vocabulary(self.p_tok, self.q_tok, q_rows)
        return memo[q_rows]

    # --- can it work at all --------------------------------------------------------------------

    def writable(self) -> tuple[float, str, str]:
        """The share of the target's tokens that the draft's tokenizer writes back unchanged, and one it cannot
        (its text, what came back). Tried: up to WRITABLE_SAMPLE tokens spread over the target's vocabulary, of
        those with visible text that the target's own tokenizer writes back (a byte of a character, say, is not),
        each after the letter "a" (SentencePiece-style decoders drop a space at the very start of a text)."""
        memo = self.__dict__.get("_writable")
        if memo is None:

            def p_round_trip(t: str) -> bool:
                ids = self.p_tok("a" + t, add_special_tokens=False)["input_ids"]
                return self.p_tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) == "a" + t

            texts = [t for _, t in sorted(token_text(self.p_tok).items()) if t.strip() and t.isprintable()]
            spread = texts[:: max(1, len(texts) // WRITABLE_SAMPLE)]
            sample = [t for t in spread if p_round_trip(t)][:WRITABLE_SAMPLE]
            miss, ok = ("", ""), 0
            for t in sample:
                back = self.draft_text(self.to_draft("a" + t))[1:]  # after a letter: a leading space is kept
                ok += back == t
                miss = miss if back == t or miss[0] else (t, back)
            memo = self.__dict__["_writable"] = (ok / len(sample) if sample else 0.0, *miss)
        return memo

    def gap(self, p_name: str, q_name: str, shared: SharedVocabulary) -> str | None:
        """Why this draft's guesses cannot be translated for this target, in one sentence; None when they can."""
        try:
            share, text, back = self.writable()
        except Exception:  # a tokenizer that cannot decode (or encode) ordinary text
            return f"The draft {q_name}'s tokenizer cannot turn text into tokens and back, so its guesses cannot be translated for {p_name}."
        if share < MIN_WRITABLE:
            return (
                f"The draft {q_name}'s tokenizer writes back only {share:.0%} of the target's tokens ({text!r} comes "
                f"back as {back!r}), so its guesses cannot be translated for the target {p_name}."
            )
        if not len(shared.p_ids):
            return (
                f"The draft {q_name} and the target {p_name} share no token at all, "
                "so the draft's guesses cannot be aligned with the target's."
            )
        return None


def sampling_method(shared: SharedVocabulary) -> str:
    """The exact way to sample (T > 0) for a pair: the intersection where enough of the draft's vocabulary is
    shared (q then keeps most of its mass), else "match"."""
    return "intersection" if shared.draft_share >= MIN_SHARED else "match"


# --- do two tokenizers give every id the same meaning --------------------------------------------


@dataclass(frozen=True)
class TokenizerCheck:
    """Token ids compared one by one over the smaller tokenizer, added tokens included."""

    target_size: int  # len(tokenizer): every id it can produce
    draft_size: int
    compared: int
    mismatches: int  # ids whose token differs, or that only the larger tokenizer has among the compared
    examples: tuple[tuple[int, str | None, str | None], ...]  # (id, target token, draft token), a few
    special_tokens: tuple[tuple[str, str | None, str | None], ...]  # (name, target, draft) where they differ
    chat_template_same: bool
    target_has_chat_template: bool
    draft_has_chat_template: bool

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatches / self.compared if self.compared else 1.0

    @property
    def compatible(self) -> bool:
        return self.compared > 0 and self.mismatch_fraction <= MAX_MISMATCH_FRACTION


def _id_to_token(tok) -> dict[int, str]:
    return {int(i): t for t, i in tok.get_vocab().items()}


def compare_tokenizers(target_tok, draft_tok, n_examples: int = 5) -> TokenizerCheck:
    """Compare id -> token for every id of the smaller tokenizer (not just vocab_size: added tokens count)."""
    p_ids, q_ids = _id_to_token(target_tok), _id_to_token(draft_tok)
    small = p_ids if len(p_ids) <= len(q_ids) else q_ids
    bad = sorted(i for i in small if p_ids.get(i) != q_ids.get(i))
    examples = tuple((i, p_ids.get(i), q_ids.get(i)) for i in bad[:n_examples])
    specials = tuple(
        (name, getattr(target_tok, name, None), getattr(draft_tok, name, None))
        for name in SPECIAL_TOKENS
        if getattr(target_tok, name, None) != getattr(draft_tok, name, None)
    )
    p_tpl, q_tpl = getattr(target_tok, "chat_template", None), getattr(draft_tok, "chat_template", None)
    return TokenizerCheck(
        len(p_ids), len(q_ids), len(small), len(bad), examples, specials, p_tpl == q_tpl, bool(p_tpl), bool(q_tpl)
    )


# --- one translator per pair of tokenizers -------------------------------------------------------

_SAME: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # p tokenizer -> {q tokenizer: same or not}
_TRANSLATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # q tokenizer -> {p tokenizer: Translator}


def same_tokenizer(p_tok, q_tok) -> bool:
    """Whether every token id means the same token to both (the pair check's rule: at most 1% of ids differ)."""
    if p_tok is q_tok:
        return True
    known = _SAME.setdefault(p_tok, weakref.WeakKeyDictionary())
    if q_tok not in known:
        known[q_tok] = compare_tokenizers(p_tok, q_tok).compatible
    return known[q_tok]


def translator(p_tok, q_tok) -> Translator:
    known = _TRANSLATORS.setdefault(q_tok, weakref.WeakKeyDictionary())
    if p_tok not in known:
        known[p_tok] = Translator(p_tok, q_tok)
    return known[p_tok]


def needs_translation(p, q) -> bool:
    """Whether the draft q (a LoadedModel) writes other token ids than the target p: a trimmed draft never does."""
    return q.vocab_map is None and not same_tokenizer(p.tokenizer, q.tokenizer)


def draft_ids(p, q, prompt_ids: list[int]) -> list[int]:
    """The draft's own ids for the target's prompt (the same ids when they share a tokenizer)."""
    return translator(p.tokenizer, q.tokenizer).draft_prompt(prompt_ids) if needs_translation(p, q) else prompt_ids
