"""Exactness of tree verification in float64, by enumeration (no Monte Carlo), and its ceiling.

A tiny "model" gives the target law p(. | path) and the draft law q(. | path) of every path (V = 4, random, with
zeros, q = p at some paths). A tree of a fixed shape (children per node by depth) is drafted by its scheme: K iid
draws of q, an ordered sample without replacement of q, or q's top K (deterministic). The output law of one
verification step is enumerated: at each node, every draw of its children with its probability, the rule's plan
(`node_plans`, the code under test) for each draw, and the subtree laws of the accepted child. Extended by the
target's own continuation to a fixed length, it must equal p's joint law (atol 1e-12). Mutation companions break one
piece of a rule and must be told apart.
"""

import itertools
from functools import cache

import pytest
import torch
from scipy.optimize import linprog

from mmspec.core import multidraft, tree_verify
from mmspec.core.tree_verify import alpha_star, node_plans, verify_tree
from mmspec.core.trees import DraftTree, TreeLayout

V = 4
SHAPES = [(k, k) for k in range(1, 5)] + [(k, 2, 1) for k in range(1, 5)]  # children per node at depth 0, 1, 2
CASES = [(scheme, rule, shape) for scheme, rules in tree_verify.TREE_RULES.items() for rule in rules
         for shape in SHAPES if not (rule == "khisti" and max(shape) > 2)]


def law(path: tuple, which: str) -> torch.Tensor:
    """p or q after `path`: a fixed random law per path (zeros in p; q full support; q = p on some paths)."""
    seed = 1 + 7919 * sum((t + 1) * (V + 1) ** i for i, t in enumerate(path))
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, -1)
    if seed % 3 == 0:
        p[torch.randint(V, (1,), generator=g)] = 0
        p = p / p.sum()
    if which == "p":
        return p
    if seed % 5 == 0:
        return p.clamp(min=1e-3) / p.clamp(min=1e-3).sum()
    return torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * 1.5, -1)


def child_draws(q: torch.Tensor, k: int, scheme: str) -> list[tuple[tuple, float]]:
    """Every draw of k children from q with its probability."""
    if scheme == "deterministic":
        return [(tuple(q.argsort(descending=True, stable=True)[:k].tolist()), 1.0)]
    if scheme == "iid":
        return [(x, float(q[list(x)].prod())) for x in itertools.product(range(V), repeat=k)]
    draws = []
    for x in itertools.permutations(range(V), k):
        prob, drawn = 1.0, 0.0
        for token in x:
            prob *= float(q[token]) / (1 - drawn)
            drawn += float(q[token])
        draws.append((x, prob))
    return draws


def one_level_plans(path: tuple, draws: list[tuple], scheme: str, rule: str):
    """The rule's plan at the node after `path` for every draw of its children: a root with K children."""
    K = len(draws[0][0])
    R = len(draws)
    tokens = torch.tensor([d[0] for d in draws])
    q = None if scheme == "deterministic" else law(path, "q").expand(R, K + 1, V)
    tree = DraftTree(tokens, torch.full((R, K), -1), torch.ones(R, K, dtype=torch.bool), q, scheme)
    p = law(path, "p").expand(R, K + 1, V)
    return node_plans(p.clone(), tree, tree.layout(), rule)


def step_law(shape: tuple, scheme: str, rule: str) -> dict:
    """{emitted tokens: probability} of one verification step from the empty path."""

    @cache
    def from_node(path: tuple, level: int) -> dict:
        if level == len(shape):
            return {(x,): float(law(path, "p")[x]) for x in range(V)}
        draws = child_draws(law(path, "q"), shape[level], scheme)
        plan = one_level_plans(path, draws, scheme, rule)
        out: dict = {}
        for r, (children, prob) in enumerate(draws):
            reach = prob
            for j, c in enumerate(children):
                accept = reach * float(plan.accept_prob[r, 0, j])
                for rest, w in from_node(path + (c,), level + 1).items():
                    out[(c, *rest)] = out.get((c, *rest), 0.0) + accept * w
                reach -= accept
            for x in range(V):
                out[(x,)] = out.get((x,), 0.0) + reach * float(plan.residual[r, 0, x])
        return out

    return from_node((), 0)


def extended(emitted: dict, length: int) -> torch.Tensor:
    """The law of `length` tokens: each emitted sequence continued by p itself. [V] * length."""
    full = torch.zeros([V] * length, dtype=torch.float64)

    def continue_(seq, prob):
        if len(seq) == length:
            full[seq] += prob
            return
        for x, px in enumerate(law(seq, "p").tolist()):
            if px > 0:
                continue_(seq + (x,), prob * px)

    for seq, prob in emitted.items():
        if prob > 0:
            continue_(seq, prob)
    return full


def target_joint(length: int) -> torch.Tensor:
    return extended({(): 1.0}, length)


@pytest.mark.parametrize("scheme,rule,shape", CASES, ids=lambda x: "-".join(map(str, x)) if isinstance(x, tuple) else x)
def test_tree_rule_output_law_is_the_target_law(scheme, rule, shape):
    emitted = step_law(shape, scheme, rule)
    assert abs(sum(emitted.values()) - 1) < 1e-12
    length = len(shape) + 1
    torch.testing.assert_close(extended(emitted, length), target_joint(length), atol=1e-12, rtol=0)


def no_renormalisation_across_siblings(p, q):
    """Mutation: after a rejected sibling the target law is max(p - q, 0), not renormalised."""
    return (p - q).clamp(min=0)


@pytest.mark.parametrize("scheme,rule", [("iid", "specinfer"), ("without_replacement", "rsd"),
                                         ("deterministic", "deterministic")])
def test_mutant_residual_not_renormalised_across_siblings_is_caught(monkeypatch, scheme, rule):
    monkeypatch.setattr(multidraft, "residual_law", no_renormalisation_across_siblings)
    emitted = step_law((2, 2), scheme, rule)
    distance = (extended(emitted, 3) - target_joint(3)).abs().sum()
    assert distance > 1e-3


def test_mutant_without_replacement_children_verified_as_iid_is_caught():
    """Children drawn without replacement, verified by the iid rule (SpecInfer): the law is off."""
    emitted = step_law((3, 2), "without_replacement", "specinfer")
    assert (extended(emitted, 3) - target_joint(3)).abs().sum() > 1e-3


def test_verify_tree_refuses_a_rule_that_is_not_exact_for_the_scheme():
    tree = DraftTree(torch.tensor([[1, 2]]), torch.tensor([[-1, -1]]), torch.ones(1, 2, dtype=torch.bool),
                     torch.rand(1, 3, V), "without_replacement")
    with pytest.raises(ValueError, match="'specinfer' is not exact for 'without_replacement' children"):
        verify_tree(torch.rand(1, 3, V), tree, None, rule="specinfer")


# --- the layout ---------------------------------------------------------------------------------------------------


def test_layout_of_the_documented_tree():
    # nodes: 0, 1 children of the root; 2, 3 children of node 0; 4 child of node 1; row 1 has 2 real nodes
    parent = torch.tensor([[-1, -1, 0, 0, 1], [-1, 0, 0, 0, 0]])
    real = torch.arange(5) < torch.tensor([[5], [2]])
    tree = DraftTree(torch.zeros(2, 5, dtype=torch.long), parent, real, None, "deterministic")
    layout = TreeLayout.of(tree)
    assert layout.depth.tolist() == [[0, 1, 1, 2, 2, 2], [0, 1, 2, 0, 0, 0]]
    assert layout.children[0].tolist() == [[1, 2], [3, 4], [5, -1], [-1, -1], [-1, -1], [-1, -1]]
    assert layout.children[1].tolist() == [[1, -1], [2, -1], [-1, -1], [-1, -1], [-1, -1], [-1, -1]]
    assert layout.first_child[0].tolist() == [1, 3, 5, -1, -1, -1]
    assert layout.next_sibling[0].tolist() == [-1, 2, -1, 4, -1, -1]
    ancestors_of_slot_4 = layout.ancestors[0, 4].nonzero().squeeze(1).tolist()
    assert ancestors_of_slot_4 == [0, 1, 4]
    assert layout.ancestors[1, 3].nonzero().squeeze(1).tolist() == [3]  # padding sees only itself


def test_layout_of_a_tree_with_padding_between_real_nodes():
    # the documented tree with node 1 (and so its child, node 4) padding: the root keeps one child
    parent = torch.tensor([[-1, -1, 0, 0, 1]])
    real = torch.tensor([[True, False, True, True, False]])
    layout = TreeLayout.of(DraftTree(torch.zeros(1, 5, dtype=torch.long), parent, real, None, "deterministic"))
    assert layout.children[0].tolist() == [[1, -1], [3, 4], [-1, -1], [-1, -1], [-1, -1], [-1, -1]]
    assert layout.depth[0, [0, 1, 3, 4]].tolist() == [0, 1, 2, 2]


def test_a_fixed_layout_masked_by_each_rows_real_nodes_is_their_trees_layout():
    """`TreeLayout.masked` (a fixed tree's layout reused per step) against `TreeLayout.of` of each row's tree: the
    same children, and the same depth and ancestors at every real slot."""
    parent = torch.tensor([-1, -1, -1, 0, 0, 1, 1, 2, 3, 3, 5])  # 11 nodes, up to 3 children, depth 3
    N = parent.shape[0]
    g = torch.Generator().manual_seed(0)
    real = torch.rand(64, N, generator=g) < 0.7
    for node in range(N):  # a padding node's descendants are padding
        if parent[node] >= 0:
            real[:, node] &= real[:, parent[node]]
    every = torch.ones(1, N, dtype=torch.bool)
    fixed = TreeLayout.of(DraftTree(torch.zeros(1, N, dtype=torch.long), parent[None], every, None, "deterministic"))
    tree = DraftTree(torch.zeros(64, N, dtype=torch.long), parent.expand(64, N), real, None, "deterministic")
    masked, exact = fixed.masked(real), TreeLayout.of(tree)
    K = exact.children.shape[-1]
    assert torch.equal(masked.children[..., :K], exact.children) and (masked.children[..., K:] == -1).all()
    slots = torch.cat([torch.ones(64, 1, dtype=torch.bool), real], 1)
    assert torch.equal(masked.depth[slots], exact.depth[slots])
    both = slots[:, :, None] & slots[:, None, :]
    assert torch.equal(masked.ancestors[both], exact.ancestors[both])


def test_draft_tree_refuses_a_real_mask_of_the_wrong_shape_or_dtype():
    for real in (torch.ones(1, 3, dtype=torch.bool), torch.ones(1, 2, dtype=torch.long)):
        with pytest.raises(ValueError, match="DraftTree.real must be a bool tensor of shape"):
            DraftTree(torch.tensor([[1, 2]]), torch.tensor([[-1, 0]]), real, None, "deterministic")


def test_a_walk_cut_after_some_levels_hands_on_the_rows_still_accepting():
    """walk_tree(levels=1) on a chain whose drafts are always accepted (q = p): not ended, at node 1; walked to the
    leaf: ended there with the leaf's own target law (the bonus)."""
    from mmspec.core.drafts import Draft

    p = torch.softmax(torch.randn(2, 4, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
    tree = DraftTree.from_chain(Draft(torch.tensor([[1, 2, 3], [0, 1, 2]]), torch.tensor([3, 2]), p[:, :3]))
    u = torch.full((2, 3, 1), 0.5, dtype=torch.float64)
    cut = tree_verify.walk_tree(p, tree, u, levels=1)
    assert cut.path.tolist() == [[1], [1]] and not cut.ended.any() and cut.node.tolist() == [1, 1]
    full = tree_verify.walk_tree(p, tree, u)
    assert full.n_accepted.tolist() == [3, 2] and full.ended.all() and full.bonus.all()
    torch.testing.assert_close(full.law, p[[0, 1], [3, 2]])


def test_walk_samples_the_plan():
    """Monte Carlo: the walk of a fixed depth-3 tree emits each (path, token) with the probability its plan gives
    (G-test over every outcome), and reports each visited node's plan acceptance."""
    from tests.law import chi_square_p_value

    parent = torch.tensor([[-1, -1, 0, 0, 1, 2]])
    tokens = torch.tensor([[0, 2, 1, 3, 0, 2]])
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(1, 7, V, generator=g, dtype=torch.float64), -1)
    p = torch.softmax(torch.randn(1, 7, V, generator=g, dtype=torch.float64), -1)
    tree = DraftTree(tokens, parent, torch.ones(1, 6, dtype=torch.bool), q, "iid")
    layout = tree.layout()
    plan = node_plans(p, tree, layout, "specinfer")
    exact = {}

    def walk(slot, path, prob):
        reach = prob
        for j, child in enumerate(layout.children[0, slot].tolist()):
            if child < 0:
                break
            accept = reach * float(plan.accept_prob[0, slot, j])
            walk(child, path + (child,), accept)
            reach -= accept
        for x in range(V):
            exact[(path, x)] = exact.get((path, x), 0.0) + reach * float(plan.residual[0, slot, x])

    walk(0, (), 1.0)
    N = 200_000
    big = DraftTree(tokens.expand(N, -1), parent.expand(N, -1), torch.ones(N, 6, dtype=torch.bool), q.expand(N, -1, -1),
                    "iid")
    result = verify_tree(p.expand(N, -1, -1), big, torch.Generator().manual_seed(1))
    outcomes = list(exact)
    index = {o: i for i, o in enumerate(outcomes)}
    paths = [tuple(s for s in row if s >= 0) for row in result.path.tolist()]
    observed = torch.bincount(torch.tensor([index[(pth, x)] for pth, x in zip(paths, result.next_token.tolist())]),
                              minlength=len(outcomes))
    assert chi_square_p_value(observed, torch.tensor([exact[o] for o in outcomes])) > 1e-5
    root_acceptance = 1 - (1 - plan.accept_prob[0, 0]).prod()
    torch.testing.assert_close(result.node_acceptance[:, 0], root_acceptance.expand(N))
    # at the root (2 children, slots 1 and 2) the walk reports which one it accepted
    assert (result.node_children[:, 0] == 2).all()
    expected_rank = torch.where(result.path[:, 0] >= 0, result.path[:, 0] - 1, -1)
    assert torch.equal(result.accepted_rank[:, 0], expected_rank)


def test_chain_as_tree_is_speculative_sampling():
    from mmspec.core.drafts import Draft
    from mmspec.core.rules.exact import residual_law

    g = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(2, 3, V, generator=g, dtype=torch.float64), -1)
    p = torch.softmax(torch.randn(2, 4, V, generator=g, dtype=torch.float64), -1)
    tree = DraftTree.from_chain(Draft(torch.tensor([[1, 2, 3], [0, 0, 1]]), torch.tensor([3, 1]), q))
    plan = node_plans(p, tree, tree.layout(), "specinfer")
    x = tree.tokens
    expected = (p[:, :3].gather(-1, x[..., None]) / q.gather(-1, x[..., None])).clamp(max=1).squeeze(-1)
    torch.testing.assert_close(plan.accept_prob[0, :3, 0], expected[0])
    torch.testing.assert_close(plan.accept_prob[1, :1, 0], expected[1, :1])
    torch.testing.assert_close(plan.residual[1, 1], p[1, 1])  # row 1's node 0 is its last: a leaf, the bonus
    torch.testing.assert_close(plan.residual[0, 0], residual_law(p[0, 0], q[0, 0]))


# --- the ceiling --------------------------------------------------------------------------------------------------


def coupling_lp(p: torch.Tensor, q: torch.Tensor, k: int, scheme: str) -> float:
    """The optimal acceptance by linear programming: a coupling of the draft tuple and the output y with the right
    marginals, maximising P(y is one of the drafts)."""
    draws = child_draws(q, k, scheme)
    n = len(draws)
    cost = -torch.tensor([[float(y in x) for y in range(V)] for x, _ in draws]).flatten()
    rows = [[1.0 if i // V == d else 0.0 for i in range(n * V)] for d in range(n)]
    cols = [[1.0 if i % V == y else 0.0 for i in range(n * V)] for y in range(V)]
    b = [w for _, w in draws] + p.tolist()
    res = linprog(cost.numpy(), A_eq=rows + cols, b_eq=b, bounds=(0, None), method="highs")
    return -res.fun


@pytest.mark.parametrize("scheme,k", [("iid", 1), ("iid", 2), ("iid", 3), ("without_replacement", 2),
                                      ("without_replacement", 3)])
def test_alpha_star_is_the_coupling_lp_and_bounds_every_rule(scheme, k):
    for path in [(), (1,), (2, 3)]:
        p, q = law(path, "p"), law(path, "q")
        star = float(alpha_star(p[None], q[None], k, scheme))
        assert abs(star - coupling_lp(p, q, k, scheme)) < 1e-7
        draws = child_draws(q, k, scheme)
        for rule in tree_verify.TREE_RULES[scheme]:
            if rule == "khisti" and k > 2:
                continue
            plan = one_level_plans(path, draws, scheme, rule)
            accept = sum(w * float(1 - (1 - plan.accept_prob[r, 0]).prod()) for r, (_, w) in enumerate(draws))
            assert accept <= star + 1e-12
            if rule == "specinfer" and k == 1:
                assert abs(accept - float(torch.minimum(p, q).sum())) < 1e-12


@pytest.mark.parametrize("scheme,k", [("iid", 1), ("iid", 2), ("iid", 4), ("without_replacement", 1),
                                      ("without_replacement", 2)])
def test_alpha_star_above_the_enumerated_vocabulary_is_the_threshold_family(scheme, k, monkeypatch):
    g = torch.Generator().manual_seed(7)
    p = torch.softmax(torch.randn(200, 10, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(200, 10, generator=g, dtype=torch.float64) * 2, -1)
    exact = alpha_star(p, q, k, scheme)
    monkeypatch.setattr(tree_verify, "EXACT_CEILING_VOCABULARY", 0)
    threshold = alpha_star(p, q, k, scheme)
    assert (threshold >= exact - 1e-12).all()  # always an upper bound
    torch.testing.assert_close(threshold, exact, atol=1e-12, rtol=0)
