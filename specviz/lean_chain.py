"""A lean draft's greedy guesses for a round in one native call (csrc/chain.c).

`ModelDrafter.propose` at T = 0 with nothing else asked of it calls `CachedModel.next_greedy` k times, each fed the
token the last one chose. For a lean draft whose output layer is cut to the rows it proposes (the built-in one:
`LeanLlama.skip_rows`) that loop is `greedy_chain` here: the same llama.c calls and the same argmax, so the same
tokens and the same cache, with the Python between calls (about 0.4 ms a call on a 2-core Zen 1) gone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import cpus, native
from .config import SpecvizError
from .sampling import BROKEN


def next_rows(lm) -> torch.Tensor:
    """(kept,) int64: for each row of the draft's cut output layer, the input row its token is fed as next (the
    token's target id as `CachedModel._forward` maps it: LoadedModel.rows_of); kept on the lean forward beside the
    kept rows it was made for."""
    lean = lm.lean
    made = getattr(lean, "_chain_rows", None)
    if made is None or made[0] is not lean.kept:
        made = lean._chain_rows = (lean.kept, lm.rows_of(lm.vocab_map[lean.kept]).to(torch.long).contiguous())
    return made[1]


def greedy_chain(lm, cache, ids: torch.Tensor, k: int) -> torch.Tensor | None:
    """Feed `ids` (L,) (target ids) then each guess but the last; return the k guesses as (k,) target ids, or None
    where the chain cannot run here (no native library, no cut output layer, a call longer than llama.c's)."""
    lean = lm.lean
    if lean is None or lean.lib is None or lean.kept is None or lm.vocab_map is None:
        return None
    L, embed = ids.numel(), lean.embed
    if not (1 <= L <= native.MAX_ROWS and k >= 1 and embed.is_contiguous()):
        return None
    if embed.dtype not in (torch.float32, torch.float16):
        return None
    x = F.embedding(lm.rows_of(ids.view(-1)), embed).float().contiguous()  # (L, H), overwritten
    base, end = cache.length, cache.length + L + k - 1
    cache.reserve(end)
    lean._rope(end)
    hn, logits = torch.empty(L, lean.H), torch.empty(lean.head.shape[0])
    out, table = torch.empty(k, dtype=torch.long), next_rows(lm)
    made = lean.lib.llama_greedy_chain(
        *lean._layer_args,
        x.data_ptr(),
        L,
        cache.k.data_ptr(),
        cache.v.data_ptr(),
        cache.k.shape[2],
        base,
        lean.cos.data_ptr(),
        lean.sin.data_ptr(),
        *lean._head_args,
        hn.data_ptr(),
        logits.data_ptr(),
        cpus.threads(),
        embed.data_ptr(),
        int(embed.dtype == torch.float16),
        table.data_ptr(),
        k,
        out.data_ptr(),
    )
    if made < 0:
        raise RuntimeError("llama_greedy_chain refused its arguments")  # unreachable: checked above
    cache.length = base + L + made - 1
    if made < k or int(out[made - 1]) < 0:  # a call's scores were all NaN or -inf: greedy's error
        raise SpecvizError(BROKEN)
    return lm.vocab_map[lean.kept[out]]
