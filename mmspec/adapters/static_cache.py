"""`StaticCausalLMAdapter`: a transformers causal LM on a KV cache of fixed capacity that it rolls back in place, so
that a decoding step running it holds no host read and no data-dependent shape, and a CUDA graph can replay it
(`mmspec.core.runtime.capture`; the text loop runs its target and draft models on it, `mmspec.text.generate`).

Every cache row is left-aligned: row r holds its tokens at slots [0, lengths[r]), so a token's slot is its position.
A window of W tokens is written at slots lengths[r] .. lengths[r] + W - 1 of its own row (`SlotCache.write`: one
scatter per layer) and attends through an explicit 4-D mask to the slots up to its own; rolling a row back sets its
length (no crop, no host read: the stale slots after it are masked until overwritten). Tree nodes are written after
the tree's first slot (`tree_start`, the row's length when the tree's first level came) and attend to the slots
before the tree and to their ancestors, at depth-based positions; `keep_path` moves the accepted path's keys and
values onto the slots after the root. With CFG (image families) rows [B, 2B) are the unconditional twins, as in
`mmspec.adapters.causal_lm`.

capacity: the most slots a row ever holds (its prompt, its new tokens and the widest window past its end). Shapes: R
cache rows, S = capacity slots, W window tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from mmspec.adapters.causal_lm import CausalLMAdapter, CFGRows, cache_keyword, left_align
from mmspec.core.model import Logits


class SlotLayer(CacheLayerMixin):
    """One layer's keys / values [R, H, S, d]; `update` writes the new window at the cache's `write` slots [R, W]
    and returns the whole buffers (the attention mask hides what a token may not see)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, cache: SlotCache):
        super().__init__()
        self.cache = cache

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        R, H, _, _ = key_states.shape
        self.keys = key_states.new_zeros(R, H, self.cache.capacity, key_states.shape[-1])
        self.values = value_states.new_zeros(R, H, self.cache.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        index = self.cache.write[:, None, :, None]
        self.keys.scatter_(2, index.expand_as(key_states), key_states)
        self.values.scatter_(2, index.expand_as(value_states), value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.capacity, 0

    def get_seq_length(self) -> int:
        return self.cache.capacity

    def get_max_length(self) -> int:
        return self.cache.capacity


class SlotCache(Cache):
    """A transformers `Cache` of `num_layers` `SlotLayer`s of `capacity` slots; `write` [R, W] long: where the next
    forward's window goes in each row (set by the adapter before every forward)."""

    def __init__(self, num_layers: int, capacity: int):
        self.capacity = capacity
        self.write: torch.Tensor | None = None
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])


@dataclass
class StaticCausalLMState(CFGRows):
    """cache: the `SlotCache`; lengths: [R] long, the slots each row holds (its next window's first slot);
    prompt_lengths: [R] long, what the prefill left (`rollback` keeps tokens after it); tree_start: [R] long, the
    first slot of the tree being drafted or verified; batch_size: B samples; cfg: rows [B, 2B) are their twins."""

    cache: SlotCache
    lengths: torch.Tensor
    prompt_lengths: torch.Tensor
    tree_start: torch.Tensor
    batch_size: int
    cfg: bool = False


class StaticCausalLMAdapter(CausalLMAdapter):
    """A transformers causal LM as a `CausalModel` on a `SlotCache` of `capacity` slots per row (see the module
    docstring); what it changes from `CausalLMAdapter` is where keys and values live."""

    def __init__(self, model, capacity: int):
        super().__init__(model)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self.cache_keyword = cache_keyword(self.backbone)  # read once: a traced step does not call inspect

    def prefill_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, batch_size: int,
                     cfg: bool) -> tuple[StaticCausalLMState, Logits | None]:
        R, T = input_ids.shape
        device = input_ids.device
        if T > self.capacity:
            raise ValueError(f"a prompt of {T} tokens does not fit a cache of capacity {self.capacity}")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        tokens, lengths = left_align(input_ids, mask, T)
        zeros = torch.zeros(R, dtype=torch.long, device=device)
        cache = SlotCache(self.backbone.config.num_hidden_layers, self.capacity)
        state = StaticCausalLMState(cache, zeros.clone(), lengths, zeros.clone(), batch_size, cfg)
        if T == 0:
            return state, None
        output = self._write(state, positions=torch.arange(T, device=device).expand(R, T),
                             **self.prompt_inputs(tokens))
        state.lengths.copy_(lengths)
        return state, Logits.from_rows(self.head_at(output, (lengths - 1).clamp(min=0)), batch_size, cfg)

    def forward(self, tokens: torch.Tensor, state: StaticCausalLMState) -> Logits:
        if tokens.ndim != 2 or tokens.shape[0] != state.batch_size:
            raise ValueError(f"tokens must have shape [{state.batch_size}, W], got {tuple(tokens.shape)}")
        positions = state.lengths[:, None] + torch.arange(tokens.shape[1], device=tokens.device)
        output = self._write(state, positions, **self.token_inputs(state.rows(tokens)))
        state.lengths.add_(tokens.shape[1])
        return Logits.from_rows(self.head(output), state.batch_size, state.cfg)

    def forward_tree(self, tokens: torch.Tensor, offset: torch.Tensor, visible: torch.Tensor,
                     state: StaticCausalLMState) -> Logits:
        """Tree nodes [B, T] after the tree's P earlier nodes: offset [T] or [B, T] (depths), visible [T, P + T] or
        [B, T, P + T] (ancestors); logits [B, T, V]."""
        B, T = tokens.shape
        R, P = state.lengths.shape[0], visible.shape[-1] - T
        if P == 0:  # the tree's first level: it starts where the row ends
            state.tree_start.copy_(state.lengths)
        start = state.tree_start[:, None]  # [R, 1]
        write = start + P + torch.arange(T, device=tokens.device)  # [R, T]
        relative = torch.arange(self.capacity, device=tokens.device) - start  # [R, S]: the slot's index in the tree
        in_tree = (relative >= 0) & (relative < P + T)
        ancestors = state.rows(visible.expand(B, T, P + T)).gather(
            2, relative.clamp(0, P + T - 1)[:, None, :].expand(R, T, -1))  # [R, T, S]
        allowed = (relative < 0)[:, None, :] | (in_tree[:, None, :] & ancestors)
        output = self._write(state, start + state.rows(offset.expand(B, T)), allowed=allowed, write=write,
                             **self.token_inputs(state.rows(tokens)))
        state.lengths.copy_(state.tree_start + P + T)
        return Logits.from_rows(self.head(output), state.batch_size, state.cfg)

    def keep_path(self, state: StaticCausalLMState, path: torch.Tensor) -> None:
        """After `forward_tree`: move the keys / values of the accepted path's nodes (path [B, D], tree slots counted
        from the tree's first slot, -1 past the path) onto the slots right after the root, in order."""
        if path.shape[1] == 0:
            return
        path = state.rows(path)
        target = state.tree_start[:, None] + torch.arange(1, path.shape[1] + 1, device=path.device)  # [R, D]
        source = torch.where(path >= 0, state.tree_start[:, None] + path, target)
        for layer in state.cache.layers:
            for buffer in (layer.keys, layer.values):
                H, d = buffer.shape[1], buffer.shape[-1]
                moved = buffer.gather(2, source[:, None, :, None].expand(-1, H, -1, d))
                buffer.scatter_(2, target[:, None, :, None].expand(-1, H, -1, d), moved)

    def rollback(self, state: StaticCausalLMState, keep: torch.Tensor) -> None:
        """Keep the first keep[b] tokens after row b's prompt (keep: [B] long), in place."""
        state.lengths.copy_(torch.minimum(state.lengths, state.prompt_lengths + state.rows(keep)))

    def select_rows(self, state: StaticCausalLMState, index: torch.Tensor) -> None:
        """Keep only the samples `index` ([B'] long), in that order (with their twins): new, smaller buffers."""
        rows = state.sample_rows(index)
        state.lengths, state.prompt_lengths = state.lengths[rows], state.prompt_lengths[rows]
        state.tree_start, state.batch_size = state.tree_start[rows], index.shape[0]
        for layer in state.cache.layers:
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[rows], layer.values[rows]

    def _write(self, state: StaticCausalLMState, positions: torch.Tensor, allowed: torch.Tensor | None = None,
               write: torch.Tensor | None = None, **inputs):
        """One forward of a window at `positions` [R, W], written at slots `write` (default: the positions) and
        attending where `allowed` [R, W, S] (default: every slot up to its own position)."""
        if allowed is None:
            allowed = torch.arange(self.capacity, device=positions.device) <= positions[:, :, None]
        state.cache.write = positions if write is None else write
        dtype = self.model.dtype if isinstance(getattr(self.model, "dtype", None), torch.dtype) else torch.float32
        return self.backbone(**inputs, attention_mask=additive_mask(allowed, dtype), position_ids=positions,
                             use_cache=True, **{self.cache_keyword: state.cache})


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[R, 1, W, S] attention mask of `dtype`: 0 where `allowed` [R, W, S] (a query may see the slot), else -inf's
    stand-in (a transformers backbone adds a 4-D mask as it is)."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


def as_static_model(model, capacity: int):
    """A transformers causal LM, or the plain `CausalLMAdapter` of one, on a `StaticCausalLMAdapter` of `capacity`
    slots; any other model adapter as it is."""
    if type(model) is CausalLMAdapter:  # a family's subclass changes its inputs and head: it stays as it is
        model = model.model
    return StaticCausalLMAdapter(model, capacity) if isinstance(model, torch.nn.Module) else model
