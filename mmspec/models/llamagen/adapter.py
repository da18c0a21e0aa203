"""`LlamaGenAdapter`: the core's causal-model protocol (`mmspec.core.model`, the image span of
`mmspec.image.protocol.DiscreteImageModel`) over a LlamaGen GPT + VQ tokenizer, on its static KV cache: rollback moves
per-row fill levels, trees and parallel row windows (capabilities "tree", "segments") copy slots."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.core.model import Logits
from mmspec.models.llamagen.gpt import KVCache, LlamaGenTransformer
from mmspec.models.llamagen.graphs import WindowGraphs
from mmspec.models.llamagen.vq import LlamaGenVQModel


@dataclass(frozen=True)
class LlamaGenCondition:
    """states: c2i class labels [B] long, or t2i text-encoder states [B, T, caption_dim], left-padded (valid tokens
    last); mask: t2i [B, T] bool, True for real text tokens (None = all real). The unconditional twins of CFG see
    the null caption through the mask the transformer's `null_caption_mask` names (`unconditional_mask`)."""

    states: torch.Tensor
    mask: torch.Tensor | None = None


@dataclass
class LlamaGenState:
    """The KV cache of B samples: rows [0, B) conditional, rows [B, 2B) their unconditional twins when cfg."""

    cache: KVCache
    batch_size: int
    cfg: bool
    tree_start: torch.Tensor | None = None  # [R] the first slot of the last `forward_tree`'s tree, for `keep_path`
    cached: torch.Tensor | None = None  # [R, S] bool, slots a segment input may read (`forward_segments`)
    segment_slots: torch.Tensor | None = None  # [R, T] the slots of the last `forward_segments`'s inputs

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, ...] for every cache row: again for the unconditional twins with CFG (both halves see the same image
        tokens)."""
        return torch.cat([x, x]) if self.cfg else x


class LlamaGenAdapter:
    """graphs: the transformer's `WindowGraphs` (CUDA graphs): its cache holds the state of one decoding at a time,
    and `forward`'s windows replay its graphs; None = a fresh cache per prefill, eager forwards."""

    capabilities = frozenset({"tree", "segments", "features"})
    capture_static = True  # weights and graphs, not a decoding's state (`mmspec.core.runtime.capture.state_tensors`)

    def __init__(self, transformer: LlamaGenTransformer, vqvae: LlamaGenVQModel, graphs: WindowGraphs | None = None):
        if transformer.config.vocab_size != vqvae.config.codebook_size:
            raise ValueError(
                f"transformer vocab_size ({transformer.config.vocab_size}) != vqvae codebook_size "
                f"({vqvae.config.codebook_size})"
            )
        if graphs is not None and graphs.transformer is not transformer:
            raise ValueError("graphs must be the WindowGraphs of this adapter's transformer")
        self.transformer, self.vqvae, self.graphs = transformer, vqvae, graphs
        self.grid = (transformer.config.grid_size, transformer.config.grid_size)
        self.vocab_size = transformer.config.vocab_size

    @property
    def num_image_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    def prefill(self, condition: LlamaGenCondition, cfg: bool,
                max_window: int = 1) -> tuple[LlamaGenState, Logits]:
        model = self.transformer
        B = condition.states.shape[0]
        prefix = model.embed_condition(condition.states)  # [B, T, dim]
        if cfg:
            prefix = torch.cat([prefix, model.embed_condition(model.unconditional(B, prefix.device))])  # [2B, T, dim]
        new_cache = model.new_cache if self.graphs is None else self.graphs.cache
        cache = new_cache(prefix.shape[0], device=prefix.device, dtype=prefix.dtype, extra_slots=max_window)
        T = prefix.shape[1]
        if condition.mask is not None:
            cache.key_valid[:B, :T] = condition.mask
            null_mask = model.unconditional_mask(condition.mask)
            if cfg and null_mask is not None:
                cache.key_valid[B:, :T] = null_mask  # the twins see the null caption under the prompt's mask
        logits = model.forward_window(prefix, cache)[:, -1:]  # [B or 2B, 1, V]
        state = LlamaGenState(cache, B, cfg)
        return state, Logits.from_rows(logits, B, cfg)

    def forward(self, tokens: torch.Tensor, state: LlamaGenState) -> Logits:
        if tokens.ndim != 2 or tokens.shape[0] != state.batch_size:
            raise ValueError(f"tokens must have shape [{state.batch_size}, W], got {tuple(tokens.shape)}")
        rows = state.rows(tokens)
        if self.graphs is None:
            logits = self.transformer.forward_window(self.transformer.tok_embeddings(rows), state.cache)
        else:
            logits = self.graphs(rows)
        return Logits.from_rows(logits, state.batch_size, state.cfg)

    def forward_tree(self, tokens: torch.Tensor, offset: torch.Tensor, visible: torch.Tensor,
                     state: LlamaGenState) -> Logits:
        """Append tree nodes [B, T] after the tree's P earlier nodes (tree attention; the protocol's `forward_tree`):
        offset [T] or [B, T], visible [T, P + T] or [B, T, P + T]; logits [B, T, V]."""
        B, T = state.batch_size, visible.shape[-2]
        if tokens.shape != (B, T):
            raise ValueError(f"tokens must have shape [{B}, {T}], got {tuple(tokens.shape)}")
        offset = state.rows(offset) if offset.ndim == 2 else offset
        visible = state.rows(visible) if visible.ndim == 3 else visible
        state.tree_start = state.cache.lengths - (visible.shape[-1] - T)
        logits = self.transformer.forward_window(self.transformer.tok_embeddings(state.rows(tokens)), state.cache,
                                                 (offset, visible))
        return Logits.from_rows(logits, state.batch_size, state.cfg)

    def keep_path(self, state: LlamaGenState, path: torch.Tensor) -> None:
        """After `forward_tree`: move the keys/values of the accepted path's nodes (path [B, depth], the node of
        levels 1 .. depth, -1 past the path) onto the slots of the main chain's nodes of the same levels."""
        path = state.rows(path)
        levels = torch.arange(1, path.shape[1] + 1, device=path.device)
        target = state.tree_start[:, None] + levels  # [R, depth]
        state.cache.copy_slots(target, torch.where(path >= 0, state.tree_start[:, None] + path, target))

    def forward_segments(self, tokens: torch.Tensor, positions: torch.Tensor, segments: torch.Tensor,
                         state: LlamaGenState) -> Logits:
        """Score tokens [B, T] at image positions [B, T] in segments [B, T] (parallel Jacobi decoding's row windows,
        `mmspec.image.parallel`): token t sees the committed tokens before its position and its segment up to
        itself; logits [B, T, V]. The state's fill levels are not used: what a query reads is what
        `commit_segments` cached."""
        model, cache = self.transformer, state.cache
        if state.cached is None:  # the condition prefix, the only thing cached after the prefill
            filled = torch.arange(cache.capacity, device=tokens.device) < cache.lengths[:, None]
            state.cached = cache.key_valid & filled
        state.segment_slots = state.rows(positions) + model.config.cls_token_num
        logits = model.forward_segments(model.tok_embeddings(state.rows(tokens)), cache, state.segment_slots,
                                        state.rows(segments), state.cached)
        return Logits.from_rows(logits, state.batch_size, state.cfg)

    def commit_segments(self, state: LlamaGenState, keep: torch.Tensor) -> None:
        """After `forward_segments`: cache the keys/values of the kept inputs (keep [B, T] bool) at their positions."""
        keep = state.rows(keep)
        source = (self.transformer.scratch_start + torch.arange(keep.shape[1], device=keep.device)).expand_as(keep)
        target = torch.where(keep, state.segment_slots, source)  # an input not kept is copied onto itself
        state.cache.copy_slots(target, source)
        state.cached.scatter_(1, target, keep | state.cached.gather(1, target))

    def rollback(self, state: LlamaGenState, keep: torch.Tensor) -> None:
        """Keep the condition and the first keep[b] image tokens of each row (keep: [B] long, <= N, so the host knows
        a bound on the fill levels without reading them: the cache has room for a window after N tokens)."""
        T = self.transformer.config.cls_token_num
        state.cache.rollback(state.rows(keep + T), bound=T + self.num_image_tokens)

    def select_rows(self, state: LlamaGenState, index: torch.Tensor) -> None:
        """Keep only the samples `index` ([B'] long), in that order (with their unconditional twins)."""
        if self.graphs is not None:
            raise ValueError("the CUDA graphs replay this cache's rows: selecting rows needs eager forwards "
                             "(pipe.disable_cuda_graphs())")
        rows = torch.cat([index, index + state.batch_size]) if state.cfg else index
        state.cache.select(rows)
        state.batch_size = index.shape[0]

    def feature_readout(self) -> tuple[torch.nn.Embedding, torch.nn.Linear]:
        """The token embedding and the output head (whose input, after the final norm, is the feature a draft head
        reads)."""
        return self.transformer.tok_embeddings, self.transformer.output

    def feature_layers(self) -> torch.nn.ModuleList:
        """The transformer's decoder blocks, whose outputs cover the condition and image tokens (the output head
        reads their last columns)."""
        return self.transformer.layers

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.vqvae.decode(tokens, self.grid)

    def codebook(self) -> torch.Tensor:
        """[V, d] code vectors as the quantizer compares them (l2-normalised when it normalises); for LANTERN."""
        return self.vqvae.quantize.codebook()
