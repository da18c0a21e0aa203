"""Cascade drafting (`CascadeDrafter`, `ModelProposer.cascade`): the vertical cascade draws the very chain the draft
model draws alone, from the same generator, in fewer draft forwards; both cascades keep the target's law (chi-square
against the exact joint law, `test_generate_law`), and a lenient middle level (CS-Drafting's lenience, which keeps a
looked-up token the draft law merely likes) is rejected by the same test. A tree's horizontal cascade
(`ModelTreeDrafter(lookup_after=N)`) keeps the greedy output with fewer draft forwards here; its law tests sit with the
other trees' (`test_tree_generate_law`)."""

import pytest
import torch

from mmspec.core.drafting import proposer as drafting
from mmspec.core.rng import inverse_cdf
from mmspec.core.tree_shape import TreeShape
from mmspec.text import speculative_generate
from mmspec.text.drafters import CascadeDrafter, ModelDrafter, NoDrafter
from mmspec.text.tree_drafters import ModelTreeDrafter
from tests.text.table_lm import TableLM, random_table
from tests.text.test_generate import prompts
from tests.text.test_generate_law import ALPHA, MUTATION_ROWS, V, law_test


def decode(target, drafter, ids, mask, temperature, top_k, seed, draft_length=4):
    return speculative_generate(target, ids, mask, drafter=drafter, max_new_tokens=24, temperature=temperature,
                                top_k=top_k, draft_length=draft_length, pad_token_id=0,
                                generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.8, 5)])
def test_vertical_cascade_draws_the_draft_models_chain(tiny_target, tiny_draft, temperature, top_k):
    """Same seed, same tokens and acceptance as `ModelDrafter` (float64 models: the window and the one-token
    forwards agree to rounding), with fewer draft forwards wherever prompt lookup was kept."""
    ids, mask = prompts(4)
    for seed in range(3):
        plain, plain_stats = decode(tiny_target, ModelDrafter(tiny_draft), ids, mask, temperature, top_k, seed)
        cascade, stats = decode(tiny_target, CascadeDrafter(tiny_draft), ids, mask, temperature, top_k, seed)
        assert torch.equal(cascade, plain)
        assert (stats.drafted, stats.accepted) == (plain_stats.drafted, plain_stats.accepted)
        assert stats.draft_forwards <= plain_stats.draft_forwards


def test_vertical_cascade_drafts_as_far_in_fewer_forwards_on_repeats(tiny_target):
    """Greedy, one row, the target drafting for itself: its greedy continuation soon repeats, prompt lookup then
    foresees the draws, and 2 draft forwards a round draft about as far as the plain chain's 4, for the same
    output."""
    ids, mask = prompts(1)
    plain, plain_stats = decode(tiny_target, ModelDrafter(tiny_target), ids, mask, 0.0, 0, 0)
    cascade, stats = decode(tiny_target, CascadeDrafter(tiny_target, forwards_per_round=2), ids, mask, 0.0, 0, 0)
    assert torch.equal(cascade, plain)
    assert stats.draft_forwards < plain_stats.draft_forwards
    assert stats.drafted > stats.draft_forwards  # past what 2 forwards alone draw: lookup's tokens were kept


def test_a_trees_horizontal_cascade_keeps_greedy_output_in_fewer_draft_forwards(tiny_target):
    """The target drafting its own tree, 4 levels: with prompt lookup past the first, the same greedy output (the
    target's), lookup's levels costing no draft forward."""
    ids, mask = prompts(2)
    ar, _ = speculative_generate(tiny_target, ids, mask, drafter=NoDrafter(), max_new_tokens=24, temperature=0,
                                 pad_token_id=0)
    shape = TreeShape(8, 2, 2, 4)
    plain, plain_stats = speculative_generate(tiny_target, ids, mask, drafter=ModelTreeDrafter(tiny_target, shape),
                                              max_new_tokens=24, temperature=0, pad_token_id=0)
    drafter = ModelTreeDrafter(tiny_target, shape, lookup_after=1)
    cascade, stats = speculative_generate(tiny_target, ids, mask, drafter=drafter, max_new_tokens=24, temperature=0,
                                          pad_token_id=0)
    assert torch.equal(plain, ar) and torch.equal(cascade, ar)
    assert stats.draft_forwards < plain_stats.draft_forwards
    assert stats.accepted > stats.target_forwards  # looked-up nodes were accepted too


def test_a_trees_lookup_must_start_within_it(tiny_draft):
    with pytest.raises(ValueError, match="lookup_after=3 must be below the tree's depth 3"):
        ModelTreeDrafter(tiny_draft, TreeShape(6, 2, 2, 3), lookup_after=3)


# the default tier: the vertical cascade, a horizontal one, and both with fewer forwards a round (rows' drafts of
# different lengths) under top-k; the slow tier: other lengths and samplers of each
@pytest.mark.parametrize("lookup_after,forwards,draft_length,temperature,top_k", [
    pytest.param(None, None, 3, 1.0, 0, marks=pytest.mark.slow), (None, None, 2, 0.7, 3), (1, None, 3, 1.0, 0),
    pytest.param(2, None, 4, 1.3, 2, marks=pytest.mark.slow), pytest.param(None, 2, 4, 1.0, 0, marks=pytest.mark.slow),
    (2, 1, 4, 0.8, 3),
])
def test_cascade_keeps_the_targets_law(lookup_after, forwards, draft_length, temperature, top_k):
    target, draft = TableLM(random_table(V, 0)), TableLM(random_table(V, 1))
    drafter = CascadeDrafter(draft, max_ngram=2, lookup_after=lookup_after, forwards_per_round=forwards)
    p_value, stats = law_test(target, drafter, temperature, top_k, draft_length=draft_length)
    assert p_value > ALPHA, f"output law differs from the target's (p = {p_value:.2e})"
    assert 0 < stats.accepted < stats.drafted


def lenient_keep_lookup(q, draws, proposal, available, lenience=2.0):
    """Mutation: CS-Drafting's lenience at the middle level — a looked-up token is kept when the draft law gives it
    at least 1/lenience of the draw's probability, though its recorded law stays q."""
    tokens = inverse_cdf(q, draws)
    W = proposal.shape[1]
    real = torch.arange(W) < available[:, None]
    at = q[:, :W]
    liked = at.gather(2, proposal[..., None])[..., 0] * lenience >= at.gather(2, tokens[:, :W, None])[..., 0]
    tokens[:, :W] = torch.where(real & liked, proposal, tokens[:, :W])
    agree = (proposal == tokens[:, :W]) & real
    return tokens, agree.long().cumprod(1).sum(1)


def test_lenient_middle_level_is_rejected(monkeypatch):
    monkeypatch.setattr(drafting, "keep_lookup", lenient_keep_lookup)
    target, draft = TableLM(random_table(V, 0)), TableLM(random_table(V, 1))
    p_value, _ = law_test(target, CascadeDrafter(draft, max_ngram=2), 1.0, 0, rows=MUTATION_ROWS, draft_length=3)
    assert p_value < ALPHA, f"the lenient cascade was not detected (p = {p_value:.2e})"
