"""A feature-level draft head (EAGLE: Li et al. 2024, arXiv 2401.15077) that guesses from the target's own features.

The target's feature f_t is its last hidden state at position t (after the final norm, so its logits are
E f_t). The head reads pairs (the embedding of token x_{t+1}, f_t) and predicts f_{t+1}; the target's own
output rows turn that into a guess for x_{t+2}:

    f^_{t+1} = norm(block(fc([e(x_{t+1}); f_t])))          logits_{t+2} = E[rows] f^_{t+1}

One Llama block (initialised from the target's last), a linear layer over the concatenation and a final
norm are the head's own weights (a few MB); the input embedding e and the output rows E are the target's,
read, never copied (one tensor when the target ties them, as SmolLM2 does), and the output uses only the
`target_ids` rows of E (a trimmed vocabulary, like the built-in draft's), so a guess costs about one target
block plus a 10k-row product.

At the first guess of a round the head uses the target's true feature of the last verified position; at
later guesses its own predicted one. Its KV cache holds only pairs built from true features: after each
verify it drops the guessed pairs and feeds the n + 1 new true features at the next proposal.

A head folder holds `specviz_head.json` (shape, rope, `target_ids`) and `head.safetensors`.
"""

from __future__ import annotations

import json
import threading
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specviz.config import SpecvizError

HEAD_CONFIG = "specviz_head.json"
HEAD_WEIGHTS = "head.safetensors"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class HeadCache:
    """Keys and values of the pairs fed so far: (1, kv_heads, S, head_dim) each."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else int(self.k.shape[2])

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def crop(self, keep: int) -> None:
        """Keep the first `keep` pairs."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :keep], self.v[:, :, :keep]


class DraftHead(nn.Module):
    """fc over [embedding; feature] -> one Llama block -> final norm: the predicted next feature."""

    def __init__(self, cfg: dict, embed: torch.Tensor, out: torch.Tensor):
        super().__init__()
        self.cfg = dict(cfg)
        H, I = cfg["hidden"], cfg["intermediate"]  # noqa: E741
        self.n_heads, self.n_kv, self.d = cfg["heads"], cfg["kv_heads"], H // cfg["heads"]
        self.eps, self.theta = cfg["eps"], cfg["rope_theta"]
        self.fc = nn.Linear(2 * H, H, bias=True)
        self.q = nn.Linear(H, self.n_heads * self.d, bias=False)
        self.k = nn.Linear(H, self.n_kv * self.d, bias=False)
        self.v = nn.Linear(H, self.n_kv * self.d, bias=False)
        self.o = nn.Linear(self.n_heads * self.d, H, bias=False)
        self.gate, self.up = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False)
        self.down = nn.Linear(I, H, bias=False)
        self.norm_in, self.norm_mid, self.norm_out = (nn.Parameter(torch.ones(H)) for _ in range(3))
        self.register_buffer("embed", embed, persistent=False)  # the target's input embedding (Vt, H), shared
        self.register_buffer("out", out, persistent=False)  # the target's output rows (Vt, H), shared
        ids = torch.tensor(cfg["target_ids"], dtype=torch.long, device=embed.device)
        self.register_buffer("target_ids", ids, persistent=False)  # row i of the output is target token ids[i]
        self._rows: torch.Tensor | None = None  # `rows`, once gathered
        inv = 1.0 / (self.theta ** (torch.arange(0, self.d, 2, dtype=torch.float32) / self.d))
        self.register_buffer("inv_freq", inv, persistent=False)

    @property
    def rows(self) -> torch.Tensor:
        """(N, H) the target's output rows the head may guess (gathered once when not training: a 10k-row gather
        per guess would cost as much as the head's block)."""
        if self.training:
            return self.out[self.target_ids]
        if self._rows is None:
            self._rows = self.out[self.target_ids]
        return self._rows

    def forward(
        self, tokens: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor, cache: HeadCache | None = None
    ) -> torch.Tensor:
        """tokens (B, L) target ids x_{t+1}, feats (B, L, H) f_t, positions (L,) of x_{t+1} -> f^_{t+1} (B, L, H).

        With a cache (B = 1) the pairs attend to every cached pair and causally among themselves."""
        x, q, k, v = self.pairs(tokens, feats, positions)
        L = x.shape[1]
        past = 0 if cache is None else cache.length
        if cache is not None:
            k, v = cache.append(k, v)
        mask = torch.ones(L, past + L, dtype=torch.bool, device=q.device).tril(past)  # pair i sees <= past + i
        return self.finish(x, self.attend(q, k, v, mask))

    def pairs(self, tokens: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor):
        """The block's input x = fc([e(x_{t+1}); f_t]) and its rotated queries, keys and values (B, heads, L, d)."""
        B, L, _ = feats.shape
        x = self.fc(torch.cat([self.embed[tokens].to(feats.dtype), feats], dim=-1))
        h = rms_norm(x, self.norm_in, self.eps)
        q = self.q(h).view(B, L, self.n_heads, self.d).transpose(1, 2)
        k = self.k(h).view(B, L, self.n_kv, self.d).transpose(1, 2)
        v = self.v(h).view(B, L, self.n_kv, self.d).transpose(1, 2)
        ang = positions.to(self.inv_freq.dtype)[:, None] * self.inv_freq  # (L, d/2)
        cos, sin = torch.cat([ang, ang], -1).cos().to(q.dtype), torch.cat([ang, ang], -1).sin().to(q.dtype)
        return x, q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Attention of q over (k, v) (grouped heads repeated) under a boolean mask (L, S): (B, heads, L, d)."""
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def finish(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The rest of the block after attention, then the final norm: the predicted features (B, L, H)."""
        B, L, _ = x.shape
        x = x + self.o(a.transpose(1, 2).reshape(B, L, -1))
        h = rms_norm(x, self.norm_mid, self.eps)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return rms_norm(x, self.norm_out, self.eps)

    def logits(self, f: torch.Tensor) -> torch.Tensor:
        """(..., H) features -> (..., N) logits over the head's rows."""
        return f @ self.rows.T.to(f.dtype)

    @classmethod
    def from_target(cls, target_model: nn.Module, target_ids: list[int]) -> DraftHead:
        """A new head shaped like `target_model`, its block, norm and fc initialised from the target: the fc
        starts as "read the feature" (the embedding half at zero), the block as the target's last one."""
        c = target_model.config
        H = c.hidden_size
        heads = c.num_attention_heads
        theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta") or getattr(c, "rope_theta", 10000.0)
        cfg = {
            "hidden": H,
            "heads": heads,
            "kv_heads": c.num_key_value_heads,
            "intermediate": c.intermediate_size,
            "eps": c.rms_norm_eps,
            "rope_theta": float(theta),
            "target_ids": list(map(int, target_ids)),
        }
        head = cls(
            cfg,
            target_model.get_input_embeddings().weight.detach(),
            target_model.get_output_embeddings().weight.detach(),
        )
        last = target_model.model.layers[-1]
        with torch.no_grad():
            head.fc.weight.zero_()
            head.fc.weight[:, H:] = torch.eye(H)
            head.fc.bias.zero_()
            for mine, theirs in (
                (head.q, last.self_attn.q_proj),
                (head.k, last.self_attn.k_proj),
                (head.v, last.self_attn.v_proj),
                (head.o, last.self_attn.o_proj),
                (head.gate, last.mlp.gate_proj),
                (head.up, last.mlp.up_proj),
                (head.down, last.mlp.down_proj),
            ):
                mine.weight.copy_(theirs.weight)
            head.norm_in.copy_(last.input_layernorm.weight)
            head.norm_mid.copy_(last.post_attention_layernorm.weight)
            head.norm_out.copy_(target_model.model.norm.weight)
        return head

    def save(self, folder: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()},
            str(folder / HEAD_WEIGHTS),
        )
        (folder / HEAD_CONFIG).write_text(json.dumps(self.cfg))


def is_head(folder: str | Path) -> bool:
    return (Path(folder) / HEAD_CONFIG).is_file()


def locate_head(folder: str | Path) -> None:
    """A head folder that is not one, as load_head's sentence, before any model loads ("" is the built-in head)."""
    if folder and not is_head(folder):
        raise SpecvizError(f"{folder} is not a draft head folder (it has no {HEAD_CONFIG}).")


def load_head(folder: str | Path, target) -> DraftHead:
    """The head in `folder` for `target` (a LoadedModel), on the target's device and dtype."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not is_head(folder):
        raise SpecvizError(f"{folder} is not a draft head folder (it has no {HEAD_CONFIG}).")
    cfg = json.loads((folder / HEAD_CONFIG).read_text())
    embed = target.model.get_input_embeddings().weight.detach()
    out = target.model.get_output_embeddings().weight.detach()
    if embed.shape[1] != cfg["hidden"] or max(cfg["target_ids"]) >= min(embed.shape[0], out.shape[0]):
        raise SpecvizError(f"The head in {folder.name} was made for another target (its width or vocabulary differs).")
    head = DraftHead(cfg, embed, out)
    head.load_state_dict(load_file(str(folder / HEAD_WEIGHTS)))
    return head.to(device=embed.device, dtype=embed.dtype).eval()


_LOADED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target model -> {folder: head}
_LOCK = threading.Lock()


def head_for(target, folder: str | Path = "") -> DraftHead:
    """The head for `target`: the one in `folder`, or with no folder the built-in head (built-in target only).
    Loaded once per (target, folder) and shared; it only reads the target's weights."""
    from specviz.config import BUILTIN_HEAD_DIR, BUILTIN_TARGET

    if not folder:
        if target.name != BUILTIN_TARGET or not is_head(BUILTIN_HEAD_DIR):
            raise SpecvizError(
                "There is no draft head for this target; give one with head=FOLDER, or pick another drafter."
            )
        folder = BUILTIN_HEAD_DIR
    key = str(Path(folder).expanduser().resolve())
    with _LOCK:
        heads = _LOADED.setdefault(target.model, {})
        if key not in heads:
            from specviz.native.head import native_head

            head = load_head(key, target)
            head.native = native_head(head, target)  # its forward by llama.c where that runs here, else None
            heads[key] = head
        return heads[key]


def head_backend(target, folder: str | Path = "") -> str:
    """How the head for `target` in `folder` (default: the built-in one) computes on this machine, in words, for
    the bench's header, recordings and the race's closing sentences (head_native.describe)."""
    from specviz.native.head import describe

    return describe(head_for(target, folder))
