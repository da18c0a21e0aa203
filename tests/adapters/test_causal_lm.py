"""`CausalLMAdapter` on a real (tiny) transformers LM: ragged windows and per-row rollback equal a full recompute,
unused cache tails are cropped, tree attention equals each path's own forward and `keep_path` leaves exactly the path,
row selection, and the CFG rows of an image family see the same tokens."""

import torch

from mmspec.adapters.causal_lm import CausalLMAdapter, Prompt
from mmspec.core.trees import DraftTree
from tests.conftest import tiny_llama

# a tree over slots 0 (root) .. 5: nodes 0, 1 under the root, 2, 3 under node 0, 4 under node 1
PARENT = torch.tensor([[-1, -1, 0, 0, 1], [-1, 0, 1, -1, -1]])
REAL = torch.arange(5) < torch.tensor([[5], [3]])  # row 1: a chain of 3, then padding


def full_logits(model, sequence: list[int]) -> torch.Tensor:
    return model(torch.tensor([sequence])).logits[0]


def path_tokens(tree_tokens: torch.Tensor, parent: torch.Tensor, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.insert(0, int(tree_tokens[node]))
        node = int(parent[node])
    return path


def prefilled(model, B: int, g: torch.Generator):
    """Left-padded prompts of lengths 5, 3, 1 (first B of them), prefilled; their real tokens."""
    prompt = torch.randint(3, 48, (B, 5), generator=g)
    valid = torch.tensor([[1] * 5, [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)[:B]
    adapter = CausalLMAdapter(model)
    state, logits = adapter.prefill(Prompt(prompt, valid))
    sequences = [prompt[b][valid[b]].tolist() for b in range(B)]
    for b in range(B):  # the prefill's logits are those of each row's last prompt token
        torch.testing.assert_close(logits.cond[b, 0], full_logits(model, sequences[b])[-1], rtol=0, atol=1e-10)
    return adapter, state, sequences


@torch.no_grad()
def test_ragged_windows_and_rollback_match_full_recompute():
    model = tiny_llama()
    g = torch.Generator().manual_seed(0)
    adapter, state, sequences = prefilled(model, 3, g)
    after = [[] for _ in sequences]  # each row's tokens after its prompt
    for step in range(4):
        window = torch.randint(3, 48, (3, 4), generator=g)
        logits = adapter.forward(window, state).cond
        for b in range(3):
            reference = full_logits(model, sequences[b] + after[b] + window[b].tolist())[-4:]
            torch.testing.assert_close(logits[b], reference, rtol=0, atol=1e-10)
        keep_new = [step % 4, 4, 0]  # ragged acceptance, including a full reject
        for b in range(3):
            after[b] += window[b, : keep_new[b]].tolist()
        adapter.rollback(state, torch.tensor([len(a) for a in after]))
        assert state.lengths.tolist() == [len(s) + len(a) for s, a in zip(sequences, after, strict=True)]


@torch.no_grad()
def test_rollback_crops_the_unused_tail():
    model = tiny_llama()
    adapter = CausalLMAdapter(model)
    state, _ = adapter.prefill(Prompt(torch.full((2, 2), 5)))
    adapter.forward(torch.full((2, 4), 5), state)
    adapter.rollback(state, torch.tensor([2, 0]))
    assert state.slot_mask.shape[1] == 4 and state.cache.get_seq_length() == 4


@torch.no_grad()
def test_tree_forward_equals_each_paths_own_forward_and_keep_path_leaves_exactly_the_path():
    model = tiny_llama()
    g = torch.Generator().manual_seed(0)
    adapter, state, committed = prefilled(model, 2, g)
    root = torch.randint(3, 48, (2, 1), generator=g)
    nodes = torch.randint(3, 48, (2, 5), generator=g)
    layout = DraftTree(nodes, PARENT, REAL, None, "deterministic").layout()
    logits = adapter.forward_tree(torch.cat([root, nodes], 1), layout.depth, layout.ancestors, state).cond
    for b in range(2):
        for node in range(int(REAL[b].sum())):
            sequence = committed[b] + [int(root[b])] + path_tokens(nodes[b], PARENT[b], node)
            torch.testing.assert_close(logits[b, 1 + node], full_logits(model, sequence)[-1], rtol=0, atol=1e-5)
    # row 0 accepts node 1 then node 4 (slots 2, 5); row 1 accepts nodes 0, 1 of its chain (slots 1, 2)
    adapter.keep_path(state, torch.tensor([[2, 5], [1, 2]]))
    adapter.rollback(state, torch.tensor([3, 3]))  # the root and a path of two
    kept = [committed[0] + [int(root[0]), int(nodes[0, 1]), int(nodes[0, 4])],
            committed[1] + [int(root[1]), int(nodes[1, 0]), int(nodes[1, 1])]]
    assert state.lengths.tolist() == [len(k) for k in kept]
    nxt = torch.randint(3, 48, (2, 2), generator=g)
    logits = adapter.forward(nxt, state).cond
    for b in range(2):
        torch.testing.assert_close(logits[b], full_logits(model, kept[b] + nxt[b].tolist())[-2:], rtol=0, atol=1e-5)


@torch.no_grad()
def test_selected_rows_decode_as_alone():
    model = tiny_llama()
    g = torch.Generator().manual_seed(2)
    adapter, state, sequences = prefilled(model, 3, g)
    adapter.select_rows(state, torch.tensor([2, 0]))
    window = torch.randint(3, 48, (2, 3), generator=g)
    logits = adapter.forward(window, state).cond
    for row, b in enumerate((2, 0)):
        torch.testing.assert_close(logits[row], full_logits(model, sequences[b] + window[row].tolist())[-3:], rtol=0,
                                   atol=1e-10)


def test_features_are_the_lm_heads_input_and_the_decoder_layers():
    """The "features" capability: a feature head binds to any transformers causal LM through the protocol, as to an
    image model; the tap catches the LM head's input (the final norm's output) and each decoder layer's output."""
    from mmspec.adapters.features import FeatureTap
    from mmspec.core.model import require

    model = tiny_llama()
    adapter = CausalLMAdapter(model)
    require(adapter, {"features"}, "a feature head")
    embedding, lm_head = adapter.feature_readout()
    assert embedding is model.get_input_embeddings() and lm_head is model.get_output_embeddings()
    layers = adapter.feature_layers()
    assert layers == list(model.model.layers) and len(layers) == model.config.num_hidden_layers
    tap = FeatureTap(lm_head, layers[:1])
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    torch.testing.assert_close(tap.feature, out.hidden_states[-1])  # transformers' last hidden state is normed
    torch.testing.assert_close(tap.layer_outputs[0], out.hidden_states[1])
