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
    B, W = next(iter(inputs.values())).shape[:2]
    if valid is None:
        valid = torch.ones(B, W, dtype=torch.bool, device=state.slot_mask.device)
    positions = state.lengths[:, None] + valid.long().cumsum(-1) - 1  # [B, W]
    # An invalid slot with no valid slot before it is a fully masked query; transformers' masks handle that (no NaN).
    return _append(model, state, torch.cat([state.slot_mask, valid], dim=1).long(), positions.clamp(min=0), valid,
                   **inputs)


def _append(model, state: RaggedCacheState, attention_mask: torch.Tensor, positions: torch.Tensor,
            valid: torch.Tensor, **inputs):
    """One cached forward of a window whose slots `valid` [B, W] join the rows' slot masks."""
    from transformers import DynamicCache

    if state.cache is None:
        state.cache = DynamicCache(config=model.config)
    out = model(**inputs, attention_mask=attention_mask, position_ids=positions, use_cache=True,
                **{cache_keyword(model): state.cache})
    state.slot_mask = torch.cat([state.slot_mask, valid], dim=1)
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


def forward_tree(model, state: RaggedCacheState, tokens: torch.Tensor, visible: torch.Tensor, positions: torch.Tensor,
                 valid: torch.Tensor | None = None) -> torch.Tensor:
    """Append a window of tree nodes to every row and return its logits (tree attention).

    The tree's region of the cache starts at slot `S0 = S - visible.shape[-1] + W` (S = slots before this call): the
    slots before it are the row's committed tokens (seen per `slot_mask`), the region's earlier slots are nodes of
    the same tree appended by earlier calls. tokens: [B, W] long. visible: [B, W, S - S0 + W] bool, which region
    slots (earlier nodes, then this window's) each new node attends to: its ancestors and itself. positions: [B, W]
    long (the committed length plus the node's depth). valid: [B, W] bool, False for padding nodes. Returns logits
    [B, W, V]. Until `keep_path` the region's slots are all marked valid, so call it before any `forward_window`.
    """
    B, W = tokens.shape
    if valid is None:
        valid = torch.ones(B, W, dtype=torch.bool, device=tokens.device)
    committed = state.slot_mask[:, : state.slot_mask.shape[1] - (visible.shape[-1] - W)]  # [B, S0]
    allowed = torch.cat([committed[:, None, :].expand(B, W, -1), visible], -1)  # [B, W, S + W]
    allowed |= torch.eye(allowed.shape[-1], dtype=torch.bool, device=tokens.device)[-W:]  # padding sees itself
    dtype = model.dtype if isinstance(getattr(model, "dtype", None), torch.dtype) else torch.float32
    mask = torch.zeros(allowed.shape, dtype=dtype, device=tokens.device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return _append(model, state, mask[:, None], positions, valid, input_ids=tokens).logits


def keep_path(state: RaggedCacheState, region: int, keep: torch.Tensor) -> None:
    """Keep only the `keep` slots of the last `region` slots of each row (a tree's accepted path, in slot order) and
    move their keys/values to the front of the region, so the row's committed tokens are contiguous again; the rest
    become invalid and trailing slots no row uses are cropped. keep: [B, region] bool."""
    S = state.slot_mask.shape[1]
    order = (~keep).long().argsort(dim=1, stable=True)  # kept slots first, in order
    for layer in getattr(state.cache, "layers", ()):
        if layer.keys is None or layer.keys.shape[-2] != S:
            raise TypeError(f"keep_path needs a full-attention DynamicCache, got layers of {type(layer).__name__}")
        index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
        layer.keys[:, :, S - region :] = layer.keys[:, :, S - region :].gather(2, index)
        layer.values[:, :, S - region :] = layer.values[:, :, S - region :].gather(2, index)
    kept = torch.arange(region, device=keep.device) < keep.sum(-1, keepdim=True)
    state.slot_mask = torch.cat([state.slot_mask[:, : S - region], kept], 1)
    truncate(state, state.lengths)
