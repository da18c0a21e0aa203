"""Tree drafters: each proposes a `DraftTree` with the exact law its children were drawn from.

All grow their trees with the core's `grow_tree` (`mmspec.core.drafting.tree_growth`: a `TreeShape`, EAGLE-2's dynamic
tree, OPT-Tree's reranking, or a fixed tree such as `TreeShape.positional`'s, built for the rates at which walks
accept a node's k-th child). What differs is where a node's law comes from:
- `ModelTreeDrafter`: a draft LM (any transformers causal LM sharing the tokenizer, or an `early_exit_view`); one
  draft forward per depth over the frontier with tree attention, its tree slots dropped after drafting.
- `StandDrafter` (STAND, Song et al. 2025, arXiv 2506.04708): no draft model. An n-gram memory of the *target's*
  distributions: every committed token stores the top entries of the law it was drawn from, keyed by the n tokens
  before it (prompt tokens store a one-hot), in a memory of one entry per position; a node's law mixes, over
  n = 3, 2, 1, 0 with geometrically falling weights, the normalised sum of the stored laws whose key matches the
  node's last n tokens. Stochastic drafts from a logit memory are what make model-free drafting work at T > 0, where
  prompt lookup's copies are mostly rejected.

At temperature 0 the children are the top `branching` tokens of the temperature-1 draft law (deterministic).
"""

from __future__ import annotations

import torch

from mmspec.core.drafting.tree_growth import TreeLookup, grow_tree, shape_for
from mmspec.core.probs import SamplingConfig
from mmspec.core.rng import Generators
from mmspec.core.rules.base import rule_from
from mmspec.core.speculation import Tree
from mmspec.core.tree_shape import TreeShape
from mmspec.core.tree_verify import RULE_NAMES
from mmspec.core.trees import DraftTree
from mmspec.text.drafters import Drafter, WithDraftModel, exits_of, text_law, tree_lookup
from mmspec.text.kinds import check_max_ngram, check_tree_lookup
from mmspec.text.rows import TextRows

DYNAMIC_TREE = TreeShape()  # the draft models' default: 16 nodes, 2 children each for the 4 most probable paths
STAND_TREE = TreeShape(nodes=16, branching=3, expand=4, depth=6)  # STAND's default


class TreeDrafter(Drafter):
    """Base of the drafters of trees: `propose(rows, sampling, generator) -> DraftTree` after each row's tokens (its
    root is the row's last token), bounded by `shape`; `observe(rows, laws)`: the round committed rows.count[b] tokens
    to row b, drawn from laws[b, j] (for drafters that learn from the target)."""

    shape: TreeShape

    def propose(self, rows: TextRows, sampling: SamplingConfig, generator: Generators) -> DraftTree:
        raise NotImplementedError

    def step(self, vocab_size, acceptance, draft_length, tree_rule, measure_ceiling) -> Tree:
        if draft_length is not None:
            raise ValueError("draft_length applies to chain drafters; a tree drafter is sized by its TreeShape")
        acceptance = rule_from(acceptance, "text")
        if not acceptance.lossless:
            raise ValueError(f"acceptance={acceptance.name!r} is for chains; trees are verified by exact rules "
                             f"(tree_rule)")
        if tree_rule is not None and tree_rule not in RULE_NAMES:
            raise ValueError(f"tree_rule must be one of {sorted(RULE_NAMES)}, got {tree_rule!r}")
        return Tree(self, text_law, tree_rule, measure_ceiling)


class LookupAfter:
    """For the tree drafters that take a horizontal cascade (CS-Drafting): their own laws for the first
    `lookup_after` levels, prompt lookup's point masses (n-grams up to `max_ngram`) for the deeper ones."""

    lookup_after: int | None
    max_ngram: int

    def cascade(self, lookup_after: int | None, max_ngram: int) -> None:
        check_tree_lookup(lookup_after, self.shape.depth)
        check_max_ngram(max_ngram)
        self.lookup_after, self.max_ngram = lookup_after, max_ngram

    def lookup(self, rows: TextRows) -> TreeLookup | None:
        if self.lookup_after is None:
            return None
        return TreeLookup(self.lookup_after, tree_lookup(rows, self.max_ngram))


class ModelTreeDrafter(WithDraftModel, LookupAfter, TreeDrafter):
    """Dynamic trees from a draft LM (EAGLE-2's expansion of the most probable paths; OPT-Tree with
    `TreeShape(rerank=True, scheme="deterministic")`; a fixed tree with `TreeShape.positional`): one draft forward
    for the new committed tokens (which gives the root's law), then one per depth over the expanded frontier with tree
    attention on the draft's cache (`mmspec.core.drafting.proposer.ModelProposer.tree`). lookup_after: a horizontal
    cascade, the draft LM's levels up to it, prompt lookup's after (`LookupAfter`; None: every level the draft LM's)."""

    def __init__(self, model, shape: TreeShape = DYNAMIC_TREE, lookup_after: int | None = None, max_ngram: int = 3):
        if not isinstance(shape, TreeShape):
            raise TypeError(f"shape must be a TreeShape, got {type(shape).__name__}")
        self.attach(model)
        self.shape = shape
        self.cascade(lookup_after, max_ngram)

    @torch.no_grad()
    def propose(self, rows, sampling, generator) -> DraftTree:
        return self.proposer.tree(rows.seq, rows.committed, self.shape, text_law, sampling, generator,
                                  self.lookup(rows))


class LayerSkipTreeDrafter(ModelTreeDrafter):
    """Dynamic trees from the target's first `exit_layer` layers (self-speculative)."""

    def __init__(self, target, exit_layer: int, shape: TreeShape = DYNAMIC_TREE):
        super().__init__(exits_of(target, "LayerSkipTreeDrafter").exit_model(exit_layer), shape)


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


class StandDrafter(TreeDrafter):
    """STAND-style model-free trees: an n-gram memory of the target's own laws (see the module docstring).

    shape: the tree (stochastic children without replacement by default); max_ngram: longest context looked up
    (1..3); top: entries kept per stored law; backoff: weight of each shorter context's law relative to the next
    longer one in the mixture, in (0, 1]."""

    def __init__(self, shape: TreeShape = STAND_TREE, max_ngram: int = 3,
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

    def start(self, rows: TextRows, vocab_size: int, capacity: int) -> None:
        """The memory: one entry per position of the rows' tokens (and a last one that writes of nothing land in),
        the prompt's tokens stored as one-hot entries (no law was observed for them)."""
        B, P, device = rows.batch_size, rows.tokens.shape[1], rows.tokens.device
        self.vocabulary = vocab_size
        self.keys = torch.full((B, P + 1, self.max_ngram), -1, dtype=torch.long, device=device)  # -1 never matches
        self.entry_tokens = torch.zeros(B, P + 1, self.top, dtype=torch.long, device=device)
        self.entry_probs = torch.zeros(B, P + 1, self.top, device=device)
        one_hot = torch.zeros(B, P, self.top, device=device)
        one_hot[..., 0] = 1
        indices = torch.zeros(B, P, self.top, dtype=torch.long, device=device)
        indices[..., 0] = rows.tokens
        self._store(rows.tokens, torch.zeros_like(rows.lengths), P, (one_hot, indices), rows.lengths)

    def select(self, index: torch.Tensor) -> None:
        self.keys, self.entry_tokens = self.keys[index], self.entry_tokens[index]
        self.entry_probs = self.entry_probs[index]

    def _store(self, tokens, start, width, laws_top: tuple[torch.Tensor, torch.Tensor], count) -> None:
        """Entries for positions start[b] + j, j < count[b] (< width), with the stored top laws ([B, width, top]),
        written in place at their positions (a captured step's next iteration reads the memory)."""
        positions = start[:, None] + torch.arange(width, device=tokens.device)  # [B, width]
        keys = ngram_keys(tail(tokens, positions, self.max_ngram))
        real = torch.arange(width, device=tokens.device) < count[:, None]
        slots = torch.where(real, positions, self.keys.shape[1] - 1)  # the rest into the last entry, never matched
        self.keys.scatter_(1, slots[..., None].expand_as(keys), torch.where(real[..., None], keys, -1))
        self.entry_tokens.scatter_(1, slots[..., None].expand_as(laws_top[1]), laws_top[1])
        self.entry_probs.scatter_(1, slots[..., None].expand_as(laws_top[0]),
                                  laws_top[0].float() * real[..., None])

    def observe(self, rows, laws) -> None:
        tokens, count = rows.tokens, rows.count
        top = laws.topk(min(self.top, laws.shape[-1]), dim=-1)
        values = torch.nn.functional.pad(top.values, (0, self.top - top.values.shape[-1]))
        indices = torch.nn.functional.pad(top.indices, (0, self.top - top.indices.shape[-1]))
        self._store(tokens, rows.lengths - count, laws.shape[1], (values, indices), count)

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
    def propose(self, rows, sampling, generator) -> DraftTree:
        tokens, lengths = rows.tokens, rows.lengths
        V = self.vocabulary
        committed = tail(tokens, lengths[:, None], self.max_ngram)  # [B, 1, n]

        def expand(nodes, paths, node_tokens, valid):
            path = torch.where(paths >= 0, node_tokens.gather(1, paths.clamp(min=0).flatten(1)).view(paths.shape), -1)
            sequence = torch.cat([committed.expand(-1, nodes.shape[1], -1), path], -1)
            end = self.max_ngram + (paths >= 0).sum(-1)  # [B, F]
            index = end[..., None] - self.max_ngram + torch.arange(self.max_ngram, device=tokens.device)
            return self.law(sequence.gather(2, index), V)

        return grow_tree(self.law(committed, V)[:, 0], expand, shape_for(self.shape, sampling), generator)
