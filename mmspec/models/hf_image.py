"""`CausalLMImageAdapter`: the `mmspec.image.DiscreteImageModel` protocol over a transformers decoder that writes images
as tokens after a text prompt (Janus, Emu3, Lumina-mGPT / Chameleon), on public modules only.

What the families share lives here: the conditional prompt rows and their unconditional (CFG) rows run as one batch on
the core's ragged cache (`mmspec.core.cache`), each left-padded to a common length with the padding invisible; windows
of several image tokens per forward; per-row rollback to prompt + kept tokens. What differs is a family's subclass: how
image tokens enter the model (`embed_image`), which logits are the image vocabulary (`image_logits`), and what the
unconditional prompt is (`unconditional`). CFG rows are returned unmixed; `mmspec.core.process_logits` combines them.

The adapter's token ids are local: 0..C-1 are the VQ codes (code index = token id), and a family whose image span holds
structure tokens (Emu3's end-of-line, Lumina-mGPT's new-line) puts them at ids >= C and exposes `forced_tokens`.

Shapes: B samples, T prompt tokens, W window, V local ids, N = h * w image-span tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.core.cache import RaggedCacheState, forward_ragged, truncate
from mmspec.image.protocol import ImageLogits


@dataclass(frozen=True)
class PromptCondition:
    """input_ids: [B, T] long, the image-generation prompts as the family's template builds them, left-padded;
    attention_mask: [B, T], 1 for real tokens (None = all real); negative_ids / negative_mask: [B, T'] the
    unconditional rows of CFG, left-padded (None = the family's default, see the adapter's `unconditional`)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    negative_ids: torch.Tensor | None = None
    negative_mask: torch.Tensor | None = None

    def __post_init__(self):
        for name in ("input_ids", "negative_ids"):
            ids = getattr(self, name)
            if ids is not None and (not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.dtype != torch.long):
                raise TypeError(f"{name} must be a [B, T] long tensor, got {getattr(ids, 'shape', type(ids))}")
        if self.negative_ids is not None and self.negative_ids.shape[0] != self.input_ids.shape[0]:
            raise ValueError(f"negative_ids must have one row per prompt ({self.input_ids.shape[0]}), got "
                             f"{self.negative_ids.shape[0]}")


@dataclass
class PromptState:
    """Rows [0, B) conditional, [B, 2B) their unconditional rows when cfg; prompt_lengths: [B or 2B] real prompt
    tokens of each cache row."""

    cache: RaggedCacheState
    batch_size: int
    cfg: bool
    prompt_lengths: torch.Tensor


def mask_of(ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.to(ids.device).bool()


def left_pad(ids: torch.Tensor, mask: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, mask [B, T] left-padded to [B, length] (pad id 0, invisible)."""
    pad = length - ids.shape[1]
    return torch.nn.functional.pad(ids, (pad, 0)), torch.nn.functional.pad(mask, (pad, 0))


class CausalLMImageAdapter:
    """Base of the transformers-family adapters. A subclass sets `model`, `language_model` (the decoder returning
    `last_hidden_state`), `grid`, `vocab_size` and implements `embed_image`, `image_logits`, `unconditional`,
    `decode`, `codebook`."""

    model: torch.nn.Module
    language_model: torch.nn.Module
    grid: tuple[int, int]
    vocab_size: int

    def embed_image(self, tokens: torch.Tensor) -> torch.Tensor:
        """Local image-span ids [R, W] -> input embeddings [R, W, D]."""
        raise NotImplementedError

    def image_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Last hidden states [R, W, D] -> float32 logits over the local ids [R, W, V]."""
        raise NotImplementedError

    def unconditional(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The family's default unconditional rows (ids, mask) of prompts [B, T] (used when the condition has no
        negative_ids)."""
        raise NotImplementedError

    def prefill(self, condition: PromptCondition, cfg: bool, max_window: int = 1) -> tuple[PromptState, ImageLogits]:
        ids = condition.input_ids
        mask = mask_of(ids, condition.attention_mask)
        if cfg:
            if condition.negative_ids is None:
                negative, negative_mask = self.unconditional(ids, mask)
            else:
                negative, negative_mask = condition.negative_ids, mask_of(condition.negative_ids,
                                                                           condition.negative_mask)
            length = max(ids.shape[1], negative.shape[1])
            (ids, mask), (negative, negative_mask) = left_pad(ids, mask, length), left_pad(negative, negative_mask,
                                                                                           length)
            ids, mask = torch.cat([ids, negative]), torch.cat([mask, negative_mask])
        state = PromptState(RaggedCacheState.empty(ids.shape[0], ids.device), condition.input_ids.shape[0], cfg,
                            mask.sum(-1))
        embeds = self.model.get_input_embeddings()(ids)
        hidden = forward_ragged(self.language_model, state.cache, mask, inputs_embeds=embeds)
        return state, self._split(self.image_logits(hidden.last_hidden_state[:, -1:]), state)

    def forward(self, tokens: torch.Tensor, state: PromptState) -> ImageLogits:
        if tokens.ndim != 2 or tokens.shape[0] != state.batch_size:
            raise ValueError(f"tokens must have shape [{state.batch_size}, W], got {tuple(tokens.shape)}")
        rows = torch.cat([tokens, tokens]) if state.cfg else tokens  # both halves see the same image tokens
        hidden = forward_ragged(self.language_model, state.cache, inputs_embeds=self.embed_image(rows))
        return self._split(self.image_logits(hidden.last_hidden_state), state)

    def rollback(self, state: PromptState, keep: torch.Tensor) -> None:
        truncate(state.cache, state.prompt_lengths + (torch.cat([keep, keep]) if state.cfg else keep))

    @staticmethod
    def _split(logits: torch.Tensor, state: PromptState) -> ImageLogits:
        if not state.cfg:
            return ImageLogits(logits)
        return ImageLogits(logits[: state.batch_size], logits[state.batch_size :])


def structured_span(height: int, width: int, line_token: int) -> torch.Tensor:
    """forced_tokens [height * (width + 1)] of an image span written row by row, each row closed by `line_token`:
    -1 (free) on image columns, `line_token` on the last column."""
    forced = torch.full((height, width + 1), -1, dtype=torch.long)
    forced[:, width] = line_token
    return forced.flatten()


def restricted_logits(logits: torch.Tensor, columns: torch.Tensor, n_codes: int) -> torch.Tensor:
    """Logits [R, W, vocab] of a full LM head -> float32 [R, W, len(columns)] over the local ids: the code columns as
    they are, the structure tokens after them (ids >= n_codes) at the float32 minimum — they are only ever emitted where
    `forced_tokens` names them, and a finite minimum keeps CFG's difference of logits finite."""
    local = logits[..., columns].float()
    local[..., n_codes:] = torch.finfo(torch.float32).min
    return local
