"""Draft-model speculative decoding, chains and trees: its output law equals AR sampling's (the law harness of
test_jacobi_law.py, with a table drafter whose laws differ from the target's; trees on 200,001 rows), mutation
companions (the trees' on 50,001 rows), greedy equivalence and per-row reproducibility on real (tiny) LlamaGen
transformers."""

import pytest
import torch

from mmspec.core import multidraft, speculation, tree_verify
from mmspec.core.drafts import Draft
from mmspec.core.probs import SamplingConfig
from mmspec.core.rules import exact
from mmspec.core.stats import SpecStats
from mmspec.image import AR, DraftModel
from mmspec.models.llamagen.adapter import LlamaGenAdapter, LlamaGenCondition
from tests.image.table_model import TableImageModel
from tests.image.test_jacobi_law import (
    ALPHA,
    FORCED,
    GRID,
    GROUP,
    MUTATION_GROUPS,
    N,
    V,
    assert_exact,
    decode_rows,
    law_checks,
)
from tests.models.llamagen_tiny import TEXT_CONTEXT, tiny_transformer, tiny_vq


def drafter(scale=1.0):
    return TableImageModel(GRID, V, forced_tokens=FORCED, seed=1, scale=scale)


@pytest.mark.parametrize("draft_length", [1, 2, N - 1, pytest.param(N + 2, marks=pytest.mark.slow)])  # past the image
def test_draft_model_decoding_matches_the_exact_law(draft_length):
    tokens, stats, model = decode_rows(DraftModel(draft_length, drafter=drafter()))
    assert_exact(tokens, model)
    assert 0 < stats.accepted < stats.drafted and stats.tokens_per_target_forward > 1.0
    assert stats.draft_forwards == 1 + draft_length * (stats.target_forwards - 1)
    assert (tokens[:, 2] == 3).all()


def test_draft_model_decoding_matches_the_exact_law_without_cfg():
    sampling = SamplingConfig(temperature=1.2, top_p=0.9)
    tokens, _, model = decode_rows(DraftModel(3, drafter=drafter(scale=3.0)), sampling)
    assert_exact(tokens, model, sampling)


TREE_GROUPS = 66_667  # 200,001 rows


# deeper trees in the default tier: the dynamic tree (depth 3) and the tree without CFG (depth 2) below
@pytest.mark.parametrize("depth,width", [(1, 2), pytest.param(2, 3, marks=pytest.mark.slow),
                                         pytest.param(3, 2, marks=pytest.mark.slow)])
def test_draft_trees_match_the_exact_law(depth, width, monkeypatch):
    """CFG, top-k 3 < V, a forced position (one child there) and the image's end (no children past the last
    position a draft may take) make the trees ragged across the batch."""
    sizes = []

    def recording(p, tree, *args, **kwargs):
        sizes.append(tree.n_nodes.unique())
        return tree_verify.verify_tree(p, tree, *args, **kwargs)

    monkeypatch.setattr(speculation, "verify_tree", recording)
    decoding = DraftModel(depth, tree_width=width, drafter=drafter())
    tokens, stats, model = decode_rows(decoding, groups=TREE_GROUPS)
    assert_exact(tokens, model)
    assert 0 < stats.accepted < stats.drafted and stats.tokens_per_target_forward > 1.0
    assert len(torch.cat(sizes).unique()) > 1  # ragged trees at batch > 1
    assert stats.draft_forwards == 1 + depth * (stats.target_forwards - 1)  # catch-up + one per inner level


def test_a_dynamic_draft_tree_matches_the_exact_law():
    """EAGLE-2's dynamic tree of the draft model, with CFG (`decode_rows`' default); the positional tree takes the
    same path (tests/image/test_draft_heads.py tests it with a head)."""
    tokens, stats, model = decode_rows(DraftModel(3, tree_size=5, drafter=drafter()), groups=TREE_GROUPS)
    assert_exact(tokens, model)
    assert 0 < stats.accepted < stats.drafted and len(stats.child_acceptance) == 2


@pytest.mark.slow  # trees under another sampler: the default tier tests trees with CFG and top-k, chains without CFG
def test_draft_trees_match_the_exact_law_without_cfg():
    sampling = SamplingConfig(temperature=1.2, top_p=0.9)
    tokens, _, model = decode_rows(DraftModel(2, tree_width=2, drafter=drafter(scale=3.0)), sampling,
                                   groups=TREE_GROUPS)
    assert_exact(tokens, model, sampling)


def keep_no_path(self, state, path):
    """Mutation: the cache keeps the tree's nodes where they were scored (the first nodes after the root, whatever
    branch they are on), not the accepted path."""


def siblings_not_renormalised(p, q):
    """Mutation: after a rejected child the target law is max(p - q, 0), not renormalised."""
    return (p - q).clamp(min=0)


TREE_MUTATIONS = {  # name: (owner, attribute, replacement)
    "keeps_rejected_branch_kv": (TableImageModel, "keep_path", keep_no_path),
    "residual_not_renormalised_across_siblings": (multidraft, "residual_law", siblings_not_renormalised),
    "without_replacement_children_verified_as_iid": (tree_verify, "check_rule", lambda scheme, rule: "specinfer"),
}


@pytest.mark.parametrize("mutation", list(TREE_MUTATIONS))
def test_tree_mutations_are_rejected(mutation, monkeypatch):
    owner, attribute, replacement = TREE_MUTATIONS[mutation]
    monkeypatch.setattr(owner, attribute, replacement)
    tokens, _, model = decode_rows(DraftModel(2, tree_width=3, drafter=drafter()), groups=MUTATION_GROUPS)
    checks = law_checks(tokens, model)
    assert min(checks.values()) < ALPHA, f"mutation {mutation} was not detected: {checks}"


VERIFY = speculation.verify


def misaligned_draft_laws(p, chain, generator, test, greedy=False):
    """Mutation: each draft is verified against the draft law of the position before it (an off-by-one in the
    bookkeeping of q). (Treating the drafts as deterministic would not be a mutation: accept-with-p(x)-else-p-minus-x
    is exact for any draft distribution, just with lower acceptance.)"""
    rolled = Draft(chain.tokens, chain.lengths, chain.q.roll(1, dims=1))
    return VERIFY(p, rolled, generator, test, greedy)


def residual_is_p(p, q):
    """Mutation: resample from p at a rejection instead of norm(max(p - q, 0))."""
    return p


MUTATIONS = {
    "misaligned_draft_laws": (speculation, "verify", misaligned_draft_laws),
    "residual_is_p": (exact, "residual_law", residual_is_p),
    "no_target_rollback": (TableImageModel, "rollback", lambda self, state, keep: None),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mutations_are_rejected(mutation, monkeypatch):
    owner, attribute, replacement = MUTATIONS[mutation]
    monkeypatch.setattr(owner, attribute, replacement)
    tokens, _, model = decode_rows(DraftModel(2, drafter=drafter()), groups=MUTATION_GROUPS)
    checks = law_checks(tokens, model)
    assert min(checks.values()) < ALPHA, f"mutation {mutation} was not detected: {checks}"


def llamagen(seed):
    return LlamaGenAdapter(tiny_transformer(seed=seed), tiny_vq())


def condition(B, seed=0):
    states = torch.randn(B, TEXT_CONTEXT, 16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return LlamaGenCondition(states)


def decode(decoding, model, B, sampling, generator):
    stats = SpecStats()
    with torch.no_grad():
        *_, last = decoding.run(model, condition(B), sampling, generator, stats)
    return last.tokens, stats


@pytest.mark.parametrize("settings", [dict(draft_length=1), dict(draft_length=3), dict(draft_length=20),
                                      dict(draft_length=1, tree_width=3), dict(draft_length=3, tree_width=2),
                                      dict(tree_size=6, draft_length=3), dict(tree_size=6, tree_rates=(0.5, 0.3))])
def test_greedy_draft_decoding_equals_greedy_ar(settings):
    sampling = SamplingConfig(temperature=0, guidance_scale=2.0)
    target = llamagen(0)
    ar, _ = decode(AR(), target, 3, sampling, None)
    spec, stats = decode(DraftModel(drafter=llamagen(1), **settings), target, 3, sampling, None)
    assert torch.equal(ar, spec)
    assert stats.target_forwards < 1 + target.num_image_tokens or stats.accepted == 0


@pytest.mark.parametrize("tree_width", [1, 2])
def test_rows_do_not_depend_on_the_rest_of_the_batch(tree_width):
    sampling = SamplingConfig(temperature=1.0, guidance_scale=2.0)
    target, decoding = llamagen(0), DraftModel(3, tree_width=tree_width, drafter=llamagen(1))
    seeds = [5, 6, 7]
    together, _ = decode(decoding, target, 3, sampling, [torch.Generator().manual_seed(s) for s in seeds])
    alone, _ = decode(decoding, target, 1, sampling, [torch.Generator().manual_seed(seeds[0])])
    assert torch.equal(together[:1], alone)


def test_tree_settings_are_checked():
    with pytest.raises(ValueError, match="tree_width must be >= 1"):
        DraftModel(tree_width=0)
    with pytest.raises(ValueError, match="tree_width > 1 .* acceptance must be Exact"):
        DraftModel(tree_width=2, acceptance="lantern")
    with pytest.raises(ValueError, match="tree_width > 1 or tree_size > 0 drafts a tree, .* acceptance must be Exact"):
        DraftModel(tree_size=8, acceptance="lantern")
    with pytest.raises(ValueError, match="tree_rates builds a positional tree of tree_size nodes"):
        DraftModel(tree_rates=(0.5,))
    assert DraftModel(3, tree_width=2).forward_width == 1 + 2 + 4 + 8
    assert DraftModel(tree_size=10).forward_width == 11 and DraftModel(tree_size=10).tree
    positional = DraftModel(tree_size=10, tree_rates=(0.5, 0.25))
    assert positional.tree_shape().template is not None and "draft_length=" not in positional.describe()
    plain = drafter()
    plain.forward_tree = None
    decoding = DraftModel(2, tree_width=2, drafter=plain)
    with pytest.raises(ValueError, match=r"drafter needs a model adapter with forward_tree and keep_path \(capability "
                                         r"'tree'\); TableImageModel has no forward_tree"):
        next(decoding.run(TableImageModel(GRID, V, forced_tokens=FORCED), GROUP, SamplingConfig(), None, SpecStats()))
