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
    every such node); child_acceptance: for k = 1, 2, ..., the share of the visited inner nodes with at least k
    children where the walk accepted the k-th child drawn (the positional acceptance rates that
    `TreeShape.positional` builds a tree from); None for chains."""

    from_draft: torch.Tensor | None = None
    tree_acceptance: float | None = None
    tree_alpha_star: float | None = None
    child_acceptance: tuple[float, ...] | None = None
    _tree_nodes: list = field(default_factory=list, repr=False)

    def record_tree_walk(self, node_acceptance: torch.Tensor, node_alpha_star: torch.Tensor | None,
                         node_children: torch.Tensor, accepted_rank: torch.Tensor) -> None:
        """[B, D] each, at every inner node a walk visited: the rule's acceptance probability, the ceiling alpha*
        (NaN elsewhere; None when not measured), the node's children and the rank of the one accepted (-1: none)."""
        self._tree_nodes.append((node_acceptance.flatten(), None if node_alpha_star is None else
                                 node_alpha_star.flatten(), node_children.flatten(), accepted_rank.flatten()))

    def as_dict(self) -> dict:
        """`SpecStats.as_dict` and, for trees, the figures above (child_acceptance: what a positional tree is built
        from, so a run with a wide tree prints it)."""
        base = super().as_dict()
        timings = base.pop("timings_s")
        tree = {"tree_acceptance": self.tree_acceptance, "tree_alpha_star": self.tree_alpha_star,
                "child_acceptance": None if self.child_acceptance is None else
                [round(rate, 4) for rate in self.child_acceptance]}
        tree = {key: round(value, 4) if isinstance(value, float) else value for key, value in tree.items()
                if value is not None}
        return {**base, **tree, "timings_s": timings}

    def finalize(self) -> None:
        if self._tree_nodes:
            rule, star, children, rank = (torch.cat(t).cpu() if all(x is not None for x in t) else None
                                          for t in zip(*self._tree_nodes, strict=True))
            self._tree_nodes.clear()
            inner = ~rule.isnan()
            self.tree_acceptance = float(rule[inner].double().mean()) if inner.any() else None
            known = star is not None and inner.any() and not star[inner].isnan().any()
            self.tree_alpha_star = float(star[inner].double().mean()) if known else None
            ranks = range(int(children.max())) if children.numel() else range(0)
            self.child_acceptance = tuple(float((rank == k).sum() / (children > k).sum()) for k in ranks) or None
        super().finalize()
