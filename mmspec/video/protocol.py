"""What frame speculation may ask of a next-frame model: the engine never imports a model family.
`mmspec.models.nextframe.NextFrameTransformer` is the implementation the pipelines use."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from mmspec.video.cache import FrameKVCache


class NextFrameModel(Protocol):
    """A block-causal next-frame flow model over frame latents [L_f tokens, C channels] with a frame-level KV cache.

    config: needs `latent_channels`, `attention_window` (frames a frame attends to) and `num_actions`.
    """

    config: Any
    tokens_per_frame: int
    dtype: torch.dtype
    device: torch.device

    def new_cache(self, batch_size: int, max_speculative: int) -> FrameKVCache:
        """An empty cache for this model: the attention window of committed frames plus `max_speculative`."""

    def __call__(self, latents: torch.Tensor, timesteps: torch.Tensor, actions: torch.Tensor,
                 first_frame: int | torch.Tensor = 0, cache: FrameKVCache | None = None, *,
                 checked: bool = False) -> tuple[torch.Tensor, Any]:
        """latents [B, n, L_f, C] of frames first_frame .. first_frame + n - 1 (an int or a 0-d long tensor on the
        model's device) at flow times [B, n] under actions [B, n] -> (velocity [B, n, L_f, C], the new frames'
        per-layer keys / values for `cache.append`). checked: the actions were checked on the host; the call must
        not read the device then (no host read: a CUDA graph replays it)."""
