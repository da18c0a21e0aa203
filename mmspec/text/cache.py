"""Per-row KV-cache state for transformers causal LMs, with rollback that never makes a row wait.

A batch whose rows accept different numbers of draft tokens cannot share one cache length. We keep the transformers
cache rectangular and give every slot a validity bit instead: rolling a row back clears the bits of its rejected slots,
and the attention mask hides them. RoPE positions come from the count of valid slots, so a row's tokens see exactly
the positions and keys they would have seen without speculation. Trailing slots that no row uses are cropped with
`DynamicCache.crop(-n)` (transformers 5 takes the count to remove, negative).

Slots: S = cache length. `slot_mask: [B, S]` bool. A row's committed tokens are its valid slots, in order.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch


@dataclass
class RaggedCacheState:
    """Decoding state of one causal LM over a batch with ragged per-row lengths.

    cache: the transformers cache (None before the first forward).
    slot_mask: [B, S] bool, which cache slots hold a token of the row's sequence.
    """

    cache: object | None
    slot_mask: torch.Tensor

    @classmethod
    def empty(cls, batch_size: int, device: torch.device) -> RaggedCacheState:
        return cls(cache=None, slot_mask=torch.zeros(batch_size, 0, dtype=torch.bool, device=device))

    @property
    def lengths(self) -> torch.Tensor:
        """[B] long, number of tokens each row has in the cache."""
        return self.slot_mask.sum(-1)


def forward_window(model, state: RaggedCacheState, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Append a window of tokens to every row and return its logits.

    tokens: [B, W] long. valid: [B, W] bool, False for padding slots that must stay invisible (None = all valid).
    Returns logits [B, W, V] in the model's dtype. Logits at invalid slots are meaningless.
    """
    return forward_ragged(model, state, valid, input_ids=tokens).logits


def cache_keyword(model) -> str:
    """The name under which a transformers model's forward takes (and its output returns) the KV cache: `cache` since
    transformers 5.24, `past_key_values` before (deprecated there, to be removed in 5.40)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def forward_ragged(model, state: RaggedCacheState, valid: torch.Tensor | None = None, **inputs):
    """`forward_window` for any transformers decoder: `inputs` is `input_ids=[B, W]` or `inputs_embeds=[B, W, D]`
    (e.g. a model whose image tokens enter through their own embedding); returns the model's output (logits or
    last_hidden_state, whatever the model returns)."""
    from transformers import DynamicCache

    B, W = next(iter(inputs.values())).shape[:2]
    if valid is None:
        valid = torch.ones(B, W, dtype=torch.bool, device=state.slot_mask.device)
    positions = state.lengths[:, None] + valid.long().cumsum(-1) - 1  # [B, W]
    slot_mask = torch.cat([state.slot_mask, valid], dim=1)  # [B, S + W]
    if state.cache is None:
        state.cache = DynamicCache(config=model.config)
    # An invalid slot with no valid slot before it is a fully masked query; transformers' masks handle that (no NaN).
    out = model(
        **inputs,
        attention_mask=slot_mask.long(),
        position_ids=positions.clamp(min=0),
        use_cache=True,
        **{cache_keyword(model): state.cache},
    )
    state.slot_mask = slot_mask
    return out


def truncate(state: RaggedCacheState, keep: torch.Tensor) -> None:
    """Roll each row back to its first `keep[b]` tokens (rows with fewer keep all).

    keep: [B] long. Rejected slots become invalid; trailing slots no row uses are cropped from the cache.
    """
    rank = state.slot_mask.long().cumsum(-1)  # [B, S], 1-based index of each valid slot
    state.slot_mask = state.slot_mask & (rank <= keep[:, None])
    used = state.slot_mask.any(0)
    # One host sync: the crop length must be a Python int.
    n_unused_tail = int((~used).flip(0).long().cumprod(0).sum())
    if n_unused_tail and state.cache is not None:
        state.cache.crop(-n_unused_tail)
        state.slot_mask = state.slot_mask[:, : state.slot_mask.shape[1] - n_unused_tail]


def select_rows(state: RaggedCacheState, index: torch.Tensor) -> None:
    """Keep only the batch rows `index` ([B'] long), in that order (finished rows leaving the batch)."""
    state.slot_mask = state.slot_mask[index]
    if state.cache is not None:
        state.cache.batch_select_indices(index)
