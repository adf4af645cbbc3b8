"""What a speculative run needs before its first round, apart from the algorithm (engine.py): the drafter (with a
draft head read from disk where the drafter needs one), the gamma policy and the tree policy, and the costs the
`auto` ones are calibrated with (a verify of 1 .. k tokens and a draft step, timed once per loaded model here).
"""

from __future__ import annotations

from specviz.backends import Limits, limits_of
from specviz.config import TREE_AUTO_MAX, SpecConfig, SpecvizError
from specviz.drafters.lookup import never_copied
from specviz.drafters.model import Drafter, LookupDrafter, make_drafter
from specviz.drafters.policies import TreePolicy, make_policy
from specviz.engine.costs import calibration, draft_step_calibration, head_calibration, tree_read_calibration
from specviz.models.head import head_for
from specviz.models.loaded import LoadedModel
from specviz.models.translate import draft_ids


def make_run(
    target: LoadedModel, draft: LoadedModel | None, prompt_ids: list[int], cfg: SpecConfig, drafter: Drafter | None
):
    """The drafter and gamma policy of one run (auto measures the verify costs once per model first).

    Returns (drafter, gamma policy, tree policy or None, seconds spent measuring now).
    """
    V, limits = target.vocab_size, limits_of(target)
    check_limits(cfg, limits)
    lookup = lookup_options(cfg, target)
    head = head_for(target, cfg.head) if drafter is None and cfg.drafter.endswith("head") else None
    drafter = drafter or make_drafter(cfg.drafter, draft, V, head=head, target=target, **lookup)
    verify_s, step_s, next_s, read_s, spent, paid = [], 0.0, None, 0.0, 0.0, "model"
    chains_only = runs_chains(cfg, target, drafter)
    tree_auto = cfg.tree == "auto" and not chains_only
    if cfg.gamma_policy == "auto" or tree_auto:
        verify_s, spent = calibration(target, prompt_ids, max(cfg.gamma, TREE_AUTO_MAX if tree_auto else 0) + 1)
        mixed = head is not None and cfg.drafter.endswith("model+head")  # a first guess pays both (drafters_mix)
        if draft is not None and not isinstance(drafter, LookupDrafter) and (head is None or mixed):
            d_ids = draft_ids(target, draft, prompt_ids)  # draft steps, as a round pays them
            greedy = cfg.sampling.greedy and not cfg.detail  # the drafter's fast path (drafters.ModelDrafter)
            (step_s, next_s), spent_q = draft_step_calibration(target, draft, prompt_ids, d_ids, V, greedy)
            spent += spent_q
            if cfg.tree != "off" and not chains_only:  # and a tree node's read (what a tree's rate is priced with)
                (read_s,), spent_q = tree_read_calibration(draft, d_ids, V, greedy)
                spent += spent_q
        if head is not None:  # one head step, for its cost
            (head_s,), spent_q = head_calibration(head)
            spent += spent_q
            step_s, paid = (step_s + head_s, "model+head") if mixed else (head_s, "head")
    policy = make_policy(cfg.gamma_policy, cfg.gamma, cfg.confidence, verify_s[: cfg.gamma + 1], step_s, paid, next_s)
    tree = None
    if cfg.tree != "off" and not chains_only:
        tree = TreePolicy(None if tree_auto else cfg.tree, TREE_AUTO_MAX if tree_auto else cfg.tree, verify_s, read_s)
    return drafter, policy, tree, spent


def runs_chains(cfg: SpecConfig, target, drafter: Drafter) -> bool:
    """Whether a run asked for trees runs chains anyway (the race says so): a draft with another tokenizer guesses
    a line of text at a time; a served target has no tree-masked verify (a fixed budget is refused there,
    check_limits); and tree "auto" grows trees at temperature 0 only. At T > 0 its estimates do not hold: a round
    gives fewer tokens than expected and drafting costs more (the q rows every node then needs), so trees ran no
    faster than the chain; a fixed budget still grows them there."""
    no_tree_verify = not limits_of(target).tree_verify
    return drafter.chains_only or no_tree_verify or (cfg.tree == "auto" and not cfg.sampling.greedy)


def lookup_options(cfg: SpecConfig, target) -> dict:
    """The keywords prompt lookup is built with for a run of `cfg` on `target` (make_drafter's **lookup)."""
    return dict(
        prompt_lookup_num_tokens=cfg.prompt_lookup_num_tokens,
        max_matching_ngram_size=cfg.max_matching_ngram_size,
        never=never_copied(target),
    )


def check_limits(cfg: SpecConfig, limits: Limits) -> None:
    """One sentence for what `cfg` asks of a target that it cannot give (its Limits: hidden states, all of p, a
    tree-masked verify); nothing where it can give all of it."""
    if cfg.drafter.endswith("head") and not limits.hidden_states:
        raise SpecvizError(
            f"The head drafters read the target's hidden states, which {limits.what} does not send; "
            "use model, lookup or lookup+model."
        )
    if cfg.relaxed_w < 1.0 and not limits.all_of_p:
        raise SpecvizError(f"Relaxed verification needs all of p at every position, which {limits.what} does not send.")
    if cfg.tree not in ("off", "auto") and not limits.tree_verify:  # auto runs chains there
        raise SpecvizError(
            f"Token trees need a tree-masked verify, which {limits.what}'s API does not offer; use chains."
        )
