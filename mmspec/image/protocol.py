"""What a discrete image AR decoder may ask of a model: the core's causal-model protocol (`mmspec.core.model`) plus
the image span. Decoders never import a model family.

A model adapter holds the generation state outside the `nn.Module`: `prefill` runs the condition and returns it,
`forward` appends a window of image tokens to it, `rollback` truncates it per row. With classifier-free guidance the
adapter runs the conditional and the unconditional rows of each sample in lockstep and returns both logits (`Logits`);
they are combined by `mmspec.core.process_logits` (the one probability function), never by the model.
"""

from __future__ import annotations

from typing import Protocol

import torch

from mmspec.core.model import CausalModel


class DiscreteImageModel(CausalModel, Protocol):
    """Adapter protocol of a discrete-token AR image model.

    The image span: `grid` (h, w), its N = h * w tokens in raster order, and `vocab_size` V (image-token ids
    0..V-1); "tokens after the prompt" are image tokens. An adapter may also expose `forced_tokens`: [N] long, the
    token every sample has at a position (e.g. an end-of-line column) or -1 where the position is free; decoders then
    treat those positions as one-hot laws. Relaxed acceptance rules read `codebook()` -> [C, d] (and
    `codebook_token_ids` [C] when token ids are not the code indices), `mmspec.core.codebook`.
    """

    grid: tuple[int, int]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, h*w] -> images [B, 3, H, W], roughly in [-1, 1]."""
