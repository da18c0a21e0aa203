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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from mmspec.core.multidraft import without_replacement
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators, inverse_cdf, uniform
from mmspec.core.trees import SCHEMES, DraftTree


@dataclass(frozen=True)
class TreeShape:
    """How big a tree grows. nodes: the node budget N; branching: children drawn per expanded node; expand: nodes
    expanded per depth (the most probable paths); depth: levels at most; scheme: how children are drawn
    ("without_replacement", "iid" or "deterministic"); rerank: OPT-Tree, grow `expand` x `branching` per level and
    keep the `nodes` most probable (deterministic only). batch_tokens: the most tokens one target forward scores over
    the batch (None = no limit): a batch of B rows gets min(nodes, batch_tokens // B - 1) nodes per row, since the
    verification forward stops being free as the batch grows (on the embedded pair's CPU bench, 6-node trees beat
    14 and 30 at batch 8). A chain is branching 1, expand 1, depth = nodes."""

    nodes: int = 16
    branching: int = 2
    expand: int = 4
    depth: int = 8
    scheme: str = "without_replacement"
    rerank: bool = False
    batch_tokens: int | None = None

    def __post_init__(self):
        for name in ("nodes", "branching", "expand", "depth") + (() if self.batch_tokens is None else ("batch_tokens",)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TreeShape.{name} must be an int >= 1, got {value!r}")
        if self.scheme not in SCHEMES:
            raise ValueError(f"TreeShape.scheme must be one of {SCHEMES}, got {self.scheme!r}")
        if self.rerank and self.scheme != "deterministic":
            raise ValueError("TreeShape.rerank (OPT-Tree) prunes children by their own probability, which only "
                             "deterministic children allow; use scheme='deterministic'")

    @classmethod
    def full(cls, depth: int, branching: int, **settings) -> TreeShape:
        """Every node `branching` children, to `depth` levels (branching + branching^2 + ... nodes)."""
        return cls(nodes=sum(branching**d for d in range(1, depth + 1)), branching=branching,
                   expand=branching ** (depth - 1), depth=depth, **settings)

    def nodes_for(self, batch_size: int) -> int:
        """Nodes per row at this batch size (at least one)."""
        if self.batch_tokens is None:
            return self.nodes
        return max(1, min(self.nodes, self.batch_tokens // batch_size - 1))


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


def grow_tree(root_law: torch.Tensor, expand, shape: TreeShape, generator: Generators) -> DraftTree:
    """Grow a tree depth by depth. root_law: [B, V], the law of the root's children. expand(nodes, paths, tokens,
    valid) -> [B, F, V], the laws of the frontier nodes `nodes` [B, F] (indices into the nodes so far, whose tokens
    are `tokens` [B, n]); paths: [B, F, depth], each frontier node's path from the root's child down to itself (node
    indices, -1 past it); valid [B, F] bool, which of them are real. Nodes come out in topological order, real nodes
    first."""
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
        law = expand(nodes, paths, tokens, nodes_real) * nodes_real[..., None]  # [B, F, V]
        laws.append(law)
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
    return _pack(tokens, parent, keep, laws, expanded, shape.scheme)


def _pack(tokens, parent, keep, laws, expanded, scheme) -> DraftTree:
    """Real nodes first (topological order kept), parents renumbered, laws placed at their nodes' slots; the nodes
    no row keeps are cut off (one host sync), so the target never scores them."""
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
    width = int(n_nodes.max())
    q = None if q is None else q[:, : width + 1]
    real = torch.arange(width, device=tokens.device) < n_nodes[:, None]
    return DraftTree(tokens.gather(1, order)[:, :width], parent[:, :width], real, q, scheme)


def shape_for(shape: TreeShape, sampling: SamplingConfig) -> TreeShape:
    """Deterministic children at temperature 0 (the target's law is one-hot: a stochastic child is wasted)."""
    return dataclasses.replace(shape, scheme="deterministic") if sampling.greedy else shape


def visible_slots(fed: torch.Tensor, paths: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """[B, F, R + F]: which of the fed nodes `fed` [B, R] and then the frontier `nodes` [B, F] each frontier node
    attends to (its ancestors and itself: the nodes on its path, `paths` [B, F, depth])."""
    columns = torch.cat([fed, nodes], 1)  # [B, R + F]
    return (paths[:, :, None, :] == columns[:, None, :, None]).any(-1)
