"""A next-frame diffusion transformer in the NFD architecture (Cheng et al., "Playing with Transformer at 30+ FPS via
Next-Frame Diffusion", arXiv 2506.01380), as a diffusers `ModelMixin, ConfigMixin`.

Frames are grids of continuous latents (from a per-frame autoencoder), cut into patch_size x patch_size patches (DiT's
patchify) that are the transformer's tokens. Attention is **block-causal**: bidirectional within a frame, causal
across frames, so a frame never sees a later one and all tokens of a frame are denoised in parallel; a frame attends
to itself and the `attention_window` frames before it (a sliding window, used in training and sampling alike, so a
rollout of any length stays within the relative positions seen in training). Positions are 3-D rotary embeddings over
(absolute frame index, row, column) with the head dimension split between the three axes (HunyuanVideo style), so
cached keys stay valid when older frames are dropped. Every frame has its own flow-matching time t (0 = clean data,
1 = noise) and its own action; both enter every block through adaLN-zero, computed once per frame.

`forward(latents, timesteps, actions, first_frame, cache)` denoises frames first_frame .. first_frame + n - 1 attending
to the frames held in a `FrameKVCache` (their keys and values, computed when they were appended) and returns the
velocity and the new frames' keys / values, which the caller appends to the cache once the frames are final.

Shapes: B batch, n new frames, L_f = latent_size^2 latent positions per frame, C latent channels, P = (latent_size /
patch_size)^2 tokens per frame, D width, H heads, d = D / H.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from mmspec.models.mar.model import Mlp, TimestepEmbedder, modulate
from mmspec.video.cache import FrameKVCache

KV = list[tuple[torch.Tensor, torch.Tensor]]


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Head dims given to (frame, row, column): a quarter to time, the rest shared by space, all even."""
    t = 2 * max(1, head_dim // 8)
    h = 2 * ((head_dim - t) // 4)
    return t, h, head_dim - t - h


def rope_cos_sin(frames: torch.Tensor, size: int, head_dim: int, base: float = 10000.0):
    """(cos, sin) [n * size^2, d / 2] for tokens of frames `frames` [n] (absolute indices) in raster order, on the
    frames' device."""
    device = frames.device
    rows, cols = torch.meshgrid(torch.arange(size, device=device), torch.arange(size, device=device), indexing="ij")
    n = len(frames)
    axes = (frames.repeat_interleave(size * size), rows.flatten().repeat(n), cols.flatten().repeat(n))
    angles = []
    for position, dim in zip(axes, rope_split(head_dim), strict=True):
        inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)
        angles.append(position.float()[:, None] * inv_freq[None])
    angles = torch.cat(angles, dim=1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x [B, H, T, d] by the angles (cos, sin) [T, d / 2]."""
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).to(x.dtype)


class Block(nn.Module):
    """DiT block with adaLN-zero (per-frame conditioning) and block-causal attention that can read cached frames."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        nn.init.zeros_(self.adaLN_modulation[1].weight)
        nn.init.zeros_(self.adaLN_modulation[1].bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                context: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, n, P, D], c [B, n, 1, D] per-frame conditioning, mask [n P, T_ctx + n P] bool (True = attend).
        Returns (x, k, v) with this block's rotated keys / values of the new tokens [B, H, n P, d]."""
        B, n, P, D = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=-1)
        h = modulate(self.norm1(x), shift1, scale1).view(B, n * P, D)
        q, k, v = self.qkv(h).view(B, n * P, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = (k, v) if context is None else (torch.cat([context[0], k], 2), torch.cat([context[1], v], 2))
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + gate1 * self.proj(attended.transpose(1, 2).reshape(B, n, P, D))
        x = x + gate2 * self.mlp(modulate(self.norm2(x), shift2, scale2))
        return x, k, v


class NextFrameTransformer(ModelMixin, ConfigMixin):
    r"""Block-causal diffusion transformer over per-frame latent grids, conditioned per frame on a flow-matching time
    and a discrete action (adaLN-zero). Predicts the flow velocity (noise - data) of every latent position."""

    @register_to_config
    def __init__(self, latent_channels: int = 4, latent_size: int = 8, num_actions: int = 5, dim: int = 128,
                 depth: int = 4, num_heads: int = 4, mlp_ratio: float = 4.0, attention_window: int = 4,
                 patch_size: int = 1):
        super().__init__()
        if dim % num_heads or (dim // num_heads) % 2:
            raise ValueError(f"dim / num_heads must be an even integer, got dim={dim}, num_heads={num_heads}")
        if attention_window < 1:
            raise ValueError(f"attention_window must be >= 1, got {attention_window}")
        if patch_size < 1 or latent_size % patch_size:
            raise ValueError(f"patch_size must divide latent_size={latent_size}, got {patch_size}")
        patch_dim = latent_channels * patch_size**2
        self.proj_in = nn.Linear(patch_dim, dim)
        self.time_embed = TimestepEmbedder(dim)
        self.action_embed = nn.Embedding(num_actions, dim)
        self.blocks = nn.ModuleList(Block(dim, num_heads, mlp_ratio) for _ in range(depth))
        self.norm_out = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.adaLN_out = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.proj_out = nn.Linear(dim, patch_dim)
        for layer in (self.adaLN_out[1], self.proj_out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    @property
    def tokens_per_frame(self) -> int:
        """Latent positions per frame (L_f): the size of a frame's latents in and velocity out."""
        return self.config.latent_size**2

    @property
    def grid_size(self) -> int:
        """Patches per side: a frame is grid_size^2 transformer tokens."""
        return self.config.latent_size // self.config.patch_size

    def new_cache(self, batch_size: int, max_speculative: int) -> FrameKVCache:
        """An empty cache for this model's layers and frames, holding `attention_window` committed frames."""
        heads = self.config.num_heads
        return FrameKVCache(self.config.depth, batch_size, heads, self.config.dim // heads, self.grid_size**2,
                            self.config.attention_window, max_speculative, dtype=self.dtype, device=self.device)

    def patchify(self, latents: torch.Tensor) -> torch.Tensor:
        """[B, n, L_f, C] (raster order) -> [B, n, P, p^2 C]."""
        B, n, _, C = latents.shape
        g, p = self.grid_size, self.config.patch_size
        x = latents.view(B, n, g, p, g, p, C).permute(0, 1, 2, 4, 3, 5, 6)
        return x.reshape(B, n, g * g, p * p * C)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """[B, n, P, p^2 C] -> [B, n, L_f, C] (raster order)."""
        B, n = x.shape[:2]
        g, p, C = self.grid_size, self.config.patch_size, self.config.latent_channels
        x = x.view(B, n, g, g, p, p, C).permute(0, 1, 2, 4, 3, 5, 6)
        return x.reshape(B, n, g * p * g * p, C)

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, actions: torch.Tensor,
                first_frame: int | torch.Tensor = 0, cache: FrameKVCache | None = None, *,
                checked: bool = False) -> tuple[torch.Tensor, KV]:
        """latents [B, n, L_f, C] of frames first_frame .. first_frame + n - 1 at flow times timesteps [B, n] in
        [0, 1] under actions [B, n] long, attending to the frames in `cache` (which must end at first_frame) ->
        (velocity [B, n, L_f, C], per layer (k, v) [B, H, n P, d] of the new frames). first_frame: an int, or a
        0-d long tensor on the model's device (what a CUDA graph replays with: the frames' rotary angles are computed
        from it on the device). checked: the caller has checked that the actions are in [0, num_actions)
        (`FrameSession` does, on the host, before any forward), so the forward does not read them from the device."""
        B, n = latents.shape[:2]
        P, device = self.grid_size**2, latents.device
        if cache is not None and isinstance(first_frame, int) and cache.end != first_frame:
            raise ValueError(f"first_frame must follow the cached frames (cache ends at {cache.end}), got "
                             f"{first_frame}")
        if not checked and (actions.min() < 0 or actions.max() >= self.config.num_actions):
            raise ValueError(f"actions must be in [0, {self.config.num_actions}), got "
                             f"{sorted(actions.unique().tolist())}")
        c = self.time_embed(timesteps.reshape(-1) * 1000) + self.action_embed(actions.reshape(-1))  # [B n, D]
        c = c.view(B, n, 1, -1)  # per frame, broadcast over its tokens
        frames = first_frame + torch.arange(n, device=device)
        head_dim = self.config.dim // self.config.num_heads
        cos, sin = rope_cos_sin(frames, self.grid_size, head_dim)
        # block-causal within the sliding window: frame distances from the held frames' count (no absolute index)
        held = 0 if cache is None else cache.num_frames
        query_frame = torch.arange(n, device=device).repeat_interleave(P)
        key_frame = torch.arange(-held, n, device=device).repeat_interleave(P)
        behind = query_frame[:, None] - key_frame[None, :]
        mask = (behind >= 0) & (behind <= self.config.attention_window)
        x = self.proj_in(self.patchify(latents))
        new_kv = []
        for layer, block in enumerate(self.blocks):
            x, k, v = block(x, c, cos, sin, mask, None if cache is None else cache.context(layer))
            new_kv.append((k, v))
        shift, scale = self.adaLN_out(c).chunk(2, dim=-1)
        return self.unpatchify(self.proj_out(modulate(self.norm_out(x), shift, scale))), new_kv
