"""Draft-length stop rules (`mmspec.core.drafting.stops`): SpecDec++'s learned stop and the confidence stop only
change what is proposed, so the output keeps the target's law (chi-square against the exact joint law through the
real loop) and greedy output stays the target's; a stop that drops the token which tripped it (keeping only the
tokens the rule liked, under a law that no longer describes them) is rejected by the same test."""

import pytest
import torch

from mmspec.core.drafting import proposer as drafting
from mmspec.models.acceptance import AcceptanceHead
from mmspec.text import speculative_generate
from mmspec.text.drafters import ModelDrafter
from tests.text.table_lm import TableLM, random_table
from tests.text.test_generate import prompts
from tests.text.test_generate_law import ALPHA, MUTATION_ROWS, V, law_test


def acceptance_head(feature_size: int, seed: int = 0) -> AcceptanceHead:
    """A random head (its predictions spread around 1/2) in float64."""
    torch.manual_seed(seed)
    return AcceptanceHead(feature_size=feature_size, hidden=16, layers=1).double().eval()


def learned_drafter(draft, threshold: float = 0.6) -> ModelDrafter:
    return ModelDrafter(draft, acceptance_head=acceptance_head(draft.config.hidden_size), stop_threshold=threshold)


@pytest.mark.parametrize("draft_length,temperature,top_k", [(4, 1.0, 0), (3, 0.7, 3)])
def test_learned_stop_keeps_the_targets_law(draft_length, temperature, top_k):
    target, draft = TableLM(random_table(V, 0)), TableLM(random_table(V, 1))
    p_value, stats = law_test(target, learned_drafter(draft), temperature, top_k, draft_length=draft_length)
    assert p_value > ALPHA, f"output law differs from the target's (p = {p_value:.2e})"
    lengths = torch.arange(stats.accept_hist.numel())
    assert stats.drafted < draft_length * int(stats.steps.sum())  # the rule cut drafts short
    assert 0 < stats.accepted < stats.drafted and lengths.numel() > 1


def test_learned_stop_keeps_greedy_output(tiny_target, tiny_draft):
    ids, mask = prompts(4)
    expected = tiny_target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                                    pad_token_id=0)
    out, stats = speculative_generate(tiny_target, ids, mask, drafter=learned_drafter(tiny_draft, 0.3),
                                      max_new_tokens=24, temperature=0, eos_token_id=tiny_target.config.eos_token_id,
                                      pad_token_id=0, draft_length=6)
    assert torch.equal(out, expected)
    assert stats.drafted < 6 * int(stats.steps.sum())


def test_learned_stop_checks_its_inputs(tiny_draft):
    head = acceptance_head(tiny_draft.config.hidden_size)
    with pytest.raises(ValueError, match="two stop rules"):
        ModelDrafter(tiny_draft, confidence_threshold=0.3, acceptance_head=head)
    with pytest.raises(ValueError, match="stop_threshold applies with an acceptance_head"):
        ModelDrafter(tiny_draft, stop_threshold=0.5)
    with pytest.raises(ValueError, match="reads features of width 8"):
        ModelDrafter(tiny_draft, acceptance_head=acceptance_head(8))
    with pytest.raises(ValueError, match=r"stop_threshold must be two values in \(0, 1\)"):
        AcceptanceHead(stop_threshold=(0.5, 1.0))


def drop_the_tripping_token(stop_at, stopped, i):
    """Mutation: a row that stops after token i keeps only tokens 0 .. i - 1."""
    return torch.where(stopped & (stop_at > i), torch.clamp(torch.tensor(i), min=1), stop_at)


@pytest.mark.parametrize("rule", ["confidence", "learned"])
def test_dropping_the_tripping_token_is_rejected(rule, monkeypatch):
    monkeypatch.setattr(drafting, "stop_after", drop_the_tripping_token)
    target, draft = TableLM(random_table(V, 0)), TableLM(random_table(V, 1))
    drafter = ModelDrafter(draft, confidence_threshold=0.3) if rule == "confidence" else learned_drafter(draft)
    rows = MUTATION_ROWS if rule == "confidence" else None  # the learned stop's mutant: p 6e-4 on 12,500 rows, seed 1
    p_value, _ = law_test(target, drafter, 1.0, 0, rows=rows, draft_length=3)
    assert p_value < ALPHA, f"the mutant stop was not detected (p = {p_value:.2e})"
