"""VocabTrim's draft vocabulary (`mmspec.core.vocabulary`, `ModelDrafter(vocabulary=...)`): the trimmed draft
drafts from its law renormalised over S and records it V-wide, so the output keeps the target's law (chi-square
against the exact joint law) and greedy output stays the target's; a draft that draws over S but reads its index as
a token id (the "first |S| ids" map) is rejected by the same test."""

import pytest
import torch

from mmspec.core import vocabulary
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.vocabulary import frequent_vocabulary
from mmspec.text import speculative_generate
from mmspec.text.drafters import ModelDrafter, trimmed_view
from tests.text.table_lm import TableLM, random_table
from tests.text.test_generate import prompts
from tests.text.test_generate_law import ALPHA, EOS, V, law_test

KEPT = torch.tensor([0, 2, EOS])
WIDEN = vocabulary.widen


@pytest.mark.parametrize("draft_length,temperature,top_k", [(3, 1.0, 0), (2, 0.7, 2)])
def test_trimmed_draft_keeps_the_targets_law(draft_length, temperature, top_k):
    target, draft = TableLM(random_table(V, 0)), TableLM(random_table(V, 1))
    p_value, stats = law_test(target, ModelDrafter(draft, vocabulary=KEPT), temperature, top_k,
                              draft_length=draft_length)
    assert p_value > ALPHA, f"output law differs from the target's (p = {p_value:.2e})"
    assert 0 < stats.accepted < stats.drafted


def test_trimmed_draft_law_is_the_full_law_renormalised_over_the_vocabulary(tiny_draft):
    kept = torch.arange(0, 48, 3)
    ids = torch.tensor([[5, 6, 7, 5]])
    full, trimmed = tiny_draft(input_ids=ids).logits, trimmed_view(tiny_draft, kept)(input_ids=ids).logits
    assert trimmed.shape[-1] == kept.numel()
    sampling = SamplingConfig(temperature=0.8)
    masked = torch.full_like(full, float("-inf"))
    masked[..., kept] = full[..., kept]
    _, wide = vocabulary.widen(torch.zeros(1, 4, dtype=torch.long), process_logits(trimmed, sampling), kept, 48)
    torch.testing.assert_close(wide, process_logits(masked, sampling))
    assert tiny_draft.get_output_embeddings().weight.shape[0] == 48  # the draft itself is untouched


def test_trimmed_draft_keeps_greedy_output(tiny_target, tiny_draft):
    ids, mask = prompts(4)
    expected = tiny_target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                                    pad_token_id=0)
    kept = frequent_vocabulary(torch.arange(47, -1, -1), 24, keep=[tiny_target.config.eos_token_id])
    out, stats = speculative_generate(tiny_target, ids, mask, drafter=ModelDrafter(tiny_draft, vocabulary=kept),
                                      max_new_tokens=24, temperature=0, eos_token_id=tiny_target.config.eos_token_id,
                                      pad_token_id=0, draft_length=3)
    assert torch.equal(out, expected)


def test_frequent_vocabulary_keeps_the_specials_and_checks_its_inputs(tiny_draft):
    assert frequent_vocabulary([7, 3, 9, 1, 0], 3, keep=[0]).tolist() == [0, 3, 7, 9]
    with pytest.raises(ValueError, match=r"size must be an int in \[1, 5\]"):
        frequent_vocabulary([7, 3, 9, 1, 0], 6)
    with pytest.raises(ValueError, match="distinct sorted token ids"):
        trimmed_view(tiny_draft, torch.tensor([3, 1]))
    with pytest.raises(ValueError, match="does not take a trimmed vocabulary"):
        ModelDrafter(tiny_draft, acceptance_head=object(), vocabulary=torch.tensor([1, 2]))


def first_ids_map(index, q, kept, vocab_size):
    """Mutation: the index into S read as a token id (a vocabulary map left at "the first |S| ids"), the law
    recorded where S's tokens are."""
    _, wide = WIDEN(index, q, kept, vocab_size)
    return index, wide


def test_first_ids_map_is_rejected(monkeypatch):
    monkeypatch.setattr(vocabulary, "widen", first_ids_map)
    target, draft = TableLM(random_table(V, 0)), TableLM(random_table(V, 1))
    p_value, _ = law_test(target, ModelDrafter(draft, vocabulary=KEPT), 1.0, 0, draft_length=3)
    assert p_value < ALPHA, f"the mutant map was not detected (p = {p_value:.2e})"
