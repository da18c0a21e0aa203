"""The convolutional building blocks of taming-transformers / LDM autoencoders (GroupNorm(32), swish, ResNet blocks,
single-head attention, asymmetric-pad downsampling, nearest upsampling), under the parameter names their checkpoints
use. LlamaGen's VQ tokenizer and MAR's KL autoencoder are both built from them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=32, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.norm1 = group_norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = group_norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        shortcut = self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x
        return shortcut + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the h*w positions of a feature map."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = group_norm(channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, h, w = x.shape
        y = self.norm(x)
        q, k, v = (proj(y).flatten(2).transpose(1, 2) for proj in (self.q, self.k, self.v))  # [B, h*w, C]
        out = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        return x + self.proj_out(out.transpose(1, 2).reshape(B, C, h, w))


class Downsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # asymmetric padding, as in the official models


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
