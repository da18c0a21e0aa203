import torch

from mmspec.text.cache import RaggedCacheState, forward_window, truncate
from tests.conftest import tiny_llama


def full_logits(model, sequences: list[list[int]]) -> list[torch.Tensor]:
    return [model(torch.tensor([s])).logits[0] for s in sequences]


@torch.no_grad()
def test_ragged_windows_and_rollback_match_full_recompute():
    model = tiny_llama()
    g = torch.Generator().manual_seed(0)
    B = 3
    state = RaggedCacheState.empty(B, torch.device("cpu"))
    # Left-padded prompts of lengths 5, 3, 1.
    prompt = torch.randint(3, 48, (B, 5), generator=g)
    valid = torch.tensor([[1] * 5, [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)
    sequences = [prompt[b][valid[b]].tolist() for b in range(B)]
    forward_window(model, state, prompt, valid)
    for step in range(4):
        window = torch.randint(3, 48, (B, 4), generator=g)
        logits = forward_window(model, state, window)
        for b in range(B):
            reference = full_logits(model, [sequences[b] + window[b].tolist()])[0][-4:]
            torch.testing.assert_close(logits[b], reference, rtol=0, atol=1e-10)
        keep_new = torch.tensor([step % 4, 4, 0])  # ragged acceptance, including a full reject
        for b in range(B):
            sequences[b] += window[b, : keep_new[b]].tolist()
        truncate(state, torch.tensor([len(s) for s in sequences]))
        assert state.lengths.tolist() == [len(s) for s in sequences]


@torch.no_grad()
def test_truncate_crops_unused_tail():
    model = tiny_llama()
    state = RaggedCacheState.empty(2, torch.device("cpu"))
    forward_window(model, state, torch.full((2, 6), 5))
    truncate(state, torch.tensor([4, 2]))
    assert state.slot_mask.shape[1] == 4
    assert state.cache.get_seq_length() == 4
