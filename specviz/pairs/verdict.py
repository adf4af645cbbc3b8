"""The pair check's findings in sentences: what the tokenizer comparison means for the pair, whether the
measured speedup is worth a second model, and whether a token tree pays on this machine.

Nothing here measures; each function turns numbers the check measured (pairs_measure.py) into reasons and warnings.
"""

from __future__ import annotations

from specviz.models.loaded import LoadedModel
from specviz.models.translate import TokenizerCheck
from specviz.pairs.measure import TreeTrial

MIN_SPEEDUP = 1.05  # below this a second model is not worth its memory and complexity
TREE_PAYS = 1.03  # a tree is recommended when it is expected at least 3% faster than the best chain


def _tok(s: str | None) -> str:
    return "nothing" if s is None else repr(s)


def tokenizer_findings(t: TokenizerCheck) -> tuple[list[str], list[str]]:
    """(reasons it is incompatible, warnings). A draft whose vocabulary cannot serve the target never gets here:
    check_pair refuses it first (models.vocab_gap), as load_pair does on every other path."""
    bad, warn = [], []
    if not t.compatible:
        i, p_tok, q_tok = t.examples[0] if t.examples else (None, None, None)
        eg = f"; e.g. id {i} is {_tok(p_tok)} for the target but {_tok(q_tok)} for the draft" if t.examples else ""
        bad.append(
            f"The tokenizers differ: {t.mismatches:,} of {t.compared:,} token ids ({t.mismatch_fraction:.1%}) "
            f"mean different tokens{eg}, so the target would misread every draft."
        )
    elif t.mismatches:
        ex = ", ".join(f"id {i}: {_tok(p)} vs {_tok(q)}" for i, p, q in t.examples)
        warn.append(f"{t.mismatches} token ids differ ({ex}); drafts of those tokens will be rejected.")
    if t.compatible and t.target_size != t.draft_size:
        side = "target" if t.target_size > t.draft_size else "draft"
        warn.append(
            f"The {side}'s tokenizer has {abs(t.target_size - t.draft_size):,} more tokens "
            f"({t.target_size:,} vs {t.draft_size:,}); the first {t.compared:,} agree."
        )
    for name, p_tok, q_tok in t.special_tokens:
        warn.append(
            f"The {name.replace('_', ' ')} differs: {_tok(p_tok)} for the target, {_tok(q_tok)} for the draft "
            "(decoding uses the target's)."
        )
    if not t.chat_template_same:
        if t.target_has_chat_template and t.draft_has_chat_template:
            what = "The chat templates differ"
        else:
            what = f"Only the {'target' if t.target_has_chat_template else 'draft'} has a chat template"
        warn.append(f"{what}; prompts are formatted with the target's, which may lower acceptance.")
    return bad, warn


def translation_findings(p: LoadedModel, q: LoadedModel, t: TokenizerCheck) -> tuple[list[str], list[str], dict]:
    """(reasons it cannot work, warnings, the report's translation fields) for a draft with another tokenizer."""
    from specviz.models.translate import METHODS, sampling_method, translator

    tr = translator(p.tokenizer, q.tokenizer)
    shared = tr.shared(q.vocab_size)
    gap = tr.gap(p.name, q.name, shared)
    m = sampling_method(shared)
    extra = dict(
        translation=f"text: {METHODS['text']}",
        sampling_translation=f"{m}: {METHODS[m]}",
        coverage=shared.coverage,
        draft_share=shared.draft_share,
    )
    warn = [
        f"The tokenizers differ ({t.mismatches:,} of {t.compared:,} token ids mean other tokens), so the draft's "
        f"guesses are translated through text: it has {shared.coverage:.0%} of the target's vocabulary by string "
        f"(after mapping the space marker), and {shared.draft_share:.0%} of its own tokens are the target's. "
        "Each model reads the prompt through its own chat template."
    ]
    return ([gap] if gap else []), warn, extra


def worth_verdict(a: float, c: float, best_gamma: int, best: float, translated: bool = False) -> tuple[str, list[str]]:
    if best >= MIN_SPEEDUP:
        how = (
            "The draft's guesses are translated from its own tokens, and it"
            if translated
            else "The tokenizers match and the draft"
        )
        return "compatible", [
            f"{how} is expected to make greedy decoding {best:.2f}x faster "
            f"at gamma {best_gamma} (acceptance a = {a:.2f}, cost ratio c = {c:.2f})."
        ]
    why = []
    if a < 0.5:
        why.append(f"The draft agrees with the target too rarely: acceptance a = {a:.2f}, so most drafts are wasted.")
    if c > 0.5:
        why.append(f"The draft is too slow: one draft step costs {c:.2f} of a target step (c), eating the saving.")
    if not why:
        why.append(f"Acceptance a = {a:.2f} and cost ratio c = {c:.2f} together leave too little to gain.")
    why.append(
        f"The best expected speedup is {best:.2f}x (gamma {best_gamma}), below the {MIN_SPEEDUP}x "
        "that pays for a second model."
    )
    return "not worth it", why


def tree_advice(trials: tuple[TreeTrial, ...], best_chain: float, gamma: int, chain_tokens: float) -> str:
    """One sentence: does a token tree pay for this pair on this machine, and why (measured)."""
    t = max(trials, key=lambda x: x.speedup)
    ratio = t.speedup / best_chain if best_chain > 0 else float("nan")
    said = (
        f"a tree of {t.budget} nodes gives {t.tokens_per_call:.2f} tokens per target call against "
        f"{chain_tokens:.2f} for the best chain (gamma {gamma}), and its verify of {t.nodes_per_call + 1:.1f} positions costs "
        f"{t.verify_cost:.2f} plain steps here"
    )
    if ratio >= TREE_PAYS:
        return f"Token trees pay on this machine: {said}, so it is expected at {ratio:.2f}x the best chain (use tree={t.budget} or auto)."
    return (
        f"Token trees do not pay on this machine: {said}, so it is expected at {ratio:.2f}x the best chain; "
        "tree=auto (the default, with gamma auto) weighs each round's best tree against the best chain by these "
        "costs and runs the chain where the tree is not expected to be faster, and tree=off runs chains only."
    )
