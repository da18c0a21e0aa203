"""`DraftModel(...)`: speculative decoding with a draft image model over the same tokens, chains or the drafter's trees
(full, EAGLE-2's dynamic or positional), exact or (chains) relaxed. The settings; the step is
`mmspec.image.draft_model.draft_step`, on the draft-model proposer every modality shares
(`mmspec.core.drafting.proposer`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mmspec.core.registry import register_decoding
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import Exact
from mmspec.core.settings import runtime, setting
from mmspec.core.tree_shape import TREE_RATES_HELP
from mmspec.image.methods.base import TREE_SIZE_HELP, DraftedTree, ImageDecoding


@register_decoding
@dataclass(frozen=True)
class DraftModel(DraftedTree, ImageDecoding):
    """Speculative decoding with a draft image model, batched, with per-row acceptance. drafter: the draft model's
    adapter (same grid and image vocabulary as the target); pipelines supply their own, so it is not saved."""

    name: ClassVar[str] = "draft"
    draft_length: int = setting(4, "tokens drafted per target forward (the depth of the full tree, tree_width > 1, "
                                "and of the dynamic one, tree_size > 0)", low=1)
    acceptance: AcceptanceRule = Exact()
    tree_width: int = setting(1, "children per node of the draft model's full tree, draft_length deep, all scored in "
                              "one target forward (exact; 1 = a chain)", low=1)
    tree_size: int = setting(0, TREE_SIZE_HELP, low=0)
    tree_rates: tuple[float, ...] | None = setting(None, TREE_RATES_HELP, kind=tuple)
    drafter: Any = runtime(supplied_by="draft_adapter")

    def check_model(self, model) -> None:
        """The target and the drafter: the drafter shares the target's image tokens; trees need both to have them."""
        from mmspec.core.model import require

        if self.drafter is None:
            raise ValueError("decoding='draft' needs a draft model: load a pipeline that has a draft_transformer, or "
                             "pass drafter=<adapter> to DraftModel")
        if (self.drafter.grid, self.drafter.vocab_size) != (model.grid, model.vocab_size):
            raise ValueError(
                f"the drafter must share the target's image tokens: drafter grid {self.drafter.grid}, vocab_size "
                f"{self.drafter.vocab_size}; target grid {model.grid}, vocab_size {model.vocab_size}")
        super().check_model(model)
        require(self.drafter, self.capabilities, "DraftModel(tree_width > 1 or tree_size > 0)'s drafter")

    def step(self, model, opening, sampling, generator, stats):
        from mmspec.image.draft_model import draft_step

        return draft_step(self, model, opening, sampling, generator, stats)
