"""Small verification trees at SJD's frontier (SJD-PAC's proactive drafting, Kang et al. 2026, arXiv 2603.18599).

About half of SJD's forwards commit a single token: the drafts right after the committed prefix were drawn under a
prefix that has since changed, so the first of them is often rejected. A frontier tree gives each of the first
`depth` draft positions of the window `width` candidates instead of one, scored in the same target forward.

Layout (`FrontierTree`, one per window width W, shared by rows and iterations). Nodes 0 .. W-1 are SJD's window
[x_{c-1}, d_c, ..., d_{c+W-2}] (the main chain, in window order, so that a path along it keeps the cache contiguous);
the alternates follow, level by level. Node t holds a token of image position c - 1 + level[t] and attends to the
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
d_i removed; under an alternate all `width` are drawn from q_i (Gumbel-top-k, `without_replacement`). Where q_i's
support runs out (one-hot initial drafts, forced positions) a node simply has fewer children.

Verification walks the tree from the root. At the current node: RSD over its children (`rsd_plan`, Jeon et al.
2024) with the node's output as the target law; the first accepted child becomes the current node, or, when all
are rejected, a token is drawn from RSD's final residual and the walk ends. A walk still on the main chain at level
`depth` goes on as SJD's chain test; a walk at an alternate of level `depth` (a leaf) ends with a token of the
leaf's output law.

Why it stays exact (the argument of `mmspec.image.jacobi`, one step more). The children drawn for position i are
randomness of position i: no test at a position < i reads them, and they are drawn afresh every iteration. Given
F_i (everything drawn for positions < i) SJD's draft d_i has law q_i, so with the alternates drawn as above the
children of every node at position i form an ordered sample without replacement from q_i, and RSD emits a token of
law p(. | path) given F_i whichever node the walk reached. The main chain's redrafts past the committed run are
SJD's (their laws are fixed by F_i). The cache keeps exactly the accepted path: its nodes' keys/values move onto the
main chain's slots (`keep_path` of the adapter) before the rollback. `tests/image/test_frontier_law.py` shows the law
test rejecting a residual that is not renormalised across children, alternates drawn with d_i left in, and a
rollback that keeps the rejected branch's keys/values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.core.multidraft import rsd_plan, without_replacement
from mmspec.core.rng import inverse_cdf
from mmspec.core.verify import VerifyResult


@dataclass(frozen=True)
class FrontierTree:
    """The static node layout of a window of W main nodes with a (width, depth) tree at its start.

    level: [T] long, node t holds the token of image position c - 1 + level[t].
    children: [T, width] long node ids, -1 where absent. ancestors: [T, T] bool, t attends to u (itself included).
    groups: per level l = 1 .. depth, [G_l] long, the nodes of level l - 1 whose children are drawn; the main node
    comes first.
    """

    window: int
    width: int
    depth: int
    level: torch.Tensor
    children: torch.Tensor
    ancestors: torch.Tensor
    groups: tuple[torch.Tensor, ...]

    @property
    def size(self) -> int:
        """T, nodes per row."""
        return self.level.shape[0]

    @classmethod
    def build(cls, window: int, width: int, depth: int, device: torch.device | str = "cpu") -> FrontierTree:
        depth = min(depth, window - 1)  # a window's last main node has no draft after it
        parent, level = list(range(-1, window - 1)), list(range(window))
        children = [[t + 1] if t + 1 < window else [] for t in range(window)]
        groups, frontier = [], [0]
        for lv in range(1, depth + 1):
            groups.append(frontier)
            below = []
            for node in frontier:
                while len(children[node]) < width:
                    children[node].append(len(parent))
                    children.append([])
                    parent.append(node)
                    level.append(lv)
                below.extend(children[node])
            frontier = below
        T = len(parent)
        ancestors = torch.zeros(T, T, dtype=torch.bool)
        for t in range(T):
            node = t
            while node >= 0:
                ancestors[t, node] = True
                node = parent[node]
        padded = torch.tensor([c + [-1] * (width - len(c)) for c in children], dtype=torch.long)
        return cls(window, width, depth, torch.tensor(level, device=device), padded.to(device), ancestors.to(device),
                   tuple(torch.tensor(g, device=device) for g in groups))

    def draft(self, main_tokens: torch.Tensor, q: torch.Tensor, lengths: torch.Tensor,
              gumbel_uniforms: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw the alternates of one iteration; pure tensor code.

        main_tokens: [B, W] the main chain's inputs; q: [B, >= depth, V] the laws stored with the drafts at output
        positions 0 .. depth-1; lengths: [B] real drafts per row; gumbel_uniforms: per level, [B, >= G_l, V]
        U[0, 1) draws. Returns tokens [B, T] (alternates past a law's support hold a placeholder) and valid [B, T]
        bool, which nodes are real candidates (main nodes: real drafts)."""
        B, W = main_tokens.shape
        T, K = self.size, self.width
        rows = torch.arange(B, device=main_tokens.device)[:, None, None]
        level = self.level.expand(B, T)
        tokens = torch.cat([main_tokens, main_tokens.new_zeros(B, T - W)], 1)
        valid = (level >= 1) & (level <= lengths[:, None])
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
            valid[rows, node] = torch.where(alternate, drawn_valid.gather(-1, take) & valid[rows, node],
                                            valid[rows, node])
        return tokens, valid

    def walk(self, p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor,
             u_main: torch.Tensor, u_tree: torch.Tensor) -> TreeWalk:
        """RSD from the root through the tree levels; pure tensor code (a loop over `depth` levels and `width`
        children, each vectorised over rows).

        p: [B, T, V] the nodes' output laws; q: [B, >= depth, V] as in `draft`; tokens, valid: [B, T] from `draft`;
        u_main: [B, >= depth] the chain test's uniforms (the main child is tested with them, so a walk along the
        main chain decides exactly as SJD's chain test); u_tree: [B, depth, width] the other children's."""
        B = p.shape[0]
        rows = torch.arange(B, device=p.device)
        current = torch.zeros(B, dtype=torch.long, device=p.device)
        walking = torch.ones(B, dtype=torch.bool, device=p.device)
        ended = torch.zeros_like(walking)
        bonus = torch.zeros_like(walking)
        accepted = torch.zeros_like(current)
        law = p[:, 0]
        path = torch.full((B, self.depth), -1, dtype=torch.long, device=p.device)
        for lv in range(1, self.depth + 1):
            kids = self.children[current]  # [B, K]
            kid_valid = (kids >= 0) & valid.gather(1, kids.clamp(min=0))
            kid_tokens = tokens.gather(1, kids.clamp(min=0))
            p_here = p[rows, current]
            plan = rsd_plan(p_here, q[:, lv - 1], kid_tokens, kid_valid)
            u = u_tree[:, lv - 1].clone()
            u[:, 0] = torch.where(current < self.window, u_main[:, lv - 1], u[:, 0])
            hit = u < plan.accept_prob
            first = torch.where(hit.any(-1), hit.long().argmax(-1), self.width)  # [B]
            stop = walking & (first == self.width)
            law = torch.where(stop[:, None], plan.residual, law)  # p_here itself where no child was a candidate
            bonus |= stop & ~kid_valid.any(-1)
            ended |= stop
            walking &= ~stop
            current = torch.where(walking, kids.gather(1, first.clamp(max=self.width - 1)[:, None]).squeeze(1),
                                  current)
            accepted += walking.long()
            path[:, lv - 1] = torch.where(walking, current, -1)
        at_leaf = walking & (current >= self.window)  # an alternate of the last level: its output closes the run
        law = torch.where(at_leaf[:, None], p[rows, current], law)
        return TreeWalk(accepted, path, ended | at_leaf, bonus | at_leaf, law)


def without_first_child(q: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """[B, 1, V]: q [B, V] with the main node's first child (its draft, [B]) removed, the law its other children are
    drawn from (without replacement: unnormalised is fine for Gumbel-top-k)."""
    return q.scatter(-1, first[:, None], 0.0)[:, None]


@dataclass(frozen=True)
class TreeWalk:
    """accepted: [B] long, drafts accepted by the walk; path: [B, depth] the node accepted at each level, -1 past the
    walk; ended: [B] bool, the walk decided the row (it left the main chain, or rejected every child of a main
    node); the others are on the main chain at level `depth` and SJD's chain test goes on. law: [B, V] the law of the
    closing token of an ended row (RSD's residual, or an alternate leaf's output). bonus: [B] bool, that law is a
    node's own output (no child was a candidate: an alternate leaf, or past the row's real drafts); it is drawn like
    SJD's bonus token, so a row's tokens do not depend on how deep its batch's window lets the tree be."""

    accepted: torch.Tensor
    path: torch.Tensor
    ended: torch.Tensor
    bonus: torch.Tensor
    law: torch.Tensor


def merge(step_verify: VerifyResult, step_tokens: torch.Tensor, walk: TreeWalk, tokens: torch.Tensor,
          u_residual: torch.Tensor, u_fresh: torch.Tensor) -> tuple[VerifyResult, torch.Tensor, torch.Tensor]:
    """Combine SJD's chain step with the walk: rows the walk ended take its accepted path and a closing token drawn
    from its law with the uniform SJD uses at the closing position for a residual (u_residual [B, >= W]) or a bonus
    token (u_fresh); past the committed run every row keeps SJD's redrafts. Returns the step's VerifyResult, the
    window's tokens [B, W] and the path [B, depth] whose keys/values the cache keeps (main nodes on chain rows)."""
    B, W = step_tokens.shape
    n = torch.where(walk.ended, walk.accepted, step_verify.n_accepted)
    u_close = torch.where(walk.bonus[:, None], u_fresh, u_residual).gather(1, walk.accepted[:, None]).squeeze(1)
    closing = inverse_cdf(walk.law, u_close)
    next_token = torch.where(walk.ended, closing, step_verify.next_token)
    position = torch.arange(W, device=step_tokens.device)
    on_path = tokens.gather(1, walk.path.clamp(min=0))  # [B, depth]
    on_path = torch.nn.functional.pad(on_path, (0, W - on_path.shape[1]))
    window = torch.where(position < n[:, None], on_path,
                         torch.where(position == n[:, None], next_token[:, None], step_tokens))
    window = torch.where(walk.ended[:, None], window, step_tokens)
    draft_positions = torch.arange(W - 1, device=step_tokens.device)
    accept_mask = torch.where(walk.ended[:, None], draft_positions < n[:, None], step_verify.accept_mask)
    main_path = torch.arange(1, walk.path.shape[1] + 1, device=step_tokens.device).expand_as(walk.path)
    path = torch.where(walk.ended[:, None], walk.path, main_path)
    return VerifyResult(n_accepted=n, next_token=next_token, accept_mask=accept_mask), window, path
