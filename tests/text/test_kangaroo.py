"""Kangaroo's self-speculative drafter (`KangarooDrafter`, `kangaroo_view`, `KangarooAdapter`): the view runs the
target's own first layers (its adapter reads exactly the target's hidden state at the exit) and self-drafting keeps
the target's greedy output. Its law test, with the double early exit, is beside S2D's in
`tests/text/test_sorted_exits.py`."""

import pytest
import torch

from mmspec.adapters.views import kangaroo_view
from mmspec.models.kangaroo import KangarooAdapter
from mmspec.text import TextSpeculation, speculative_generate
from mmspec.text.drafters import KangarooDrafter
from tests.conftest import tiny_llama
from tests.text.test_generate import prompts
from tests.text.test_generate_law import V


def adapter_for(model, exit_layer: int, noise: float = 0.3, seed: int = 0) -> KangarooAdapter:
    """An adapter started from the model's next layer, then moved off it by `noise` (so it is not that layer's)."""
    adapter = KangarooAdapter.for_target(model, exit_layer)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in adapter.parameters():
            weight.add_(noise * torch.randn(weight.shape, generator=generator, dtype=weight.dtype))
    return adapter


def test_the_adapter_reads_the_targets_hidden_state_at_the_exit(tiny_target):
    adapter = adapter_for(tiny_target, exit_layer=2)
    seen = []
    adapter.block.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    ids, mask = prompts(2)
    view = kangaroo_view(tiny_target, adapter)
    logits = view(input_ids=ids, attention_mask=mask).logits
    expected = tiny_target(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[2]
    torch.testing.assert_close(seen[0], expected)
    assert view.config.num_hidden_layers == 3 and tiny_target.config.num_hidden_layers == 3
    assert logits.shape[-1] == tiny_target.config.vocab_size
    assert view.get_output_embeddings() is tiny_target.get_output_embeddings()  # the target's own head


def test_an_adapter_copied_from_the_last_layer_drafts_the_targets_own_law(tiny_target):
    """With the last layer's feed-forward zeroed, that layer is an attention block between two norms: an adapter
    copied from it at the exit before it gives the target's logits, whole-sequence and through the draft's cache."""
    with torch.no_grad():
        tiny_target.model.layers[2].mlp.down_proj.weight.zero_()
    adapter = KangarooAdapter.for_target(tiny_target, 2)
    view = kangaroo_view(tiny_target, adapter)
    ids, mask = prompts(3)
    torch.testing.assert_close(view(input_ids=ids, attention_mask=mask).logits,
                               tiny_target(input_ids=ids, attention_mask=mask).logits)
    expected = tiny_target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                                    pad_token_id=0)
    out, stats = speculative_generate(tiny_target, ids, mask, drafter=KangarooDrafter(tiny_target, adapter),
                                      max_new_tokens=16, temperature=0, pad_token_id=0, draft_length=4)
    assert torch.equal(out, expected) and stats.accepted == stats.drafted  # every draft is the target's own choice


@pytest.mark.parametrize("confidence_threshold", [0.0, 0.4])
def test_self_drafting_keeps_the_targets_greedy_output(tiny_target, confidence_threshold):
    ids, mask = prompts(4)
    expected = tiny_target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                                    pad_token_id=0)
    drafter = KangarooDrafter(tiny_target, adapter_for(tiny_target, 2, noise=0.02),
                              confidence_threshold=confidence_threshold)
    out, stats = speculative_generate(tiny_target, ids, mask, drafter=drafter, max_new_tokens=24, temperature=0,
                                      eos_token_id=tiny_target.config.eos_token_id, pad_token_id=0, draft_length=5)
    assert torch.equal(out, expected)
    assert 0 < stats.accepted < stats.drafted


def exit_drafter(confidence_threshold: float) -> KangarooDrafter:
    """Kangaroo's drafter on a tiny Llama over the law test's vocabulary, its head sharpened so that the double exit
    trips at any depth (the table target verifies: the law test needs its exact joint law; the drafter's cache,
    adapter and double exit are Kangaroo's)."""
    host = tiny_llama(vocab_size=V, hidden_size=8, num_layers=2, seed=3, num_heads=1)
    with torch.no_grad():
        host.lm_head.weight.mul_(60.0)
    return KangarooDrafter(host, adapter_for(host, 1), confidence_threshold=confidence_threshold)


def test_bad_adapters_are_refused(tiny_target):
    with pytest.raises(ValueError, match=r"exit_layer must be an int in \[1, 2\]"):
        KangarooAdapter.for_target(tiny_target, 3)
    narrow = KangarooAdapter(exit_layer=1, hidden_size=16, num_attention_heads=4, num_key_value_heads=4, head_dim=4)
    with pytest.raises(ValueError, match="features of width 16"):
        kangaroo_view(tiny_target, narrow)
    with pytest.raises(TypeError, match="KangarooAdapter"):
        kangaroo_view(tiny_target, torch.nn.Linear(2, 2))
    ids, mask = prompts(1)
    with pytest.raises(ValueError, match="needs an exit adapter"):
        TextSpeculation(drafter="kangaroo").run(tiny_target, None, ids, mask, max_new_tokens=4)
