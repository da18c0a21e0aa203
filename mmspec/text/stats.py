"""TextStats: the stats of text decodings."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mmspec.core.stats import SpecStats


@dataclass
class TextStats(SpecStats):
    """`SpecStats` of a text decoding adds from_draft: [B, N] bool, True where the new token is an accepted draft
    token (else the target drew it: a residual or bonus token, or every token of plain AR); False on padding; and
    for trees tree_acceptance: the mean over the inner nodes the walks visited of the rule's probability of
    accepting one of the node's children, and tree_alpha_star: the mean of the best any verifier could do at the
    same nodes (alpha*, `speculative_generate(..., measure_ceiling=True)`; None where alpha* is not computable at
    every such node); None for chains."""

    from_draft: torch.Tensor | None = None
    tree_acceptance: float | None = None
    tree_alpha_star: float | None = None
    _tree_nodes: list = field(default_factory=list, repr=False)

    def record_tree_walk(self, node_acceptance: torch.Tensor, node_alpha_star: torch.Tensor | None) -> None:
        """node_acceptance, node_alpha_star: [B, D], at each inner node a walk visited the rule's acceptance
        probability and the ceiling alpha* (NaN elsewhere; alpha* None when not measured)."""
        self._tree_nodes.append((node_acceptance.flatten(), None if node_alpha_star is None else
                                 node_alpha_star.flatten()))

    def finalize(self) -> None:
        if self._tree_nodes:
            rule, star = (torch.cat(t).double().cpu() if all(x is not None for x in t) else None
                          for t in zip(*self._tree_nodes, strict=True))
            self._tree_nodes.clear()
            inner = ~rule.isnan()
            self.tree_acceptance = float(rule[inner].mean()) if inner.any() else None
            known = star is not None and inner.any() and not star[inner].isnan().any()
            self.tree_alpha_star = float(star[inner].mean()) if known else None
        super().finalize()

