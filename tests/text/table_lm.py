"""Lookup-table causal LMs whose exact joint law is computable, run through the real cache and decoding loop.

`TableLM` is a second-order Markov model: the logits of the next token are `table[prev2, prev1]`, where prev1 and
prev2 are the last two *valid* tokens of the row up to the query slot. It reads its history from the transformers
cache (a key is its token's id) and the attention mask, exactly as a transformer would, so a missing cache rollback
or a wrong position changes its output law. It takes the 2-D slot mask of `forward_window` and the 4-D additive
tree mask of `forward_tree`.
"""

import torch
from transformers import DynamicCache, PretrainedConfig

NONE = -1  # "no token" in the history (sequence start)


class Reversed(torch.nn.Module):
    """A stand-in decoder layer: its output is its input's entries in reverse order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(-1)


class TableLM(torch.nn.Module):
    def __init__(self, table: torch.Tensor):
        super().__init__()
        V = table.shape[-1]
        assert table.shape == (V + 1, V + 1, V), "table: [V + 1, V + 1, V], index V = no token"
        self.table = table
        # an embedding and an LM head for draft heads: the feature is the logit row padded to an even width (rotary
        # pairs), and the head reads its first V entries back exactly
        width = V + V % 2
        self.config = PretrainedConfig(num_hidden_layers=1, vocab_size=V, hidden_size=width,
                                       max_position_embeddings=1024)
        self.embed_tokens = torch.nn.Embedding(V, width, dtype=torch.float64)
        self.lm_head = torch.nn.Linear(width, V, bias=False, dtype=torch.float64)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.eye(V, width, dtype=torch.float64))
        self.layers = torch.nn.ModuleList([Reversed()])  # a "decoder layer" for EAGLE-3 heads to fuse

    def get_input_embeddings(self):
        return self.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, head):
        self.lm_head = head

    def get_decoder(self):
        return self  # its `layers`

    def forward(self, input_ids, attention_mask, position_ids=None, past_key_values=None, use_cache=True):
        V = self.table.shape[-1]
        B, W = input_ids.shape
        if past_key_values is None:  # a whole-sequence forward (the online learner reads the target's laws so)
            past_key_values = DynamicCache()
        ids = input_ids.double()[:, None, :, None]  # [B, 1, W, 1]: a token's key and value are its id
        keys, _ = past_key_values.update(ids, ids, 0)
        history = keys[:, 0, :, 0].long()  # [B, S]
        S = history.shape[1]
        slots = torch.arange(S)
        if attention_mask.ndim == 4:  # tree attention: an additive [B, 1, W, S] mask, 0 where visible
            visible = attention_mask[:, 0] == 0
        else:
            valid = attention_mask.bool()  # [B, S]
            visible = valid[:, None, :] & (slots[None, None, :] <= slots[S - W :, None])  # [B, W, S]
        # each query's last two visible slots, counted from 1 (0: none); int16 keeps this [B, W, S] work small
        seen = visible * (slots + 1).to(torch.int16)  # [B, W, S]
        last1 = seen.amax(-1)  # [B, W]
        last2 = (seen * (seen != last1[..., None])).amax(-1)

        def token_at(slot):  # [B, W] slot counted from 1 -> its token, or NONE
            return torch.where(slot > 0, history.gather(1, (slot.long() - 1).clamp(min=0)), NONE)
        prev1, prev2 = token_at(last1), token_at(last2)
        logits = self.table[prev2.clamp(min=0) + (prev2 < 0) * V, prev1.clamp(min=0) + (prev1 < 0) * V]
        feature = torch.nn.functional.pad(logits, (0, self.lm_head.in_features - V))
        self.layers[0](feature)  # its output, column for column beside the feature, is what a fusing head reads
        logits = self.lm_head(feature)
        return type("Output", (), {"logits": logits})()


def random_table(V: int, seed: int, sharpness: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V + 1, V + 1, V, generator=g, dtype=torch.float64) * sharpness


def reference_probs(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """Independent implementation of temperature + top-k (not mmspec's process_logits)."""
    if top_k:
        kth = logits.sort(descending=True).values[top_k - 1]
        logits = torch.where(logits >= kth, logits, torch.tensor(float("-inf"), dtype=logits.dtype))
    return torch.softmax(logits / temperature, -1)


def exact_joint_law(table, prompt, n_new, temperature, top_k, eos):
    """{continuation tuple: probability} for AR sampling of n_new tokens after prompt (stopping at eos)."""
    V = table.shape[-1]
    law = {}

    def recurse(seq, new, prob):
        if len(new) == n_new or (new and new[-1] == eos):
            law[tuple(new)] = law.get(tuple(new), 0.0) + prob
            return
        prev1 = seq[-1] if len(seq) >= 1 else V
        prev2 = seq[-2] if len(seq) >= 2 else V
        probs = reference_probs(table[prev2, prev1], temperature, top_k)
        for x in range(V):
            if probs[x] > 0:
                recurse(seq + [x], new + [x], prob * probs[x].item())

    recurse(list(prompt), [], 1.0)
    return law
