"""The draft model itself (train_draft.py trains it): a transformers LlamaForCausalLM over the trimmed vocabulary,
built from the target where shapes allow (`build_draft`), or continued from an earlier draft (`start_from`), and the
folder the engine loads (`save_draft`).

`cfg` below is train_draft.TrainConfig (its shape fields, init_from_target and save_dtype).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def build_draft(target, target_ids: list[int], cfg):
    """A LlamaForCausalLM over the trimmed vocabulary, initialised from the target where shapes allow."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tc = target.config
    hidden = cfg.hidden or tc.hidden_size
    heads = cfg.heads or (tc.num_attention_heads if hidden == tc.hidden_size else max(1, hidden // 64))
    kv = cfg.kv_heads or (tc.num_key_value_heads if hidden == tc.hidden_size else heads)
    inter = cfg.intermediate or (tc.intermediate_size if hidden == tc.hidden_size else 4 * hidden)
    dc = LlamaConfig(
        vocab_size=len(target_ids),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=cfg.layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hidden // heads,
        max_position_embeddings=tc.max_position_embeddings,
        rms_norm_eps=tc.rms_norm_eps,
        rope_parameters=dict(tc.rope_parameters),
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        unk_token_id=0,
    )
    draft = LlamaForCausalLM(dc)
    rows = torch.tensor(target_ids)
    E = target.get_input_embeddings().weight.detach().float()  # (49152, H_p)
    with torch.no_grad():
        if hidden == tc.hidden_size:
            draft.model.embed_tokens.weight.copy_(E[rows])
        else:  # PCA: project the target's rows onto their top `hidden` directions, keep the target's scale
            X = E[rows] - E[rows].mean(0)
            _, _, V = torch.linalg.svd(X, full_matrices=False)  # V: (H_p, H_p)
            Z = X @ V[:hidden].T  # (N, hidden)
            draft.model.embed_tokens.weight.copy_(Z * (E[rows].std() / Z.std()))
        same = (hidden, heads, kv, inter) == (
            tc.hidden_size,
            tc.num_attention_heads,
            tc.num_key_value_heads,
            tc.intermediate_size,
        )
        if cfg.init_from_target and same:
            for i in range(min(cfg.layers, tc.num_hidden_layers)):
                draft.model.layers[i].load_state_dict(target.model.layers[i].state_dict())
            draft.model.norm.load_state_dict(target.model.norm.state_dict())
    draft.tie_weights()
    return draft


@torch.no_grad()
def start_from(draft, target_ids: list[int], folder: Path) -> None:
    """Copy an earlier draft into `draft`: every block and the norm, and the embedding rows of the target tokens
    both vocabularies have. Shapes must match. The rows of tokens the earlier draft lacked keep their init mapped
    by the least-squares linear fit of the shared rows' init to the earlier draft's rows: left as the target's
    rows they were about 8 % longer than trained ones, so the tied output layer gave the new tokens most of the
    probability and the first steps' loss was 7 (2.9 forty steps later).

    A draft with more blocks than the earlier one (more capacity, trained on): the extra blocks come after the
    earlier ones, each as `build_draft` left it (the target's block of that index where shapes allow) with its
    attention's and MLP's output projections zeroed, so it adds nothing to the residual stream and the grown draft
    starts out computing the earlier draft's guesses exactly; training then grows the blocks in."""
    from transformers import AutoModelForCausalLM

    old = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    old_ids = json.loads((folder / "specviz_vocab.json").read_text())["target_ids"]
    n_old, n_new = len(old.model.layers), len(draft.model.layers)
    if n_old > n_new:
        raise ValueError(f"{folder} has {n_old} blocks, more than this draft's {n_new}")
    state = {k: v for k, v in old.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    missing = draft.load_state_dict(state, strict=False).missing_keys
    grown = tuple(f"model.layers.{i}." for i in range(n_old, n_new))
    if [k for k in missing if "embed_tokens" not in k and "lm_head" not in k and not k.startswith(grown)]:
        raise ValueError(f"{folder} does not have this draft's shape")
    for block in draft.model.layers[n_old:]:
        block.self_attn.o_proj.weight.zero_()
        block.mlp.down_proj.weight.zero_()
    where = {t: i for i, t in enumerate(old_ids)}
    shared = [i for i, t in enumerate(target_ids) if t in where]
    fresh = [i for i, t in enumerate(target_ids) if t not in where]
    E = draft.model.embed_tokens.weight
    trained = old.model.embed_tokens.weight[[where[target_ids[i]] for i in shared]].float()
    if fresh and len(shared) > E.shape[1]:  # more shared rows than the width: the fit is determined
        fit = torch.linalg.lstsq(E[shared].float(), trained).solution  # (H, H): init row -> trained row
        E[fresh] = (E[fresh].float() @ fit).to(E.dtype)
    E[shared] = trained.to(E.dtype)
    draft.tie_weights()


def save_draft(draft, target_ids: list[int], blocked: list[int], target_dir: Path, out: Path, cfg, meta: dict) -> None:
    """Write the draft folder the engine loads; atomically (staged beside it, then renamed). blocked: the rows it
    never proposes (draft_rows.never_propose; row 0 doubles as the label of every target token outside the
    vocabulary, so it is always one)."""
    import copy

    stage = out.with_name(out.name + ".tmp")
    if stage.exists():
        shutil.rmtree(stage)
    model = copy.deepcopy(draft).to("cpu", dtype=getattr(torch, cfg.save_dtype))
    model.save_pretrained(stage)
    for name in TOKENIZER_FILES:
        if (target_dir / name).is_file():
            shutil.copy2(target_dir / name, stage / name)
    (stage / "specviz_vocab.json").write_text(json.dumps({"target_ids": target_ids, "never_propose": blocked}))
    (stage / "train_meta.json").write_text(json.dumps(meta, indent=1))
    if out.exists():
        shutil.rmtree(out)
    stage.rename(out)
