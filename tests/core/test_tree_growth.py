"""Fixed trees for positional acceptance (`TreeShape.positional`, Sequoia's) and growing them (`grow_tree`): the
shape is the best tree of its size under the positional model (against brute force over every tree), every prefix
is a tree, and `grow_tree` draws exactly that shape for every row (padding where a law runs out of support), with
the laws it drew from. Exactness of the trees' walks is tested with the other tree drafters in
tests/text/test_tree_generate_law.py; dynamic trees are tested in tests/text/test_trees.py."""

import heapq
import itertools
import math

import pytest
import torch

from mmspec.core.drafting.tree_growth import TreeShape, grow_tree

RATES = (0.6, 0.25, 0.1)


def values(template: tuple[int, ...], rates) -> list[float]:
    """Each node's value: the product of rates[rank] along its path."""
    out, seen = [], {}
    for parent in template:
        rank = seen.get(parent, 0)
        seen[parent] = rank + 1
        out.append((out[parent] if parent >= 0 else 1.0) * rates[rank])
    return out


def ancestors(template: torch.Tensor, node: int) -> list[int]:
    """The nodes above `node` (its ancestors, nearest first)."""
    above = []
    while int(template[node]) >= 0:
        node = int(template[node])
        above.append(node)
    return above


def every_tree(size: int, ranks: int) -> list[frozenset]:
    """Every tree of `size` nodes as a set of paths (tuples of child ranks), where a node's rank-k child needs its
    rank-(k - 1) sibling: grown one node at a time from every smaller tree."""
    trees = {frozenset()}
    for _ in range(size):
        grown = set()
        for tree in trees:
            for path in [(), *tree]:
                children = [p for p in tree if len(p) == len(path) + 1 and p[:-1] == path]
                if len(children) < ranks:
                    grown.add(tree | {path + (len(children),)})
        trees = grown
    return list(trees)


@pytest.mark.parametrize("size", range(1, 7))
def test_positional_tree_is_the_best_tree_of_its_size(size):
    best = max(sum(math.prod(RATES[k] for k in path) for path in tree) for tree in every_tree(size, len(RATES)))
    shape = TreeShape.positional(size, RATES)
    assert shape.nodes == size and shape.template is not None
    assert sum(values(shape.template, RATES)) == pytest.approx(best, abs=1e-12)


def test_every_prefix_of_a_positional_tree_is_the_best_tree_of_its_size():
    template = TreeShape.positional(40, RATES).template
    candidates = []  # every node of the infinite tree to depth 12, by value
    for depth in range(1, 13):
        for path in itertools.product(range(len(RATES)), repeat=depth):
            candidates.append(math.prod(RATES[k] for k in path))
    largest = heapq.nlargest(40, candidates)
    node_values = values(template, RATES)
    for n in (1, 5, 17, 40):
        prefix = template[:n]
        assert all(-1 <= parent < node for node, parent in enumerate(prefix))  # a tree, parents first
        assert sum(node_values[:n]) == pytest.approx(sum(largest[:n]), abs=1e-12)


def test_positional_tree_drops_nodes_of_value_zero_and_takes_noisy_rates():
    chain = TreeShape.positional(50, (0.7, 0.0, 0.2), max_depth=9)
    assert chain.template == (-1, 0, 1, 2, 3, 4, 5, 6, 7) and chain.branching == 1 and chain.depth == 9
    noisy = TreeShape.positional(20, (0.5, 0.1, 0.15))  # measured rates need not fall
    seen = {}
    for node, parent in enumerate(noisy.template):
        assert -1 <= parent < node
        seen[parent] = seen.get(parent, 0) + 1
    assert max(seen.values()) == noisy.branching <= 3


@pytest.mark.parametrize("rates", [(), (0.0, 0.5), (1.2,), (0.5, -0.1)])
def test_positional_refuses_rates_that_are_not_probabilities(rates):
    with pytest.raises(ValueError, match="rates must be probabilities, one per child rank, the first > 0"):
        TreeShape.positional(10, rates)


@pytest.mark.parametrize("settings,match", [
    (dict(nodes=1, template=(0,)), r"TreeShape.template\[0\] must be -1 \(the root\) or an earlier node"),
    (dict(nodes=3, template=(-1, 0)), r"must not exceed the template's 2 nodes"),
    (dict(nodes=2, depth=1, template=(-1, 0)), "must bound the template"),
    (dict(nodes=3, branching=2, template=(-1, -1, -1)), "must bound the template"),
    (dict(nodes=1, scheme="deterministic", rerank=True, template=(-1,)), "template is a fixed tree"),
])
def test_tree_shape_refuses_a_bad_template(settings, match):
    with pytest.raises(ValueError, match=match):
        TreeShape(**settings)


def test_grow_tree_draws_the_fixed_shape_for_every_row():
    """Every row gets the template's tree; a root law with one token of support less than the root's children in
    the template leaves the last one padding (and its subtree); expand sees each level's frontier with its paths,
    and the root law is stored at slot 0."""
    shape = TreeShape.positional(12, RATES)
    template = torch.tensor(shape.template)
    k = int((template == -1).sum())  # the root's children
    V = 8
    g = torch.Generator().manual_seed(0)
    root = torch.softmax(torch.randn(3, V, generator=g), -1)
    root[2] = torch.tensor([1.0 / (k - 1)] * (k - 1) + [0.0] * (V - k + 1))
    calls = []

    def expand(nodes, paths, tokens, valid):
        calls.append((nodes.clone(), paths.clone(), valid.clone()))
        depth = (paths >= 0).sum(-1, keepdim=True)  # a law per frontier node that says which depth asked
        return torch.softmax(torch.randn(*nodes.shape, V, generator=g) + depth, -1)

    tree = grow_tree(root, expand, shape, torch.Generator().manual_seed(1))
    assert tree.scheme == "without_replacement" and tree.tokens.shape == (3, 12)
    assert torch.equal(tree.parent[:2], template.expand(2, -1)) and tree.real[:2].all()
    assert len(calls) == shape.depth - 1  # one expansion per level below the root
    for nodes, paths, _ in calls:  # a frontier node's path ends at itself and follows the template's parents
        for node, path in zip(nodes[0].tolist(), paths[0].tolist(), strict=True):
            path = [p for p in path if p >= 0]
            assert path[-1] == node and all(template[b] == a for a, b in zip([-1] + path, path, strict=False))
    last = int((template == -1).nonzero()[-1])
    subtree = {last} | {n for n in range(12) if any(a == last for a in ancestors(template, n))}
    assert k >= 2 and int(tree.real[2].sum()) == 12 - len(subtree)  # row 2: the root's last child is padding
    layout = tree.layout()
    for b in range(3):  # siblings are distinct (without replacement), and q at slot 0 is the root law
        for kids in layout.children[b]:
            tokens = tree.tokens[b, kids[kids >= 0] - 1]
            assert tokens.unique().numel() == tokens.numel()
    torch.testing.assert_close(tree.q[:, 0], root)


def test_a_batch_takes_the_best_prefix_of_a_fixed_tree():
    shape = TreeShape.positional(30, RATES, batch_tokens=64)
    assert [shape.nodes_for(b) for b in (1, 4, 8)] == [30, 15, 7]
    root = torch.softmax(torch.randn(8, 6, generator=torch.Generator().manual_seed(0)), -1)

    def expand(nodes, paths, tokens, valid):
        return torch.full((*nodes.shape, 6), 1 / 6)

    tree = grow_tree(root, expand, shape, torch.Generator().manual_seed(1))
    assert tree.tokens.shape == (8, 7) and tree.real.all()
    assert torch.equal(tree.parent[0], torch.tensor(shape.template[:7]))
