"""VocabTrim's draft vocabulary (`mmspec.core.drafting.vocabulary`, `ModelDrafter(vocabulary=...)`,
`HeadDrafter(vocabulary= ...)`): the trimmed draft LM or head drafts from its law renormalised over S and records it
V-wide, so the output keeps the target's law (chi-square against the exact joint law) and greedy output stays the
target's; a drafter that draws over S but reads its index as a token id (the "first |S| ids" map) is rejected by the
same test."""

import pytest
import torch

from mmspec.adapters.views import trimmed_view
from mmspec.core.drafting import vocabulary
from mmspec.core.drafting.vocabulary import frequent_vocabulary
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.text import speculative_generate
from mmspec.text.drafters import ModelDrafter
from mmspec.text.head_drafters import HeadDrafter
from mmspec.text.methods import TextDraftHeads, TextSpeculation, draft_vocabulary
from tests.text.table_lm import TableLM, random_table
from tests.text.test_generate import prompts
from tests.text.test_generate_law import ALPHA, EOS, MUTATION_ROWS, V, law_test
from tests.text.test_head_drafters import head

KEPT = torch.tensor([0, 2, EOS])
WIDEN = vocabulary.widen


def trimmed_drafter(kind, target):
    """The draft LM's or the EAGLE head's chains, trimmed to KEPT."""
    if kind == "model":
        return ModelDrafter(TableLM(random_table(V, 1)), vocabulary=KEPT)
    return HeadDrafter(target, head("eagle"), vocabulary=KEPT)


@pytest.mark.parametrize("kind,draft_length,temperature,top_k", [  # the head without top-k: the slow tier
    ("model", 3, 1.0, 0), ("model", 2, 0.7, 2), pytest.param("head", 3, 1.0, 0, marks=pytest.mark.slow),
    ("head", 2, 0.7, 2)])
def test_trimmed_draft_keeps_the_targets_law(kind, draft_length, temperature, top_k):
    target = TableLM(random_table(V, 0))
    p_value, stats = law_test(target, trimmed_drafter(kind, target), temperature, top_k, draft_length=draft_length)
    assert p_value > ALPHA, f"output law differs from the target's (p = {p_value:.2e})"
    assert 0 < stats.accepted < stats.drafted


def test_a_trimmed_head_drafts_only_the_vocabulary():
    """Every token the trimmed head drafts is in S, and its recorded law is zero outside S."""
    target = TableLM(random_table(V, 0))
    drafter = HeadDrafter(target, head("eagle"), vocabulary=KEPT)
    captured = []
    ids = torch.tensor([[1, 3, 2], [3, 1, 1]])
    original = drafter.propose

    def propose(*args):
        draft = original(*args)
        captured.append(draft)
        return draft

    drafter.propose = propose
    speculative_generate(target, ids, drafter=drafter, max_new_tokens=6, temperature=1.0, draft_length=3,
                         generator=torch.Generator().manual_seed(0))
    outside = torch.ones(V, dtype=torch.bool)
    outside[KEPT] = False
    assert captured and all(torch.isin(d.tokens, KEPT).all() for d in captured)
    assert all(d.q[..., outside].abs().max() == 0 for d in captured)


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


@pytest.mark.parametrize("kind", ["model", "head"])
def test_first_ids_map_is_rejected(kind, monkeypatch):
    monkeypatch.setattr(vocabulary, "widen", first_ids_map)
    target = TableLM(random_table(V, 0))
    p_value, _ = law_test(target, trimmed_drafter(kind, target), 1.0, 0, rows=MUTATION_ROWS, draft_length=3)
    assert p_value < ALPHA, f"the mutant map was not detected (p = {p_value:.2e})"


def test_the_vocabulary_comes_from_the_targets_ranking(tiny_target):
    with pytest.raises(ValueError, match="needs the target's token ranking"):
        draft_vocabulary(tiny_target, 4)
    tiny_target.config.token_ranking = list(range(47, -1, -1))
    try:
        assert draft_vocabulary(tiny_target, 3).tolist() == sorted({45, 46, 47, *[
            i for i in (tiny_target.config.eos_token_id, tiny_target.config.pad_token_id,
                        tiny_target.config.bos_token_id) if i is not None]})
    finally:
        del tiny_target.config.token_ranking
    with pytest.raises(ValueError, match="draft_vocabulary trims a chain's head"):
        TextDraftHeads(tree_size=8, draft_vocabulary=16)
    with pytest.raises(ValueError, match="draft_vocabulary"):
        TextSpeculation(drafter="ngram", draft_vocabulary=16)
