"""`DraftHeads(...)`: speculative decoding with a draft head on the target's own features (EAGLE, Hydra), chains or
trees (full, EAGLE-2's dynamic or positional), exact or (chains) relaxed. The settings; the step is
`mmspec.image.draft_model.HeadStep`, on the feature-head proposer every modality shares
(`mmspec.core.head_drafting`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mmspec.core.head_kinds import HEAD_KINDS, check_head_tree, head_tree
from mmspec.core.registry import register_decoding
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import Exact
from mmspec.core.settings import runtime, setting
from mmspec.core.tree_shape import TreeShape
from mmspec.image.methods.base import DraftedTree, ImageDecoding


@register_decoding
@dataclass(frozen=True)
class DraftHeads(DraftedTree, ImageDecoding):
    """Speculative decoding with a head that drafts from the target's own features (EAGLE: one decoder layer; Hydra:
    sequentially dependent MLP heads), batched, with per-row acceptance. head: the head itself (pipelines supply
    the `kind` they ship, so it is not saved)."""

    name: ClassVar[str] = "heads"
    kind: str = setting("eagle", "which head drafts: 'eagle' (one decoder layer over the target's features) or "
                        "'hydra' (sequentially dependent MLP heads, at most their number of tokens)",
                        choices=HEAD_KINDS)
    draft_length: int = setting(4, "tokens drafted per target forward (the depth of the full tree, tree_width > 1, "
                                "and of the dynamic one, tree_size > 0)", low=1)
    acceptance: AcceptanceRule = Exact()
    tree_width: int = setting(1, "children per node of the head's full tree, draft_length deep, all scored in one "
                              "target forward (exact; 1 = a chain)", low=1)
    tree_size: int = setting(0, "nodes of the head's tree, all scored in one target forward (exact): EAGLE-2's dynamic "
                             "tree (the most probable paths expanded) or, with tree_rates, the positional one; 0 = "
                             "the full tree of tree_width, or a chain", low=0)
    tree_rates: tuple[float, ...] | None = setting(
        None, "the rates at which walks accept a node's k-th child (a tree run's stats.child_acceptance): the fixed "
        "tree of tree_size nodes built for them, as deep as they make it", kind=tuple)
    head: Any = runtime()

    @property
    def tree(self) -> bool:
        return self.tree_width > 1 or self.tree_size > 0

    @property
    def capabilities(self) -> frozenset[str]:
        return super().capabilities | {"features"}

    def check(self) -> None:
        if self.tree_size and not isinstance(self.acceptance, Exact):
            raise ValueError(f"tree_size > 0 drafts a tree, verified by exact tree rules: acceptance must be Exact(), "
                             f"got {self.acceptance.describe()}")
        super().check()
        if self.tree_size and self.tree_width > 1:
            raise ValueError("tree_width sets the full tree; with tree_size the tree is the dynamic (or, with "
                             "tree_rates, the positional) one")
        check_head_tree(self.tree_size, self.draft_length, self.tree_rates, DraftHeads.draft_length)

    def reads(self, field: str) -> bool:
        """Of the tree settings, those of the tree that runs (draft_length: not by a positional tree)."""
        unread = {"tree_size": self.tree_size == 0, "tree_rates": self.tree_rates is None,
                  "draft_length": self.tree_rates is not None, "tree_width": self.tree_size > 0}
        return not unread.get(field, False) and super().reads(field)

    def tree_shape(self) -> TreeShape:
        """The head's tree: positional with tree_rates, EAGLE-2's dynamic one with tree_size, else the full one."""
        if self.tree_size:
            return head_tree(self.tree_size, self.draft_length, self.tree_rates)
        return super().tree_shape()

    def check_model(self, model) -> None:
        """A head of this kind, trained on this target's vocabulary, and a target that hands out its features (which
        are tapped from here on)."""
        if self.head is None:
            raise ValueError(f"decoding='heads' needs a draft head: load a pipeline that has a {self.kind}_head, or "
                             f"pass head=<{'EagleHead' if self.kind == 'eagle' else 'HydraHead'}> to DraftHeads")
        from mmspec.core.head_drafting import FeatureTap, check_draft_depth

        if self.tree_rates is None:
            check_draft_depth(self.head, self.draft_length, "draft_length")
        else:
            check_draft_depth(self.head, self.tree_shape().depth, "tree_rates", "levels")
        if self.head.config.vocab_size != model.vocab_size:
            raise ValueError(f"the head was trained for {self.head.config.vocab_size} image tokens; the target has "
                             f"{model.vocab_size}")
        if getattr(model, "graphs", None) is not None:
            raise ValueError("decoding='heads' reads the target's features from eager forwards: run it with the "
                             "CUDA graphs off (pipe.disable_cuda_graphs())")
        super().check_model(model)
        FeatureTap.of(model.feature_readout()[1])  # before the prefill, whose features the head starts from

    def step(self, model, opening, sampling, generator, stats):
        from mmspec.image.draft_model import HeadStep

        return HeadStep(self, model, opening, sampling, generator, stats)
