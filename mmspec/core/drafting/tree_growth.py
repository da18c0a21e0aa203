"""Growing draft trees, for the tree drafters of every modality (`mmspec.text.tree_drafters`,
`mmspec.image.draft_model`): a `TreeShape` bounds the tree, `grow_tree` draws it depth by depth from the laws a
drafter supplies and returns a `DraftTree` with the exact law every node's children were drawn from.

The root's children come first; then depth by depth the `expand` frontier nodes of highest path draft probability get
`branching` children each, until `nodes` nodes or `depth` levels (EAGLE-2's dynamic tree, Li et al. 2024,
arXiv 2406.16858: expand the top-m most probable paths). Which nodes grow depends only on paths already drawn, never
on the children being drawn, so the tree rules stay exact (`mmspec.core.tree_verify`). OPT-Tree (Wang et al. 2025,
arXiv 2406.17276) keeps, from a larger grown pool, the `nodes` nodes of highest path probability: the tree
maximising E[accepted length] when acceptance follows the draft probability; that prunes children by their own
probability, so it takes deterministic (top-k) children only.

A fixed tree (`TreeShape.positional`, Sequoia's, Chen et al. 2024, arXiv 2402.12374) maximises E[accepted length]
when the walk accepts a node's k-th child with a rate r_k that does not depend on where the node is (the positional
acceptance a calibration run measures, `TextStats.child_acceptance`): the `nodes` paths of highest prod r_k. Every
row grows that shape whatever it draws, so it is exact for stochastic children too; under sampling the draft's
most probable paths (EAGLE-2) are often not the ones the walk takes, and the fixed tree puts its budget where the
walk goes (the embedded pair at T = 1, 8 held-out prompts: 3.76 tokens per forward against the dynamic tree's 3.16,
both of 60 nodes).

A horizontal cascade (CS-Drafting, Chen et al. 2023, arXiv 2312.11462), `TreeLookup`: the drafter's laws give the
first levels, a cheaper deterministic proposer (prompt lookup) continues every deeper node, its law a point mass.
Each level's children are drawn from, and recorded with, the one law that level has, so the rules stay exact.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mmspec.core.multidraft import without_replacement
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators, inverse_cdf, uniform
from mmspec.core.tree_shape import TreeShape
from mmspec.core.trees import DraftTree


def draw_children(law: torch.Tensor, k: int, scheme: str, generator: Generators) -> tuple[torch.Tensor, torch.Tensor]:
    """k children per law: law [B, F, V] -> tokens [B, F, k], real [B, F, k] bool (a prefix of each node's)."""
    B, F, V = law.shape
    if scheme == "deterministic":
        values, tokens = law.topk(min(k, V), dim=-1)
        return tokens, values > 0
    if scheme == "iid":
        tokens = inverse_cdf(law[:, :, None].expand(B, F, k, V), uniform((B, F, k), generator, law.device, law.dtype))
        return tokens, (law.sum(-1, keepdim=True) > 0).expand(B, F, k)
    return without_replacement(law, uniform((B, F, V), generator, law.device, law.dtype), min(k, V))


@dataclass(frozen=True)
class TreeLookup:
    """A horizontal cascade of a tree: the drafter's `expand` gives the laws of the nodes of the first `after` levels
    (the root's children are level 1), `propose` those of every deeper node. propose(paths, tokens) -> (next [B, F]
    long, found [B, F] bool): the token a cheaper, deterministic drafter puts after each frontier node's path
    (`paths`, `tokens` as `grow_tree` gives `expand`); that node's law is the point mass on it, or zero (no child)
    where nothing was found."""

    after: int
    propose: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

    def law(self, paths: torch.Tensor, tokens: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """[B, F, V] point masses, of the vocabulary and dtype of `like` ([B, V])."""
        following, found = self.propose(paths, tokens)
        return torch.nn.functional.one_hot(following, like.shape[-1]).to(like.dtype) * found[..., None]


def level_law(expand, lookup: TreeLookup | None, depth: int, nodes, paths, tokens, valid,
              root_law: torch.Tensor) -> torch.Tensor:
    """The laws of frontier `nodes` at `depth` (their children's): the cascade's lookup past `lookup.after` levels,
    else the drafter's `expand`."""
    if lookup is not None and depth >= lookup.after:
        return lookup.law(paths, tokens, root_law)
    return expand(nodes, paths, tokens, valid)


def grow_tree(root_law: torch.Tensor, expand, shape: TreeShape, generator: Generators,
              lookup: TreeLookup | None = None) -> DraftTree:
    """Grow a tree depth by depth. root_law: [B, V], the law of the root's children. expand(nodes, paths, tokens,
    valid) -> [B, F, V], the laws of the frontier nodes `nodes` [B, F] (indices into the nodes so far, whose tokens
    are `tokens` [B, n]); paths: [B, F, depth], each frontier node's path from the root's child down to itself (node
    indices, -1 past it); valid [B, F] bool, which of them are real. lookup: a horizontal cascade, the levels past
    its `after` from its point masses instead of `expand`. Nodes come out in topological order, real nodes first."""
    if lookup is not None and not 1 <= lookup.after < shape.depth:
        raise ValueError(f"a tree lookup must start within the tree: after={lookup.after} for depth {shape.depth}")
    if shape.template is not None:
        return _grow_fixed(root_law, expand, shape, generator, lookup)
    B, V = root_law.shape
    device = root_law.device
    k, m = shape.branching, shape.expand
    kids, real = draw_children(root_law[:, None], k, shape.scheme, generator)  # [B, 1, k]
    size = shape.nodes_for(B)
    budget = size * (4 if shape.rerank else 1)  # OPT-Tree reranks a pool of 4 N nodes
    tokens, real = kids[:, 0, :budget], real[:, 0, :budget]
    parent = torch.full_like(tokens, -1)
    score = torch.where(real, root_law.gather(1, tokens).log(), -torch.inf)  # path log-probability
    lineage = torch.full((B, tokens.shape[1], shape.depth), -1, dtype=torch.long, device=device)
    lineage[:, :, 0] = torch.arange(tokens.shape[1], device=device)
    laws = [root_law[:, None]]
    expanded = torch.zeros(B, 0, dtype=torch.long, device=device)  # nodes whose law is in laws[1:]
    layer_start = 0
    for d in range(1, shape.depth):
        n = tokens.shape[1]
        if n >= budget:
            break
        layer_score = score[:, layer_start:]
        F = min(m, n - layer_start)
        top_score, top = layer_score.topk(F, dim=-1)
        nodes, nodes_real = top + layer_start, top_score > -torch.inf
        paths = lineage.gather(1, nodes[..., None].expand(B, F, shape.depth))
        law = level_law(expand, lookup, d, nodes, paths, tokens, nodes_real, root_law) * nodes_real[..., None]
        laws.append(law)  # [B, F, V]
        expanded = torch.cat([expanded, nodes], 1)
        new, new_real = draw_children(law, k, shape.scheme, generator)  # [B, F, k']
        per_node = new.shape[-1]
        width = min(F * per_node, budget - n)  # the lowest-ranked nodes' children are cut at the budget
        of = (torch.arange(width, device=device) // per_node).expand(B, width)  # each child's frontier rank
        new, new_real = new.flatten(1)[:, :width], new_real.flatten(1)[:, :width] & nodes_real.gather(1, of)
        parents = nodes.gather(1, of)
        child_law = law.gather(1, of[..., None].expand(B, width, V)).gather(2, new[..., None]).squeeze(-1)
        new_score = torch.where(new_real, score.gather(1, parents) + child_law.log(), -torch.inf)
        new_lineage = lineage.gather(1, parents[..., None].expand(B, width, shape.depth)).clone()
        new_lineage[:, :, d] = n + torch.arange(width, device=device)
        layer_start = n
        tokens, parent = torch.cat([tokens, new], 1), torch.cat([parent, parents], 1)
        real, score = torch.cat([real, new_real], 1), torch.cat([score, new_score], 1)
        lineage = torch.cat([lineage, new_lineage], 1)
    keep = real
    if shape.rerank:  # OPT-Tree: the `nodes` most probable paths (a subtree: scores fall along every path)
        depth_of = (lineage >= 0).sum(-1)
        rank = (score - 1e-9 * depth_of).topk(min(size, score.shape[1]), dim=-1).indices
        keep = torch.zeros_like(real).scatter_(1, rank, True) & real
    return _pack(tokens, parent, keep, laws, expanded, shape.scheme, min(tokens.shape[1], size), k)


@dataclass(frozen=True)
class _Level:
    """One level of a fixed tree: frontier [F], the slots whose children it holds (0: the root); nodes [C], those
    children (node indices); of [C], each one's parent's index in frontier; rank [C], its rank among its siblings;
    width: the most children of a frontier slot."""

    frontier: torch.Tensor
    nodes: torch.Tensor
    of: torch.Tensor
    rank: torch.Tensor
    width: int


@functools.lru_cache(maxsize=64)
def _fixed_levels(template: tuple[int, ...], depth: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, tuple[_Level, ...]]:
    """A fixed tree's parent [n], paths [n, depth] (node indices from the root's child down, -1 past) and levels."""
    paths = []
    for parent in template:
        paths.append((paths[parent] if parent >= 0 else []) + [len(paths)])
    levels = []
    for d in range(1, max(map(len, paths)) + 1):
        nodes = [node for node, path in enumerate(paths) if len(path) == d]
        slots = [template[node] + 1 for node in nodes]
        frontier = list(dict.fromkeys(slots))
        rank = [slots[:i].count(slot) for i, slot in enumerate(slots)]
        of = [frontier.index(slot) for slot in slots]
        tensors = (torch.tensor(x, device=device) for x in (frontier, nodes, of, rank))
        levels.append(_Level(*tensors, width=max(rank) + 1))
    paths = torch.tensor([path + [-1] * (depth - len(path)) for path in paths], device=device)
    return torch.tensor(template, device=device), paths, tuple(levels)


def _grow_fixed(root_law: torch.Tensor, expand, shape: TreeShape, generator: Generators,
                lookup: TreeLookup | None) -> DraftTree:
    """`grow_tree` for a fixed tree: the first `nodes_for(B)` nodes of `shape.template`, level by level, each level's
    children drawn for every row (a node whose law runs out of support has fewer: they stay padding)."""
    B = root_law.shape[0]
    parent, paths, levels = _fixed_levels(shape.template[: shape.nodes_for(B)], shape.depth, root_law.device)
    n = parent.shape[0]
    tokens = torch.zeros(B, n, dtype=torch.long, device=root_law.device)
    real = torch.zeros(B, n, dtype=torch.bool, device=root_law.device)
    laws, expanded = [root_law[:, None]], []
    for d, level in enumerate(levels):
        if d == 0:  # the root's children
            law, frontier_real = laws[0], real.new_ones(B, 1)
        else:
            nodes = (level.frontier - 1).expand(B, -1)  # [B, F]
            frontier_real = real.gather(1, nodes)
            law = level_law(expand, lookup, d, nodes, paths[nodes], tokens, frontier_real, root_law)
            law = law * frontier_real[..., None]  # [B, F, V]
            laws.append(law)
            expanded.append(nodes)
        drawn, drawn_real = draw_children(law, level.width, shape.scheme, generator)  # [B, F, K]
        tokens[:, level.nodes] = drawn[:, level.of, level.rank]
        real[:, level.nodes] = drawn_real[:, level.of, level.rank] & frontier_real[:, level.of]
    expanded = torch.cat(expanded, 1) if expanded else tokens.new_zeros(B, 0)
    return _pack(tokens, parent.expand(B, n), real, laws, expanded, shape.scheme, n,
                 max((level.width for level in levels), default=1))


def _pack(tokens, parent, keep, laws, expanded, scheme, width: int, branching: int) -> DraftTree:
    """Real nodes first (topological order kept), parents renumbered, laws placed at their nodes' slots, in `width`
    node columns (the shape's budget, >= the kept nodes of any row): a static shape, with no host read, so a graph
    can hold the round. branching: the most children a node can have (the layout's table width)."""
    B, n = tokens.shape
    order = (~keep).long().argsort(dim=1, stable=True)
    new_index = torch.empty_like(order).scatter_(1, order, torch.arange(n, device=tokens.device).expand(B, n))
    n_nodes = keep.sum(-1)
    parent = parent.gather(1, order)
    parent = torch.where(parent >= 0, new_index.gather(1, parent.clamp(min=0)), -1)
    q = None
    if scheme != "deterministic":
        V = laws[0].shape[-1]
        q = laws[0].new_zeros(B, n + 2, V)  # slot n + 1 takes the laws of nodes that were not kept
        q[:, 0] = laws[0][:, 0]
        if expanded.shape[1]:
            slots = torch.where(keep.gather(1, expanded), new_index.gather(1, expanded) + 1, n + 1)
            q.scatter_(1, slots[..., None].expand(-1, -1, V), torch.cat(laws[1:], 1))
    q = None if q is None else q[:, : width + 1]
    real = torch.arange(width, device=tokens.device) < n_nodes[:, None]
    return DraftTree(tokens.gather(1, order)[:, :width], parent[:, :width], real, q, scheme, branching)


def shape_for(shape: TreeShape, sampling: SamplingConfig) -> TreeShape:
    """Deterministic children at temperature 0 (the target's law is one-hot: a stochastic child is wasted)."""
    return dataclasses.replace(shape, scheme="deterministic") if sampling.greedy else shape


def visible_slots(fed: torch.Tensor, paths: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """[B, F, R + F]: which of the fed nodes `fed` [B, R] and then the frontier `nodes` [B, F] each frontier node
    attends to (its ancestors and itself: the nodes on its path, `paths` [B, F, depth])."""
    columns = torch.cat([fed, nodes], 1)  # [B, R + F]
    return (paths[:, :, None, :] == columns[:, None, :, None]).any(-1)
