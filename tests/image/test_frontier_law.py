"""Sequence-level exactness of SJD with a frontier tree (`mmspec.image.frontier`): its output law equals AR sampling's.

The same lookup-table model, batch (100,002 rows of prompts A, B, A), sampler (CFG 2.0, temperature 0.9, top-k 3 < V)
and checks (per row, per prompt, independence of two rows; alpha = 1e-7 each) as `test_jacobi_law.py`, through the
real SJD loop with trees of width 2 and 3 and depth 1 to 3, windows from 2 to past the image, every initialisation and
coupling among the configurations. The table model implements tree attention exactly (each node reads its own
ancestors), so a walk that reads the wrong node's law, or a cache that keeps a rejected branch, shows. Mutation
companions break one step of the argument in the module docstring and must be rejected.
"""

import pytest
import torch

from mmspec.core import multidraft, tree_verify
from mmspec.core.probs import SamplingConfig
from mmspec.image import SJD, frontier
from tests.image.table_model import TableImageModel
from tests.image.test_jacobi_law import ALPHA, MUTATION_GROUPS, N, assert_exact, decode_rows, law_checks

TREES = [SJD(2, "horizontal", "maximal", tree_width=3, tree_depth=1),
         SJD(3, "random", "none", tree_width=3, tree_depth=2),
         # the slow tier: a window of the whole image, the mutation companions' tree, and a window past the image with
         # depth 3 and Gumbel coupling
         pytest.param(SJD(N, "horizontal", "maximal", tree_width=2, tree_depth=2), marks=pytest.mark.slow),
         pytest.param(SJD(N, "vertical", "maximal", tree_width=3, tree_depth=2), marks=pytest.mark.slow),
         pytest.param(SJD(N + 3, "random", "gumbel", tree_width=2, tree_depth=3), marks=pytest.mark.slow)]
CHAIN_GROUPS = 4_167  # the chains' acceptance rates on 12,501 rows are within 0.002 of theirs on 100,002 (measured)


@pytest.mark.parametrize("decoding", TREES, ids=repr)
def test_sjd_with_a_frontier_tree_matches_the_exact_law(decoding):
    tokens, stats, model = decode_rows(decoding)
    assert_exact(tokens, model)
    assert (tokens[:, 2] == 3).all()
    chain = SJD(decoding.window, decoding.init, decoding.coupling)
    _, chain_stats, _ = decode_rows(chain, seed=1, groups=CHAIN_GROUPS)
    # the alternates were accepted: a higher acceptance rate than the chain's (the smallest gap, window 2's, is 0.015)
    assert stats.acceptance_rate > chain_stats.acceptance_rate + 0.005


@pytest.mark.slow  # other samplers: the default tier tests CFG with top-k
def test_a_frontier_tree_matches_the_exact_law_without_cfg_and_with_top_p():
    for sampling in (SamplingConfig(temperature=1.0), SamplingConfig(temperature=1.3, top_p=0.8, guidance_scale=3.0)):
        tokens, _, model = decode_rows(SJD(N, "vertical", "maximal", tree_width=3, tree_depth=2), sampling)
        assert_exact(tokens, model, sampling)


# ---- mutation companions ------------------------------------------------------------------------------------------
def siblings_not_renormalised(p, q):
    """After a rejected child the target law is max(p - q, 0), not renormalised."""
    return (p - q).clamp(min=0)


MUTATIONS = {  # (object, attribute, replacement)
    # the rejected child stays in q (SJD-PAC's sibling-q renormalisation forgotten): the iid rule
    "without_replacement_children_verified_as_iid": (tree_verify, "check_rule", lambda scheme, rule: "specinfer"),
    "residual_not_renormalised_across_children": (multidraft, "residual_law", siblings_not_renormalised),
    "alternates_drawn_with_the_draft_left_in": (frontier, "without_first_child", lambda q, first: q[:, None]),
    "cache_keeps_the_rejected_branch": (TableImageModel, "keep_path", lambda self, state, path: None),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mutations_are_rejected(mutation, monkeypatch):
    owner, attribute, replacement = MUTATIONS[mutation]
    monkeypatch.setattr(owner, attribute, replacement)
    tokens, _, model = decode_rows(SJD(N, "vertical", "maximal", tree_width=3, tree_depth=2), groups=MUTATION_GROUPS)
    checks = law_checks(tokens, model)
    assert min(checks.values()) < ALPHA, f"mutation {mutation} was not detected: {checks}"


def test_layout_of_a_width_3_depth_2_tree():
    tree = frontier.FrontierTree.build(window=5, width=3, depth=2)
    assert tree.size == 5 + 2 + 2 + 3 * 2  # main chain, level 1 alternates, level 2 under main and under each
    assert tree.children[0].tolist() == [1, 5, 6] and tree.children[1].tolist() == [2, 7, 8]
    assert tree.children[5].tolist() == [9, 10, 11] and tree.children[2].tolist() == [3, -1, -1]
    assert tree.level.tolist() == [0, 1, 2, 3, 4, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2]
    assert tree.ancestors[10].nonzero().flatten().tolist() == [0, 5, 10]
    assert [g.tolist() for g in tree.groups] == [[0], [1, 5, 6]]
    assert frontier.FrontierTree.build(window=2, width=3, depth=2).depth == 1  # a window's last node has no child


def test_the_window_is_a_draft_tree_whose_fixed_layout_is_its_own():
    """FrontierTree.draft gives the core's DraftTree: children without replacement from the law of their position,
    padding where a law's support runs out (a one-hot law: no alternates) or past a row's real drafts, and the
    fixed layout masked by its real nodes is `TreeLayout.of` the tree."""
    layout = frontier.FrontierTree.build(window=5, width=3, depth=2)
    B, V = 3, 6
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(B, 4, V, generator=g), -1)
    q[1, 0] = torch.nn.functional.one_hot(torch.tensor(2), V)  # row 1: d_c is the only candidate at level 1
    main = torch.cat([torch.zeros(B, 1, dtype=torch.long), q.argmax(-1)], 1)
    uniforms = [torch.rand(B, group.shape[0], V, generator=g) for group in layout.groups]
    tree = layout.draft(main, q, torch.tensor([4, 4, 1]), uniforms)
    assert tree.scheme == "without_replacement" and tree.tokens.shape == (B, layout.size - 1)
    assert torch.equal(tree.q[:, [0, 1, 5, 6]], q[:, [0, 1, 1, 1]])  # slot t's children sit at position level[t]
    assert tree.real[0].all()
    # row 1: no alternates beside a one-hot draft (nodes 4, 5), nor below them (nodes 8 .. 13)
    assert tree.real[1].tolist() == [True] * 4 + [False] * 2 + [True] * 2 + [False] * 6
    assert tree.real[2].tolist() == [True] + [False] * 3 + [True, True] + [False] * 8  # one real draft: level 1 only
    exact = tree.layout()
    for b in range(B):  # a node's real children are distinct
        for kids in exact.children[b]:
            tokens = tree.tokens[b, kids[kids >= 0] - 1]
            assert tokens.unique().numel() == tokens.numel()
    masked = layout.layout.masked(tree.real)
    assert torch.equal(masked.children[..., : exact.children.shape[-1]], exact.children)


@pytest.mark.parametrize("settings,match", [
    (dict(tree_width=0), "tree_width must be >= 1"),
    (dict(tree_width=3, tree_depth=16), r"tree_depth must be < the window \(16\)"),
    (dict(tree_depth=3), "tree_depth is read only with tree_width > 1"),
    (dict(tree_width=2, acceptance="lantern"), "acceptance must be Exact"),
])
def test_clear_errors(settings, match):
    with pytest.raises(ValueError, match=match):
        SJD(**settings)


def test_an_adapter_without_tree_attention_is_refused_before_the_prefill():
    model = TableImageModel()
    model.forward_tree = None
    with pytest.raises(ValueError, match=r"decoding='sjd' needs a model adapter with forward_tree and keep_path "
                                         r"\(capability 'tree'\); TableImageModel has no forward_tree"):
        next(SJD(4, tree_width=2).run(model, torch.tensor([0]), SamplingConfig(), None, None))
    model = TableImageModel()
    model.capabilities = frozenset()  # the methods are there, the adapter does not declare them
    with pytest.raises(ValueError, match="capability 'tree'"):
        next(SJD(4, tree_width=2).run(model, torch.tensor([0]), SamplingConfig(), None, None))
