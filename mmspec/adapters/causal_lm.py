"""`CausalLMAdapter`: a transformers causal LM behind the core's model protocol (`mmspec.core.model`), with per-row
KV-cache rollback that never makes a row wait.

A batch whose rows accept different numbers of draft tokens cannot share one cache length. The transformers cache
stays rectangular and every slot gets a validity bit instead: rolling a row back clears the bits of its rejected
slots, and the attention mask hides them. RoPE positions come from the count of valid slots, so a row's tokens see
exactly the positions and keys they would have seen without speculation. Trailing slots that no row uses are cropped
with `DynamicCache.crop(-n)` (transformers 5 takes the count to remove, negative). Tree nodes attend through an
explicit 4-D mask (their ancestors and the row's valid slots) at depth-based positions, and `keep_path` moves the
accepted path's keys/values next to the root so a rollback keeps exactly that path.

With CFG (image families) a state holds each sample's conditional row and, after all of them, its unconditional twin;
every window feeds both the same tokens. Subclasses change how tokens enter the model (`token_inputs`), which module
runs (`backbone`) and how its output becomes logits (`head`); `mmspec.models.hf_image` builds the image families on
that. Slots: S = cache length; `slot_mask: [R, S]` bool over the R = B (or 2B) cache rows.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from mmspec.core.model import Logits


def cache_keyword(model) -> str:
    """The name under which a transformers model's forward takes (and its output returns) the KV cache: `cache` since
    transformers 5.24, `past_key_values` before (deprecated there, to be removed in 5.40)."""
    return _cache_keyword(type(model))


@functools.cache
def _cache_keyword(model_class: type) -> str:
    # read once per class: every cached forward asks, and a signature costs more than a small model's kernel launch
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


@dataclass(frozen=True)
class Prompt:
    """input_ids: [R, T] long, the tokens a prefill caches, padded on either side; attention_mask: [R, T], 1 for real
    tokens (None = all real)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None


class CFGRows:
    """The cache rows of a state's `batch_size` samples: with `cfg`, rows [B, 2B) are their unconditional twins."""

    batch_size: int
    cfg: bool

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, ...] for every cache row: again for the unconditional twins with CFG (both see the same tokens)."""
        return torch.cat([x, x]) if self.cfg else x

    def sample_rows(self, index: torch.Tensor) -> torch.Tensor:
        """The cache rows of samples `index` ([B'] long): theirs, then their twins' with CFG."""
        return torch.cat([index, index + self.batch_size]) if self.cfg else index


@dataclass
class CausalLMState(CFGRows):
    """Decoding state of a causal LM over a batch with ragged per-row lengths.

    cache: the transformers cache (None before the first forward). slot_mask: [R, S] bool, which cache slots hold a
    token of the row's sequence. prompt_lengths: [R] long, the valid slots the prefill left (what `rollback` keeps
    before the tokens after the prompt). batch_size: B samples; cfg: rows [B, 2B) are their unconditional twins.
    tree_start: the slot where the last `forward_tree`'s tree begins.
    """

    cache: Any | None
    slot_mask: torch.Tensor
    prompt_lengths: torch.Tensor
    batch_size: int
    cfg: bool = False
    tree_start: int | None = None

    @property
    def lengths(self) -> torch.Tensor:
        """[R] long, the tokens each cache row holds (prompt included)."""
        return self.slot_mask.sum(-1)


class CausalLMAdapter:
    """A transformers causal LM (`model(input_ids=...).logits`) as a `CausalModel` over its own vocabulary."""

    capabilities = frozenset({"tree", "features", "exits"})

    def __init__(self, model):
        self.model = model
        self.vocab_size = model.config.vocab_size

    @property
    def context_length(self) -> int | None:
        """The most positions the model attends over (its config's `max_position_embeddings`; None: no bound)."""
        return getattr(self.model.config, "max_position_embeddings", None)

    @property
    def pad_token_id(self) -> int | None:
        """The id the model's generation config pads finished rows with (None: it names none)."""
        return getattr(getattr(self.model, "generation_config", None), "pad_token_id", None)

    @property
    def special_token_ids(self) -> list[int]:
        """The config's EOS, padding and BOS ids (each may be a list), flattened."""
        ids = (getattr(self.model.config, f"{name}_token_id", None) for name in ("eos", "pad", "bos"))
        return [i for id_ in ids if id_ is not None for i in ([id_] if isinstance(id_, int) else id_)]

    @property
    def token_ranking(self) -> list[int] | None:
        """The ids ordered by how often the model writes them (its config's `token_ranking`, written by
        `mmspec.zoo.train_vocabulary`; None: never measured): VocabTrim's draft vocabulary is its head."""
        return getattr(self.model.config, "token_ranking", None)

    @property
    def early_exit_layer(self) -> int | None:
        """The layer the model was trained to exit early at (its config's `early_exit_layer`; None: none)."""
        return getattr(self.model.config, "early_exit_layer", None)

    @property
    def feature_size(self) -> int:
        """The width of the feature a head reads (the input of the LM head: the backbone's hidden size)."""
        return self.backbone.config.hidden_size

    def generate(self, **kwargs) -> torch.Tensor:
        """The model's own autoregressive generation (transformers' `generate`, same arguments): the AR baseline."""
        return self.model.generate(**kwargs)

    def trimmed(self, vocabulary: torch.Tensor) -> CausalLMAdapter:
        """This model with an LM head that scores only the ids `vocabulary` ([|S|] long): VocabTrim's draft."""
        from mmspec.adapters.views import trimmed_view

        return CausalLMAdapter(trimmed_view(self.model, vocabulary))

    # --- what a subclass changes -----------------------------------------------------------------------------------
    @property
    def backbone(self) -> torch.nn.Module:
        """The module a forward runs (the LM; an image family's language model)."""
        return self.model

    def prompt_inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The keyword arguments that feed prompt ids [R, T] to `backbone`."""
        return {"input_ids": input_ids}

    def token_inputs(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """The keyword arguments that feed decoded tokens [R, W] (the adapter's ids) to `backbone`."""
        return {"input_ids": tokens}

    def head(self, output) -> torch.Tensor:
        """`backbone`'s output -> logits [R, W, V] over the adapter's ids."""
        return output.logits

    def head_at(self, output, index: torch.Tensor) -> torch.Tensor:
        """The logits [R, 1, V] at window position index[r] ([R] long) of each row."""
        logits = self.head(output)
        return logits.gather(1, index[:, None, None].expand(-1, 1, logits.shape[-1]))

    def feature_readout(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The token embedding and the LM head, whose input (after the final norm) is the feature a draft head
        reads."""
        return self.model.get_input_embeddings(), self.model.get_output_embeddings()

    def feature_layers(self) -> list[torch.nn.Module]:
        """The decoder layers in order (the decoder's `layers`, or GPT-2's `h`; none if neither)."""
        decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else None
        layers = getattr(decoder, "layers", None) or getattr(decoder, "h", None)
        return list(layers or [])

    def exit_model(self, exit_layer: int | None, adapter=None) -> torch.nn.Module:
        """A causal LM sharing this one's weights that exits early: its first `exit_layer` layers, then its final
        norm and LM head (LayerSkip's draft, `early_exit_view`), or with a Kangaroo exit `adapter` (None: at the
        adapter's own exit layer) between them (`kangaroo_view`). It has its own config, so its own shallower cache."""
        from mmspec.adapters.views import early_exit_view, kangaroo_view

        if adapter is None:
            return early_exit_view(self.model, exit_layer)
        return kangaroo_view(self.model, adapter, exit_layer)

    # --- the protocol ----------------------------------------------------------------------------------------------
    def prefill(self, prompt: Prompt, cfg: bool = False, max_window: int = 1) -> tuple[CausalLMState, Logits | None]:
        """Cache `prompt`'s tokens (text: each row's prompt but its last token, which opens the first window); the
        logits [B, 1, V] at each row's last prompt token, None for an empty prompt."""
        return self.prefill_rows(prompt.input_ids, prompt.attention_mask, prompt.input_ids.shape[0], cfg)

    def prefill_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, batch_size: int,
                     cfg: bool) -> tuple[CausalLMState, Logits | None]:
        """`prefill` of rows already laid out: [R, T] ids (R = 2B with CFG, conditional rows first) and their mask."""
        valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        R, device = input_ids.shape[0], input_ids.device
        state = CausalLMState(None, torch.zeros(R, 0, dtype=torch.bool, device=device), valid.sum(-1), batch_size, cfg)
        if input_ids.shape[1] == 0:
            return state, None
        output = self._forward_valid(state, valid, **self.prompt_inputs(input_ids))
        last = torch.where(valid, torch.arange(input_ids.shape[1], device=device), 0).amax(-1)  # each row's last token
        return state, Logits.from_rows(self.head_at(output, last), batch_size, cfg)

    def forward(self, tokens: torch.Tensor, state: CausalLMState) -> Logits:
        if tokens.ndim != 2 or tokens.shape[0] != state.batch_size:
            raise ValueError(f"tokens must have shape [{state.batch_size}, W], got {tuple(tokens.shape)}")
        valid = torch.ones(state.slot_mask.shape[0], tokens.shape[1], dtype=torch.bool, device=tokens.device)
        output = self._forward_valid(state, valid, **self.token_inputs(state.rows(tokens)))
        return Logits.from_rows(self.head(output), state.batch_size, state.cfg)

    def forward_tree(self, tokens: torch.Tensor, offset: torch.Tensor, visible: torch.Tensor,
                     state: CausalLMState) -> Logits:
        """Append tree nodes [B, T] after the tree's P earlier nodes (tree attention, the protocol's `forward_tree`):
        offset [T] or [B, T], visible [T, P + T] or [B, T, P + T]; logits [B, T, V]."""
        B, T = tokens.shape
        R, P = state.slot_mask.shape[0], visible.shape[-1] - T
        offset = state.rows(offset.expand(B, T))
        visible = state.rows(visible.expand(B, T, P + T))
        start = state.slot_mask.shape[1] - P  # the tree's first slot
        committed = state.slot_mask[:, :start]  # [R, start]
        allowed = torch.cat([committed[:, None, :].expand(R, T, -1), visible], -1)  # [R, T, S + T]
        dtype = self.model.dtype if isinstance(getattr(self.model, "dtype", None), torch.dtype) else torch.float32
        mask = torch.zeros(allowed.shape, dtype=dtype, device=tokens.device).masked_fill_(~allowed,
                                                                                          torch.finfo(dtype).min)
        positions = committed.sum(-1, keepdim=True) + offset  # [R, T]
        valid = torch.ones(R, T, dtype=torch.bool, device=tokens.device)
        output = self._append(state, mask[:, None], positions, valid, **self.token_inputs(state.rows(tokens)))
        state.tree_start = start
        return Logits.from_rows(self.head(output), state.batch_size, state.cfg)

    def keep_path(self, state: CausalLMState, path: torch.Tensor) -> None:
        """After `forward_tree`: move the keys/values of the accepted path's nodes (path [B, depth], tree slots
        counted from the tree's first slot, -1 past the path) onto the slots right after the root, in order."""
        if path.shape[1] == 0:
            return
        path = state.rows(path)
        target = state.tree_start + torch.arange(1, path.shape[1] + 1, device=path.device)  # [D]
        source = torch.where(path >= 0, state.tree_start + path, target)  # [R, D]
        for layer in getattr(state.cache, "layers", ()):
            if layer.keys is None or layer.keys.shape[-2] != state.slot_mask.shape[1]:
                raise TypeError(f"keep_path needs a full-attention DynamicCache, got layers of {type(layer).__name__}")
            index = source[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
            layer.keys[:, :, target] = layer.keys.gather(2, index)
            layer.values[:, :, target] = layer.values.gather(2, index)

    def rollback(self, state: CausalLMState, keep: torch.Tensor) -> None:
        """Keep the first keep[b] tokens after row b's prompt (keep: [B] long)."""
        truncate(state, state.prompt_lengths + state.rows(keep))

    def select_rows(self, state: CausalLMState, index: torch.Tensor) -> None:
        """Keep only the samples `index` ([B'] long), in that order (with their unconditional twins)."""
        rows = state.sample_rows(index)
        state.slot_mask, state.prompt_lengths = state.slot_mask[rows], state.prompt_lengths[rows]
        state.batch_size = index.shape[0]
        if state.cache is not None:
            state.cache.batch_select_indices(rows)

    # --- cache slots -----------------------------------------------------------------------------------------------
    def _forward_valid(self, state: CausalLMState, valid: torch.Tensor, **inputs):
        """Append a window whose slots `valid` [R, W] join the rows (padding slots stay invisible); returns the
        backbone's output."""
        positions = state.lengths[:, None] + valid.long().cumsum(-1) - 1  # [R, W]
        # An invalid slot with no valid slot before it is a fully masked query; transformers' masks handle that.
        attention_mask = torch.cat([state.slot_mask, valid], dim=1).long()
        return self._append(state, attention_mask, positions.clamp(min=0), valid, **inputs)

    def _append(self, state: CausalLMState, attention_mask: torch.Tensor, positions: torch.Tensor,
                valid: torch.Tensor, **inputs):
        """One cached forward of a window whose slots `valid` [R, W] join the rows' slot masks."""
        from transformers import DynamicCache

        backbone = self.backbone
        if state.cache is None:
            state.cache = DynamicCache(config=backbone.config)
        output = backbone(**inputs, attention_mask=attention_mask, position_ids=positions, use_cache=True,
                          **{cache_keyword(backbone): state.cache})
        state.slot_mask = torch.cat([state.slot_mask, valid], dim=1)
        return output


def truncate(state: CausalLMState, keep: torch.Tensor) -> None:
    """Roll each cache row back to its first `keep[r]` tokens, prompt included (rows with fewer keep all).

    keep: [R] long. Rejected slots become invalid; trailing slots no row uses are cropped from the cache.
    """
    rank = state.slot_mask.long().cumsum(-1)  # [R, S], 1-based index of each valid slot
    state.slot_mask = state.slot_mask & (rank <= keep[:, None])
    used = state.slot_mask.any(0)
    # One host sync: the crop length must be a Python int.
    n_unused_tail = int((~used).flip(0).long().cumprod(0).sum())
    if n_unused_tail and state.cache is not None:
        state.cache.crop(-n_unused_tail)
        state.slot_mask = state.slot_mask[:, : state.slot_mask.shape[1] - n_unused_tail]


def left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt tokens of each row moved to the front of a [B, width] buffer; returns (buffer, lengths [B])."""
    mask = attention_mask.bool()
    order = (~mask).long().argsort(dim=1, stable=True)  # valid positions first, in order
    buffer = torch.zeros(input_ids.shape[0], width, dtype=torch.long, device=input_ids.device)
    buffer[:, : input_ids.shape[1]] = input_ids.gather(1, order)
    return buffer, mask.sum(-1)


def as_causal_model(model) -> Any:
    """A transformers causal LM (an `nn.Module`) wrapped in a `CausalLMAdapter`; an adapter as it is."""
    return CausalLMAdapter(model) if isinstance(model, torch.nn.Module) else model
