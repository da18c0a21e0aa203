"""Exact verification of a `DraftTree`: walk from the root, at each node a multi-draft rule over its children that
matches how they were drawn; the first accepted child becomes the current node; when every child is rejected (or the
node is a leaf) one token is drawn from the rule's final residual (the target law itself at a leaf: the bonus).

| rule            | children drawn                 | P(accept at a node)                          | cost per node  |
|-----------------|--------------------------------|----------------------------------------------|----------------|
| "specinfer"     | iid from q                     | multi-round rejection (SpecInfer)            | O(K V)         |
| "spectr"        | iid from q                     | 1 - (1 - beta(rho*))^K (SpecTr K-SEQ)        | O(K V + 64 V)  |
| "khisti"        | iid from q, K <= 2             | 1 - TV(p, r), r = law of the IS-selected one | O(V^2) at K=2  |
| "rsd"           | without replacement from q     | recursive rejection (RSD)                    | O(K V)         |
| "deterministic" | a function of the context      | p(children): sample y ~ p, walk if y is one  | O(K V)         |

- SpecInfer (Miao et al. 2024, arXiv 2305.09781): p' = p; child j accepted with min(1, p'(c_j)/q(c_j)), else
  p' = norm(max(p' - q, 0)); deterministic children are the same rule with q = one-hot(c_j).
- RSD (Jeon et al. 2024, arXiv 2402.14160): as SpecInfer, but after rejecting c_j also q = q without c_j, renormalised
  (both: `mmspec.core.multidraft.recursive_plan`).
- SpecTr K-SEQ (Sun et al. 2023, arXiv 2310.15141), `mmspec.core.multidraft.spectr_plan`.
- Khisti et al. 2025 (arXiv 2410.18234), two-stage: select one of the K = 2 drafts by importance weights w = p/q
  (c_1 with w(c_1) / (w(c_1) + w(c_2))); its law is r = 2 q (M q), M[y, z] = w(y) / (w(y) + w(z)); then single-draft
  speculative sampling of the selected token against p with r.

`walk_tree` walks with uniforms the caller gives and may stop after a number of levels (SJD's frontier tree hands a
row still on its main chain back to SJD's chain test); `verify_tree` draws them, walks to the leaves and draws the
closing token.

Why a walk is exact: each rule emits a token of law p_u at node u whatever the number of children, provided that
number does not depend on the children's own draws; given the accepted child c, c's children are a fresh draw from
q_c, so the walk continues from c with law p_c. Dynamic trees that choose which nodes to expand by the path's draft
probability keep this (the path is drawn before the children); trees that prune children by their own probability
must use deterministic children.

The ceiling (`alpha_star`): Hu et al. 2025 (arXiv 2502.18779) show the best acceptance any verifier can reach for
drafts x_1..x_K ~ Q is alpha* = min over sets H of p(H) + Q(some x_j outside H) (an optimal-transport LP's dual).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations, permutations

import torch

from mmspec.core.multidraft import MultiDraftPlan, recursive_plan, spectr_plan
from mmspec.core.rng import Generators, sample, uniform
from mmspec.core.rules.exact import accept_probability, residual_law
from mmspec.core.trees import DraftTree, TreeLayout

TREE_RULES = {"iid": ("specinfer", "spectr", "khisti"), "without_replacement": ("rsd",),
              "deterministic": ("deterministic",)}
DEFAULT_RULES = {scheme: rules[0] for scheme, rules in TREE_RULES.items()}
RULE_NAMES = tuple(rule for rules in TREE_RULES.values() for rule in rules)
KHISTI_CHUNK = 1 << 24  # elements of the [rows, V, V] selection-weight tensor built at once
EXACT_CEILING_VOCABULARY = 12  # alpha_star enumerates every set H up to this many tokens


def check_rule(scheme: str, rule: str | None) -> str:
    """The rule that verifies children drawn by `scheme` (default: the first of TREE_RULES[scheme])."""
    if rule is None:
        return DEFAULT_RULES[scheme]
    if rule not in TREE_RULES[scheme]:
        exact_for = [s for s, rules in TREE_RULES.items() if rule in rules]
        raise ValueError(f"tree rule {rule!r} is not exact for {scheme!r} children; {scheme!r} takes "
                         f"{TREE_RULES[scheme]}" + (f" ({rule!r} is for {exact_for[0]!r})" if exact_for else ""))
    return rule


def khisti_selection_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """r = 2 q (M q): the law of the token that importance weights w = p/q select from two iid drafts of q.
    p, q: [R, V] -> [R, V]. Built in row chunks of at most KHISTI_CHUNK weight entries."""
    V = p.shape[1]
    chunk = max(1, KHISTI_CHUNK // (V * V))
    laws = []
    for p_c, q_c in zip(p.split(chunk), q.split(chunk), strict=True):
        w = torch.where(q_c > 0, p_c / q_c.clamp(min=torch.finfo(q_c.dtype).tiny), 0)
        total = w[:, :, None] + w[:, None, :]
        m = torch.where(total > 0, w[:, :, None] / total.clamp(min=torch.finfo(q_c.dtype).tiny), 0.5)
        laws.append(2 * q_c * m.bmm(q_c[:, :, None]).squeeze(-1))
    return torch.cat(laws)


def khisti_plan(p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor) -> MultiDraftPlan:
    """Two-stage selection + single-draft speculative sampling for K <= 2 iid candidates, as a sequential plan:
    P(accept c_1) = s a(c_1), P(accept c_2 | c_1 not) = (1 - s) a(c_2) / (1 - s a(c_1)), s = P(select c_1),
    a = min(1, p/r)."""
    R, K = candidates.shape
    if K > 2:
        raise ValueError(f"the 'khisti' rule takes at most 2 children per node, got {K}")
    if K == 0:
        return recursive_plan(p, q, candidates, valid, without_replacement=False)
    two = valid[:, -1] if K == 2 else torch.zeros(R, dtype=torch.bool, device=p.device)
    r = q.clone()
    r[two] = khisti_selection_law(p[two], q[two])  # only the nodes with two children pay O(V^2)
    a = accept_probability(p.gather(1, candidates), r.gather(1, candidates)) * valid  # [R, K]
    if K == 1:
        return MultiDraftPlan(accept_prob=a, residual=torch.where(valid[:, :1], residual_law(p, r), p))
    w = torch.where(q > 0, p / q.clamp(min=torch.finfo(q.dtype).tiny), 0).gather(1, candidates)  # [R, 2]
    total = w.sum(-1)
    s = torch.where(two, torch.where(total > 0, w[:, 0] / total.clamp(min=torch.finfo(q.dtype).tiny), 0.5), 1.0)
    first = s * a[:, 0]
    second = torch.where(first < 1, (1 - s) * a[:, 1] / (1 - first).clamp(min=torch.finfo(q.dtype).tiny), 0)
    residual = torch.where(valid[:, :1], residual_law(p, r), p)
    return MultiDraftPlan(accept_prob=torch.stack([first, second], 1), residual=residual)


def node_plans(p: torch.Tensor, tree: DraftTree, layout: TreeLayout, rule: str,
               slots: torch.Tensor | None = None) -> MultiDraftPlan:
    """The rule's plans at `slots` [B, F] (None: every slot, F = N + 1) over their children: accept_prob [B, F, K],
    residual [B, F, V] (a leaf's residual is its target law). p: [B, N + 1, V], the target law after each slot."""
    B, S, V = p.shape
    if slots is None:
        slots = torch.arange(S, device=p.device).expand(B, S)
    F, K = slots.shape[1], layout.children.shape[-1]
    children = layout.children.gather(1, slots[..., None].expand(B, F, K))  # [B, F, K]
    valid = (children >= 0).view(B * F, K)
    node = (children - 1).clamp(min=0).view(B, F * K)
    candidates = tree.tokens.gather(1, node).view(B * F, K) if tree.tokens.shape[1] else node.view(B * F, K)
    at = slots[..., None].expand(B, F, V)
    p_at = p.gather(1, at).view(B * F, V)
    q_at = None if tree.q is None else tree.q.gather(1, at).to(p.dtype).view(B * F, V)
    if rule == "spectr":
        plan = spectr_plan(p_at, q_at, candidates, valid)
    elif rule == "khisti":
        plan = khisti_plan(p_at, q_at, candidates, valid)
    else:
        plan = recursive_plan(p_at, q_at, candidates, valid, without_replacement=rule == "rsd")
    return MultiDraftPlan(plan.accept_prob.view(B, F, K), plan.residual.view(B, F, V))


@dataclass(frozen=True)
class TreeWalk:
    """path: [B, D] long, the accepted nodes' slots by depth, -1 past them. node: [B] long, the slot the walk stopped
    at (the last accepted node, or the root). ended: [B] bool, the walk decided the row's closing token: the rule
    rejected every child of `node`, or `node` is a leaf; False where the levels ran out at an inner node. law: [B, V],
    the law of an ended row's closing token: the rule's final residual at `node`, its target law where it has no
    children. bonus: [B] bool, law is that target law (no child was a candidate). node_acceptance: [B, D] float, at
    each inner node the walk visited (root first), the rule's probability of accepting one of its children; NaN past
    the walk and at leaves (the mean over visited nodes is the rule's realised acceptance rate). node_children:
    [B, D] long, how many children those nodes have (0 elsewhere); accepted_rank: [B, D] long, which of them the
    walk accepted (0 = the first drawn; -1 where none was, and elsewhere): with node_children, the positional
    acceptance rates a fixed tree is built from (`TreeShape.positional`)."""

    path: torch.Tensor
    node: torch.Tensor
    ended: torch.Tensor
    law: torch.Tensor
    bonus: torch.Tensor
    node_acceptance: torch.Tensor
    node_children: torch.Tensor
    accepted_rank: torch.Tensor

    @property
    def n_accepted(self) -> torch.Tensor:
        """[B] long, accepted nodes."""
        return (self.path >= 0).sum(-1)


def walk_tree(p: torch.Tensor, tree: DraftTree, u: torch.Tensor, layout: TreeLayout | None = None,
              rule: str | None = None, levels: int | None = None) -> TreeWalk:
    """Walk `tree` from the root with `rule` (default: the exact rule of its scheme, see TREE_RULES), testing the
    children of the level-d node with the uniforms u[:, d] [B, >= levels, >= K]; pure tensor code (a loop over the
    levels, each vectorised over rows; the plan is computed at the visited nodes only). p: [B, N + 1, V], the target
    law after each slot. levels: how many levels to walk (None: to the leaves, one host sync for the depth); a walk
    still accepting after them is not ended, and the caller goes on from `node` (SJD's chain past its frontier
    tree, `mmspec.image.frontier`)."""
    rule = check_rule(tree.scheme, rule)
    layout = layout or tree.layout()
    B, S = p.shape[:2]
    K = layout.children.shape[-1]
    D = int(layout.depth.max()) if levels is None else levels  # host sync (levels None): the deepest path
    rows = torch.arange(B, device=p.device)
    current = torch.zeros(B, dtype=torch.long, device=p.device)
    walking = torch.ones(B, dtype=torch.bool, device=p.device)
    bonus = torch.zeros_like(walking)
    law = p[:, 0]
    path = torch.full((B, D), -1, dtype=torch.long, device=p.device)
    has_children = layout.children[..., 0] >= 0 if K else torch.zeros(B, S, dtype=torch.bool, device=p.device)
    node_acceptance = torch.full((B, D), torch.nan, dtype=p.dtype, device=p.device)
    node_children = torch.zeros(B, D, dtype=torch.long, device=p.device)
    accepted_rank = torch.full((B, D), -1, dtype=torch.long, device=p.device)
    for d in range(D):
        plan = node_plans(p, tree, layout, rule, current[:, None])
        accept, kids = plan.accept_prob[:, 0], layout.children[rows, current]  # [B, K]
        here = has_children[rows, current]
        node_acceptance[:, d] = torch.where(walking & here, 1 - (1 - accept).prod(-1), torch.nan)
        node_children[:, d] = torch.where(walking, (kids >= 0).sum(-1), 0)
        hit = (u[:, d, :K] < accept) & (kids >= 0)
        accepted_rank[:, d] = torch.where(walking & hit.any(-1), hit.long().argmax(-1), -1)
        stop = walking & ~hit.any(-1)
        law = torch.where(stop[:, None], plan.residual[:, 0], law)
        bonus |= stop & ~here
        walking &= ~stop
        chosen = kids.gather(1, hit.long().argmax(-1, keepdim=True)).squeeze(1)
        current = torch.where(walking, chosen, current)
        path[:, d] = torch.where(walking, current, -1)
    at_leaf = walking & ~has_children[rows, current]  # reached at the last level walked: its target law closes
    law = torch.where(at_leaf[:, None], p[rows, current], law)
    return TreeWalk(path, current, ~walking | at_leaf, law, bonus | at_leaf, node_acceptance, node_children,
                    accepted_rank)


@dataclass(frozen=True)
class TreeVerifyResult:
    """n_accepted: [B] long, accepted nodes. path: [B, D] long, the accepted nodes' slots by depth, -1 past them.
    next_token: [B] long, the residual or bonus token after the path. node_acceptance, node_children,
    accepted_rank: [B, D], as in `TreeWalk`. node_alpha_star: [B, D] float, alpha* at the same nodes (`alpha_star`
    for the node's children), when asked for; else None."""

    n_accepted: torch.Tensor
    path: torch.Tensor
    next_token: torch.Tensor
    node_acceptance: torch.Tensor
    node_children: torch.Tensor
    accepted_rank: torch.Tensor
    node_alpha_star: torch.Tensor | None = None


def verify_tree(p: torch.Tensor, tree: DraftTree, generator: Generators, rule: str | None = None,
                layout: TreeLayout | None = None, ceiling: bool = False,
                draws: tuple[int, int] | None = None) -> TreeVerifyResult:
    """Walk `tree` to its leaves (`walk_tree`) and draw the closing token. p: [B, N + 1, V], the target law after
    each slot. The random stream does not depend on acceptance: a [B, depth, children] block of uniforms, then one
    for the closing token. draws: (depth, children) bounds of every tree the caller draws (a drafter's shape), so
    that the block, and with per-row generators a row's stream, does not depend on the other rows' trees; None:
    this batch's deepest and widest. ceiling: also compute alpha* at every visited inner node (a sort of the
    vocabulary per node)."""
    rule = check_rule(tree.scheme, rule)
    B, S = p.shape[:2]
    if S != tree.tokens.shape[1] + 1:
        raise ValueError(f"p must be [B, N + 1, V] for a tree of N = {tree.tokens.shape[1]} nodes, got "
                         f"{tuple(p.shape)}")
    layout = layout or tree.layout()
    K = layout.children.shape[-1]
    if draws is None:
        D = int(layout.depth.max())  # host sync: the deepest path
    elif K > draws[1]:
        raise ValueError(f"draws={draws} bounds the tree's (depth, children), but the tree has up to {K} children "
                         f"per node")
    else:  # the bound (no host read): levels past a row's leaves end its walk; N nodes make at most N levels
        D = min(draws[0], tree.tokens.shape[1])
    u = uniform((B, *(draws or (D, K))), generator, p.device, p.dtype)
    walk = walk_tree(p, tree, u, layout, rule, levels=D)
    next_token = sample(walk.law, generator)
    star = None
    if ceiling:  # the inner nodes visited: the root, then each accepted node the walk tested the children of
        at = torch.cat([torch.zeros_like(walk.path[:, :1]), walk.path[:, :-1]], 1)
        star = node_ceiling(p, tree, layout, torch.where(walk.node_acceptance.isnan(), -1, at))
    return TreeVerifyResult(walk.n_accepted, walk.path, next_token, walk.node_acceptance, walk.node_children,
                            walk.accepted_rank, star)


def node_ceiling(p: torch.Tensor, tree: DraftTree, layout: TreeLayout, slots: torch.Tensor) -> torch.Tensor:
    """alpha* at the given slots [B, D] (-1: none, NaN out) for their children: [B, D] float64; NaN also where
    `alpha_star` cannot compute it (more than 2 children without replacement over a large vocabulary)."""
    B, D = slots.shape
    V = p.shape[-1]
    at = slots.clamp(min=0)
    p_at = p.gather(1, at[..., None].expand(B, D, V)).flatten(0, 1)
    kids = layout.children.gather(1, at[..., None].expand(B, D, layout.children.shape[-1])).flatten(0, 1)
    k = (kids >= 0).sum(-1)  # [B D]
    star = torch.full((B * D,), torch.nan, dtype=torch.float64, device=p.device)
    if tree.q is None:  # the children themselves: alpha* = p(children)
        tokens = tree.tokens.gather(1, (kids - 1).clamp(min=0).view(B, -1)).view(B * D, -1)
        children = torch.zeros_like(p_at).scatter_reduce(1, tokens, (kids >= 0).to(p_at.dtype), "amax")
        star = (p_at * children).sum(-1).double()
    else:
        q_at = tree.q.gather(1, at[..., None].expand(B, D, V)).flatten(0, 1).to(p.dtype)
        for count in k.unique().tolist():  # host sync: the distinct child counts (at most K)
            rows = k == count
            if count and (count <= 2 or tree.scheme == "iid" or V <= EXACT_CEILING_VOCABULARY):
                star[rows] = alpha_star(p_at[rows], q_at[rows], count, tree.scheme)
    return torch.where((slots >= 0).flatten() & (k > 0), star, torch.nan).view(B, D)


def alpha_star(p: torch.Tensor, q: torch.Tensor, k: int, scheme: str) -> torch.Tensor:
    """The best acceptance probability of any verifier for k drafts of q against target p (Hu et al. 2025), per row:
    p, q [R, V] -> [R] float64.

    alpha* = 1 - max_H [Q(every draft in H) - p(H)], with Q(every draft in H) = q(H)^k for iid drafts and the
    probability that an ordered sample without replacement of size k lies in H otherwise. With V <=
    EXACT_CEILING_VOCABULARY every H is enumerated (exact). Above it, H runs over the sets of smallest p/q
    (a sub-family, so the result is an upper bound, tight where the optimum is such a set; k <= 2 without
    replacement). "deterministic" drafts (q one-hot rows of the k children summed) give p(children)."""
    p, q = p.double(), q.double()
    V = p.shape[1]
    if scheme == "deterministic":
        return (p * (q > 0)).sum(-1)
    if V <= EXACT_CEILING_VOCABULARY:
        sets = torch.tensor([[(h >> x) & 1 for x in range(V)] for h in range(1 << V)], dtype=torch.float64)
        all_inside = _all_inside_exact(q, sets, k, scheme)  # [R, 2^V]
        return 1 - (all_inside - p @ sets.T).amax(-1).clamp(min=0)
    ratio = torch.where(q > 0, p / q.clamp(min=1e-300), torch.inf)
    order = ratio.argsort(-1)
    q_sorted, p_sorted = q.gather(1, order), p.gather(1, order)
    q_in = q_sorted.cumsum(-1)  # q(H_t), H_t = the t + 1 tokens of smallest ratio
    if scheme == "iid":
        all_inside = q_in**k
    elif k == 1:
        all_inside = q_in
    elif k == 2:  # sum over x in H of q(x) (q(H) - q(x)) / (1 - q(x))
        weight = q_sorted / (1 - q_sorted).clamp(min=1e-300)
        all_inside = q_in * weight.cumsum(-1) - (q_sorted * weight).cumsum(-1)
    else:
        raise ValueError(f"alpha_star without replacement needs k <= 2 above {EXACT_CEILING_VOCABULARY} tokens, "
                         f"got k = {k}")
    return 1 - (all_inside - p_sorted.cumsum(-1)).amax(-1).clamp(min=0)


def _all_inside_exact(q: torch.Tensor, sets: torch.Tensor, k: int, scheme: str) -> torch.Tensor:
    """Q(every draft in H) for every set H (rows of sets: [2^V, V] 0/1): [R, 2^V]."""
    if scheme == "iid":
        return (q @ sets.T) ** k
    V = q.shape[1]
    # every ordered sample without replacement, [M, k]: its probability is the product of q(x_j) / (1 - q(x_<j)),
    # built over the k draws (token-major, [M, R]: elementwise passes, where a reduction over k would be slow)
    orders = torch.tensor([order for subset in combinations(range(V), k) for order in permutations(subset)],
                          device=q.device)
    q_by_token = q.T.contiguous()  # [V, R]
    prob = torch.ones(orders.shape[0], q.shape[0], dtype=q.dtype, device=q.device)
    drawn = torch.zeros_like(prob)  # q of the tokens drawn before
    for draw in orders.T:  # the k draws
        x = q_by_token[draw]
        prob.mul_(x).div_((1 - drawn).clamp_(min=1e-300))
        drawn.add_(x)
    return (sets[:, orders].prod(-1).to(q.device) @ prob).T  # [2^V, M] @ [M, R]: whether H holds the whole sample
