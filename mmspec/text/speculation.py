"""`TextSpeculation`: the decoding component of speculative text generation, which `SpeculativeTextPipeline` holds
and saves; called with the target (and the draft model, for `drafter="model"`) it runs `speculative_generate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from mmspec.core.acceptance import Acceptance, Exact
from mmspec.core.component import DecodingComponent, StepHook
from mmspec.core.tree_growth import TreeShape
from mmspec.options import DRAFTER_SETTINGS, SCHEDULES, TEXT_DRAFTERS, TREE_DRAFTERS
from mmspec.text.drafters import DraftLengthSchedule, LayerSkipDrafter, ModelDrafter, NGramDrafter
from mmspec.text.generate import speculative_generate
from mmspec.text.stats import TextStats
from mmspec.text.tree_drafters import ModelTreeDrafter, StandDrafter


@dataclass(frozen=True)
class TextSpeculation(DecodingComponent):
    """Draft, verify in one target forward, keep the accepted prefix: `speculative_generate` with a drafter by name.

    drafter: `"model"` (the pipeline's draft LM, sharing the tokenizer), `"layerskip"` (the target's first
    `exit_layer` layers; default: the target config's `early_exit_layer`), `"ngram"` (prompt lookup over the row's
    own text, n-grams of `max_ngram` tokens down to 1), or a tree drafter: `"tree"` (the draft LM's tree, verified
    by RSD: the full tree, `tree_branching` children without replacement per node to depth `tree_depth`; or, given
    `tree_rates`, the rates at which walks accept a node's k-th child (`stats.child_acceptance` of a run with a wide
    tree), the fixed tree of `tree_nodes` nodes built for them, `TreeShape.positional`) or `"stand"` (STAND's
    n-gram memory of the target's own laws, no draft model). draft_length: tokens drafted per target
    forward; schedule: `"constant"`, or `"heuristic"` (transformers' +2 after a fully accepted draft, else -1).
    confidence_threshold: a model / layer-skip row stops drafting after a token whose draft probability is below it
    (0 = never). acceptance: `Exact()` (lossless) or, for chains, `Typical(epsilon, delta)` (lossy), or its name. A
    setting its drafter does not read is refused, not ignored.
    """

    name: ClassVar[str] = "speculative"
    modality: ClassVar[str] = "text"
    drafter: str = "model"
    draft_length: int = 4
    schedule: str = "constant"
    confidence_threshold: float = 0.0
    exit_layer: int | None = None
    max_ngram: int = 3
    tree_depth: int = 4
    tree_branching: int = 2
    tree_rates: tuple[float, ...] | None = None
    tree_nodes: int = 30
    acceptance: Acceptance = Exact()

    def __post_init__(self):
        self.check_choice("drafter", TEXT_DRAFTERS)
        self.check_count("draft_length", "tokens drafted per target forward")
        self.check_choice("schedule", SCHEDULES)
        if isinstance(self.confidence_threshold, bool) or not isinstance(self.confidence_threshold, (int, float)) or (
                not 0 <= self.confidence_threshold < 1):
            raise ValueError(f"confidence_threshold must be a number in [0, 1), got {self.confidence_threshold!r}")
        if self.exit_layer is not None:
            self.check_count("exit_layer", "target layers the draft runs")
        self.check_count("max_ngram", "tokens of the longest n-gram looked up")
        self.check_count("tree_depth", "levels of the draft tree")
        self.check_count("tree_branching", "children per tree node")
        self.check_count("tree_nodes", "nodes of the positional tree")
        self._check_tree_rates()

        for setting, drafters in DRAFTER_SETTINGS.items():
            if getattr(self, setting) != type(self).__dataclass_fields__[setting].default and (
                    self.drafter not in drafters):
                raise ValueError(f"{setting} applies to drafter {' / '.join(map(repr, drafters))}, not "
                                 f"{self.drafter!r}")
        super().__post_init__()
        if self.drafter in TREE_DRAFTERS and not self.acceptance.lossless:
            raise ValueError(f"acceptance={self.acceptance.name!r} is for chain drafters; drafter={self.drafter!r} "
                             "is verified by exact tree rules")

    def _check_tree_rates(self) -> None:
        """tree_rates (a list once loaded from JSON) as a tuple, checked by building the tree; the full tree's
        settings refused with it, tree_nodes refused without it."""
        defaults = type(self).__dataclass_fields__
        if self.tree_rates is None:
            if self.tree_nodes != defaults["tree_nodes"].default:
                raise ValueError("tree_nodes applies with tree_rates (a positional tree); the full tree is "
                                 "tree_depth x tree_branching")
            return
        if isinstance(self.tree_rates, (str, bytes)) or not hasattr(self.tree_rates, "__iter__"):
            raise TypeError(f"tree_rates must be a sequence of probabilities, got {self.tree_rates!r}")
        object.__setattr__(self, "tree_rates", tuple(self.tree_rates))
        for setting in ("tree_depth", "tree_branching"):
            if getattr(self, setting) != defaults[setting].default:
                raise ValueError(f"{setting} sets the full tree; with tree_rates the tree is the positional one of "
                                 f"tree_nodes nodes")
        try:
            self.tree_shape()
        except (TypeError, ValueError) as error:
            raise ValueError(f"tree_rates: {error}") from None

    def tree_shape(self) -> TreeShape:
        """The draft LM's tree (drafter "tree")."""
        if self.tree_rates is None:
            return TreeShape.full(self.tree_depth, self.tree_branching)
        return TreeShape.positional(self.tree_nodes, self.tree_rates)

    @staticmethod
    def reads(drafter: str, settings: dict) -> bool:
        """Whether a `drafter` reads every one of `settings` (names of `TextSpeculation` fields)."""
        return all(drafter in DRAFTER_SETTINGS.get(setting, TEXT_DRAFTERS) for setting in settings)

    def make_drafter(self, target, draft=None):
        """The `Drafter` that `speculative_generate` asks (a new one per call: drafters hold per-batch state)."""
        if self.drafter == "model":
            if draft is None:
                raise ValueError("drafter='model' needs a draft model; this pipeline has none")
            return ModelDrafter(draft, confidence_threshold=self.confidence_threshold)
        if self.drafter == "tree":
            if draft is None:
                raise ValueError("drafter='tree' needs a draft model; this pipeline has none")
            return ModelTreeDrafter(draft, self.tree_shape())
        if self.drafter == "stand":
            return StandDrafter()
        if self.drafter == "layerskip":
            exit_layer = self.exit_layer or getattr(target.config, "early_exit_layer", None)
            if exit_layer is None:
                raise ValueError("drafter='layerskip' needs exit_layer: the target's config names no early_exit_layer")
            return LayerSkipDrafter(target, exit_layer, confidence_threshold=self.confidence_threshold)
        return NGramDrafter(max_ngram=self.max_ngram)

    def __call__(self, target, draft, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 on_step: StepHook | None = None, **options) -> tuple[torch.Tensor, TextStats]:
        """`speculative_generate(target, input_ids, attention_mask, ...)` with this drafter, draft length schedule and
        acceptance; `options` are its sampling and stopping arguments (max_new_tokens, temperature, top_k, top_p,
        eos_token_id, pad_token_id, generator)."""
        if self.drafter not in TREE_DRAFTERS:
            options["draft_length"] = DraftLengthSchedule(self.draft_length, kind=self.schedule)
        return speculative_generate(target, input_ids, attention_mask, drafter=self.make_drafter(target, draft),
                                    acceptance=self.acceptance, on_step=on_step, **options)

