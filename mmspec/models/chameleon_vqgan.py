"""The image decoder of Chameleon's VQGAN (Meta, `tokenizer/vqgan.ckpt` + `vqgan.yaml`), which Lumina-mGPT decodes with
and transformers' `ChameleonVQVAE` lacks (it ships the encoder and quantizer only).

It is taming-transformers' VQGAN decoder (Esser et al. 2021): codebook lookup, a 1x1 `post_quant_conv`, then a
ResNet / attention / nearest-upsampling stack. Module and parameter names follow the official checkpoint
(`decoder.up.3.block.0.conv1.weight`, `quantize.embedding.weight`, ...), so `from_chameleon_checkpoint` loads Meta's
file with no key renaming and ignores its encoder / loss weights.

Shapes: codes [B, h, w] long; images [B, 3, h * 2**(L-1), w * 2**(L-1)] in about [-1, 1], L = len(ch_mult)
(Chameleon: 5 levels, 16x upsampling, 8192 codes of 256 dims).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from mmspec.models.autoencoder_blocks import AttnBlock, ResnetBlock, Upsample, group_norm
from mmspec.models.checkpoint import load_official_state_dict

DECODER_PREFIXES = ("decoder.", "post_quant_conv.", "quantize.embedding.")


class _UpLevel(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, depth: int, attention: bool, upsample: bool):
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(c, out_channels) for c in [in_channels] + [out_channels] * (depth - 1))
        self.attn = nn.ModuleList(AttnBlock(out_channels) for _ in range(depth if attention else 0))
        if upsample:
            self.upsample = Upsample(out_channels)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.block):
            h = block(h)
            if len(self.attn) > 0:
                h = self.attn[i](h)
        return self.upsample(h) if hasattr(self, "upsample") else h


class Decoder(nn.Module):
    """taming's `Decoder` (no timestep embedding): `up[i]` is level i, run from the deepest level up."""

    def __init__(self, ch: int, out_ch: int, ch_mult: tuple[int, ...], num_res_blocks: int,
                 attn_resolutions: tuple[int, ...], resolution: int, z_channels: int):
        super().__init__()
        levels = len(ch_mult)
        block_in = ch * ch_mult[-1]
        size = resolution // 2 ** (levels - 1)
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1, self.mid.attn_1, self.mid.block_2 = (ResnetBlock(block_in, block_in), AttnBlock(block_in),
                                                               ResnetBlock(block_in, block_in))
        up = [None] * levels
        for i in reversed(range(levels)):
            up[i] = _UpLevel(block_in, ch * ch_mult[i], num_res_blocks + 1, size in attn_resolutions, i != 0)
            block_in = ch * ch_mult[i]
            size = size * 2 if i != 0 else size
        self.up = nn.ModuleList(up)
        self.norm_out = group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for level in reversed(self.up):
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class ChameleonVQGAN(ModelMixin, ConfigMixin):
    """The decoding half of Chameleon's VQGAN. Config names follow `vqgan.yaml` (`n_embed`, `embed_dim` and the
    `ddconfig` fields); defaults are Chameleon's."""

    @register_to_config
    def __init__(self, n_embed: int = 8192, embed_dim: int = 256, z_channels: int = 256, ch: int = 128,
                 ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4), num_res_blocks: int = 2,
                 attn_resolutions: tuple[int, ...] = (), resolution: int = 512, out_ch: int = 3):
        super().__init__()
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(n_embed, embed_dim)
        self.post_quant_conv = nn.Conv2d(embed_dim, z_channels, 1)
        self.decoder = Decoder(ch, out_ch, tuple(ch_mult), num_res_blocks, tuple(attn_resolutions), resolution,
                               z_channels)

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.config.ch_mult) - 1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, h, w] long -> images [B, 3, h * f, w * f], f = `downsample_factor`."""
        if codes.ndim != 3:
            raise ValueError(f"codes must be [B, h, w], got shape {tuple(codes.shape)}")
        quant = self.quantize.embedding(codes).permute(0, 3, 1, 2)  # [B, embed_dim, h, w]
        return self.decoder(self.post_quant_conv(quant))

    @classmethod
    def from_chameleon_checkpoint(cls, checkpoint: str | Path, config: str | Path | None = None) -> ChameleonVQGAN:
        """Load Meta's `vqgan.ckpt` (the Lightning file, weights under "state_dict", or a bare state dict); `config`:
        its `vqgan.yaml` (model.params: n_embed, embed_dim, ddconfig), default Chameleon's settings. Raises if any
        decoder weight is missing or has another shape."""
        settings = {}
        if config is not None:
            import yaml

            params = yaml.safe_load(Path(config).read_text())["model"]["params"]
            dd = params["ddconfig"]
            settings = dict(n_embed=params["n_embed"], embed_dim=params["embed_dim"], z_channels=dd["z_channels"],
                            ch=dd["ch"], ch_mult=tuple(dd["ch_mult"]), num_res_blocks=dd["num_res_blocks"],
                            attn_resolutions=tuple(dd["attn_resolutions"]), resolution=dd["resolution"],
                            out_ch=dd["out_ch"])
        model = cls(**settings)
        state = {k: v for k, v in load_official_state_dict(checkpoint).items() if k.startswith(DECODER_PREFIXES)}
        expected = model.state_dict()
        missing = sorted(set(expected) - set(state))
        if missing:
            raise ValueError(
                f"{checkpoint} lacks {len(missing)} VQ decoder weight(s), e.g. {missing[:3]}; Chameleon's decoder "
                "ships in Meta's tokenizer/vqgan.ckpt (transformers' ChameleonVQVAE weights hold no decoder)"
            )
        wrong = [k for k in expected if state[k].shape != expected[k].shape]
        if wrong:
            raise ValueError(f"{checkpoint}: {wrong[:3]} have shapes {[tuple(state[k].shape) for k in wrong[:3]]}, "
                             f"the config gives {[tuple(expected[k].shape) for k in wrong[:3]]}; pass its vqgan.yaml")
        model.load_state_dict(state)
        return model.eval()
