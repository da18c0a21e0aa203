"""`TextDraftTree(...)`, `"tree"`: the draft LM's trees (RSD, OPT-Tree / Sequoia's fixed trees with `tree_rates`),
every node scored in one target forward, optionally with prompt lookup's levels under the draft LM's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.registry import register_decoding
from mmspec.core.settings import setting
from mmspec.core.tree_shape import TreeShape
from mmspec.text.kinds import check_tree_lookup
from mmspec.text.methods.base import LooksUp, TreeDrafting


@register_decoding
@dataclass(frozen=True)
class TextDraftTree(LooksUp, TreeDrafting):
    """The draft LM's full tree (tree_depth x tree_branching), or the fixed tree built for tree_rates."""

    name: ClassVar[str] = "tree"
    described: ClassVar[str] = "the draft LM's tree (RSD)"

    lookup_after: int | None = setting(None, "a horizontal cascade: the draft LM drafts the tree's first N levels, "
                                       "prompt lookup the deeper ones (default: every level from the draft LM)",
                                       kind=int, low=1)
    tree_depth: int = setting(4, "levels of the draft model's full tree", low=1)
    tree_branching: int = setting(2, "children per node of the full tree", low=1)
    tree_rates: tuple[float, ...] | None = setting(
        None, "the rates at which walks accept a node's k-th child (a run's stats.child_acceptance): the fixed tree "
        "of tree_nodes nodes built for them", kind=tuple)
    tree_nodes: int = setting(30, "nodes of the tree built for tree_rates", low=1)

    def check(self) -> None:
        super().check()
        if self.tree_rates is None:
            if self.tree_nodes != TextDraftTree.tree_nodes:
                raise ValueError("tree_nodes applies with tree_rates (a positional tree); the full tree is "
                                 "tree_depth x tree_branching")
        else:
            for setting_name in ("tree_depth", "tree_branching"):
                if getattr(self, setting_name) != getattr(TextDraftTree, setting_name):
                    raise ValueError(f"{setting_name} sets the full tree; with tree_rates the tree is the positional "
                                     f"one of tree_nodes nodes")
            try:
                self.tree_shape()
            except (TypeError, ValueError) as error:
                raise ValueError(f"tree_rates: {error}") from None
        if self.lookup_after is None and self.max_ngram != TextDraftTree.max_ngram:
            raise ValueError("max_ngram applies to a tree with lookup_after (prompt lookup's levels)")
        check_tree_lookup(self.lookup_after, self.tree_shape().depth)

    def reads(self, field: str) -> bool:
        """Of the tree's settings, the full tree's without tree_rates and tree_nodes with them; max_ngram with
        lookup_after."""
        unread = {"tree_depth": self.tree_rates is not None, "tree_branching": self.tree_rates is not None,
                  "tree_nodes": self.tree_rates is None, "max_ngram": self.lookup_after is None}
        return not unread.get(field, False) and super().reads(field)

    def tree_shape(self) -> TreeShape:
        if self.tree_rates is None:
            return TreeShape.full(self.tree_depth, self.tree_branching)
        return TreeShape.positional(self.tree_nodes, self.tree_rates)

    def needs_draft_model(self) -> bool:
        return True

    def make_drafter(self, target, draft=None):
        from mmspec.text.tree_drafters import ModelTreeDrafter

        return ModelTreeDrafter(draft, self.tree_shape(), lookup_after=self.lookup_after, max_ngram=self.max_ngram)
