"""The nested drafts of a sorted exit adapter (S2D's, `mmspec.models.kangaroo.KangarooAdapter` trained at several exits
l_1 < ... < l_k) over a transformers Llama-style target, on one cache: the "exits" its drafter
(`mmspec.text.sorted_exits.SortedExitDrafter`) chooses among, the target's first l_j layers then the adapter.

`NestedExits` runs them on one cache: the target's first l_k layers, then the adapter's attention at each exit in
slots of its own. A step feeds a token through every level (`step`), so that the step has one shape whatever exits
the rows take (a captured step holds it).

Each level keeps the features it hands the next level (`ExitsState.hidden`). The tokens a step commits after the
drafts it fed lack their states (the closing token, and a last draft never fed), so each level first re-reads the
last slots before each row's end in one window of fixed width (`catch_up`: from the level below's features, already
caught up): every exit then reads the states a whole-sequence pass gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.adapters.causal_lm import CausalLMAdapter, Prompt, cache_keyword
from mmspec.adapters.static_cache import SlotCache, additive_mask
from mmspec.adapters.views import block_at, check_adapter


@dataclass
class ExitsState:
    """cache: keys and values of every layer and exit; hidden: [B, S, d] per level but the last, the features it
    hands the next (its segment's output) at every slot."""

    cache: SlotCache
    hidden: list[torch.Tensor]

    def select(self, index: torch.Tensor) -> None:
        """Keep only rows `index` ([B'] long), in that order."""
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[index], layer.values[index]
        self.hidden = [features[index] for features in self.hidden]


class NestedExits:
    """The nested drafts of a sorted `adapter` over `target` (a transformers Llama-style causal LM, or its
    `CausalLMAdapter`: its decoder layers take rotary `position_embeddings`), level j being `levels[j]` (the target's
    layers l_{j-1} + 1 .. l_j) and `exit_blocks[j]` (the adapter's block after layer l_j, its keys and values in
    cache layer l_k + j), then the adapter's norm and the target's LM head. The layers are called one by one, sharing
    a window's rotary table and mask, so a level pays for its layers only, not for a backbone's own mask and rotary
    work each time. Shapes: B rows, W window tokens, S slots, d features."""

    def __init__(self, target, adapter):
        if isinstance(target, CausalLMAdapter):
            target = target.model
        exits = adapter.exits
        for exit_layer in exits:
            check_adapter(target, adapter, exit_layer)
        backbone, deepest = target.model, exits[-1]
        self.exit_layers = exits
        self.levels = [list(backbone.layers[start:end]) for start, end in zip((0, *exits[:-1]), exits, strict=True)]
        self.exit_blocks = [block_at(adapter.block, deepest + j) for j in range(len(exits))]
        self.norm, self.rotary = adapter.norm, backbone.rotary_emb
        self.embed, self.head = target.get_input_embeddings(), target.get_output_embeddings()
        self.num_slots = deepest + len(exits)
        self.dtype = target.dtype
        self.cache_keyword = cache_keyword(backbone.layers[0])

    def prefill(self, prompt: Prompt, capacity: int) -> ExitsState:
        """A state of `capacity` slots per row holding `prompt` (each row's tokens at slots 0, 1, ...; its
        attention_mask says how many) at every level."""
        ids = prompt.input_ids
        B, T = ids.shape
        state = ExitsState(SlotCache(self.num_slots, capacity),
                           [ids.new_zeros(B, capacity, self.embed.embedding_dim, dtype=self.dtype)
                            for _ in self.exit_layers[:-1]])
        if T:
            slots = torch.arange(T, device=ids.device).expand(B, T)
            hidden = self.embed(ids)
            for level in range(len(self.exit_layers)):
                hidden, _ = self._level(level, hidden, slots, state, with_exit=True)
        return state

    def catch_up(self, level: int, tokens: torch.Tensor, end: torch.Tensor, state: ExitsState,
                 width: int) -> torch.Tensor:
        """Bring `level` (the levels below it already caught up to `end`) up to slot end[b] ([B] long) of each row,
        whose tokens are tokens[b, :end[b]] ([B, S] long, slot = index), re-reading the `width` slots before end[b]
        (at least those committed since the last step; a row with fewer re-reads slots it holds, the same values;
        near the start the window runs past end[b], slots the next steps overwrite); returns its exit's output at
        slot end[b] - 1, [B, d]."""
        start = (end - width).clamp(min=0)
        slots = start[:, None] + torch.arange(width, device=end.device)
        inputs = (self.embed(tokens.gather(1, slots.clamp(max=tokens.shape[1] - 1))) if level == 0 else
                  state.hidden[level - 1].gather(1, slots[:, :, None].expand(-1, -1, state.hidden[0].shape[-1])))
        _, exited = self._level(level, inputs, slots, state, with_exit=True)
        return exited.gather(1, (end - 1 - start)[:, None, None].expand(-1, 1, exited.shape[-1]))[:, 0]

    def step(self, tokens: torch.Tensor, slots: torch.Tensor, state: ExitsState) -> torch.Tensor:
        """Feed one token per row (`tokens` [B, 1] at `slots` [B, 1]) through every level; the outputs of every exit,
        [B, k, d]."""
        hidden, outputs = self.embed(tokens), []
        for level in range(len(self.exit_layers)):
            hidden, exited = self._level(level, hidden, slots, state, with_exit=True)
            outputs.append(exited[:, -1])
        return torch.stack(outputs, 1)

    def _level(self, level: int, inputs: torch.Tensor, slots: torch.Tensor, state: ExitsState,
               with_exit: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Level `level` (and, `with_exit`, its exit) on a window: `inputs` [B, W, d] at `slots` [B, W], each
        attending to the slots up to its own; it keeps its features for the next level. (its layers' output, its
        exit's output or None), [B, W, d] each."""
        allowed = torch.arange(state.cache.capacity, device=slots.device) <= slots[:, :, None]
        window = (slots, additive_mask(allowed, self.dtype), self.rotary(inputs, position_ids=slots), state.cache)
        state.cache.write = slots
        hidden = inputs
        for layer in self.levels[level]:
            hidden = self._layer(layer, hidden, *window)
        if level < len(state.hidden):
            state.hidden[level].scatter_(1, slots[:, :, None].expand_as(hidden), hidden)
        return hidden, self._exit(level, hidden, *window) if with_exit else None

    def _exit(self, level: int, hidden: torch.Tensor, *window) -> torch.Tensor:
        return self.norm(self._layer(self.exit_blocks[level], hidden, *window))

    def _layer(self, layer, hidden, slots, mask, rotary, cache) -> torch.Tensor:
        output = layer(hidden, attention_mask=mask, position_ids=slots, position_embeddings=rotary,
                       **({} if cache is None else {self.cache_keyword: cache}))
        return output[0] if isinstance(output, tuple) else output  # transformers < 5 returned a tuple

    def exit_logits(self, hidden_states: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """Whole-sequence logits [B, T, V] at every exit from the target's `hidden_states` (a transformers forward's
        `output_hidden_states`: entry l is layer l's output), causal and without a cache: what sorted fine-tuning
        trains."""
        features = hidden_states[0]
        B, T = features.shape[:2]
        slots = torch.arange(T, device=features.device).expand(B, T)
        mask = additive_mask((slots[:, None, :] <= slots[:, :, None]), features.dtype)
        rotary = self.rotary(features, position_ids=slots)
        return [self.head(self._exit(level, hidden_states[layer], slots, mask, rotary, None))
                for level, layer in enumerate(self.exit_layers)]
