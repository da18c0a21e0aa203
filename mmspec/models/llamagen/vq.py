"""LlamaGen's VQ image tokenizer (Sun et al., "Autoregressive Model Beats Diffusion", arXiv 2406.06525, §2.2) as a
diffusers `ModelMixin, ConfigMixin`.

Architecture as in LlamaGen's `tokenizer/tokenizer_image/vq_model.py` (itself from taming-transformers / MaskGIT): a
conv encoder (ResNet blocks, attention at the lowest resolution and in the middle, GroupNorm(32), swish), a 1x1
projection to a low-dimensional code space (8 dims) with an l2-normalised codebook (nearest code by cosine), a 1x1
projection back and a mirrored conv decoder. Module and parameter names follow the official checkpoints
(`encoder.conv_blocks.0.res.0.norm1.weight`, `quantize.embedding.weight`, ...), so `from_llamagen_checkpoint` loads
`vq_ds16_c2i.pt` / `vq_ds16_t2i.pt` with no key renaming.

Shapes: images [B, 3, H, W] in [-1, 1]; latents [B, C, h, w] with h = H / 2**(len(ch_mult) - 1); token ids [B, h*w]
in raster order.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from mmspec.models.autoencoder_blocks import AttnBlock, Downsample, ResnetBlock, Upsample, group_norm
from mmspec.models.checkpoint import load_official_state_dict, load_weights
from mmspec.models.llamagen.gpt import SAMPLING_KEYS

KNOWN_EXTRAS = ("quantize.codebook_used",)  # training's codebook-usage counter, in every released VQ file


class _Level(nn.Module):
    """One resolution level: `depth` ResNet blocks (the first maps in_channels -> out_channels), each followed by an
    attention block when `attention` (lowest resolution only), then an optional resampler named "downsample" or
    "upsample" (the official parameter names)."""

    def __init__(self, in_channels: int, out_channels: int, depth: int, attention: bool,
                 resample: tuple[str, type[nn.Module]] | None):
        super().__init__()
        self.res = nn.ModuleList(ResnetBlock(c, out_channels) for c in [in_channels] + [out_channels] * (depth - 1))
        self.attn = nn.ModuleList(AttnBlock(out_channels) for _ in range(depth if attention else 0))
        if resample is not None:
            name, module = resample
            self.add_module(name, module(out_channels))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.res):
            h = block(h)
            if len(self.attn) > 0:
                h = self.attn[i](h)
        for name in ("downsample", "upsample"):
            if hasattr(self, name):
                h = getattr(self, name)(h)
        return h


def _mid(channels: int) -> nn.ModuleList:
    return nn.ModuleList([ResnetBlock(channels, channels), AttnBlock(channels), ResnetBlock(channels, channels)])


class Encoder(nn.Module):
    def __init__(self, ch: int, ch_mult: tuple[int, ...], num_res_blocks: int, z_channels: int):
        super().__init__()
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        levels, block_in = [], ch
        for i, mult in enumerate(ch_mult):
            last = i == len(ch_mult) - 1
            downsample = None if last else ("downsample", Downsample)
            levels.append(_Level(block_in, ch * mult, num_res_blocks, last, downsample))
            block_in = ch * mult
        self.conv_blocks = nn.ModuleList(levels)
        self.mid = _mid(block_in)
        self.norm_out = group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for block in (*self.conv_blocks, *self.mid):
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, ch: int, ch_mult: tuple[int, ...], num_res_blocks: int, z_channels: int):
        super().__init__()
        block_in = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, padding=1)
        self.mid = _mid(block_in)
        levels = []
        for i in reversed(range(len(ch_mult))):
            first = i == len(ch_mult) - 1
            upsample = ("upsample", Upsample) if i != 0 else None
            levels.append(_Level(block_in, ch * ch_mult[i], num_res_blocks + 1, first, upsample))
            block_in = ch * ch_mult[i]
        self.conv_blocks = nn.ModuleList(levels)
        self.norm_out = group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for block in (*self.mid, *self.conv_blocks):
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Nearest-code quantiser with an l2-normalised codebook (cosine similarity in the 8-dim code space)."""

    def __init__(self, codebook_size: int, embed_dim: int, l2_norm: bool):
        super().__init__()
        self.l2_norm = l2_norm
        self.embedding = nn.Embedding(codebook_size, embed_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / codebook_size, 1.0 / codebook_size)

    def codebook(self) -> torch.Tensor:
        """[K, C] code vectors (normalised when l2_norm)."""
        weight = self.embedding.weight
        return F.normalize(weight, dim=-1) if self.l2_norm else weight

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """z: [N, C] -> [N] index of the nearest code."""
        codebook = self.codebook()
        if self.l2_norm:
            z = F.normalize(z, dim=-1)
        distance = z.pow(2).sum(-1, keepdim=True) - 2 * z @ codebook.T + codebook.pow(2).sum(-1)
        return distance.argmin(-1)


class LlamaGenVQModel(ModelMixin, ConfigMixin):
    """LlamaGen VQ tokenizer: `encode(images) -> ids`, `decode(ids) -> images`.

    The defaults are the official `VQ-16` (ds16, 16384 codes of dim 8); the embedded model uses a 4x-downsampling
    variant so that 64x64 images become 16x16 = 256 tokens.
    """

    @register_to_config
    def __init__(
        self,
        codebook_size: int = 16384,
        codebook_embed_dim: int = 8,
        codebook_l2_norm: bool = True,
        ch: int = 128,
        ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4),
        num_res_blocks: int = 2,
        z_channels: int = 256,
        commit_loss_beta: float = 0.25,
    ):
        super().__init__()
        ch_mult = tuple(ch_mult)
        if ch % 32 or any((ch * m) % 32 for m in ch_mult):
            raise ValueError(f"ch * ch_mult must be multiples of 32 (GroupNorm(32)), got ch={ch}, ch_mult={ch_mult}")
        self.encoder = Encoder(ch, ch_mult, num_res_blocks, z_channels)
        self.decoder = Decoder(ch, ch_mult, num_res_blocks, z_channels)
        self.quantize = VectorQuantizer(codebook_size, codebook_embed_dim, codebook_l2_norm)
        self.quant_conv = nn.Conv2d(z_channels, codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(codebook_embed_dim, z_channels, 1)

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.config.ch_mult) - 1)

    def encode_latents(self, images: torch.Tensor) -> torch.Tensor:
        """images: [B, 3, H, W] in [-1, 1] -> continuous code-space latents [B, C, h, w] (before quantisation)."""
        return self.quant_conv(self.encoder(images))

    def quantize_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """latents: [B, C, h, w] -> token ids [B, h*w] (raster order)."""
        B, C, h, w = latents.shape
        return self.quantize.nearest(latents.permute(0, 2, 3, 1).reshape(-1, C)).view(B, h * w)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images: [B, 3, H, W] in [-1, 1] -> token ids [B, h*w]."""
        return self.quantize_latents(self.encode_latents(images))

    def codes_to_latents(self, ids: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """ids: [B, h*w] -> code vectors [B, C, h, w]."""
        h, w = grid
        if ids.ndim != 2 or ids.shape[1] != h * w:
            raise ValueError(f"ids must have shape [B, {h * w}] for a {h}x{w} grid, got {tuple(ids.shape)}")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.config.codebook_size):
            raise ValueError(f"ids must be in [0, {self.config.codebook_size}), got [{ids.min()}, {ids.max()}]")
        codes = self.quantize.codebook()[ids]  # [B, h*w, C]
        return codes.view(ids.shape[0], h, w, -1).permute(0, 3, 1, 2)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """latents: [B, C, h, w] -> images [B, 3, H, W], roughly in [-1, 1] (not clamped)."""
        return self.decoder(self.post_quant_conv(latents))

    def decode(self, ids: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """ids: [B, h*w] token ids -> images [B, 3, H, W], roughly in [-1, 1] (not clamped)."""
        return self.decode_latents(self.codes_to_latents(ids, grid))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training pass: (reconstruction [B, 3, H, W], VQ + commitment loss, ids [B, h*w]).

        Straight-through estimator as in the official model: codes get the codebook loss, the encoder the commitment
        loss, and the decoder's gradient passes through the quantiser unchanged.
        """
        latents = self.encode_latents(images)
        B, C, h, w = latents.shape
        ids = self.quantize_latents(latents.detach())
        z = latents.permute(0, 2, 3, 1)  # [B, h, w, C]
        if self.config.codebook_l2_norm:
            z = F.normalize(z, dim=-1)
        z_q = self.quantize.codebook()[ids].view(B, h, w, C)
        vq_loss = (z_q - z.detach()).pow(2).mean() + self.config.commit_loss_beta * (z_q.detach() - z).pow(2).mean()
        z_q = z + (z_q - z).detach()
        return self.decode_latents(z_q.permute(0, 3, 1, 2)), vq_loss, ids

    @classmethod
    def from_llamagen_checkpoint(cls, path: str | Path, weights: str | None = None, **config) -> LlamaGenVQModel:
        """Load an official LlamaGen VQ `.pt` file (`vq_ds16_c2i.pt`, `vq_ds16_t2i.pt`, `vq_ds8_c2i.pt`).

        The codebook size and dimension are read from the weights; `config` overrides the rest (default: the official
        VQ-16 layout; pass `ch_mult=(1, 2, 2, 4)` for the ds8 tokenizer). weights: the file's entry to read (None =
        "model", as LlamaGen's scripts load it; "ema" for a training run's EMA copy). The codebook-usage counter of
        training is ignored (logged); a missing weight is refused by name.
        """
        state = load_official_state_dict(path, SAMPLING_KEYS, weights)
        if "quantize.embedding.weight" not in state:
            raise ValueError(f"{path} has no 'quantize.embedding.weight': not a LlamaGen VQ checkpoint")
        codebook_size, embed_dim = state["quantize.embedding.weight"].shape
        model = cls(codebook_size=codebook_size, codebook_embed_dim=embed_dim, **config)
        load_weights(model, state, str(path), KNOWN_EXTRAS)
        return model.eval()
