"""`DraftHeads(...)`: speculative decoding with a draft head on the target's own features (EAGLE, Hydra), chains or
trees (full, EAGLE-2's dynamic or positional), exact or (chains) relaxed. The settings; the step is
`mmspec.image.draft_model.draft_step`, on the feature-head proposer every modality shares
(`mmspec.core.drafting.heads`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mmspec.core.kinds import HEAD_KINDS
from mmspec.core.registry import register_decoding
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import Exact
from mmspec.core.settings import runtime, setting
from mmspec.core.tree_shape import TREE_RATES_HELP
from mmspec.image.methods.base import TREE_SIZE_HELP, DraftedTree, ImageDecoding


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
    tree_size: int = setting(0, TREE_SIZE_HELP, low=0)
    tree_rates: tuple[float, ...] | None = setting(None, TREE_RATES_HELP, kind=tuple)
    head: Any = runtime(supplied_by="{kind}_head")

    @property
    def capabilities(self) -> frozenset[str]:
        return super().capabilities | {"features"}

    def check_model(self, model) -> None:
        """A head of this kind, trained on this target's vocabulary, and a target that hands out its features (which
        are tapped from here on)."""
        if self.head is None:
            raise ValueError(f"decoding='heads' needs a draft head: load a pipeline that has a {self.kind}_head, or "
                             f"pass head=<{'EagleHead' if self.kind == 'eagle' else 'HydraHead'}> to DraftHeads")
        from mmspec.adapters.features import bind_head
        from mmspec.core.drafting.heads import check_draft_depth

        if self.tree_rates is None:
            check_draft_depth(self.head, self.draft_length, "draft_length")
        else:
            check_draft_depth(self.head, self.tree_shape().depth, "tree_rates", "levels")
        if self.head.config.vocab_size != model.vocab_size:
            raise ValueError(f"the head was trained for {self.head.config.vocab_size} image tokens; the target has "
                             f"{model.vocab_size}")
        super().check_model(model)
        bind_head(self.head, model)  # before the prefill, whose features the head starts from

    def step(self, model, opening, sampling, generator, stats):
        from mmspec.image.draft_model import draft_step

        return draft_step(self, model, opening, sampling, generator, stats, heads=True)
