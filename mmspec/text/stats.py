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
    _tree_sums: torch.Tensor | None = field(default=None, repr=False)  # [4] float64, see record_tree_walk
    _child_counts: torch.Tensor | None = field(default=None, repr=False)  # [2, K] long: accepted, seen per rank
    _star_measured: bool = field(default=True, repr=False)

    def record_tree_walk(self, node_acceptance: torch.Tensor, node_alpha_star: torch.Tensor | None,
                         node_children: torch.Tensor, accepted_rank: torch.Tensor,
                         max_children: int | None = None, active: torch.Tensor | None = None) -> None:
        """[B, D] each, at every inner node a walk visited: the rule's acceptance probability, the ceiling alpha*
        (NaN elsewhere; None when not measured), the node's children and the rank of the one accepted (-1: none).
        max_children: what bounds node_children (the tree's branching; None: read from it, a host read); active:
        [B] bool, the rows whose walk counts (default all: a row that had finished still walks in a captured batch).
        Accumulates on the device, in place (a captured step replays it): the sum and count of the acceptance at
        inner nodes, the sum of alpha* there and its NaNs, and per rank k the nodes that accepted their k-th child
        and those that have one."""
        device = node_acceptance.device
        K = int(node_children.max()) if max_children is None else max_children
        if self._tree_sums is None:
            self._tree_sums = torch.zeros(4, dtype=torch.float64, device=device)
        if self._child_counts is None or self._child_counts.shape[1] < K:
            old, self._child_counts = self._child_counts, torch.zeros(2, K, dtype=torch.long, device=device)
            if old is not None:
                self._child_counts[:, : old.shape[1]] = old
        rule = node_acceptance.double()
        counted = torch.ones_like(rule, dtype=torch.bool) if active is None else active[:, None].expand_as(rule)
        inner = ~rule.isnan() & counted
        star = rule.new_zeros(()) if node_alpha_star is None else node_alpha_star.double()
        self._star_measured &= node_alpha_star is not None
        self._tree_sums += torch.stack([torch.where(inner, rule, 0).sum(), inner.sum(),
                                        torch.where(inner & ~star.isnan(), star, 0).sum(),
                                        (inner & star.isnan()).sum()])
        ranks = torch.arange(self._child_counts.shape[1], device=device)
        counted = counted.flatten()[:, None]
        self._child_counts[0] += ((accepted_rank.flatten()[:, None] == ranks) & counted).sum(0)
        self._child_counts[1] += ((node_children.flatten()[:, None] > ranks) & counted).sum(0)

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
        if self._tree_sums is not None:
            (rule, inner, star, unknown), (hits, seen) = self._tree_sums.tolist(), self._child_counts.tolist()
            self._tree_sums = self._child_counts = None
            self.tree_acceptance = rule / inner if inner else None
            self.tree_alpha_star = star / inner if inner and self._star_measured and not unknown else None
            self.child_acceptance = tuple(hit / count for hit, count in zip(hits, seen, strict=True) if count) or None
        super().finalize()
