"""DraftTree: the one draft record of tree speculation, for text and image decoders (a chain is a tree with one child
per node).

Slots. A tree of N nodes per row hangs off its root, the row's last committed token. Slot 0 is the root, slot 1 + i
is node i, so every per-node tensor has N + 1 entries: the target law p[:, s] after slot s's path (one target
forward over all slots with a tree mask, `TreeLayout.ancestors`, and depth-based positions), and the draft law
q[:, s] that slot s's children were drawn from.

                      slot 0 (root)                      node  parent  depth   children of slot (K = 2)
                     /            \\                      0     -1      1       slot 0: [1, 2]
              slot 1 (node 0)    slot 2 (node 1)          1     -1      1       slot 1: [3, 4]
               /        \\            \\                    2      0      2       slot 2: [5, -1]
         slot 3        slot 4        slot 5              3      0      2       first_child = children[..., 0]
                                                          4      1      2       next_sibling: slot 3 -> 4, 4 -> -1

Trees of one batch share their node count N; a row's padding nodes (`real` False) are not drafts: a tree grown to
a budget pads its end (ragged trees at batch > 1), and a fixed layout shared by every row (SJD's frontier tree,
`mmspec.image.frontier`) marks the nodes a row could not draw.

How children were drawn decides which verification rule is exact for them (`mmspec.core.tree_verify`):
"iid" (K independent draws from q), "without_replacement" (an ordered sample without replacement from q,
Gumbel-top-k) or "deterministic" (chosen as a function of the context, e.g. the draft's top-k; q is None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mmspec.core.drafts import Draft
from mmspec.core.tree_shape import SCHEMES


@dataclass(frozen=True)
class DraftTree:
    """Draft nodes per row, in topological order (a node's parent comes before it; siblings in the order drawn).

    tokens: [B, N] long. parent: [B, N] long, the parent's node index, -1 for a child of the root.
    real: [B, N] bool, which nodes are drafts; the others are padding, never scored as candidates (a padding node's
       descendants must be padding too). q: [B, N + 1, V] float, the law slot s's children were drawn from (rows of
       childless slots are never read), or None for "deterministic" trees. scheme: how children were drawn, one of
       SCHEMES.
    """

    tokens: torch.Tensor
    parent: torch.Tensor
    real: torch.Tensor
    q: torch.Tensor | None
    scheme: str
    branching: int | None = None  # the most children a slot can have, when the grower knows it (no host read)

    def __post_init__(self):
        if self.tokens.ndim != 2 or self.parent.shape != self.tokens.shape:
            raise ValueError(f"DraftTree.tokens and .parent must both be [B, N], got {tuple(self.tokens.shape)} and "
                             f"{tuple(self.parent.shape)}")
        B, N = self.tokens.shape
        if self.real.shape != (B, N) or self.real.dtype != torch.bool:
            raise ValueError(f"DraftTree.real must be a bool tensor of shape [{B}, {N}], got {self.real.dtype} of "
                             f"shape {tuple(self.real.shape)}")
        if self.scheme not in SCHEMES:
            raise ValueError(f"DraftTree.scheme must be one of {SCHEMES}, got {self.scheme!r}")
        if (self.q is None) != (self.scheme == "deterministic"):
            raise ValueError("DraftTree.q must be None exactly when scheme is 'deterministic'")
        if self.q is not None and self.q.shape[:2] != (B, N + 1):
            raise ValueError(f"DraftTree.q must have shape [{B}, {N + 1}, V] (one law per slot), got "
                             f"{tuple(self.q.shape)}")

    @classmethod
    def from_chain(cls, draft: Draft) -> DraftTree:
        """A chain draft as a tree: node j's parent is node j - 1; the law of token j becomes slot j's children law."""
        B, L = draft.tokens.shape
        position = torch.arange(L, device=draft.tokens.device)
        q = None if draft.q is None else torch.cat([draft.q, torch.zeros_like(draft.q[:, :1])], 1)
        return cls(draft.tokens, (position - 1).expand(B, L), position < draft.lengths[:, None], q,
                   "deterministic" if draft.q is None else "iid")

    @property
    def n_nodes(self) -> torch.Tensor:
        """[B] long, real nodes per row."""
        return self.real.sum(-1)

    def layout(self) -> TreeLayout:
        return TreeLayout.of(self)


@dataclass(frozen=True)
class TreeLayout:
    """A tree's structure over slots (0 = root), computed once per step with one host sync (the widest family).

    depth: [B, N + 1] long (root 0; padding nodes 0). ancestors: [B, N + 1, N + 1] bool, ancestors[b, s, t] = t is
    s or an ancestor of s (the tree attention mask over the window of slots). children: [B, N + 1, K] long, the
    slots of each slot's children in the order drawn, -1 where absent; K = the most children of any slot.
    """

    depth: torch.Tensor
    ancestors: torch.Tensor
    children: torch.Tensor

    @classmethod
    def of(cls, tree: DraftTree) -> TreeLayout:
        B, N = tree.tokens.shape
        device = tree.tokens.device
        real = tree.real
        parent_slot = torch.where(real, tree.parent + 1, -1)
        slots = torch.arange(N + 1, device=device)
        # pointer doubling: `jump` is each slot's 2^i-th ancestor (the root's and a padding node's: itself), `depth`
        # how far up that is (the slot's depth once `jump` is the root), and every ancestor up to it is in
        # `ancestors` after round i; paths are at most N long
        jump = torch.cat([slots[:1].expand(B, 1), torch.where(real, parent_slot, slots[1:])], 1)  # [B, N + 1]
        depth = (jump != slots).long()
        ancestors = (slots == slots[:, None]).repeat(B, 1, 1).scatter_(2, jump[..., None], True)
        row_start = torch.arange(B, device=device)[:, None] * (N + 1)
        for _ in range(math.ceil(math.log2(N + 1))):
            # the ancestor rows by row index (an index per row, not per entry: cheaper than a gather)
            ancestors |= ancestors.view(B * (N + 1), N + 1).index_select(0, (row_start + jump).flatten()).view_as(
                ancestors)
            depth = depth + depth.gather(1, jump)
            jump = jump.gather(1, jump)
        # sibling rank: earlier real nodes with the same parent (summed as int16: a bool sum to int64 is slow)
        same_parent = (parent_slot[:, :, None] == parent_slot[:, None, :]) & real[:, :, None] & real[:, None, :]
        earlier = torch.ones(N, N, dtype=torch.bool, device=device).tril(-1)
        rank = (same_parent & earlier).sum(-1, dtype=torch.int16).long()  # [B, N]
        K = tree.branching if tree.branching is not None else (  # host sync without the grower's bound
            int(torch.where(real, rank + 1, 0).max()) if N else 0)
        children = torch.full((B, (N + 1) * K + 1), -1, dtype=torch.long, device=device)
        column = torch.where(real, parent_slot * K + rank, (N + 1) * K)  # padding goes to a dropped column
        children.scatter_(1, column, torch.arange(1, N + 1, device=device).expand(B, N))
        return cls(depth, ancestors, children[:, :-1].view(B, N + 1, K))

    def masked(self, real: torch.Tensor) -> TreeLayout:
        """This layout (of a fixed tree, batch 1, every node real) for trees of the same structure whose real nodes
        are `real` [B, N]: padding children leave the children table (a slot's real children first, in the order
        drawn); depth and ancestors stay the fixed tree's, which are a real slot's in `of` too. No host sync, so one
        layout serves every step of a decoding (SJD's frontier tree)."""
        B = real.shape[0]
        slots = torch.cat([torch.ones_like(real[:, :1]), real], 1)  # [B, N + 1], the root is real
        children = self.children.expand(B, -1, -1)
        kept = (children >= 0) & slots.gather(1, children.clamp(min=0).flatten(1)).view_as(children)
        order = (~kept).long().argsort(dim=-1, stable=True)
        return TreeLayout(self.depth.expand(B, -1), self.ancestors.expand(B, -1, -1),
                          torch.where(kept, children, -1).gather(-1, order))

    @property
    def first_child(self) -> torch.Tensor:
        """[B, N + 1] long, each slot's first child slot, -1 for leaves."""
        if self.children.shape[-1] == 0:
            return torch.full(self.depth.shape, -1, dtype=torch.long, device=self.depth.device)
        return self.children[..., 0]

    @property
    def next_sibling(self) -> torch.Tensor:
        """[B, N + 1] long, each slot's next sibling slot in the order drawn, -1 for the last child and the root."""
        B, S = self.children.shape[:2]
        following = torch.cat([self.children[..., 1:], self.children.new_full((B, S, 1), -1)], -1)
        sibling = torch.full((B, S + 1), -1, dtype=torch.long, device=self.children.device)
        slots = torch.where(self.children >= 0, self.children, S).flatten(1)
        return sibling.scatter_(1, slots, following.flatten(1))[:, :S]
