"""`TextDraftHeads(...)`, `"heads"`: a draft head on the target's own features (EAGLE, EAGLE-3's fused layers, Hydra),
chains or trees."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mmspec.core.kinds import HEAD_KINDS
from mmspec.core.registry import register_decoding
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import Exact
from mmspec.core.settings import runtime, setting
from mmspec.core.tree_shape import TREE_RATES_HELP, TreeShape, check_sized_tree, sized_tree
from mmspec.text.methods.base import TextDecoding, attached, draft_vocabulary


@register_decoding
@dataclass(frozen=True)
class TextDraftHeads(TextDecoding):
    """Speculative decoding with a draft head on the target's own features (EAGLE or Hydra). EAGLE: one decoder
    layer, chains of any length or EAGLE-2's dynamic trees; Hydra: sequentially dependent MLP heads, at most their
    number of tokens a round. head: the head itself (pipelines supply the `kind` they ship: `eagle_head`,
    `hydra_head`; not saved)."""

    name: ClassVar[str] = "heads"
    described: ClassVar[str] = "a draft head on the target's own features (EAGLE or Hydra)"
    auto_settings: ClassVar[frozenset] = frozenset({"draft_length", "acceptance"})  # what `"auto"` passes it
    kind: str = setting("eagle", "which head drafts: 'eagle' (one decoder layer over the target's features) or "
                        "'hydra' (sequentially dependent MLP heads)", choices=HEAD_KINDS)
    draft_length: int = setting(4, "tokens drafted per target forward (the dynamic tree's depth with tree_size > 0)",
                                low=1)
    tree_size: int = setting(0, "nodes of the head's tree, all scored in one target forward: EAGLE-2's dynamic tree "
                             "(the most probable paths expanded) or, with tree_rates, the positional one; 0 = a chain",
                             low=0)
    tree_rates: tuple[float, ...] | None = setting(None, TREE_RATES_HELP, kind=tuple)
    lookup_after: int | None = setting(None, "a horizontal cascade: the head drafts the first N positions (a "
                                       "tree's first N levels), prompt lookup the rest (default: every position "
                                       "from the head)", kind=int, low=1)
    draft_vocabulary: int | None = setting(None, "VocabTrim: a chain's head reads out only the N tokens the target "
                                           "writes most (its config's token_ranking) and the special tokens "
                                           "(default: all)", kind=int, low=1)
    acceptance: AcceptanceRule = Exact()
    head: Any = runtime(supplied_by="{kind}_head")

    def check(self) -> None:
        if self.tree_size and not self.acceptance.lossless:
            raise ValueError(f"acceptance={self.acceptance.name!r} is for chains; trees are verified by exact rules")
        check_sized_tree(self.tree_size, self.draft_length, self.tree_rates, TextDraftHeads.draft_length)
        depth = self.tree_shape().depth if self.tree_size else self.draft_length
        if self.lookup_after is not None and self.lookup_after >= depth:
            raise ValueError(f"lookup_after={self.lookup_after} must be below the draft's depth {depth} (draft_length, "
                             "or the tree's levels): the positions after it are prompt lookup's")
        if self.draft_vocabulary is not None and self.tree_size:
            raise ValueError("draft_vocabulary trims a chain's head: it needs tree_size=0")

    def reads(self, field: str) -> bool:
        """draft_length is not read by a positional tree, tree_rates only by one."""
        unread = {"tree_rates": self.tree_rates is None, "draft_length": self.tree_rates is not None}
        return not unread.get(field, False) and super().reads(field)

    def tree_shape(self) -> TreeShape:
        """The head's tree (tree_size > 0): positional with tree_rates, else EAGLE-2's dynamic one."""
        return sized_tree(self.tree_size, self.draft_length, self.tree_rates)

    def make_drafter(self, target: Any, draft: Any = None):
        from mmspec.text.head_drafters import HeadDrafter, HeadTreeDrafter

        if self.head is None:
            raise ValueError(f"decoding='heads' needs a draft head: load a pipeline that has a {self.kind}_head, or "
                             f"pass head=<{'EagleHead' if self.kind == 'eagle' else 'HydraHead'}>")
        if self.tree_size:
            return HeadTreeDrafter(target, self.head, self.tree_shape(), lookup_after=self.lookup_after)
        vocabulary = None if self.draft_vocabulary is None else draft_vocabulary(target, self.draft_vocabulary)
        return HeadDrafter(target, self.head, lookup_after=self.lookup_after, vocabulary=vocabulary)

    def run(self, target, draft, input_ids, attention_mask=None, **options):
        """`speculative_steps` with this head's drafter (`draft` is not read)."""
        from mmspec.text.generate import speculative_steps

        if not self.tree_size:
            options["draft_length"] = self.draft_length
        return speculative_steps(target, input_ids, attention_mask, drafter=self.make_drafter(target),
                                 acceptance=attached(self.acceptance, target), **options)
