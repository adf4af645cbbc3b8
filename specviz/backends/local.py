"""The engine's runtime: `CachedModel`, one loaded model with its own KV cache, through which every model call
of the engine, the drafters, the step-through, the pair check and the cost measurements goes; plain feeds, tree
feeds (`feed_tree` / `keep_path`), rollback, over the native forward or transformers' (forwards.py, chosen once per run).
`cache_kwargs` hands transformers a model's cache under the keyword its version takes. p is the target, q the draft.

The chat template's opening (the tokens every chat prompt of a model starts with: SmolLM2's system turn, 24 of a
short prompt's 35) is encoded once per process and model (`keep_opening`, called off every run's clock), and each
prefill that starts with it copies its cache rows instead of computing them again: a serving engine's prefix cache.
"""

from __future__ import annotations

import os
import time
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from specviz import sampling
from specviz.backends.forwards import cache_kwargs, forward_of  # noqa: F401 (cache_kwargs: importable from here)
from specviz.config import SamplingConfig, SpecvizError
from specviz.models.loaded import LoadedModel, chat_ids
from specviz.native import chain as lean_chain
from specviz.native import library as native


def fast_greedy(logits: torch.Tensor) -> torch.Tensor:
    """sampling.greedy's ids (the first index of each row's largest score, NaN never counting), by native.first_max
    where it runs (float32 scores on the CPU, csrc/greedy.c: no cleaned copy, no second pass), else by
    sampling.greedy itself; one sentence where a row has no score above -inf."""
    best = native.first_max(logits)
    if best is None:
        return sampling.greedy(logits)
    if best.numel() and int(best.min()) < 0:
        raise SpecvizError(sampling.BROKEN)
    return best


class CachedModel:
    """A loaded causal LM with its own KV cache, returning logits in the target's vocabulary (`V` wide).

    Every model call of the engine, the drafters, the step-through, the pair check and the cost measurements
    goes through here, so all of them compute the same numbers. `length` is the number of tokens in the cache.
    A backends.TargetRun whose `decides` is False: it returns all of p and the engine applies the rule.
    """

    decides = False

    def __init__(self, lm: LoadedModel, V: int):
        self.lm, self.V = lm, V
        self.fwd = forward_of(lm)  # the native forward or transformers' (forwards.py), chosen once
        self.cache = self.fwd.new_cache()
        self.length = 0
        self.calls = 0
        # rows fed as tree nodes (feed_tree): row -> (parent row, position); every other row r continues row r - 1
        self.tree_rows: dict[int, tuple[int, int]] = {}

    def prefill(self, prompt: torch.Tensor, hidden: bool = False) -> torch.Tensor | None:
        """Cache every prompt token but the last (which the first decoding call feeds); not a decoding call.
        With `hidden`, return the last hidden states of those positions (P - 1, H). A prompt that starts with the
        model's kept chat-template opening (`keep_opening`) copies that part's rows instead of computing them."""
        if prompt.numel() <= 1:
            return None
        keep_opening(self.lm, self.V)  # every prefill of the process the same way, whoever encodes first
        kept = _OPENINGS.get(self.fwd.key)
        n = kept.reused_by(prompt) if kept is not None and self.length == 0 else 0
        if n:
            kept.copy_into(self)
        h = None
        if prompt.numel() - 1 > n:
            h = self._forward(prompt[n:-1], last_only=not hidden, hidden=hidden)[1]
            self.calls -= 1
        if not hidden or not n:
            return h
        opening_h = kept.hidden_of(self)
        return opening_h if h is None else torch.cat([opening_h, h])

    def feed(self, ids: torch.Tensor, last_only: bool = False, hidden: bool = False):
        """ids (L,) -> logits (L or 1, V); the cache grows by L. With `hidden`, also the last hidden states (L, H)."""
        logits, h = self._forward(ids, last_only, hidden)
        logits = self.lm.to_target_logits(logits.float(), self.V)  # a float16 draft's too: p and q in float32
        return (logits, h) if hidden else logits

    def feed_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ids (L,); the last position's float32 logits over the target ids the model can propose, and those ids
        (None: all V, in order). The same law as `feed`'s V-wide row, whose other columns are -inf; a trimmed lean
        draft computes only its kept rows (as `next_greedy` does), and nothing V wide is built."""
        rows = lean_chain.kept_ids(self.lm)
        if rows is not None:
            return self._forward(ids, last_only=True, kept_only=True)[0][-1].float(), rows  # (kept,)
        return self.feed(ids, last_only=True)[-1], None

    def kept_ids(self) -> torch.Tensor | None:
        """The target ids of the output rows this model's forward computes, ascending; None where it computes all."""
        return lean_chain.kept_ids(self.lm)

    def next_greedy(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed ids (L,) and return the argmax next token as a (1,) target id.

        The argmax is taken in the model's own (maybe trimmed) vocabulary and mapped, so the V-wide logits are
        never built. Same token as greedy(feed(...)[-1]).
        """
        kept = self.fwd.kept
        if kept is not None and self.lm.vocab_map is not None:
            # the rows its output layer computes: every other row would be -inf
            logits = self._forward(ids, last_only=True, kept_only=True)[0][-1]  # (kept,)
            return self.lm.vocab_map[kept[fast_greedy(logits)]].view(1)
        logits = self._forward(ids, last_only=True)[0][-1]  # (Vm,)
        if self.lm.vocab_map is not None:
            return self.lm.vocab_map[fast_greedy(logits)].view(1)
        return fast_greedy(logits[: self.V]).view(1)  # a padded head: the extra rows never count

    def greedy_chain(self, ids: torch.Tensor, k: int, mix: tuple | None = None) -> torch.Tensor | None:
        """`next_greedy` k times, the first fed ids (L,), each later one the token the last chose: the k tokens as
        (k,) target ids, computed in one native call (lean_chain.py) with the same tokens and cache; None where
        that call cannot run (the caller loops next_greedy). mix: lean_chain.greedy_chain's (a mixed first guess)."""
        if self.tree_rows:
            return None
        return self._chained(ids, k, lean_chain.greedy_chain(self.lm, self.cache, ids, k, mix))

    def sampled_chain(self, ids: torch.Tensor, k: int, temperature: float, generator: torch.Generator):
        """`greedy_chain` at T > 0, drawing as `drafters_base.draw` does (lean_chain.sampled_chain): (the k guesses,
        their scores and the probabilities they were drawn from over `lm.proposable`), or None (the caller loops)."""
        if self.tree_rows:
            return None
        return self._chained(ids, k, lean_chain.sampled_chain(self.lm, self.cache, ids, k, temperature, generator))

    def _chained(self, ids: torch.Tensor, k: int, made):
        if made is not None:
            self.length += ids.numel() + k - 1  # the last token is never fed
            self.calls += k
        return made

    def tree_read(self, ids: torch.Tensor, parent: int | None, n: int) -> tuple[list[float], list[int]] | None:
        """A token tree's read at T = 0 in one native call, where this model has one (lean_chain.tree_read): with
        parent None ids (L,) fed as `feed` feeds them (a round's root), else one token continuing cache row `parent`
        as `feed_tree` feeds it; the last token's n likeliest proposals at T = 1 as (probabilities, target ids).
        None: nothing was fed (the caller feeds and reads as before)."""
        if parent is not None and (parent < 0 or ids.numel() != 1):
            return None
        base, tail = self.length, []
        if parent is None:
            seen, pos = -1, base
        else:
            row, tail = self._climb(parent)
            seen, pos = row + 1, self._pos(parent, base, []) + 1
        out = lean_chain.tree_read(self.lm, self.cache, ids, pos, seen, tail, n)
        if out is None:
            return None
        if parent is not None:
            self.tree_rows[base] = (parent, pos)
        self.length += ids.numel()
        self.calls += 1
        return out

    def feed_tree(self, ids: torch.Tensor, parents: list[int], hidden: bool = False):
        """Feed tokens that branch: token i continues cache row parents[i] (-1: none, the very start; row
        length + j is the j-th token of this call, so parents[i] < length + i). Each token sees only its own
        ancestry: the rows its parent saw and its parent; its position is its parent's plus one. One forward call,
        through a 4-D additive attention mask and explicit position ids. ids (L,) -> logits (L, V) (and the last
        hidden states (L, H) with `hidden`); the cache grows by L rows, kept apart until `keep_path`.
        """
        L, base = int(ids.numel()), self.length
        pos, lines = [], []  # per new token: its position, and the rows it sees (_line's form)
        for i, par in enumerate(parents):
            if not -1 <= par < base + i:
                raise ValueError(f"token {i} of a tree continues row {par}, which it cannot see")
            plain, rows = self._line(par, base, lines)
            pos.append(self._pos(par, base, pos) + 1)
            lines.append((plain, rows + [base + i]))
        # (L, base + L) additive: 0 where a token sees a row, -inf elsewhere (the lean forward's form; `_forward` makes
        # transformers' from it), built in NumPy, whose small operations cost a few microseconds where PyTorch's cost
        # tens, every round
        sees = np.zeros((L, base + L), dtype=bool)
        first = min(plain for plain, _ in lines)
        sees[:, :first] = True
        for i, (plain, rows) in enumerate(lines):
            sees[i, first:plain] = True
            sees[i, rows] = True
        mask = torch.from_numpy(np.where(sees, np.float32(0.0), np.float32(-np.inf))).to(self.lm.device)
        position_ids = torch.tensor([pos], device=self.lm.device)
        logits, h = self._forward(ids, False, hidden, mask=mask, position_ids=position_ids)
        for i, par in enumerate(parents):
            self.tree_rows[base + i] = (par, pos[i])
        logits = self.lm.to_target_logits(logits.float(), self.V)
        return (logits, h) if hidden else logits

    def _pos(self, row: int, base: int, new_pos: list[int]) -> int:
        """The position of a row (-1 for none): a tree row's own, a plain row's index."""
        if row >= base:
            return new_pos[row - base]
        return self.tree_rows[row][1] if row in self.tree_rows else row

    def _line(self, row: int, base: int, lines: list[tuple[int, list[int]]]) -> tuple[int, list[int]]:
        """The rows a token continuing `row` sees, `row` and everything `row` saw (nothing for -1), as (p, rows):
        the plain rows 0 .. p - 1, then the tree rows `rows`, oldest first."""
        if row >= base:
            return lines[row - base]  # the caller extends a copy
        row, tail = self._climb(row)
        return row + 1, tail[::-1]

    def _climb(self, row: int) -> tuple[int, list[int]]:
        """From a cached row up through the tree rows of earlier calls: (the plain row reached, the tree rows passed,
        nearest first)."""
        tail = []
        while row in self.tree_rows:
            tail.append(row)
            row = self.tree_rows[row][0]
        return row, tail

    def keep_path(self, prefix: int, rows: list[int]) -> None:
        """Keep the first `prefix` rows and then `rows` (a path of tree rows, each continuing the one before),
        moved into place; drop every other row. After this the cache is a plain sequence again."""
        want = list(range(prefix, prefix + len(rows)))
        for i, r in enumerate(rows):
            parent, pos = self.tree_rows.get(r, (r - 1, r))
            if pos != prefix + i or parent != (rows[i - 1] if i else prefix - 1):
                raise ValueError("keep_path needs a path that continues the kept prefix")
        if rows != want:  # gather the path's keys and values into place, in every layer
            idx = torch.tensor(want, dtype=torch.long, device=self.lm.device)
            src = torch.tensor(rows, dtype=torch.long, device=self.lm.device)
            self.fwd.move_rows(self.cache, src, idx)
        self.tree_rows = {}
        self.rollback(prefix + len(rows))

    @property
    def supports_trees(self) -> bool:
        """Whether `feed_tree` / `keep_path` work on this model's cache (plain full-attention layers only)."""
        return self.fwd.supports_trees(self.cache)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """sampling.greedy's ids, the fast way (`fast_greedy`)."""
        return fast_greedy(logits)

    def probs_at(self, logits: torch.Tensor, rows: list[int], cols: list[int]) -> list[float]:
        """sampling.probs_at's numbers, in one native call where it can (native.probs_at: each row's maximum and sum
        of exponentials, then only the chosen entries')."""
        known = native.probs_at(logits, rows, cols)
        return known if known is not None else sampling.probs_at(logits, rows, cols)

    def verify_note(self, s: SamplingConfig, plain: bool = False) -> str:
        """Nothing to say: p is computed here and the engine's rule decides, exactly, at any temperature."""
        return ""

    def run_stats(self, s: SamplingConfig, plain: bool = False) -> dict:
        """Nothing beyond the tally's counts."""
        return {}

    def _forward(
        self, ids: torch.Tensor, last_only: bool, hidden: bool = False, mask=None, position_ids=None, kept_only=False
    ):
        """ids (L,) -> (logits (L or 1, Vm) in the model's own vocabulary, last hidden states or None); kept_only:
        a native draft's logits over the rows its output layer computes (LeanLlama.forward)."""
        x = self.lm.rows_of(ids.view(1, -1))  # a trimmed draft: target ids -> its own rows
        if mask is None and self.tree_rows:
            raise RuntimeError("a plain feed after a tree feed: keep_path or rollback first")
        logits, h = self.fwd(self.cache, x, last_only, hidden, mask, position_ids, kept_only)
        self.length += x.shape[1]
        self.calls += 1
        return logits, h

    def rollback(self, keep: int) -> None:
        """Drop cached tokens past the first `keep`."""
        if keep < self.length:
            self.cache.crop(keep - self.length)  # transformers 5: a negative count of tokens to remove
            self.length = keep
            self.tree_rows = {r: v for r, v in self.tree_rows.items() if r < keep}


# --- the chat template's opening, encoded once per process and model ----------------------------------------------


@dataclass
class _Opening:
    """A model's chat-template opening and the cache rows (and last hidden states) its prefill wrote."""

    ids: list[int]
    rows: object  # the lean forward's (keys, values), (layers, kv heads, len(ids), head dim) each; a DynamicCache
    # (transformers' forward); None where there is no opening
    hidden: torch.Tensor | None  # (len(ids), H); None until a run asks for them (transformers' forward pays for them)

    def reused_by(self, prompt: torch.Tensor) -> int:
        """How many of the prompt's tokens these rows stand for: all of the opening where the prompt starts with it
        and has more to encode after it, else 0."""
        n = len(self.ids)
        return n if prompt.numel() - 1 >= n and prompt[:n].tolist() == self.ids else 0

    def hidden_of(self, run: CachedModel) -> torch.Tensor:
        """The opening's last hidden states (a drafter that reads the target's features asks), computed once."""
        if self.hidden is None:
            again = CachedModel(run.lm, run.V)
            self.hidden = again._forward(torch.tensor(self.ids, device=run.lm.device), True, hidden=True)[1]
        return self.hidden

    def copy_into(self, run: CachedModel) -> None:
        n = len(self.ids)
        run.cache = run.fwd.with_opening(run.cache, self.rows, n)
        run.length = n


_OPENINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a model's forward -> its _Opening


def _forward_key(lm: LoadedModel):
    """What computes a model's rows: its native forward where it has one (a draft's int8 variant is another one)."""
    return forward_of(lm).key


def opening_kept() -> bool:
    """SPECVIZ_KEEP_OPENING: "1" (default: the chat template's opening encoded once per process), "0" (every prefill
    encodes every token, as transformers' `generate` does; for comparing against it)."""
    return os.environ.get("SPECVIZ_KEEP_OPENING", "1").strip().lower() not in ("0", "false", "no", "off")


def opening_note(lm) -> str:
    """What a bench header and a recording say of `lm`'s prompt encoding."""
    if not isinstance(lm, LoadedModel):
        return "prompts encoded by the server"
    n = len(template_opening(lm))
    if n:
        return f"the chat template's first {n} tokens encoded once per process, then copied into each prefill"
    return "every prompt token encoded" + ("" if opening_kept() else " (SPECVIZ_KEEP_OPENING=0)")


def forget_openings() -> None:
    """Drop every kept opening: the next prefill of each model decides (SPECVIZ_KEEP_OPENING) and encodes anew."""
    _OPENINGS.clear()


def template_opening(lm: LoadedModel) -> list[int]:
    """The tokens every chat prompt of `lm` starts with (its chat template's system turn and the user turn's
    header: the ids different messages share), or [] where it has no template, the template refuses or
    SPECVIZ_KEEP_OPENING is 0."""
    if not opening_kept() or not getattr(lm.tokenizer, "chat_template", None):
        return []
    try:  # messages that start differently (a tokenizer may read two capitals alike, as <unk>)
        a, *others = [chat_ids(lm.tokenizer, m) for m in ("Hello", "world", "42")]
    except Exception:  # a template that wants other roles or arguments: nothing shared to keep
        return []
    n = 0
    while all(n < len(b) and a[n] == b[n] for b in others):
        n += 1
    return a[:n]


@torch.inference_mode()
def keep_opening(lm, V: int) -> float:
    """Encode `lm`'s chat-template opening once per process, for every later prefill of a prompt that starts with
    it to copy (a served target encodes its prompts on its server: nothing to keep). Seconds spent now, 0 when
    already kept; callers run it before a run's clock starts, as they measure costs."""
    if not isinstance(lm, LoadedModel) or _forward_key(lm) in _OPENINGS:
        return 0.0
    t0 = time.perf_counter()
    ids = template_opening(lm)
    rows, hidden = None, None
    if ids:
        run = CachedModel(lm, V)
        free = run.fwd.hidden_free  # the native forward's hidden states come free; transformers' cost extra: on demand
        _, hidden = run._forward(torch.tensor(ids, device=lm.device), last_only=True, hidden=free)
        rows = run.fwd.opening_rows(run.cache, len(ids))
    _OPENINGS[_forward_key(lm)] = _Opening(ids, rows, hidden)
    return time.perf_counter() - t0
