"""Sequence-level exactness of speculative_generate with tree drafters: the output law equals the target's AR joint law.

The set-up of `test_generate_law` (lookup-table LMs over V = 5, token 4 = EOS, 4 new tokens, two prompts of different
lengths in one left-padded batch of 200,000 rows, chi-square per prompt at alpha = 1e-5), with every tree drafter
and every tree rule: dynamic trees of a draft LM drawn without replacement (RSD), iid (SpecInfer, SpecTr, Khisti),
deterministic top-k children reranked OPT-Tree style, and STAND's n-gram memory. The draft LM reads its tree through
the same tree attention as the target. Mutation companions must be rejected by the same test.
"""

import pytest

from mmspec.adapters.static_cache import StaticCausalLMAdapter
from mmspec.core import multidraft, tree_verify
from mmspec.core.tree_shape import TreeShape
from mmspec.text import speculative_generate
from mmspec.text.tree_drafters import ModelTreeDrafter, StandDrafter
from tests.text.table_lm import TableLM, random_table
from tests.text.test_generate_law import ALPHA, EOS, MUTATION_ROWS, PROMPT_MASK, PROMPTS, V, law_test

CONFIGS = {  # name: (drafter, tree rule, temperature, top_k)
    "rsd_k2": (lambda d: ModelTreeDrafter(d, TreeShape(6, 2, 2, 3)), None, 1.0, 0),
    "rsd_k3_topk": (lambda d: ModelTreeDrafter(d, TreeShape(7, 3, 1, 3)), None, 0.7, 3),
    "specinfer_iid": (lambda d: ModelTreeDrafter(d, TreeShape(6, 2, 2, 3, "iid")), "specinfer", 1.3, 0),
    "spectr_iid": (lambda d: ModelTreeDrafter(d, TreeShape(7, 3, 1, 3, "iid")), "spectr", 1.0, 0),
    "khisti_iid": (lambda d: ModelTreeDrafter(d, TreeShape(6, 2, 2, 3, "iid")), "khisti", 1.0, 3),
    "opt_tree_deterministic": (lambda d: ModelTreeDrafter(d, TreeShape(5, 3, 2, 3, "deterministic", True)), None,
                               1.0, 0),
    "stand": (lambda d: StandDrafter(TreeShape(6, 2, 2, 3), max_ngram=2), None, 1.0, 0),
    # a fixed tree whose root has 4 children where top-k leaves 3 tokens: padding between real nodes
    "positional_rsd_topk": (lambda d: ModelTreeDrafter(d, TreeShape.positional(9, (0.5, 0.3, 0.2, 0.2))), None, 0.8,
                            3),
    # horizontal cascades (CS-Drafting): the draft LM's first level(s), prompt lookup's point masses below
    "cascade_rsd": (lambda d: ModelTreeDrafter(d, TreeShape(6, 2, 2, 3), lookup_after=1, max_ngram=2), None, 1.0, 0),
    "cascade_positional_iid_topk": (lambda d: ModelTreeDrafter(d, TreeShape.positional(9, (0.5, 0.3, 0.2, 0.2),
                                                                                       scheme="iid"),
                                                               lookup_after=2, max_ngram=2), "specinfer", 0.8, 3),
}


def run_and_test(name, seed=0, rows=None):
    """Min p-value over the two prompts, and the stats."""
    make, rule, temperature, top_k = CONFIGS[name]
    target, draft = TableLM(random_table(V, 0)), TableLM(random_table(V, 1))
    return law_test(target, make(draft), temperature, top_k, seed, rows, tree_rule=rule, measure_ceiling=True)


# the slow tier: variants of a tree the default tier covers once (top-k, a positional tree, a cascade); and SpecTr's and
# Khisti's iid rules and OPT-Tree's deterministic children, whose output laws tests/core/test_tree_verify.py
# enumerates in float64 in the default tier
SLOW_CONFIGS = {"rsd_k3_topk", "positional_rsd_topk", "cascade_positional_iid_topk", "spectr_iid", "khisti_iid",
                "opt_tree_deterministic"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_CONFIGS else name
                                  for name in CONFIGS])
def test_tree_speculation_matches_exact_joint_law(name):
    p_value, stats = run_and_test(name)
    assert p_value > ALPHA, f"output law differs from the target's (p = {p_value:.2e})"
    assert 0 < stats.accepted < stats.drafted  # both branches of the rule were exercised
    assert stats.mean_accepted_length > 1.2
    assert 0 < stats.tree_acceptance < 1
    # no rule beats the ceiling in expectation over the children's draws (0.01: the noise of those draws' mean)
    if stats.tree_alpha_star is not None:  # None: 3 or more children without replacement (not computed)
        assert stats.tree_acceptance <= stats.tree_alpha_star + 0.01
    assert 0 < stats.child_acceptance[0] < 1 and all(0 <= r <= 1 for r in stats.child_acceptance)


def keep_rejected_branches(adapter, state, path):
    """Mutation: the cache keeps the tree's slots in their order, the rejected branches' nodes instead of the path."""


def siblings_not_renormalised(p, q):
    """Mutation: after a rejected child the target law is max(p - q, 0), not renormalised."""
    return (p - q).clamp(min=0)


MUTATIONS = {  # name: (config, module, attribute, replacement)
    "keeps_rejected_branch_kv": ("rsd_k2", StaticCausalLMAdapter, "keep_path", keep_rejected_branches),
    "residual_not_renormalised_across_siblings": ("rsd_k2", multidraft, "residual_law", siblings_not_renormalised),
    "without_replacement_children_verified_as_iid": (
        "rsd_k3_topk", tree_verify, "check_rule", lambda scheme, rule: "specinfer"),
    # a cascade's deeper levels are drawn from and recorded with one law (`grow_tree`'s `level_law`), so its own
    # companions break what the looked-up paths go through: the kept cache and the sibling residuals
    "cascade_keeps_rejected_branch_kv": ("cascade_rsd", StaticCausalLMAdapter, "keep_path", keep_rejected_branches),
    "cascade_residual_not_renormalised": ("cascade_positional_iid_topk", multidraft, "residual_law",
                                          siblings_not_renormalised),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_tree_mutations_are_rejected(mutation, monkeypatch):
    config, module, attribute, replacement = MUTATIONS[mutation]
    monkeypatch.setattr(module, attribute, replacement)
    p_value, _ = run_and_test(config, rows=MUTATION_ROWS)
    assert p_value < ALPHA, f"mutation {mutation} was not detected (p = {p_value:.2e})"


def test_greedy_tree_decoding_is_the_targets_greedy_output():
    """At temperature 0 the tree's children are the draft's top tokens and the output is the target's argmax path."""
    target, draft = TableLM(random_table(V, 0)), TableLM(random_table(V, 1))
    out, stats = speculative_generate(target, PROMPTS, PROMPT_MASK,
                                      drafter=ModelTreeDrafter(draft, TreeShape(6, 2, 2, 3)),
                                      max_new_tokens=6, temperature=0.0, pad_token_id=EOS)
    for r in range(2):
        seq = PROMPTS[r][PROMPT_MASK[r].bool()].tolist()
        for _ in range(6):
            prev2 = seq[-2] if len(seq) >= 2 else V
            seq.append(int(target.table[prev2, seq[-1]].argmax()))
        assert out[r, PROMPTS.shape[1]:].tolist() == seq[-6:]
    assert stats.accepted > 0
