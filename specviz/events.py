"""The small, frozen events the engine yields; the UI, the CLI and the benchmark all read this stream.

A run yields one `Start`, then `Round`s (speculative) or `Step`s (autoregressive), then one `Done`.
Times are seconds of this run's own compute (`elapsed_s` is cumulative), so two runs interleaved in
one worker can still be drawn on a fair common clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

Kind = Literal["resampled", "bonus", "plain"]  # plain: nothing was proposed, the target took one step


@dataclass(frozen=True)
class Start:
    mode: Literal["spec", "ar"]
    prompt_ids: tuple[int, ...]
    gamma: int  # spec: the constant gamma, or the most a round may propose under the other policies
    temperature: float
    prefill_s: float  # time to encode the prompt (both models for spec)
    drafter: str = ""  # spec: model | lookup | lookup+model
    gamma_policy: str = ""  # spec: constant | heuristic | confidence | auto
    calibration_s: float = 0.0  # setup before the run, off its clock, once per model: auto's cost measurements, the
    # chat template's opening encoded (runtime.keep_opening)
    translation: str = ""  # a draft with another tokenizer: how its guesses become the target's tokens
    tree: str = ""  # spec: "" (chains), or the token trees' node budget: "auto" or a number
    # a served target (served.py): "served greedy" | "served exact" | "served approximate: top-20" | "served
    # engine sample" (the plain lane at T > 0); "" for a target run here
    verify: str = ""


@dataclass(frozen=True)
class Candidates:
    """Top candidates of p and q at one drafted position (only when SpecConfig.detail > 0)."""

    token_ids: tuple[int, ...]  # union of the top ids of p and q, sorted by p descending
    p: tuple[float, ...]
    q: tuple[float, ...]
    residual: tuple[float, ...]  # norm(max(0, p - q)) at these ids: where a correction would come from


@dataclass(frozen=True)
class TreeRound:
    """A round whose guesses formed a tree (one entry per node, parents before children), and the walk over it.

    The target checked every node in one call; the walk went from the root (the text's last token) into the
    kept child at each node, trying children in order (rank 0 first), and stopped at a node whose every child
    it turned down (the correction is then drawn from what is left of p there) or at a leaf (the bonus).
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]  # the parent node of each node; -1: the root
    ranks: tuple[int, ...]  # the node's place among its siblings: 0 the draft's first choice, 1 its second ...
    sources: tuple[str, ...]  # which drafter proposed each node
    p: tuple[float, ...]  # p(x) at the node's parent (read at T = 1 when decoding greedily)
    q: tuple[float, ...]  # q(x) the draft gave it (T = 1 when greedy; 1 for a point mass such as lookup's)
    accept_prob: tuple[
        float, ...
    ]  # min(1, p/q) as the walk tested it (after earlier siblings' rejections); NaN if untested
    r: tuple[float, ...]  # the draw that tested it; NaN if untested or greedy
    status: tuple[str, ...]  # "kept" | "rejected" | "" (never tested: the walk went elsewhere)
    path: tuple[int, ...]  # the kept nodes, root first: the accepted path

    @property
    def depths(self) -> tuple[int, ...]:
        """1 for the root's children, 2 for theirs ..."""
        d: list[int] = []
        for par in self.parents:
            d.append(1 if par < 0 else d[par] + 1)
        return tuple(d)


@dataclass(frozen=True)
class Round:
    """One draft/verify round of speculative decoding (one target forward call)."""

    index: int
    drafted: tuple[int, ...]  # the tokens proposed, in order (0 .. gamma of them)
    q: tuple[float, ...]  # q_i(x_i): the probability the draft gave its own proposal
    p: tuple[float, ...]  # p_i(x_i): the probability the target gives it
    accept_prob: tuple[float, ...]  # min(1, p_i / q_i)
    r: tuple[float, ...]  # the uniform draws (NaN where greedy: acceptance is then argmax equality)
    n: int  # how many proposals were accepted (the first n)
    correction: int  # the token the target adds: resampled at position n, or the bonus if n == gamma
    kind: Kind
    tokens: tuple[int, ...]  # what this round adds to the output: drafted[:n] + (correction,), cut at EOS/max
    draft_s: float
    verify_s: float
    elapsed_s: float  # cumulative compute of this run, prefill included
    draft_calls: int = 0  # forward calls of a draft model this round (catching up included); 0 for free guesses
    candidates: tuple[Candidates, ...] = field(default=())  # gamma + 1 entries when detail > 0
    sources: tuple[str, ...] = field(default=())  # which drafter proposed each token: "model" | "lookup"
    planned: int = 0  # the most tokens the gamma policy allowed this round
    stop: str = ""  # why the proposal ended where it did: gamma | budget | confidence | no match | match end
    origins: tuple[str, ...] = field(default=())  # a translated guess: the draft's own tokens behind each proposal
    # a tree round: every node and the walk (drafted, q, p, accept_prob, r then hold the walked line: the
    # accepted path, then the first child turned down where the walk stopped, if it stopped at a node with children)
    tree: TreeRound | None = None

    @property
    def proposed(self) -> int:
        """Tokens the target checked for this round's guesses: the tree's nodes, or the drafted tokens."""
        return len(self.tree.tokens) if self.tree is not None else len(self.drafted)

    @property
    def rejected(self) -> int | None:
        """The proposal the target turned down, if any."""
        return self.drafted[self.n] if self.n < len(self.drafted) else None


@dataclass(frozen=True)
class Step:
    """One token of plain autoregressive decoding (one target forward call)."""

    index: int
    token: int
    p: float  # probability the (tempered, filtered) target gave this token; 1.0 when greedy
    forward_s: float
    elapsed_s: float


@dataclass(frozen=True)
class Done:
    token_ids: tuple[int, ...]  # the new tokens
    finish_reason: Literal["eos", "length"]
    stats: dict  # the run's Tally.stats() (tally.py): new_tokens, target_calls, alpha ...; a served run's requests


Event = Union[Start, Round, Step, Done]
