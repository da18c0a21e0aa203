"""How big a draft tree grows: `TreeShape`, the bound every tree drafter grows its trees to
(`mmspec.core.drafting.tree_growth` grows them). EAGLE-2's dynamic trees (Li et al. 2024, arXiv 2406.16858) expand the
most probable paths; OPT-Tree (Wang et al. 2025, arXiv 2406.17276) reranks a larger pool; a fixed tree
(`TreeShape.positional`, Sequoia's, Chen et al. 2024, arXiv 2402.12374) maximises E[accepted length] for the rates at
which walks accept a node's k-th child. Pure Python: components validate their tree settings with it before torch loads.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

SCHEMES = ("iid", "without_replacement", "deterministic")  # how a node's children are drawn (`DraftTree.scheme`)


@dataclass(frozen=True)
class TreeShape:
    """How big a tree grows. nodes: the node budget N; branching: children drawn per expanded node; expand: nodes
    expanded per depth (the most probable paths); depth: levels at most; scheme: how children are drawn
    ("without_replacement", "iid" or "deterministic"); rerank: OPT-Tree, grow `expand` x `branching` per level and
    keep the `nodes` most probable (deterministic only). batch_tokens: the most tokens one target forward scores over
    the batch (None = no limit): a batch of B rows gets min(nodes, batch_tokens // B - 1) nodes per row, since the
    verification forward stops being free as the batch grows (on the embedded pair's CPU bench, 6-node trees beat
    14 and 30 at batch 8). template: a fixed tree instead of a dynamic one, each node's parent (-1: the root), in
    an order where every prefix is a tree (a node after its parent and its earlier siblings): every row grows this
    shape, its first `nodes_for(B)` nodes (`TreeShape.positional` builds the best one for measured acceptance
    rates; branching and depth must bound it). A chain is branching 1, expand 1, depth = nodes."""

    nodes: int = 16
    branching: int = 2
    expand: int = 4
    depth: int = 8
    scheme: str = "without_replacement"
    rerank: bool = False
    batch_tokens: int | None = None
    template: tuple[int, ...] | None = field(default=None, repr=False)

    def __post_init__(self):
        counts = ("nodes", "branching", "expand", "depth") + (() if self.batch_tokens is None else ("batch_tokens",))
        for name in counts:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TreeShape.{name} must be an int >= 1, got {value!r}")
        if self.scheme not in SCHEMES:
            raise ValueError(f"TreeShape.scheme must be one of {SCHEMES}, got {self.scheme!r}")
        if self.rerank and self.scheme != "deterministic":
            raise ValueError("TreeShape.rerank (OPT-Tree) prunes children by their own probability, which only "
                             "deterministic children allow; use scheme='deterministic'")
        if self.template is not None:
            self._check_template()

    def _check_template(self) -> None:
        if self.rerank:
            raise ValueError("TreeShape.template is a fixed tree; rerank (OPT-Tree) grows a dynamic one")
        if self.nodes > len(self.template):
            raise ValueError(f"TreeShape.nodes ({self.nodes}) must not exceed the template's {len(self.template)} "
                             "nodes")
        depth, branching = template_extent(self.template)
        if depth > self.depth or branching > self.branching:
            raise ValueError(f"TreeShape.depth and .branching must bound the template (depth {depth}, up to "
                             f"{branching} children per node), got depth={self.depth}, branching={self.branching}")

    @classmethod
    def full(cls, depth: int, branching: int, **settings) -> TreeShape:
        """Every node `branching` children, to `depth` levels (branching + branching^2 + ... nodes)."""
        return cls(nodes=sum(branching**d for d in range(1, depth + 1)), branching=branching,
                   expand=branching ** (depth - 1), depth=depth, **settings)

    @classmethod
    def positional(cls, nodes: int, rates: Sequence[float], max_depth: int = 32, **settings) -> TreeShape:
        """The fixed tree of `nodes` nodes that maximises E[accepted length] when the walk accepts a node's k-th
        child with probability rates[k - 1] wherever the node is (Sequoia): best first by value, the product of
        rates[rank] along a node's path, at most `max_depth` levels deep, a node's next sibling becoming a
        candidate once it is taken; nodes of value 0 add nothing and are left out (the tree may then be smaller).
        rates: probabilities, one per child rank, the first > 0 (`TextStats.child_acceptance` of a calibration
        run with a wide tree, e.g. TreeShape.full(3, 4)). Where they do not increase (measured rates do not, up to
        noise) values fall along every path and across siblings, so the tree is the best of its size, and so is
        every prefix of it (`batch_tokens` takes one)."""
        rates = tuple(float(r) for r in rates)
        if not rates or any(not 0 <= r <= 1 for r in rates) or rates[0] == 0:
            raise ValueError(f"rates must be probabilities, one per child rank, the first > 0, got {rates}")
        for name, value in (("nodes", nodes), ("max_depth", max_depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        # best-first: a node's children enter the frontier when it is taken; ties go to the earlier sibling
        frontier = [(-rates[0], 0, -1, 1, 0)]  # (-value, order, parent, depth, rank)
        template, parents, order = [], [set() for _ in range(max_depth + 1)], 1
        while frontier and len(template) < nodes:
            value, _, parent, level, rank = heapq.heappop(frontier)
            node = len(template)
            template.append(parent)
            parents[level].add(parent)
            if rank + 1 < len(rates) and rates[rank + 1] > 0:  # the next sibling
                heapq.heappush(frontier, (value / rates[rank] * rates[rank + 1], order, parent, level, rank + 1))
                order += 1
            if level < max_depth:  # the first child
                heapq.heappush(frontier, (value * rates[0], order, node, level + 1, 0))
                order += 1
        depth, branching = template_extent(template)
        return cls(nodes=len(template), branching=branching, expand=max(map(len, parents)), depth=depth,
                   template=tuple(template), **settings)

    def nodes_for(self, batch_size: int) -> int:
        """Nodes per row at this batch size (at least one)."""
        if self.batch_tokens is None:
            return self.nodes
        return max(1, min(self.nodes, self.batch_tokens // batch_size - 1))


def template_extent(template: Sequence[int]) -> tuple[int, int]:
    """A fixed tree's depth and most children of one node (the root included); each node's parent must be -1 (the
    root) or an earlier node."""
    depth, children = [], [0] * (len(template) + 1)
    for node, parent in enumerate(template):
        if not isinstance(parent, int) or not -1 <= parent < node:
            raise ValueError(f"TreeShape.template[{node}] must be -1 (the root) or an earlier node, got {parent!r}")
        depth.append(1 if parent < 0 else depth[parent] + 1)
        children[parent + 1] += 1
    return max(depth, default=0), max(children)


# The help of a `tree_rates` setting (the decodings that grow trees by size: text and image draft heads, the image
# draft model), shown by the CLI and the demo.
TREE_RATES_HELP = ("the rates at which walks accept a node's k-th child (a tree run's stats.child_acceptance): the "
                   "fixed tree of tree_size nodes built for them, as deep as they make it")


def sized_tree(nodes: int, depth: int, rates: Sequence[float] | None) -> TreeShape:
    """A drafter's tree of `nodes` nodes: EAGLE-2's dynamic tree, `depth` deep, or with `rates` (the rates at which
    walks accept a node's k-th child) the positional tree for them, as deep as they make it."""
    if rates is None:
        return TreeShape(nodes=nodes, depth=depth)
    return TreeShape.positional(nodes, rates)


def check_sized_tree(tree_size: int, draft_length: int, tree_rates: Sequence[float] | None,
                     default_draft_length: int) -> None:
    """Raise a `ValueError` naming the setting when tree_rates comes without a tree_size, beside a draft_length that
    is not the default (a positional tree's depth follows from its rates), or is no rates a tree can be built for."""
    if tree_rates is None:
        return
    if not tree_size:
        raise ValueError("tree_rates builds a positional tree of tree_size nodes: set tree_size > 0")
    if draft_length != default_draft_length:
        raise ValueError("draft_length is the dynamic tree's depth; the positional tree's depth follows from "
                         "tree_rates")
    try:
        sized_tree(tree_size, draft_length, tree_rates)
    except (TypeError, ValueError) as error:
        raise ValueError(f"tree_rates: {error}") from None
