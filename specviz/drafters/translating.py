"""The translating drafter: the "model" drafter for a draft with another tokenizer than the target's.

The draft reads and writes text, translated to and from the target's tokens (translate.py says how, and why each
method is exact). `translation_of` says in words which method a run uses.
"""

from __future__ import annotations

import time

import torch

from specviz.backends import eos_ids, open_run
from specviz.config import SamplingConfig, SpecvizError
from specviz.drafters.base import (
    STOP_CONFIDENCE,
    STOP_END,
    STOP_UNTRANSLATED,
    DraftContext,
    Drafter,
    Proposal,
    draw_guess,
    empty_proposal,
)
from specviz.models.loaded import LoadedModel
from specviz.sampling import scatter_rows, to_probs


class TranslatingDrafter(Drafter):
    """A draft model with another tokenizer than the target's: it reads the reply as text in its own tokens and
    its guesses are translated into the target's (translate.py says how, and why each method is exact).

    Its cache holds its own prompt (through its own chat template) and the reply re-encoded with its own
    tokenizer; before each proposal the reply is encoded again and the cache kept up to the longest common
    prefix of token ids (a rejected guess, or a reply it split otherwise, is dropped from there).
    """

    name = "model"
    chains_only = True  # its guesses are a line of text, translated: no token tree

    def __init__(self, draft: LoadedModel, target: LoadedModel, method: str | None = None):
        from specviz.models.translate import METHODS, translator

        if method is not None and method not in METHODS:
            raise SpecvizError(f"Unknown translation method {method!r}; use one of {', '.join(METHODS)}.")
        self.lm, self.target, self.method = draft, target, method  # method None: by the sampling settings
        self.tr = translator(target.tokenizer, draft.tokenizer)
        self.run = open_run(draft, draft.vocab_size)  # logits in its own vocabulary
        self.q_eos, self.p_eos = eos_ids(draft), _first_eos(target)
        tok = draft.tokenizer
        self.q_special = set(getattr(tok, "all_special_ids", ()) or ()) | set(
            getattr(tok, "added_tokens_decoder", {}) or ()
        )
        self.q_prompt: list[int] = []
        self.fed: list[int] = []  # its own ids in its cache, in order
        self.prompt_len = 0  # target tokens of the prompt
        self.translate_s = 0.0  # seconds spent encoding and decoding text (the pair check reports it)
        self._shared = None
        self._shared_map: tuple | None = None

    @property
    def calls(self) -> int:
        return self.run.calls

    @property
    def shared(self):
        """The vocabularies' shared tokens (translate.SharedVocabulary), built on first use."""
        if self._shared is None:
            self._shared = self.tr.shared(self.lm.vocab_size)
        return self._shared

    def method_for(self, sampling: SamplingConfig) -> str:
        """ "text" when greedy; at T > 0 "intersection" where enough of the draft's vocabulary is shared, else "match"."""
        from specviz.models.translate import sampling_method

        if self.method is not None:
            return self.method
        return "text" if sampling.greedy else sampling_method(self.shared)

    def begin(self, prompt_ids: list[int], hidden: torch.Tensor | None = None) -> None:
        t0 = time.perf_counter()
        self.q_prompt = self.tr.draft_prompt(list(prompt_ids))
        self.prompt_len = len(prompt_ids)
        self.translate_s += time.perf_counter() - t0
        self.run.prefill(torch.tensor(self.q_prompt, device=self.lm.device))
        self.fed = self.q_prompt[:-1]

    def _sync(self, seq: list[int]) -> list[int]:
        """Bring the cache in line with the reply in `seq`; return its own ids for prompt + reply."""
        t0 = time.perf_counter()
        want = self.q_prompt + self.tr.to_draft(self.tr.reply_text(seq[self.prompt_len :]))
        self.translate_s += time.perf_counter() - t0
        keep = 0
        for a, b in zip(self.fed, want[:-1]):  # at least one token is fed: its logits guess the next
            if a != b:
                break
            keep += 1
        self.run.rollback(keep)
        self.fed = want[:keep]
        return want

    def _feed(self, ids: list[int]) -> torch.Tensor:
        """Feed its own ids; (Vq,) logits after the last."""
        self.fed += ids
        return self.run.feed(torch.tensor(ids, device=self.lm.device), last_only=True)[-1]

    def propose(self, seq: list[int], ctx: DraftContext) -> Proposal:
        k, why = ctx.k_for(self.name)
        if k == 0:
            return empty_proposal(ctx, 0, why)
        want = self._sync(seq)
        logits = self._feed(want[len(self.fed) :])  # (Vq,)
        if self.method_for(ctx.sampling) == "intersection":
            return self._propose_shared(logits, k, why, ctx)
        guess, stop, ended = [], why, False
        for i in range(k):
            x = draw_guess(logits, ctx)
            if x is None:
                stop = STOP_CONFIDENCE
                break
            x = int(x)
            if x in self.q_eos or x in self.q_special:  # its end of turn becomes the target's; other specials end it
                ended, stop = x in self.q_eos, STOP_END
                break
            guess.append(x)
            if i + 1 < k:
                logits = self._feed([x])
        t0 = time.perf_counter()
        reply = want[len(self.q_prompt) :]
        text = self.tr.new_text(reply, guess)
        tokens = self.tr.to_target(seq, text)[:k]
        origins = self.tr.origins(seq, tokens, reply, guess) if tokens else ()
        if ended and self.p_eos is not None and len(tokens) < k and (tokens or not guess):
            tokens.append(self.p_eos)
            origins += ("(the draft's end of turn)",)
        self.translate_s += time.perf_counter() - t0
        if guess and not tokens:
            stop = STOP_UNTRANSLATED
        t = torch.tensor(tokens, dtype=torch.long, device=ctx.device)
        q = torch.nn.functional.one_hot(t, ctx.V).float() if ctx.need_q else None  # (m, V) point masses: exact
        return Proposal(t, q, (self.name,) * len(tokens), k, stop, origins=origins)

    def _propose_shared(self, logits: torch.Tensor, k: int, why: str, ctx: DraftContext) -> Proposal:
        """The token-level intersection: q over the shared tokens only, scattered into the target's ids."""
        rows, ids, back = self._intersection(logits.device)
        tokens, q_rows, origins, stop = [], [], [], why
        for i in range(k):
            row = scatter_rows(logits[rows][None].float(), ids, ctx.V)[0].to(ctx.device)  # (V,) -inf off the shared
            x = draw_guess(row, ctx)
            if x is None:
                stop = STOP_CONFIDENCE
                break
            tokens.append(int(x))
            q_rows.append(row)
            own = back[int(x)]
            origins.append(self.lm.tokenizer.convert_ids_to_tokens(own))
            if own in self.q_eos:
                stop = STOP_END
                break
            if i + 1 < k:
                logits = self._feed([own])
        t = torch.tensor(tokens, dtype=torch.long, device=ctx.device)
        q = to_probs(torch.stack(q_rows), ctx.sampling) if q_rows and ctx.need_q else None  # (m, V)
        return Proposal(t, q, (self.name,) * len(tokens), k, stop, tuple(q_rows), origins=tuple(origins))

    def _intersection(self, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, dict[int, int]]:
        """(draft rows, their target ids, target id -> draft row) of the shared tokens, its end of turn mapped to
        the target's; built once per run."""
        if self._shared_map is None:
            shared = self.shared
            rows, ids = shared.q_rows.tolist(), shared.p_ids.tolist()
            eos_row = next((r for r in sorted(self.q_eos) if r < self.lm.vocab_size), None)
            if self.p_eos is not None and eos_row is not None and self.p_eos not in ids:
                rows, ids = rows + [eos_row], ids + [self.p_eos]
            self._shared_map = (torch.tensor(rows, device=dev), torch.tensor(ids, device=dev), dict(zip(ids, rows)))
        return self._shared_map


def _first_eos(lm: LoadedModel) -> int | None:
    """The token a model ends its turn with: its tokenizer's EOS when that is one of its stop tokens, else the
    smallest of them."""
    ids = eos_ids(lm)
    e = getattr(lm.tokenizer, "eos_token_id", None)
    return e if e in ids else min(ids) if ids else None


def translation_of(drafter: Drafter, sampling: SamplingConfig) -> str:
    """In words, how a translating drafter (alone or inside lookup+model) turns guesses into the target's tokens
    at these sampling settings; "" for a drafter with the target's own tokenizer."""
    from specviz.models.translate import METHODS

    inner = getattr(drafter, "model", drafter)
    if not isinstance(inner, TranslatingDrafter):
        return ""
    return f"{inner.method_for(sampling)}: {METHODS[inner.method_for(sampling)]}"
