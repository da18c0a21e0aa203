"""Feature-head drafting for images (`DraftHeads`: EAGLE, Hydra): its output law equals AR sampling's with CFG, top-k
and a forced position (the harness of test_jacobi_law.py: a table model whose features are its logit rows; trees on
200,001 rows), mutation companions, and greedy equivalence and per-row reproducibility on a real (tiny) LlamaGen, with
EAGLE-3 heads that fuse decoder layers' outputs too."""

import pytest
import torch

from mmspec.core.drafting import heads as head_drafting
from mmspec.core.probs import SamplingConfig
from mmspec.image import AR, DraftHeads
from mmspec.models.heads import EagleHead, HydraHead
from tests.image.test_draft_model import TREE_GROUPS, decode, llamagen
from tests.image.test_jacobi_law import ALPHA, MUTATION_GROUPS, V, assert_exact, decode_rows, law_checks
from tests.text.test_head_drafters import check_fused_columns, law_of_previous_depth


def head(kind: str, width: int = V, vocab: int = V, seed: int = 0, **options):
    """A random head; one with `feature_layers` gets a random fuser too (its initial one reads f alone)."""
    torch.manual_seed(seed)
    if kind == "eagle":
        made = EagleHead(feature_size=width, vocab_size=vocab, n_head=1, ffn_hidden=8, positions="2d",
                         grid_size=3, **options)
        if made.config.feature_layers:
            torch.nn.init.normal_(made.fuser.weight, std=0.5)
        return made.double().eval()
    return HydraHead(feature_size=width, vocab_size=vocab, num_heads=3, hidden=8).double().eval()


@pytest.mark.parametrize("kind,draft_length,options", [
    ("eagle", 2, {}), pytest.param("eagle", 5, {}, marks=pytest.mark.slow), ("hydra", 3, {}),
    ("eagle", 3, {"feature_layers": (0,)})])
def test_head_chains_match_the_exact_law(kind, draft_length, options):
    tokens, stats, model = decode_rows(DraftHeads(kind, draft_length, head=head(kind, **options)))
    assert_exact(tokens, model)
    assert 0 < stats.accepted < stats.drafted


# the default tier: one full tree; the slow tier: EAGLE's, and a positional one
@pytest.mark.parametrize("kind,trees", [
    pytest.param("eagle", dict(draft_length=2, tree_width=2), marks=pytest.mark.slow),
    ("hydra", dict(draft_length=2, tree_width=2)),
    pytest.param("eagle", dict(tree_size=5, tree_rates=(0.6, 0.3)), marks=pytest.mark.slow)])
def test_head_trees_match_the_exact_law(kind, trees):
    """Full trees, and a positional one (EAGLE-2's dynamic tree takes the same image path: test_draft_model.py tests
    it with the draft model)."""
    tokens, stats, model = decode_rows(DraftHeads(kind, head=head(kind), **trees), groups=TREE_GROUPS)
    assert_exact(tokens, model)
    assert 0 < stats.accepted < stats.drafted
    assert len(stats.child_acceptance) == 2 and 0 < stats.tree_acceptance < 1  # 2 children per node at most


@pytest.mark.parametrize("options", [{}, {"feature_layers": (0,)}])
def test_stale_laws_are_rejected(monkeypatch, options):
    monkeypatch.setattr(head_drafting.HeadProposer, "chain", law_of_previous_depth(head_drafting.HeadProposer.chain))
    tokens, _, model = decode_rows(DraftHeads("eagle", 3, head=head("eagle", **options)), groups=MUTATION_GROUPS)
    assert min(law_checks(tokens, model).values()) < ALPHA


def tiny_head(kind, **options):
    target = llamagen(0).transformer
    c = target.config
    if kind == "eagle":
        made = EagleHead(feature_size=c.dim, vocab_size=c.vocab_size, n_head=c.n_head, ffn_hidden=32,
                         positions="2d", grid_size=c.grid_size, **options)
        if made.config.feature_layers:
            torch.nn.init.normal_(made.fuser.weight, std=0.1)
    else:
        made = HydraHead(feature_size=c.dim, vocab_size=c.vocab_size, num_heads=4, hidden=32)
    return made.double()


@pytest.mark.parametrize("kind,settings", [
    ("eagle", dict(draft_length=3)), ("eagle", dict(draft_length=3, tree_width=2)), ("hydra", dict(draft_length=3)),
    ("hydra", dict(draft_length=3, tree_width=2)), ("eagle", dict(draft_length=3, tree_size=6)),
    ("hydra", dict(tree_size=6, tree_rates=(0.5, 0.3, 0.2))), ("eagle3", dict(draft_length=3)),
    ("eagle3", dict(tree_size=6, tree_rates=(0.5, 0.3, 0.2))),
])
def test_greedy_head_decoding_equals_greedy_ar(kind, settings, monkeypatch):
    """"eagle3": an EAGLE head fusing the first and the last decoder layer, whose every fusion checks that the last
    layer's output, through the target's final norm, is the feature beside it (the prefill's, the windows', the
    trees')."""
    sampling = SamplingConfig(temperature=0, guidance_scale=2.0)
    target = llamagen(0)
    ar, _ = decode(AR(), target, 3, sampling, None)
    if kind == "eagle3":
        fused = check_fused_columns(monkeypatch, target.transformer.norm)
        drafter = tiny_head("eagle", feature_layers=(0, len(target.transformer.layers) - 1))
    else:
        fused, drafter = None, tiny_head(kind)
    spec, stats = decode(DraftHeads(kind[:5], head=drafter, **settings), target, 3, sampling, None)
    assert torch.equal(ar, spec)
    assert stats.draft_forwards > 0
    assert fused is None or max(fused) > 1


def test_rows_do_not_depend_on_the_rest_of_the_batch():
    sampling = SamplingConfig(temperature=1.0, guidance_scale=2.0)
    target, decoding = llamagen(0), DraftHeads("eagle", 3, head=tiny_head("eagle"))
    seeds = [5, 6, 7]
    together, _ = decode(decoding, target, 3, sampling, [torch.Generator().manual_seed(s) for s in seeds])
    alone, _ = decode(decoding, target, 1, sampling, [torch.Generator().manual_seed(seeds[0])])
    assert torch.equal(together[:1], alone)


def test_draft_heads_refuse_what_they_cannot_run():
    model = llamagen(0)
    with pytest.raises(ValueError, match="needs a draft head: load a pipeline that has a hydra_head"):
        DraftHeads("hydra").check_model(model)
    with pytest.raises(ValueError, match="draft_length: this Hydra head drafts at most 4 tokens, got 5"):
        DraftHeads("hydra", 5, head=tiny_head("hydra")).check_model(model)
    with pytest.raises(ValueError, match=r"decoder layers \[1, 9\]; the target has 2"):
        DraftHeads("eagle", head=tiny_head("eagle", feature_layers=(1, 9))).check_model(model)
    with pytest.raises(ValueError, match="kind must be one of"):
        DraftHeads("medusa")
    with pytest.raises(ValueError, match="tree_width > 1 .* acceptance must be Exact"):
        DraftHeads(tree_width=2, acceptance="lantern")
    with pytest.raises(ValueError, match="tree_width > 1 or tree_size > 0 drafts a tree, .* acceptance must be Exact"):
        DraftHeads(tree_size=8, acceptance="lantern")
    with pytest.raises(ValueError, match="tree_width sets the full tree; with tree_size"):
        DraftHeads(tree_size=8, tree_width=2)
    with pytest.raises(ValueError, match="tree_rates builds a positional tree of tree_size nodes"):
        DraftHeads(tree_rates=(0.5, 0.2))
    with pytest.raises(ValueError, match="positional tree's depth follows from tree_rates"):
        DraftHeads(tree_size=8, tree_rates=(0.5, 0.2), draft_length=2)
    with pytest.raises(ValueError, match="tree_rates: rates must be probabilities"):
        DraftHeads(tree_size=8, tree_rates=(0.0, 0.2))
    with pytest.raises(ValueError, match="tree_rates: this Hydra head drafts at most 4 levels, got 6"):
        DraftHeads("hydra", tree_size=6, tree_rates=(1.0,), head=tiny_head("hydra")).check_model(model)
