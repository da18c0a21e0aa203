"""Small verification trees at SJD's frontier (SJD-PAC's proactive drafting, Kang et al. 2026, arXiv 2603.18599).

About half of SJD's forwards commit a single token: the drafts right after the committed prefix were drawn under a
prefix that has since changed, so the first of them is often rejected. A frontier tree gives each of the first
`depth` draft positions of the window `width` candidates instead of one, scored in the same target forward.

Layout (`FrontierTree`, one per window width W, shared by rows and iterations). Each iteration's window is a
`DraftTree` (`mmspec.core.trees`) whose slot t is node t: slot 0 is the root x_{c-1}, slots 1 .. W-1 SJD's drafts
[d_c, ..., d_{c+W-2}] (the main chain, in window order, so that a path along it keeps the cache contiguous); the
alternates follow, level by level. Node t holds a token of image position c - 1 + level[t] and attends to the
committed prefix and to its ancestors (tree attention); its output is the target law of the next position given its
path. Every node of level l < depth has `width` children: a main node's first child is the next main node, the
other children are alternates; an alternate's children are all alternates. For width 3, depth 2 that is 10
alternates; past level `depth` only the main chain goes on.

    level:   0        1                 2
             x_{c-1} ─ d_c ─────────── d_{c+1} ─ d_{c+2} ─ ...      (main chain)
                    │      └ a, a'
                    ├ a ── a, a', a''
                    └ a' ─ a, a', a''

Drafting. The children of one node at image position i are an ordered sample without replacement from q_i, the law
stored with SJD's draft d_i: under a main node the first child is d_i itself and the others are drawn from q_i with
d_i removed; under an alternate all `width` are drawn from q_i (Gumbel-top-k, `without_replacement`). So the tree's
scheme is "without_replacement" and q_i is the law of every slot whose children sit at position i. Where q_i's
support runs out (one-hot initial drafts, forced positions) a node has fewer children: the others are padding nodes
of the row's DraftTree (`real` False), as are the main nodes past the row's real drafts and their subtrees.

Verification is the core's tree walk (`mmspec.core.tree_verify.walk_tree`) with RSD (Jeon et al. 2024), the rule
for children drawn without replacement, for the tree's `depth` levels: at the current node the first accepted child
becomes the current node, or, when all are rejected, a token is drawn from RSD's final residual and the walk ends. A
walk still on the main chain after `depth` levels goes on as SJD's chain test; a walk at a leaf (an alternate of
level `depth`, or a node past the row's real drafts) ends with a token of the leaf's output law. A node's first
child is tested with SJD's chain-test uniform of its position, so a walk along the main chain decides exactly as
SJD's chain test; on a walk that left the main chain that uniform is read by nothing else (its position is then
committed, so SJD's redraft there is discarded).

Why it stays exact (the argument of `mmspec.image.jacobi`, one step more). The children drawn for position i are
randomness of position i: no test at a position < i reads them, and they are drawn afresh every iteration. Given
F_i (everything drawn for positions < i) SJD's draft d_i has law q_i, so with the alternates drawn as above the
children of every node at position i form an ordered sample without replacement from q_i, and RSD emits a token of
law p(. | path) given F_i whichever node the walk reached. The main chain's redrafts past the committed run are
SJD's (their laws are fixed by F_i). The cache keeps exactly the accepted path: its nodes' keys/values move onto the
main chain's slots (`keep_path` of the adapter) before the rollback. `tests/image/test_frontier_law.py` shows the law
test rejecting children verified as iid, a residual that is not renormalised across children, alternates drawn with
d_i left in, and a rollback that keeps the rejected branch's keys/values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmspec.core.model import Logits
from mmspec.core.multidraft import without_replacement
from mmspec.core.rng import Generators, inverse_cdf, uniform
from mmspec.core.tree_verify import TreeWalk, walk_tree
from mmspec.core.trees import DraftTree, TreeLayout
from mmspec.core.verify import VerifyResult


@dataclass(frozen=True)
class FrontierTree:
    """The fixed layout of a window of W main nodes with a (width, depth) tree at its start.

    parent: [T - 1] long, the DraftTree parent of each node (node t - 1 is slot t; -1 = the root). layout: the
    `TreeLayout` of the tree with every node real (batch 1). groups: per level l = 1 .. depth, [G_l] long, the slots
    of level l - 1 whose children are drawn; the main node comes first.
    """

    window: int
    width: int
    depth: int
    parent: torch.Tensor
    layout: TreeLayout
    groups: tuple[torch.Tensor, ...]

    @property
    def size(self) -> int:
        """T, slots per row (the root and every node)."""
        return self.level.shape[0]

    @property
    def level(self) -> torch.Tensor:
        """[T] long, slot t holds the token of image position c - 1 + level[t]."""
        return self.layout.depth[0]

    @property
    def ancestors(self) -> torch.Tensor:
        """[T, T] bool, slot t attends to slot u (itself included): the tree mask of the window's forward."""
        return self.layout.ancestors[0]

    @property
    def children(self) -> torch.Tensor:
        """[T, width] long, each slot's children in the order drawn (a main node's main child first), -1 absent."""
        return self.layout.children[0]

    @classmethod
    def build(cls, window: int, width: int, depth: int, device: torch.device | str = "cpu") -> FrontierTree:
        depth = min(depth, window - 1)  # a window's last main node has no draft after it
        parent = list(range(-1, window - 1))  # each slot's parent slot: the main chain first
        groups, frontier = [], [0]
        for _ in range(depth):
            groups.append(frontier)
            below = []
            for node in frontier:
                main = [node + 1] if node < window - 1 else []  # a main node's first child is the next main node
                alternates = list(range(len(parent), len(parent) + width - len(main)))
                parent.extend([node] * len(alternates))
                below.extend(main + alternates)
            frontier = below
        nodes = torch.tensor(parent[1:], dtype=torch.long, device=device) - 1  # slot t is node t - 1
        template = DraftTree(torch.zeros_like(nodes)[None], nodes[None], torch.ones_like(nodes, dtype=torch.bool)[None],
                             None, "deterministic")
        return cls(window, width, depth, nodes, TreeLayout.of(template),
                   tuple(torch.tensor(g, device=device) for g in groups))

    def draft(self, main_tokens: torch.Tensor, q: torch.Tensor, lengths: torch.Tensor,
              gumbel_uniforms: list[torch.Tensor]) -> DraftTree:
        """Draw the alternates of one iteration; pure tensor code.

        main_tokens: [B, W] the main chain's inputs; q: [B, W - 1, V] the laws stored with the drafts at output
        positions 0 .. W - 2; lengths: [B] real drafts per row; gumbel_uniforms: per level, [B, >= G_l, V] U[0, 1)
        draws. Returns the window's DraftTree (its nodes: slots 1 .. T - 1; alternates past a law's support and
        main nodes past a row's real drafts, with their subtrees, are padding)."""
        B, W = main_tokens.shape
        T, K = self.size, self.width
        rows = torch.arange(B, device=main_tokens.device)[:, None, None]
        level = self.level.expand(B, T)
        tokens = torch.cat([main_tokens, main_tokens.new_zeros(B, T - W)], 1)
        valid = level <= lengths[:, None]  # the root and the real drafts; alternates below real nodes only
        for lv, parents in enumerate(self.groups, start=1):
            G = parents.shape[0]
            law = q[:, lv - 1, None].expand(B, G, -1)
            law = torch.cat([without_first_child(law[:, 0], main_tokens[:, lv]), law[:, 1:]], 1)
            drawn, drawn_valid = without_replacement(law, gumbel_uniforms[lv - 1][:, :G], K)  # [B, G, K]
            kids = self.children[parents]  # [G, K]
            rank = torch.arange(K, device=kids.device).expand(G, K) - (kids[:, :1] < W).long()  # main child: rank 0
            alternate = kids >= W
            node = kids.clamp(min=0).expand(B, G, K)
            take = rank.clamp(min=0).expand(B, G, K)
            tokens[rows, node] = torch.where(alternate, drawn.gather(-1, take), tokens[rows, node])
            real = drawn_valid.gather(-1, take) & valid[rows, node] & valid[:, parents, None]
            valid[rows, node] = torch.where(alternate, real, valid[rows, node])
        laws = q[:, self.level.clamp(max=W - 2)]  # [B, T, V]: slot t's children sit at output position level[t]
        return DraftTree(tokens[:, 1:], self.parent.expand(B, -1), valid[:, 1:], laws, "without_replacement")

    def walk(self, p: torch.Tensor, tree: DraftTree, u_main: torch.Tensor, u_tree: torch.Tensor) -> TreeWalk:
        """The core's tree walk (RSD) over the tree's `depth` levels. p: [B, T, V] the slots' output laws; tree:
        from `draft`; u_main: [B, >= depth] the chain test's uniforms, which test each level's first child (so a
        walk along the main chain decides exactly as SJD's chain test); u_tree: [B, depth, width - 1] the other
        children's."""
        u = torch.cat([u_main[:, : self.depth, None], u_tree[:, : self.depth]], -1)  # [B, depth, width]
        return walk_tree(p, tree, u, self.layout.masked(tree.real), levels=self.depth)


def without_first_child(q: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """[B, 1, V]: q [B, V] with the main node's first child (its draft, [B]) removed, the law its other children are
    drawn from (without replacement: unnormalised is fine for Gumbel-top-k)."""
    return q.scatter(-1, first[:, None], 0.0)[:, None]


def merge(step_verify: VerifyResult, step_tokens: torch.Tensor, walk: TreeWalk, slot_tokens: torch.Tensor,
          u_residual: torch.Tensor, u_fresh: torch.Tensor) -> tuple[VerifyResult, torch.Tensor, torch.Tensor]:
    """Combine SJD's chain step with the walk (`FrontierTree.walk`): rows the walk ended take its accepted path and a
    closing token drawn from its law with the uniform SJD uses at the closing position for a residual (u_residual
    [B, >= W]) or a bonus token (u_fresh: the walk's law is a node's own output, as SJD's bonus is, so a row's
    tokens do not depend on how deep its batch's window lets the tree be); past the committed run every row keeps
    SJD's redrafts. slot_tokens: [B, T], each slot's token. Returns the step's VerifyResult, the window's tokens
    [B, W] and the path [B, depth] whose keys/values the cache keeps (main nodes on chain rows)."""
    B, W = step_tokens.shape
    accepted = walk.n_accepted
    n = torch.where(walk.ended, accepted, step_verify.n_accepted)
    u_close = torch.where(walk.bonus[:, None], u_fresh, u_residual).gather(1, accepted[:, None]).squeeze(1)
    closing = inverse_cdf(walk.law, u_close)
    next_token = torch.where(walk.ended, closing, step_verify.next_token)
    position = torch.arange(W, device=step_tokens.device)
    on_path = slot_tokens.gather(1, walk.path.clamp(min=0))  # [B, depth]
    on_path = torch.nn.functional.pad(on_path, (0, W - on_path.shape[1]))
    window = torch.where(position < n[:, None], on_path,
                         torch.where(position == n[:, None], next_token[:, None], step_tokens))
    window = torch.where(walk.ended[:, None], window, step_tokens)
    draft_positions = torch.arange(W - 1, device=step_tokens.device)
    accept_mask = torch.where(walk.ended[:, None], draft_positions < n[:, None], step_verify.accept_mask)
    main_path = torch.arange(1, walk.path.shape[1] + 1, device=step_tokens.device).expand_as(walk.path)
    path = torch.where(walk.ended[:, None], walk.path, main_path)
    return VerifyResult(n_accepted=n, next_token=next_token, accept_mask=accept_mask), window, path


class ChainWindow:
    """How SJD scores its window without a tree: the main chain alone, in a window forward. The other half of the
    frontier strategy that `FrontierTrees` is (the Jacobi step calls both the same way)."""

    def __init__(self, window: int, device: torch.device | str = "cpu"):
        self.level = torch.arange(window, device=device)  # [W] slot t holds the token of position c - 1 + t

    def draft(self, inputs: torch.Tensor, q: torch.Tensor, lengths: torch.Tensor, generator: Generators) -> None:
        """Nothing to draw beyond the window's drafts."""

    def forward(self, model: Any, inputs: torch.Tensor, state: Any) -> Logits:
        return model.forward(inputs, state)

    def verify(self, step: Any, p: torch.Tensor, uniforms: torch.Tensor) -> tuple[VerifyResult, torch.Tensor]:
        """SJD's own chain test decides (step: the window's `mmspec.image.jacobi.JacobiOutcome`): its VerifyResult and
        the window's tokens [B, W]."""
        return step.verify, step.tokens

    def keep(self, model: Any, state: Any) -> None:
        """The window's keys/values are already where the rollback keeps them."""


class FrontierTrees:
    """SJD-PAC's frontier tree around SJD's window (see the module docstring): each iteration draws the alternates
    of every row (a fixed number of draws per row, so a row's random stream does not depend on its batch), scores
    the window's main chain and alternates in one `forward_tree`, walks the tree with RSD for its depth (rows still
    on the main chain then go on as SJD's chain test) and keeps the accepted path's keys/values."""

    def __init__(self, window: int, width: int, depth: int, device: torch.device | str = "cpu"):
        self.width, self.depth = width, depth
        self.layout = FrontierTree.build(window, width, depth, device)
        self.level = self.layout.level  # [T]

    def draft(self, inputs: torch.Tensor, q: torch.Tensor, lengths: torch.Tensor, generator: Generators) -> None:
        """Draw the alternates of the window (inputs [B, W], q [B, W - 1, V], lengths [B])."""
        B, V, device = inputs.shape[0], q.shape[-1], inputs.device
        gumbel_uniforms = [uniform((B, g.shape[0], V), generator, device, q.dtype) for g in self.layout.groups]
        self.walk_uniforms = uniform((B, self.depth, self.width - 1), generator, device, q.dtype)
        self.tree = self.layout.draft(inputs, q, lengths, gumbel_uniforms)
        self.tokens = torch.cat([inputs[:, :1], self.tree.tokens], 1)  # [B, T] the root, then the tree's nodes

    def forward(self, model: Any, inputs: torch.Tensor, state: Any) -> Logits:
        return model.forward_tree(self.tokens, self.layout.level, self.layout.ancestors, state)

    def verify(self, step: Any, p: torch.Tensor, uniforms: torch.Tensor) -> tuple[VerifyResult, torch.Tensor]:
        """The tree walk over the slots' laws p [B, T, V], merged with SJD's chain step (`merge`; step: the window's
        `JacobiOutcome`), with the iteration's uniforms [B, 4, >= W] (init, accept, residual, fresh)."""
        walk = self.layout.walk(p, self.tree, uniforms[:, 1], self.walk_uniforms[:, : self.layout.depth])
        verified, tokens, self.path = merge(step.verify, step.tokens, walk, self.tokens, uniforms[:, 2],
                                            uniforms[:, 3])
        return verified, tokens

    def keep(self, model: Any, state: Any) -> None:
        model.keep_path(state, self.path)  # the accepted path's keys/values onto the main chain's slots
