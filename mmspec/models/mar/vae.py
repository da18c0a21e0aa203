"""The KL autoencoder MAR's tokens live in (LDM's AutoencoderKL as LTH14/mar `models/vae.py` configures it: KL-16 =
channel multipliers (1, 1, 2, 2, 4), 16 latent channels, attention at 16 px in the encoder only), as a diffusers
`ModelMixin, ConfigMixin` with the official parameter names, so `kl16.ckpt`'s `model` weights load without renaming.

Images [B, 3, H, W] in [-1, 1] <-> latents [B, z_channels, H / 2^(levels-1), W / 2^(levels-1)]; MAR multiplies the
latent by `scaling_factor` (0.2325) before patchifying and divides by it before decoding.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from mmspec.models.autoencoder_blocks import AttnBlock, Downsample, ResnetBlock, Upsample, group_norm
from mmspec.models.checkpoint import load_official_state_dict, load_weights

KNOWN_EXTRAS = ("loss.*",)  # LDM's training loss (its log-variance, LPIPS and discriminator), saved with the weights


class _Level(nn.Module):
    """One resolution of the encoder or decoder (`block`, `attn`, and `downsample` / `upsample` as named officially)."""

    def __init__(self, channels_in: int, channels_out: int, num_blocks: int, attention: bool):
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(channels_in if i == 0 else channels_out, channels_out)
                                   for i in range(num_blocks))
        self.attn = nn.ModuleList(AttnBlock(channels_out) for _ in range(num_blocks if attention else 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.block):
            x = block(x)
            if len(self.attn):
                x = self.attn[i](x)
        return x


class _Middle(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = ResnetBlock(channels, channels), AttnBlock(channels), ResnetBlock(
            channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class Encoder(nn.Module):
    def __init__(self, ch: int, ch_mult: tuple[int, ...], num_res_blocks: int, attn_resolutions: tuple[int, ...],
                 resolution: int, z_channels: int, in_channels: int = 3):
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, ch, 3, padding=1)
        self.down = nn.ModuleList()
        channels, size = ch, resolution
        for i, mult in enumerate(ch_mult):
            level = _Level(channels, ch * mult, num_res_blocks, size in attn_resolutions)
            channels = ch * mult
            if i != len(ch_mult) - 1:
                level.downsample = Downsample(channels)
                size //= 2
            self.down.append(level)
        self.mid = _Middle(channels)
        self.norm_out, self.conv_out = group_norm(channels), nn.Conv2d(channels, 2 * z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        return self.conv_out(F.silu(self.norm_out(self.mid(h))))


class Decoder(nn.Module):
    def __init__(self, ch: int, ch_mult: tuple[int, ...], num_res_blocks: int, attn_resolutions: tuple[int, ...],
                 resolution: int, z_channels: int, out_channels: int = 3):
        super().__init__()
        channels, size = ch * ch_mult[-1], resolution // 2 ** (len(ch_mult) - 1)
        self.conv_in = nn.Conv2d(z_channels, channels, 3, padding=1)
        self.mid = _Middle(channels)
        levels = []
        for i in reversed(range(len(ch_mult))):
            level = _Level(channels, ch * ch_mult[i], num_res_blocks + 1, size in attn_resolutions)
            channels = ch * ch_mult[i]
            if i != 0:
                level.upsample = Upsample(channels)
                size *= 2
            levels.append(level)
        self.up = nn.ModuleList(reversed(levels))  # up[i] is resolution level i, as officially indexed
        self.norm_out, self.conv_out = group_norm(channels), nn.Conv2d(channels, out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = level(h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class KLAutoencoder(ModelMixin, ConfigMixin):
    r"""`encode(images) -> (mean, logvar)` latents, `decode(latents) -> images`; defaults are MAR's KL-16 at 256 px."""

    @register_to_config
    def __init__(self, embed_dim: int = 16, ch: int = 128, ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4),
                 num_res_blocks: int = 2, encoder_attn_resolutions: tuple[int, ...] = (16,),
                 decoder_attn_resolutions: tuple[int, ...] = (), resolution: int = 256,
                 scaling_factor: float = 0.2325):
        super().__init__()
        ch_mult = tuple(ch_mult)
        self.encoder = Encoder(ch, ch_mult, num_res_blocks, tuple(encoder_attn_resolutions), resolution, embed_dim)
        self.decoder = Decoder(ch, ch_mult, num_res_blocks, tuple(decoder_attn_resolutions), resolution, embed_dim)
        self.quant_conv = nn.Conv2d(2 * embed_dim, 2 * embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(embed_dim, embed_dim, 1)

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.config.ch_mult) - 1)

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, logvar) [B, embed_dim, h, w] of the posterior (logvar clamped to [-30, 20] as LDM does)."""
        mean, logvar = self.quant_conv(self.encoder(images)).chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(latents))

    @classmethod
    def from_mar_checkpoint(cls, path, **config) -> KLAutoencoder:
        """The autoencoder of an official `kl16.ckpt` (its `model` weights, as MAR loads them); `config` overrides the
        KL-16 defaults. The training loss's entries the file carries (`loss.logvar`, the LPIPS and discriminator
        weights) are ignored and logged; a missing weight or a tensor of another shape is refused."""
        model = cls(**config)
        load_weights(model, load_official_state_dict(path, weights="model"), str(path), KNOWN_EXTRAS, "KL autoencoder")
        return model
