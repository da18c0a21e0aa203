"""Growing trees, the tree drafters' contracts and the loop's refusals (tree attention and the accepted-path
rollback on a real LM: `tests/adapters`). The exactness of trees in the loop is `test_tree_generate_law`."""

from types import SimpleNamespace

import pytest
import torch

from mmspec.core.drafting.tree_growth import grow_tree
from mmspec.core.probs import SamplingConfig
from mmspec.core.tree_shape import TreeShape
from mmspec.text import speculative_generate
from mmspec.text.drafters import ModelDrafter
from mmspec.text.tree_drafters import ModelTreeDrafter, StandDrafter
from tests.conftest import tiny_llama
from tests.text.test_drafters import rows_of


def test_grow_tree_respects_the_budget_and_puts_real_nodes_first():
    g = torch.Generator().manual_seed(1)
    V = 6
    root = torch.softmax(torch.randn(3, V, generator=g), -1)
    root[2] = torch.tensor([1.0, 0, 0, 0, 0, 0])  # one token of support: one child without replacement

    def expand(nodes, paths, tokens, valid):
        return torch.softmax(torch.randn(*nodes.shape, V, generator=g), -1)

    tree = grow_tree(root, expand, TreeShape(nodes=7, branching=2, expand=2, depth=4), torch.Generator())
    assert tree.tokens.shape[1] <= 7 and tree.n_nodes[0] == 7
    layout = tree.layout()
    assert int(layout.depth.max()) <= 4
    assert (layout.children.shape[-1]) <= 2
    assert tree.n_nodes[2] < 7  # the one-token root law gave one child
    for b in range(3):  # parents come first and are real
        n = int(tree.n_nodes[b])
        assert all(-1 <= int(tree.parent[b, i]) < i for i in range(n))
        assert tree.q[b, 0].sum() == pytest.approx(1)


def test_opt_tree_rerank_keeps_the_most_probable_subtree():
    V = 5
    root = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]])
    child = torch.tensor([0.9, 0.05, 0.03, 0.01, 0.01])

    def expand(nodes, paths, tokens, valid):
        return child.expand(*nodes.shape, V)

    tree = grow_tree(root, expand, TreeShape(4, 3, 3, 3, "deterministic", rerank=True), None)
    # path probabilities: 0.5 (0), 0.45 (0 -> 0), 0.405 (0 -> 0 -> 0), 0.3 (1), 0.27 (1 -> 0), ...
    assert tree.n_nodes.tolist() == [4] and tree.tokens.shape == (1, 4)  # the pool's other nodes are cut off
    assert sorted(tree.tokens[0].tolist()) == [0, 0, 0, 1]
    assert tree.q is None


def test_batch_aware_budget_shrinks_the_tree_as_the_batch_grows():
    shape = TreeShape(nodes=30, branching=2, expand=16, depth=4, batch_tokens=56)
    assert [shape.nodes_for(b) for b in (1, 2, 8, 64)] == [30, 27, 6, 1]
    root = torch.softmax(torch.randn(8, 6, generator=torch.Generator().manual_seed(0)), -1)

    def expand(nodes, paths, tokens, valid):
        return torch.full((*nodes.shape, 6), 1 / 6)

    tree = grow_tree(root, expand, shape, torch.Generator().manual_seed(1))
    assert tree.tokens.shape[1] == 6 and (tree.n_nodes == 6).all()


def test_tree_shape_refuses_bad_settings():
    with pytest.raises(ValueError, match="TreeShape.nodes must be an int >= 1"):
        TreeShape(nodes=0)
    with pytest.raises(ValueError, match="only deterministic children allow"):
        TreeShape(rerank=True)
    with pytest.raises(ValueError, match="TreeShape.scheme must be one of"):
        TreeShape(scheme="beam")
    with pytest.raises(ValueError, match="TreeShape.batch_tokens must be an int >= 1"):
        TreeShape(batch_tokens=0)


def test_stand_memory_returns_the_stored_laws_of_the_matching_context():
    drafter = StandDrafter(TreeShape(4, 2, 1, 2), max_ngram=2, top=2, backoff=1e-6)
    drafter.start(rows_of(torch.tensor([[1, 2, 3, 1, 2]]), torch.tensor([5])), vocab_size=6, capacity=8)  # the
    tokens = torch.tensor([[1, 2, 3, 1, 2, 0, 0, 0]])  # prompt stored as one-hot entries
    law = drafter.law(torch.tensor([[[1, 2]]]), 6)[0, 0]  # "1 2" was followed by 3
    assert law.argmax() == 3 and law[3] > 0.99
    laws = torch.zeros(1, 1, 6)
    laws[0, 0, 4], laws[0, 0, 5] = 0.75, 0.25  # the target's law at position 5, after "1 2"
    tokens[0, 5] = 4
    committed = SimpleNamespace(tokens=tokens, lengths=torch.tensor([6]), count=torch.tensor([1]))  # one new token
    drafter.observe(committed, laws)
    law = drafter.law(torch.tensor([[[1, 2]]]), 6)[0, 0]
    torch.testing.assert_close(law[[3, 4, 5]], torch.tensor([0.5, 0.375, 0.125]), atol=1e-5, rtol=0)


@torch.no_grad()
def test_tree_drafter_q_is_the_law_its_root_children_are_drawn_from():
    """Drafter contract: many root draws against the returned law (chi-square), first child of the root."""
    from tests.law import chi_square_p_value

    model = tiny_llama(vocab_size=8, num_layers=1, seed=3)
    drafter = ModelTreeDrafter(model, TreeShape(3, 1, 1, 3))
    tokens = torch.tensor([[1, 2, 3]]).expand(20_000, 3).contiguous()
    rows = rows_of(tokens, torch.full((20_000,), 3))
    drafter.start(rows, 8, capacity=12)
    tree = drafter.propose(rows, SamplingConfig(), torch.Generator().manual_seed(0))
    root_children = tree.tokens[tree.parent == -1]
    assert chi_square_p_value(torch.bincount(root_children, minlength=8), tree.q[0, 0].double()) > 1e-4
    assert (tree.q[:, 0] == tree.q[0, 0]).all()


def test_speculative_generate_refuses_chain_settings_with_trees_and_tree_settings_with_chains():
    model = tiny_llama()
    ids = torch.tensor([[5, 6, 7]])
    tree_drafter = ModelTreeDrafter(tiny_llama(num_layers=1, seed=4))
    with pytest.raises(ValueError, match="draft_length applies to chain drafters"):
        speculative_generate(model, ids, drafter=tree_drafter, draft_length=4)
    with pytest.raises(ValueError, match="'typical' is for chains"):
        speculative_generate(model, ids, drafter=tree_drafter, acceptance="typical")
    with pytest.raises(ValueError, match="tree_rule must be one of"):
        speculative_generate(model, ids, drafter=tree_drafter, tree_rule="leviathan")
    with pytest.raises(ValueError, match="tree_rule and measure_ceiling apply to tree drafters"):
        speculative_generate(model, ids, drafter=ModelDrafter(tiny_llama(num_layers=1, seed=4)), tree_rule="rsd")


@pytest.mark.parametrize("make", [lambda d: ModelTreeDrafter(d, TreeShape(6, 2, 2, 3)),
                                  lambda d: StandDrafter(TreeShape(6, 3, 2, 3), max_ngram=2)], ids=["model", "stand"])
def test_per_row_generators_make_tree_rows_independent_of_the_batch(make):
    """A row's tokens depend on its own generator only: every step draws a fixed block of uniforms per row (the
    shape's depth x branching), not one sized by the batch's deepest or widest tree."""
    from tests.text.table_lm import TableLM, random_table

    target, draft = TableLM(random_table(5, 0)), TableLM(random_table(5, 1))
    ids = torch.tensor([[0, 3, 1], [0, 0, 2], [1, 1, 1]])
    mask = torch.tensor([[1, 1, 1], [0, 0, 1], [1, 1, 1]])
    seeds = [11, 12, 13]
    kwargs = dict(max_new_tokens=12, temperature=1.0)
    batch, _ = speculative_generate(target, ids, mask, drafter=make(draft),
                                    generator=[torch.Generator().manual_seed(s) for s in seeds], **kwargs)
    for b in range(3):
        alone, _ = speculative_generate(target, ids[b : b + 1], mask[b : b + 1], drafter=make(draft),
                                        generator=torch.Generator().manual_seed(seeds[b]), **kwargs)
        assert torch.equal(alone[0], batch[b])
