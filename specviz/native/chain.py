"""A lean draft's guesses for a round in one native call (csrc/chain.c).

`ModelDrafter.propose` calls the draft once per guess, each fed the token the last one chose: at T = 0
`CachedModel.next_greedy` (the argmax), at T > 0 `feed` and `drafters_base.draw` (a draw from the softmax). For a
lean draft whose output layer is cut to the rows it proposes (the built-in one: `LeanLlama.skip_rows`) that loop is
`greedy_chain` or `sampled_chain` here: the same llama.c calls, the same argmax or the same draw from the same
uniforms, so the same tokens and the same cache, with the Python between calls (a large share of a small draft's
step) gone.
"""

from __future__ import annotations

import ctypes
import threading

import torch
import torch.nn.functional as F

from specviz.config import SpecvizError
from specviz.host import cpus
from specviz.native import library as native
from specviz.sampling import BROKEN


def _memo(owner, name: str, key, make):
    """What `make()` returns, kept on `owner` as `name` beside the `key` it was made for (the lean forward's kept
    output rows, or a model's input map), and made again where the key is another object."""
    made = getattr(owner, name, None)
    if made is None or made[0] is not key:
        made = (key, make())
        setattr(owner, name, made)
    return made[1]


def next_rows(lm) -> torch.Tensor:
    """(kept,) int64: for each row of the draft's cut output layer, the input row its token is fed as next (the
    token's target id as `CachedModel._forward` maps it: LoadedModel.rows_of); made once per cut output layer."""
    lean = lm.lean
    return _memo(
        lean, "_chain_rows", lean.kept, lambda: lm.rows_of(lm.vocab_map[lean.kept]).to(torch.long).contiguous()
    )


def kept_ids(lm) -> torch.Tensor | None:
    """(kept,) the target ids of a lean draft's cut output layer's rows, in their order (what a chain's argmax picks
    among); None without a cut output layer."""
    lean = lm.lean
    if lean is None or lean.kept is None or lm.vocab_map is None:
        return None
    return lm.vocab_map[lean.kept]


def proposal_order(lm) -> torch.Tensor | None:
    """(kept,) int64: the output rows in the order of the target ids they propose (`LoadedModel.proposable`, the
    order `draw` reads its probabilities and draws in), or None where those are not the same ids or there is no cut
    output layer; made once per cut output layer."""
    lean = lm.lean
    if lean is None or lean.kept is None or lm.vocab_map is None:
        return None

    def make():
        ids = lm.vocab_map[lean.kept]
        order = torch.argsort(ids, stable=True)
        same = lm.proposable is not None and torch.equal(ids[order], lm.proposable.to(ids.device))
        return order.contiguous() if same else None

    return _memo(lean, "_chain_order", lean.kept, make)


def _fits(lean, L: int) -> bool:
    """Whether llama_chain and llama_tree_read take a first call of L tokens over this draft's embedding."""
    embed = lean.embed
    return 1 <= L <= native.MAX_ROWS and embed.is_contiguous() and embed.dtype in (torch.float32, torch.float16)


def _forward_args(lean, cache, x: torch.Tensor, base: int, hn: torch.Tensor, logits: torch.Tensor) -> list:
    """The arguments llama_chain and llama_tree_read share, in their order: the forward's (x (L, H) at cache row
    base), the threads, then the embedding table and whether it is float16."""
    embed = lean.embed
    args = [*lean._layer_args, x.data_ptr(), x.shape[0], cache.k.data_ptr(), cache.v.data_ptr(), cache.k.shape[2]]
    args += [base, lean.cos.data_ptr(), lean.sin.data_ptr(), *lean._head_args, hn.data_ptr(), logits.data_ptr()]
    return args + [cpus.threads(), embed.data_ptr(), int(embed.dtype == torch.float16)]


def _run(lm, cache, ids: torch.Tensor, k: int, sampled: tuple | None, mix: tuple | None = None):
    """The chain's call (llama_chain): the output rows chosen (k,), or None where it cannot run here. sampled: (1 / T,
    uniforms (k,) float64, proposal_order, scores out (k, kept), probabilities out (k, kept)); None: greedy. mix
    (greedy only): (m (kept,) float32 contiguous, keep): the first guess is the argmax of keep * softmax + m."""
    lean = lm.lean
    if lean is None or lean.lib is None or lean.kept is None or lm.vocab_map is None:
        return None
    if not (_fits(lean, ids.numel()) and k >= 1):
        return None
    L, embed = ids.numel(), lean.embed
    x = F.embedding(lm.rows_of(ids.view(-1)), embed).float().contiguous()  # (L, H), overwritten
    base, end = cache.length, cache.length + L + k - 1
    cache.reserve(end)
    lean._rope(end)
    hn, logits = torch.empty(L, lean.H), torch.empty(lean.head.shape[0])
    out, table = torch.empty(k, dtype=torch.long), next_rows(lm)
    args = _forward_args(lean, cache, x, base, hn, logits) + [table.data_ptr(), k, out.data_ptr()]
    inv_t, *tensors = sampled or (0.0, None, None, None, None)  # greedy: no uniforms
    args += [inv_t, *(None if t is None else t.data_ptr() for t in tensors)]
    args += [None, 1.0] if mix is None else [mix[0].data_ptr(), float(mix[1])]
    made = lean.lib.llama_chain(*args)
    if made < 0:  # -3: no memory for a call's buffers (the out-of-memory sentence); -1 unreachable: checked above
        native.check(made, "the draft's chain")
    cache.length = base + L + made - 1
    if made < k or int(out[made - 1]) < 0:  # a call's scores were all NaN or -inf: greedy's and draw's error
        raise SpecvizError(BROKEN)
    return out


def greedy_chain(lm, cache, ids: torch.Tensor, k: int, mix: tuple | None = None) -> torch.Tensor | None:
    """Feed `ids` (L,) (target ids) then each guess but the last; return the k guesses as (k,) target ids, or None
    where the chain cannot run here (no native library, no cut output layer, a call longer than llama.c's). mix:
    (m, keep), m (kept,) over the cut output layer's rows (`kept_ids` gives their target ids): the first guess is
    the argmax of keep * (the draft's probabilities at T = 1) + m (drafters_mix.py)."""
    if mix is not None:  # a mix has one float32 entry per kept row, or the caller's loop runs
        kept = lm.lean.kept if lm.lean is not None else None
        if kept is None or mix[0].shape != kept.shape or mix[0].dtype != torch.float32:
            return None
    out = _run(lm, cache, ids, k, None, mix)
    return None if out is None else lm.vocab_map[lm.lean.kept[out]]


def sampled_chain(lm, cache, ids: torch.Tensor, k: int, temperature: float, generator: torch.Generator):
    """`greedy_chain` at temperature T > 0, as `drafters_base.draw` draws (no top-k, no top-p: the caller loops
    for those): (the k guesses as (k,) target ids, their scores and the probabilities they were drawn from, each
    (k, n) over `lm.proposable`'s n ids in its order), or None where the chain cannot run here. Takes k uniforms
    from `generator`, as k draws would."""
    order = proposal_order(lm)
    if order is None:
        return None
    n, before = order.numel(), generator.get_state()
    u = torch.rand(k, generator=generator, dtype=torch.float64)  # what `sample` takes, one a draw, in turn
    s, p = torch.empty(k, n), torch.empty(k, n)
    out = _run(lm, cache, ids, k, (1.0 / temperature, u, order, s, p))
    if out is None:  # nothing ran: the uniforms go back, so the loop that runs instead draws the same ones
        generator.set_state(before)
        return None
    return lm.vocab_map[lm.lean.kept[out]], s, p


def tree_read(lm, cache, ids: torch.Tensor, pos0: int, seen: int, extra: list[int], n: int):
    """A token tree's read at T = 0 in one native call (llama_tree_read): feed `ids` (L,) (target ids) at the cache's
    next rows, positions pos0.. (seen >= 0: one tree node, L = 1, that sees the cache's first `seen` rows, the tree rows
    `extra` and itself; seen < 0: a plain call), and return the last token's n most likely proposals at T = 1 as
    (probabilities, target ids), largest first, each a list of n (0.0 and -1 past the rows above 0); or None where it
    cannot run here (no native library, no cut output layer whose rows are the ids it proposes, a call longer than
    llama.c's). The same numbers as `feed_tree` or `feed` then `to_probs` over `lm.proposable` and `topk` (a softmax
    summed in another order: the last bits of a probability may differ)."""
    lean = lm.lean
    if lean is None or lean.lib is None or proposal_order(lm) is None:
        return None
    L = ids.numel()
    if not (_fits(lean, L) and 0 <= n <= 16) or (seen >= 0 and L != 1):
        return None
    base = cache.length
    cache.reserve(base + L)
    lean._rope(pos0 + L)
    buf = _read_buffers(lean)
    to_row = _input_rows(lm)
    for i, t in enumerate(ids.view(-1).tolist()):  # LoadedModel.rows_of, from a list
        buf.rows[i] = t if to_row is None else to_row[min(t, len(to_row) - 1)]
    x, hn = buf.x[:L], buf.hn[:L]
    more = (ctypes.c_long * len(extra))(*extra) if extra else None
    args = _forward_args(lean, cache, x, base, hn, buf.logits) + [buf.rows, pos0, seen, more, len(extra), n]
    args += [buf.top_r, buf.top_p]
    made = lean.lib.llama_tree_read(*args)
    if made in (-1, -3):  # -3: no memory for the mask or the call (the out-of-memory sentence); -1 unreachable
        native.check(made, "the draft's tree read")
    cache.length = base + L
    if made == -2:  # every score NaN or -inf: greedy's and draw's error
        raise SpecvizError(BROKEN)
    target = _kept_list(lm)
    return buf.top_p[:n], [target[r] if r >= 0 else -1 for r in buf.top_r[:n]]


def _read_buffers(lean) -> threading.local:
    """This thread's buffers for `tree_read`'s calls on this lean forward, made once per thread: the residual stream x
    and the normed states hn (MAX_ROWS, H), the output layer's scores, the fed rows and the n best rows and
    probabilities (ctypes arrays: a read returns lists made from them). Making them for every read, with the fed ids
    mapped by a tensor index, was a visible share of a root read."""
    local = lean.__dict__.get("_read_local")
    if local is None:
        local = lean.__dict__.setdefault("_read_local", threading.local())
    if getattr(local, "x", None) is None or local.x.shape[1] != lean.H or local.logits.numel() != lean.head.shape[0]:
        local.x, local.hn = torch.empty(native.MAX_ROWS, lean.H), torch.empty(native.MAX_ROWS, lean.H)
        local.logits = torch.empty(lean.head.shape[0])
        local.rows = (ctypes.c_long * native.MAX_ROWS)()
        local.top_r, local.top_p = (ctypes.c_long * 16)(), (ctypes.c_float * 16)()
    return local


def _input_rows(lm) -> list[int] | None:
    """`LoadedModel.input_map` as a list (None: a model that reads target ids as they are), made once per map."""
    if lm.input_map is None:
        return None
    return _memo(lm, "_input_rows", lm.input_map, lm.input_map.tolist)


def _kept_list(lm) -> list[int]:
    """`kept_ids` as a Python list, made once per cut output layer: a read maps its n rows through it (indexing the
    V-wide tensor is most of a read's Python)."""
    return _memo(lm.lean, "_kept_list", lm.lean.kept, lambda: kept_ids(lm).tolist())
