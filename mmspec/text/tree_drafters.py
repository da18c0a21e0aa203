"""Tree drafters: each proposes a `DraftTree` with the exact law its children were drawn from.

All grow their trees the same way (`grow_tree`, a `TreeShape`): the root's children, then depth by depth the
`expand` frontier nodes of highest path draft probability get `branching` children each, until `nodes` nodes or
`depth` levels (EAGLE-2's dynamic tree, Li et al. 2024, arXiv 2406.16858: expand the top-m most probable paths).
Which nodes grow depends only on paths already drawn, never on the children being drawn, so the tree rules stay exact
(`mmspec.core.tree_verify`). OPT-Tree (Wang et al. 2025, arXiv 2406.17276) keeps, from a larger grown pool, the
`nodes` nodes of highest path probability: the tree maximising E[accepted length] when acceptance follows the draft
probability; that prunes children by their own probability, so it takes deterministic (top-k) children only.

What differs is where a node's law comes from:
- `ModelTreeDrafter`: a draft LM (any transformers causal LM sharing the tokenizer, or an `early_exit_view`); one
  draft forward per depth over the frontier with tree attention, its tree slots dropped after drafting.
- `StandDrafter` (STAND, Song et al. 2025, arXiv 2506.04708): no draft model. An n-gram memory of the *target's*
  distributions: every committed token stores the top entries of the law it was drawn from, keyed by the n tokens
  before it (prompt tokens store a one-hot); a node's law mixes, over n = 3, 2, 1, 0 with geometrically falling
  weights, the normalised sum of the stored laws whose key matches the node's last n tokens. Stochastic drafts from a logit memory are what make
  model-free drafting work at T > 0, where prompt lookup's copies are mostly rejected.

At temperature 0 the children are the top `branching` tokens of the temperature-1 draft law (deterministic).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch

from mmspec.core.multidraft import without_replacement
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.rng import Generators, inverse_cdf, uniform
from mmspec.core.trees import SCHEMES, DraftTree
from mmspec.text.cache import forward_tree, truncate
from mmspec.text.drafters import ModelDrafter, early_exit_view


class TreeDrafter(Protocol):
    """What `speculative_generate` asks of a tree drafter (reset / rollback / select as for `Drafter`)."""

    vocab_size: int | None
    forwards: int
    shape: TreeShape  # bounds every tree it proposes: depth, children per node

    def reset(self, batch_size: int, device: torch.device, vocab_size: int) -> None:
        """Forget the previous batch; the target's vocabulary has `vocab_size` tokens (the width of q)."""

    def propose_tree(self, tokens: torch.Tensor, lengths: torch.Tensor, sampling: SamplingConfig,
                     generator: Generators) -> DraftTree:
        """A tree after `tokens[b, :lengths[b]]` (its root is the row's last token)."""

    def observe(self, tokens: torch.Tensor, start: torch.Tensor, laws: torch.Tensor, count: torch.Tensor) -> None:
        """The step committed `count[b]` tokens at positions `start[b]...` of `tokens`, drawn from `laws[b, j]`."""

    def rollback(self, keep: torch.Tensor) -> None: ...

    def select(self, index: torch.Tensor) -> None: ...


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
    return DraftTree(tokens.gather(1, order)[:, :width], parent[:, :width], n_nodes, q, scheme)


def tree_law(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """The law a node's children are drawn from: the processed draft law, or at temperature 0 the temperature-1
    law whose top tokens become deterministic children."""
    return process_logits(logits, SamplingConfig(top_k=sampling.top_k, top_p=sampling.top_p) if sampling.greedy
                          else sampling)


def shape_for(shape: TreeShape, sampling: SamplingConfig) -> TreeShape:
    """Deterministic children at temperature 0 (the target's law is one-hot: a stochastic child is wasted)."""
    return dataclasses.replace(shape, scheme="deterministic") if sampling.greedy else shape


def visible_slots(fed: torch.Tensor, paths: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """[B, F, R + F]: which of the fed nodes `fed` [B, R] and then the frontier `nodes` [B, F] each frontier node
    attends to (its ancestors and itself: the nodes on its path, `paths` [B, F, depth])."""
    columns = torch.cat([fed, nodes], 1)  # [B, R + F]
    return (paths[:, :, None, :] == columns[:, None, :, None]).any(-1)


class ModelTreeDrafter(ModelDrafter):
    """Dynamic trees from a draft LM (EAGLE-2's expansion of the most probable paths; OPT-Tree with
    `TreeShape(rerank=True, scheme="deterministic")`): one draft forward for the new committed tokens (which gives
    the root's law), then one per depth over the expanded frontier with tree attention on the draft's cache."""

    def __init__(self, model, shape: TreeShape = TreeShape()):
        if not isinstance(shape, TreeShape):
            raise TypeError(f"shape must be a TreeShape, got {type(shape).__name__}")
        super().__init__(model)
        self.shape = shape

    def reset(self, batch_size: int, device: torch.device, vocab_size: int) -> None:
        super().reset(batch_size, device)

    def observe(self, tokens, start, laws, count) -> None:
        pass

    @torch.no_grad()
    def propose_tree(self, tokens, lengths, sampling, generator) -> DraftTree:
        root_law = tree_law(self._catch_up(tokens, lengths), sampling)
        fed = torch.zeros(tokens.shape[0], 0, dtype=torch.long, device=tokens.device)

        def expand(nodes, paths, node_tokens, valid):
            nonlocal fed
            positions = lengths[:, None] - 1 + (paths >= 0).sum(-1)  # the committed length - 1 + depth
            self.forwards += 1
            logits = forward_tree(self.model, self.state, node_tokens.gather(1, nodes),
                                  visible_slots(fed, paths, nodes), positions, valid)
            fed = torch.cat([fed, nodes], 1)
            return tree_law(logits, sampling)

        tree = grow_tree(root_law, expand, shape_for(self.shape, sampling), generator)
        truncate(self.state, lengths)  # the tree's slots leave the draft cache; accepted tokens are fed next step
        return tree


class LayerSkipTreeDrafter(ModelTreeDrafter):
    """Dynamic trees from the target's first `exit_layer` layers (self-speculative)."""

    def __init__(self, target, exit_layer: int, shape: TreeShape = TreeShape()):
        super().__init__(early_exit_view(target, exit_layer), shape)


NGRAM_BASE = 1 << 20  # n-gram keys are exact for token ids below it and n <= 3 (2^60 < 2^63)


def ngram_keys(context: torch.Tensor) -> torch.Tensor:
    """[..., n] long tokens (the last one latest; -1 = before the sequence) -> [..., n] keys of the last 1..n."""
    n = context.shape[-1]
    keys, key = [], torch.zeros_like(context[..., 0])
    for i in range(1, n + 1):  # n <= 3
        key = key * NGRAM_BASE + context[..., n - i] + 1
        keys.append(key)
    return torch.stack(keys, -1)


def tail(tokens: torch.Tensor, end: torch.Tensor, n: int) -> torch.Tensor:
    """tokens[b, end[b] - n : end[b]] with -1 before position 0: tokens [B, T], end [B, ...] -> [B, ..., n]."""
    index = end[..., None] - n + torch.arange(n, device=tokens.device)
    flat = tokens.gather(1, index.clamp(min=0).flatten(1)).view(index.shape)
    return torch.where(index >= 0, flat, -1)


class StandDrafter:
    """STAND-style model-free trees: an n-gram memory of the target's own laws (see the module docstring).

    shape: the tree (stochastic children without replacement by default); max_ngram: longest context looked up
    (1..3); top: entries kept per stored law; backoff: weight of each shorter context's law relative to the next
    longer one in the mixture, in (0, 1]."""

    vocab_size = None

    def __init__(self, shape: TreeShape = TreeShape(nodes=16, branching=3, expand=4, depth=6), max_ngram: int = 3,
                 top: int = 8, backoff: float = 0.25):
        if not isinstance(shape, TreeShape):
            raise TypeError(f"shape must be a TreeShape, got {type(shape).__name__}")
        if isinstance(max_ngram, bool) or not isinstance(max_ngram, int) or not 1 <= max_ngram <= 3:
            raise ValueError(f"max_ngram must be an int in [1, 3], got {max_ngram!r}")
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise ValueError(f"top must be an int >= 1 (entries kept per stored law), got {top!r}")
        if not 0 < backoff <= 1:
            raise ValueError(f"backoff must be in (0, 1] (weight of each shorter context), got {backoff!r}")
        self.shape, self.max_ngram, self.top, self.backoff = shape, max_ngram, top, backoff
        self.forwards = 0

    def reset(self, batch_size: int, device: torch.device, vocab_size: int) -> None:
        self.vocabulary = vocab_size
        self.keys = torch.zeros(batch_size, 0, self.max_ngram, dtype=torch.long, device=device)
        self.entry_tokens = torch.zeros(batch_size, 0, self.top, dtype=torch.long, device=device)
        self.entry_probs = torch.zeros(batch_size, 0, self.top, device=device)
        self.seen = torch.zeros(batch_size, dtype=torch.long, device=device)  # positions stored so far

    def rollback(self, keep: torch.Tensor) -> None:
        pass  # the memory holds committed tokens only

    def select(self, index: torch.Tensor) -> None:
        self.keys, self.seen = self.keys[index], self.seen[index]
        self.entry_tokens, self.entry_probs = self.entry_tokens[index], self.entry_probs[index]

    def _store(self, tokens, start, width, laws_top: tuple[torch.Tensor, torch.Tensor], count) -> None:
        """Entries for positions start[b] + j, j < count[b] (< width), with the stored top laws ([B, width, top])."""
        positions = start[:, None] + torch.arange(width, device=tokens.device)  # [B, width]
        keys = ngram_keys(tail(tokens, positions, self.max_ngram))
        real = torch.arange(width, device=tokens.device) < count[:, None]
        self.keys = torch.cat([self.keys, torch.where(real[..., None], keys, -1)], 1)  # -1 never matches
        self.entry_tokens = torch.cat([self.entry_tokens, laws_top[1]], 1)
        self.entry_probs = torch.cat([self.entry_probs, laws_top[0].float() * real[..., None]], 1)
        self.seen = torch.maximum(self.seen, start + count)

    def observe(self, tokens, start, laws, count) -> None:
        top = laws.topk(min(self.top, laws.shape[-1]), dim=-1)
        values = torch.nn.functional.pad(top.values, (0, self.top - top.values.shape[-1]))
        indices = torch.nn.functional.pad(top.indices, (0, self.top - top.indices.shape[-1]))
        self._store(tokens, start, laws.shape[1], (values, indices), count)

    def _store_unseen(self, tokens, lengths) -> None:
        """One-hot entries for committed tokens no law was observed for (the prompt, on the first call)."""
        width = int((lengths - self.seen).max())  # host sync, once per step: 0 after the first call
        if width > 0:
            positions = self.seen[:, None] + torch.arange(width, device=tokens.device)
            ids = tokens.gather(1, positions.clamp(max=tokens.shape[1] - 1))
            one_hot = torch.zeros(*ids.shape, self.top, device=tokens.device)
            one_hot[..., 0] = 1
            indices = torch.zeros(*ids.shape, self.top, dtype=torch.long, device=tokens.device)
            indices[..., 0] = ids
            self._store(tokens, self.seen, width, (one_hot, indices), lengths - self.seen)

    def law(self, context: torch.Tensor, V: int) -> torch.Tensor:
        """The memory's law after each context [B, F, max_ngram] -> [B, F, V]: for every order n = 0..max_ngram
        with a match (n = 0 matches every stored law), the normalised sum of the stored laws whose last-n-token key
        matches, mixed with weight backoff^(max_ngram - n) and normalised."""
        B, F, n = context.shape
        E = self.keys.shape[1]
        match = torch.cat([torch.ones(B, F, E, 1, dtype=torch.bool, device=context.device),
                           self.keys[:, None] == ngram_keys(context)[:, :, None]], -1)  # [B, F, E, n + 1]
        weight = self.entry_probs[:, None, :, None, :] * match[..., None]  # [B, F, E, n + 1, top]
        index = self.entry_tokens[:, None, :, None, :].expand_as(weight)
        per_order = torch.zeros(B, F, n + 1, V, device=context.device)
        per_order.scatter_add_(3, index.transpose(2, 3).flatten(3), weight.transpose(2, 3).flatten(3))
        mass = per_order.sum(-1, keepdim=True)
        mix = self.backoff ** torch.arange(n, -1, -1, device=context.device, dtype=per_order.dtype)
        law = (per_order / mass.clamp(min=torch.finfo(mass.dtype).tiny) * mix[:, None]).sum(2)  # [B, F, V]
        return law / law.sum(-1, keepdim=True).clamp(min=torch.finfo(law.dtype).tiny)

    @torch.no_grad()
    def propose_tree(self, tokens, lengths, sampling, generator) -> DraftTree:
        self._store_unseen(tokens, lengths)
        V = self.vocabulary
        committed = tail(tokens, lengths[:, None], self.max_ngram)  # [B, 1, n]

        def expand(nodes, paths, node_tokens, valid):
            path = torch.where(paths >= 0, node_tokens.gather(1, paths.clamp(min=0).flatten(1)).view(paths.shape), -1)
            sequence = torch.cat([committed.expand(-1, nodes.shape[1], -1), path], -1)
            end = self.max_ngram + (paths >= 0).sum(-1)  # [B, F]
            index = end[..., None] - self.max_ngram + torch.arange(self.max_ngram, device=tokens.device)
            return self.law(sequence.gather(2, index), V)

        return grow_tree(self.law(committed, V)[:, 0], expand, shape_for(self.shape, sampling), generator)
