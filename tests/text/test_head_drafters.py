"""Feature-head drafting for text (EAGLE, Hydra): the output law of `speculative_generate` with head chains and trees
equals the target's AR joint law (the harness of test_generate_law: lookup-table LMs over V = 5, two prompts of
different lengths in one left-padded batch of 200,000 rows, chi-square at alpha = 1e-5 per prompt), mutation
companions the same test must reject, and greedy decoding with heads on a real (tiny) Llama equal to AR's. EAGLE-3
heads fuse the table LMs' stand-in layer and the tiny Llama's layers with the feature."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mmspec.core.drafting import heads as head_drafting
from mmspec.core.drafts import Draft
from mmspec.core.runtime.capture import StepGraphs
from mmspec.core.tree_shape import TreeShape
from mmspec.models.heads import EagleHead, HydraHead
from mmspec.text import speculative_generate
from mmspec.text.drafters import NoDrafter
from mmspec.text.head_drafters import HeadDrafter, HeadTreeDrafter
from tests.text.table_lm import TableLM, random_table
from tests.text.test_generate_law import ALPHA, MUTATION_ROWS, V, law_test


def head(kind: str, width: int = V + V % 2, vocab: int = V, seed: int = 0, **options):
    """A random head; one with `feature_layers` gets a random fuser too (its initial one reads f alone)."""
    torch.manual_seed(seed)
    if kind == "eagle":
        made = EagleHead(feature_size=width, vocab_size=vocab, n_head=1, ffn_hidden=8, **options).eval()
        if made.config.feature_layers:
            torch.nn.init.normal_(made.fuser.weight, std=0.5)
        return made
    return HydraHead(feature_size=width, vocab_size=vocab, num_heads=3, hidden=8).eval()


CONFIGS = {  # name: (drafter maker, draft_length, temperature, top_k)
    "eagle_chain": (lambda t: HeadDrafter(t, head("eagle")), 3, 1.0, 0),
    "eagle_chain_topk": (lambda t: HeadDrafter(t, head("eagle")), 2, 0.7, 3),
    "eagle_feature_sampling_chain": (lambda t: HeadDrafter(t, head("eagle", feature_sampling=True)), 3, 1.0, 0),
    "eagle3_chain": (lambda t: HeadDrafter(t, head("eagle", feature_layers=(0,))), 3, 1.0, 0),
    "hydra_chain": (lambda t: HeadDrafter(t, head("hydra")), 3, 1.3, 0),
    # a horizontal cascade: prompt lookup after the head's first position
    "eagle_chain_lookup_after": (lambda t: HeadDrafter(t, head("eagle"), lookup_after=1, max_ngram=2), 3, 1.0, 0),
    "eagle_tree": (lambda t: HeadTreeDrafter(t, head("eagle"), TreeShape(6, 2, 2, 3)), None, 1.0, 0),
    "eagle_positional_tree": (lambda t: HeadTreeDrafter(t, head("eagle"), TreeShape.positional(6, (0.6, 0.3, 0.2))),
                              None, 1.0, 0),
    "eagle3_tree_topk": (lambda t: HeadTreeDrafter(t, head("eagle", feature_layers=(0,)), TreeShape(6, 2, 2, 3)),
                         None, 0.8, 3),
    "hydra_tree_topk": (lambda t: HeadTreeDrafter(t, head("hydra"), TreeShape(7, 3, 1, 3)), None, 0.8, 3),
    # a tree's horizontal cascade: the head's first level, prompt lookup's point masses below it
    "eagle_tree_lookup_after": (lambda t: HeadTreeDrafter(t, head("eagle"), TreeShape(6, 2, 2, 3), lookup_after=1,
                                                          max_ngram=2), None, 1.0, 0),
}


# also run on the captured steps' code (their CPU tape), in the slow tier; the default tier checks that code token for
# token against the eager steps, whose law the eager rows here test (tests/text/test_graphs.py)
CAPTURED = ("hydra_tree_topk", "eagle_chain_topk", "eagle3_chain", "hydra_chain", "eagle_chain_lookup_after",
            "eagle_tree")


def run_and_test(name, seed=0, rows=None, captured=False):
    make, draft_length, temperature, top_k = CONFIGS[name]
    target = TableLM(random_table(V, 0))
    options = {} if draft_length is None else {"draft_length": draft_length}
    graphs = StepGraphs(cuda=False) if captured else None
    return law_test(target, make(target), temperature, top_k, seed, rows, graphs=graphs, **options)


# the default tier: an EAGLE chain (with feature sampling, EAGLE-3's fusion and a horizontal cascade) and a Hydra tree
# under top-k; the slow tier: the other chains and trees of each head
SLOW_CONFIGS = {"eagle_chain_topk", "hydra_chain", "eagle_tree", "eagle_positional_tree", "eagle3_tree_topk",
                "eagle_tree_lookup_after"}


@pytest.mark.parametrize("name,captured", [
    pytest.param(name, False, marks=pytest.mark.slow) if name in SLOW_CONFIGS else (name, False) for name in CONFIGS]
    + [pytest.param(name, True, marks=pytest.mark.slow) for name in CAPTURED])
def test_head_drafting_matches_exact_joint_law(name, captured):
    p_value, stats = run_and_test(name, captured=captured)
    assert p_value > ALPHA, f"output law differs from the target's (p = {p_value:.2e})"
    assert 0 < stats.accepted < stats.drafted  # both branches of the rule were exercised


def law_of_previous_depth(chain):
    """Mutation: each draft carries the law of the draft before it (an off-by-one in the recorded laws). (Dropping
    the laws is no mutation: a draft passed as deterministic is accepted with p(x) and the rest of p is kept, which is
    exact whatever drew it.)"""
    def mutated(self, *args, **kwargs):
        draft = chain(self, *args, **kwargs)
        return Draft(draft.tokens, draft.lengths, torch.cat([draft.q[:, :1], draft.q[:, :-1]], 1))
    return mutated


@pytest.mark.parametrize("name,captured", [("eagle_chain", False), ("eagle3_chain", False), ("eagle_chain", True)])
def test_stale_laws_are_rejected(monkeypatch, name, captured):
    monkeypatch.setattr(head_drafting.HeadProposer, "chain", law_of_previous_depth(head_drafting.HeadProposer.chain))
    p_value, _ = run_and_test(name, rows=MUTATION_ROWS, captured=captured)
    assert p_value < ALPHA


@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("kind,options", [("eagle", {}), ("eagle", {"feature_layers": (0, 1)}), ("hydra", {})])
@pytest.mark.parametrize("tree", [False, True])
def test_greedy_head_decoding_is_the_targets_greedy_output(tiny_llama, kind, options, tree, monkeypatch):
    ids = torch.randint(0, 64, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # ragged prompts: the head's prefill right-aligns them
    ar, _ = speculative_generate(tiny_llama, ids, mask, drafter=NoDrafter(), max_new_tokens=20, temperature=0)
    drafter_head = head(kind, 32, 64, **options)
    fused = check_fused_columns(monkeypatch, tiny_llama.model.norm) if options else None
    if tree:
        drafter, options = HeadTreeDrafter(tiny_llama, drafter_head, TreeShape(8, 2, 2, 3)), {}
    else:
        drafter, options = HeadDrafter(tiny_llama, drafter_head), {"draft_length": 3}
    out, stats = speculative_generate(tiny_llama, ids, mask, drafter=drafter, max_new_tokens=20, temperature=0,
                                      **options)
    assert torch.equal(out, ar)
    assert stats.draft_forwards == drafter.forwards > 0
    assert fused is None or max(fused) > 1  # the prompts' and the rounds' windows were fused


@pytest.mark.parametrize("tree", [False, True])
def test_a_heads_horizontal_cascade_keeps_greedy_output(tiny_llama, tree):
    """Prompt lookup after the head's first position (a chain's, a tree's first level), on prompts that repeat: the
    target's greedy output."""
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 9, 10, 11, 9, 10]])
    ar, _ = speculative_generate(tiny_llama, ids, drafter=NoDrafter(), max_new_tokens=20, temperature=0)
    if tree:
        drafter, options = HeadTreeDrafter(tiny_llama, head("eagle", 32, 64), TreeShape(8, 2, 2, 4), lookup_after=1), {}
    else:
        drafter, options = HeadDrafter(tiny_llama, head("eagle", 32, 64), lookup_after=1), {"draft_length": 4}
    out, stats = speculative_generate(tiny_llama, ids, drafter=drafter, max_new_tokens=20, temperature=0, **options)
    assert torch.equal(out, ar)
    assert stats.drafted > 2 * drafter.forwards  # lookup drafted beyond the head's one token (two children) a round


def check_fused_columns(monkeypatch, final_norm):
    """Make every fusion of a head tapping the target's last layer check that each column's last-layer output,
    through the target's final norm, is the feature beside it: the layers' outputs are aligned with the features."""
    fuse = EagleHead.fuse
    checked = []

    def checking(self, target_features):
        d = self.config.feature_size
        torch.testing.assert_close(final_norm(target_features[..., -2 * d : -d]), target_features[..., -d:])
        checked.append(target_features.shape[1])
        return fuse(self, target_features)

    monkeypatch.setattr(EagleHead, "fuse", checking)
    return checked


def test_head_drafters_refuse_what_they_cannot_do(tiny_llama):
    with pytest.raises(ValueError, match="draft_length: this Hydra head drafts at most 3"):
        HeadDrafter(tiny_llama, head("hydra", 32, 64)).schedule(4)
    with pytest.raises(ValueError, match="at most 3 levels"):
        HeadTreeDrafter(tiny_llama, head("hydra", 32, 64), TreeShape(8, 2, 2, 4))
    with pytest.raises(ValueError, match="vocabulary of 5"):
        HeadDrafter(tiny_llama, head("eagle", 32, 5))
    with pytest.raises(ValueError, match="features of width 6"):
        HeadDrafter(tiny_llama, head("eagle", 6, 64))
    with pytest.raises(ValueError, match=r"decoder layers \[0, 2\]; the target has 2"):
        HeadDrafter(tiny_llama, head("eagle", 32, 64, feature_layers=(0, 2)))
    with pytest.raises(ValueError, match="feature_layers must be distinct layer indices"):
        head("eagle", 32, 64, feature_layers=(1, 1))

    class TreesOnly:  # a model adapter without the "features" capability
        capabilities = frozenset({"tree"})

    with pytest.raises(ValueError, match=r"a draft head needs a model adapter with feature_readout and feature_layers "
                                         r"\(capability 'features'\); TreesOnly"):
        HeadDrafter(TreesOnly(), head("eagle", 32, 64))
