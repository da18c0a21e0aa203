"""A key / value cache held at frame granularity for block-causal next-frame transformers, with a committed prefix and
a speculative tail (reference C, "Rollback design").

Frames carry absolute indices (the model's positions are absolute, so nothing is re-encoded when frames are dropped):
the cache holds frames `start .. end - 1`; those below `committed` were emitted, the rest are speculative. `rollback`
drops the speculative tail in O(1) (a length pointer); `commit` moves the boundary forward and then evicts the oldest
committed frames beyond the window. An uncommitted frame is never evicted, so a rollback can always return to the last
committed frame, and the cache after it equals that of a run that only ever appended the committed frames.

Shapes: B batch, H heads, L_f tokens per frame, d head dim; per layer k / v [B, H, frames * L_f, d].
"""

from __future__ import annotations

import torch


class FrameKVCache:
    """Per-layer keys and values of at most `window` committed and `max_speculative` speculative frames."""

    def __init__(self, num_layers: int, batch_size: int, num_heads: int, head_dim: int, tokens_per_frame: int,
                 window: int, max_speculative: int, dtype: torch.dtype = torch.float32, device=None):
        for name, value in (("window", window), ("max_speculative", max_speculative)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.tokens_per_frame, self.window, self.max_speculative = tokens_per_frame, window, max_speculative
        shape = (batch_size, num_heads, (window + max_speculative) * tokens_per_frame, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.start = 0  # absolute index of the oldest frame held
        self.end = 0  # one past the newest frame held
        self.committed = 0  # frames < committed were emitted

    @property
    def num_frames(self) -> int:
        return self.end - self.start

    @property
    def num_speculative(self) -> int:
        return self.end - self.committed

    @property
    def positions(self) -> torch.Tensor:
        """[num_frames] long: the absolute indices of the frames held, oldest first."""
        return torch.arange(self.start, self.end)

    def context(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) [B, H, num_frames * L_f, d] of the frames held (views, valid until the next append / commit)."""
        held = self.num_frames * self.tokens_per_frame
        return self.keys[layer][:, :, :held], self.values[layer][:, :, :held]

    def append(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Add n speculative frames after the newest: per layer k / v [B, H, n * L_f, d]."""
        if len(keys) != len(self.keys) or len(values) != len(self.values):
            raise ValueError(f"keys / values: expected one tensor per layer ({len(self.keys)}), got {len(keys)} / "
                             f"{len(values)}")
        tokens = keys[0].shape[2]
        if tokens % self.tokens_per_frame:
            raise ValueError(f"keys hold {tokens} tokens, not a whole number of {self.tokens_per_frame}-token frames")
        n = tokens // self.tokens_per_frame
        if self.num_speculative + n > self.max_speculative:
            raise ValueError(f"appending {n} frames to {self.num_speculative} speculative ones exceeds "
                             f"max_speculative={self.max_speculative}; commit or roll back first")
        at = self.num_frames * self.tokens_per_frame
        for cache, new in zip(self.keys + self.values, keys + values, strict=True):
            cache[:, :, at : at + tokens] = new
        self.end += n

    def commit(self, n: int = 1) -> None:
        """Mark the oldest n speculative frames emitted, then evict committed frames beyond the window."""
        if not 0 <= n <= self.num_speculative:
            raise ValueError(f"n must be in [0, {self.num_speculative}] (the speculative frames held), got {n}")
        self.committed += n
        evict = (self.committed - self.start) - self.window
        if evict > 0:
            drop, keep = evict * self.tokens_per_frame, (self.num_frames - evict) * self.tokens_per_frame
            for cache in self.keys + self.values:
                cache[:, :, :keep] = cache[:, :, drop : drop + keep].clone()
            self.start += evict

    def rollback(self) -> int:
        """Drop every speculative frame (O(1)); returns how many were dropped."""
        dropped, self.end = self.num_speculative, self.committed
        return dropped
