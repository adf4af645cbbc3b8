"""The benchmark's inputs: its prompt sets and the grid of speculative configurations it runs (CLI parsing included).

A configuration is a drafter x gamma x gamma policy x token tree; `Config.request` turns one into the run's
options (request.RunRequest), so every value is checked the way a run checks it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specviz.config import ASSETS, TREE_DRAFTERS, SpecvizError, tree_setting
from specviz.request import RunRequest

PROMPT_DIR = ASSETS / "prompts"
PROMPT_SETS = ("everyday", "stories", "code", "summarise", "grounded", "unseen")


def load_prompts(spec: str, limit: int = 0) -> list[str]:
    """A built-in set by name (everyday, stories, code, summarise, grounded, unseen) or a text file: one prompt per
    non-empty line, where a literal \\n stands for a line break (so a prompt can carry a pasted function or text)."""
    path = PROMPT_DIR / f"{spec}.txt" if spec in PROMPT_SETS else Path(spec).expanduser()
    if not path.is_file():
        raise SpecvizError(f"No prompt set {spec!r}: use one of {', '.join(PROMPT_SETS)} or a file path.")
    lines = path.read_text(encoding="utf-8").splitlines()
    prompts = [line.strip().replace("\\n", "\n") for line in lines if line.strip()]
    if not prompts:
        raise SpecvizError(f"The prompt file {path} has no prompts (one per line).")
    return prompts[:limit] if limit and limit > 0 else prompts


def parse_grid(text: str, kind: Callable[[str], float], name: str) -> list:
    try:
        values = [kind(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise SpecvizError(f"--{name} must be a comma-separated list of numbers, like 1,2,4.") from None
    if not values:
        raise SpecvizError(f"--{name} is empty.")
    return list(dict.fromkeys(values))


@dataclass(frozen=True)
class Config:
    """One speculative configuration of the grid."""

    drafter: str  # model | lookup | lookup+model
    gamma: int | str  # a number, or "auto"
    policy: str  # constant | heuristic | confidence | auto
    tree: int | str = "off"  # token trees: "off", a node budget, or "auto" (config.SpecConfig.tree)

    @property
    def label(self) -> str:
        g = f"gamma {self.gamma}" if self.policy == "constant" else f"{self.policy} ≤{self.gamma}"
        tree = "" if self.tree == "off" else f", tree {self.tree}"
        return f"{self.drafter}, {'auto' if self.gamma == 'auto' else g}{tree}"

    def request(self, base: RunRequest) -> RunRequest:
        """`base` (the run's other options) with this configuration's drafter, gamma, policy and tree."""
        policy = "auto" if self.gamma == "auto" else self.policy
        return base.replace(mode="spec", drafter=self.drafter, gamma=self.gamma, gamma_policy=policy, tree=self.tree)


def grid(
    gammas: Sequence,
    drafters: Sequence[str] = ("model",),
    policies: Sequence[str] = ("constant",),
    trees: Sequence = ("off",),
) -> list:
    """Every (drafter, gamma, policy, tree); gamma "auto" takes the auto policy alone, and trees go only to the
    drafters that grow them (config.TREE_DRAFTERS)."""
    out = []
    for d in drafters:
        for g in gammas:
            for pol in ("auto",) if g == "auto" else policies:
                for tree in trees if d in TREE_DRAFTERS else ("off",):
                    if Config(d, g, pol, tree) not in out:
                        out.append(Config(d, g, pol, tree))
    return out


def parse_trees(text: str) -> list:
    """--trees "off,4,8,auto" -> ["off", 4, 8, "auto"] (each checked as a run's tree is: config.tree_setting)."""
    return list(dict.fromkeys(tree_setting(v.strip()) for v in str(text).split(",") if v.strip())) or ["off"]


def parse_configs(text: str) -> list[Config]:
    """--configs "model:1,model:auto,lookup:auto,lookup+model:2:heuristic,model:auto:tree=8":
    drafter:gamma[:policy][:tree=N] each."""
    out = []
    for item in (x.strip() for x in str(text).split(",") if x.strip()):
        parts = item.split(":")
        tree = "off"
        if len(parts) > 2 and parts[-1].startswith("tree="):
            tree = tree_setting(parts.pop()[5:])
        if len(parts) not in (2, 3):
            raise SpecvizError(
                f"--configs items look like model:3, lookup:auto, model:6:confidence or model:auto:tree=8, not {item!r}."
            )
        gamma = "auto" if parts[1] == "auto" else parts[1]
        try:
            gamma = gamma if gamma == "auto" else int(gamma)
        except ValueError:
            raise SpecvizError(f"--configs: {parts[1]!r} is not a gamma (a whole number or auto).") from None
        policy = "auto" if gamma == "auto" else (parts[2] if len(parts) == 3 else "constant")
        out.append(Config(parts[0], gamma, policy, tree))
    for c in out:
        c.request(RunRequest())  # one sentence for an unknown drafter or policy, before loading
    return out
