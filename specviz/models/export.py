"""A trimmed-vocabulary draft as an engine loads it: a standard transformers folder with the target's vocabulary.

A trimmed draft (specviz_vocab.json: row i of its output layer is target id target_ids[i]) has fewer output rows
than the target has ids, and vLLM, SGLang and llama.cpp need the two vocabularies to be the same size. The
export writes the same network with V rows:
- input embedding: row target_ids[i] is the draft's row i; every other id reads the draft's row 0, exactly as
  specviz feeds it (LoadedModel.input_map sends ids the draft lacks to row 0);
- output layer: row target_ids[i] is the draft's row i for each row it proposes; every other row (ids it lacks,
  and its never_propose rows) is the mean of the proposable rows. Its logit is then the mean of their logits, which
  is never above their largest, so drafting by argmax (vLLM's default draft_sample_method, llama.cpp, transformers
  greedy) proposes exactly what specviz's drafter proposes at temperature 0. Sampling the draft at T > 0 gives
  those rows a little probability: a wasted guess now and then, never a wrong token (the target verifies).
The output layer is untied from the input embedding, since their filled rows differ.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from specviz.config import BUILTIN_DRAFT, BUILTIN_TARGET, SpecvizError

EXPORT_NOTE = "specviz_export.json"  # what was exported from what, beside the weights
COPIED = ("chat_template.jinja", "generation_config.json", "MODEL_CARD.md")


def writable_folder(folder: str | Path) -> Path:
    """`folder` created if missing and proven writable, or one SpecvizError sentence; before anything is read."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise SpecvizError(f"{folder} is a file; give a folder to export the draft into.")
    if path.is_dir() and any(path.iterdir()) and not (path / EXPORT_NOTE).is_file():
        raise SpecvizError(f"The folder {folder} is not empty; give a new or empty folder (or an earlier export).")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as e:
        raise SpecvizError(f"The folder {folder} cannot be written: {e.strerror or e}.") from None
    return path


def full_vocabulary(
    embed: torch.Tensor, head: torch.Tensor, target_ids: torch.Tensor, blocked: torch.Tensor | None, V: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input embedding (V, H), output layer (V, H)) of the exported draft from a trimmed draft's (N, H) ones."""
    N = target_ids.numel()
    proposable = torch.ones(N, dtype=torch.bool)
    if blocked is not None:
        proposable[blocked] = False
    floor = head[proposable].double().mean(0).to(head.dtype)  # (H,) its logit: the mean of the proposable logits
    emb = embed[0].expand(V, -1).clone()  # (V, H): ids the draft lacks read its row 0
    emb[target_ids] = embed
    out = floor.expand(V, -1).clone()  # (V, H)
    out[target_ids[proposable]] = head[proposable]
    return emb, out


def export_draft(folder: str | Path, draft: str = BUILTIN_DRAFT, target: str | None = None) -> Path:
    """Write `draft` (a trimmed draft's folder; default the built-in one) with the target's full vocabulary into
    `folder`. The vocabulary size is the target's config's (`target`; default: the built-in target when the draft
    is the built-in one, else the size of the draft's own tokenizer). Returns the folder."""
    from specviz.models import hub

    path = writable_folder(folder)  # an unwritable folder is told before anything loads
    hub.locate(draft)
    source = Path(hub.resolve_source(draft))
    vocab_file = source / "specviz_vocab.json"
    if not vocab_file.is_file():
        raise SpecvizError(
            f"The draft {draft} has its full vocabulary already (no specviz_vocab.json); engines load its folder as it is."
        )
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    target = target or (BUILTIN_TARGET if draft == BUILTIN_DRAFT else None)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if target is not None:
        hub.locate(target)
        V = int(AutoConfig.from_pretrained(hub.resolve_source(target)).vocab_size)
    else:
        V = len(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(source)
    N = int(model.get_output_embeddings().weight.shape[0])
    target_ids, _, blocked = hub.load_vocab_map(draft, str(source), torch.device("cpu"), N)
    if int(target_ids.max()) >= V:
        raise SpecvizError(
            f"The draft {draft} proposes token id {int(target_ids.max()):,} and the target has only {V:,} ids."
        )
    with torch.no_grad():
        emb, out = full_vocabulary(
            model.get_input_embeddings().weight, model.get_output_embeddings().weight, target_ids, blocked, V
        )
        model.config.tie_word_embeddings = False
        model.config.vocab_size = V
        model.resize_token_embeddings(V, mean_resizing=False)  # new embedding matrices of V rows, untied (filled below)
        model.get_input_embeddings().weight.copy_(emb)
        model.set_output_embeddings(torch.nn.Linear(emb.shape[1], V, bias=False, dtype=out.dtype))
        model.get_output_embeddings().weight.copy_(out)
    try:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        for name in COPIED:
            if (source / name).is_file():
                shutil.copyfile(source / name, path / name)
        (path / EXPORT_NOTE).write_text(
            json.dumps({"draft": draft, "target_vocab_size": V, "kept_rows": N, "filled_rows": V - N}, indent=2)
        )
    except OSError as e:
        raise SpecvizError(f"The folder {folder} could not be written: {e.strerror or e}.") from None
    return path
