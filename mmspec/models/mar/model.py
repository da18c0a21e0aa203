"""MAR (Li et al., "Autoregressive Image Generation without Vector Quantization", arXiv 2406.11838): a bidirectional
MAE-style encoder / decoder over continuous tokens with a buffer of class slots, and a per-token diffusion MLP head
(adaLN residual blocks, eps + learned-range variance), as a diffusers `ModelMixin, ConfigMixin`.

Parameter names are those of the official checkpoints (LTH14/mar `models/mar.py`, `models/diffloss.py`; timm's ViT
`Block`), so `MARModel.from_official_state_dict` loads `mar_base/large/huge` weights without renaming.

Shapes: B images, L = seq_len tokens of C = token_dim channels, buffer_size class slots, D / D_dec encoder / decoder
widths.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from mmspec.models.checkpoint import load_checkpoint, load_weights, state_dict_of

# the official sizes (README table; the CSpD runner hard-codes the head sizes the same way)
MAR_PRESETS = {
    "mar_base": dict(encoder_embed_dim=768, encoder_depth=12, encoder_num_heads=12, decoder_embed_dim=768,
                     decoder_depth=12, decoder_num_heads=12, diffloss_d=6, diffloss_w=1024),
    "mar_large": dict(encoder_embed_dim=1024, encoder_depth=16, encoder_num_heads=16, decoder_embed_dim=1024,
                      decoder_depth=16, decoder_num_heads=16, diffloss_d=8, diffloss_w=1280),
    "mar_huge": dict(encoder_embed_dim=1280, encoder_depth=20, encoder_num_heads=16, decoder_embed_dim=1280,
                     decoder_depth=20, decoder_num_heads=16, diffloss_d=12, diffloss_w=1536),
}


class Attention(nn.Module):
    """timm's ViT attention (fused qkv, bidirectional)."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.num_heads, D // self.num_heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, D))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """timm's pre-norm ViT block (LayerNorm eps 1e-6, GELU MLP of ratio mlp_ratio)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embeddings [n, dim] of timesteps t [n] (cos half first, as in GLIDE / DiT)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int, frequency_dim: int = 256):
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(timestep_embedding(t, self.frequency_dim))


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: x * (1 + scale) + shift."""
    return x * (1 + scale) + shift


class ResBlock(nn.Module):
    """adaLN residual MLP block: x + gate * MLP(LN(x) * (1 + scale) + shift), (shift, scale, gate) from y."""

    def __init__(self, width: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, width: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(width, out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class SimpleMLPAdaLN(nn.Module):
    """The per-token diffusion head: (x_t [n, C], t [n], z [n, D_dec]) -> [n, 2C] = (eps, variance interpolation v)."""

    def __init__(self, in_channels: int, width: int, z_channels: int, depth: int):
        super().__init__()
        self.in_channels = in_channels
        self.time_embed = TimestepEmbedder(width)
        self.cond_embed = nn.Linear(z_channels, width)
        self.input_proj = nn.Linear(in_channels, width)
        self.res_blocks = nn.ModuleList(ResBlock(width) for _ in range(depth))
        self.final_layer = FinalLayer(width, 2 * in_channels)

    def forward(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = self.time_embed(t) + self.cond_embed(z)
        x = self.input_proj(x)
        for block in self.res_blocks:
            x = block(x, y)
        return self.final_layer(x, y)


class DiffLoss(nn.Module):
    """Holds the head under the official name `diffloss.net`."""

    def __init__(self, target_channels: int, z_channels: int, depth: int, width: int):
        super().__init__()
        self.net = SimpleMLPAdaLN(target_channels, width, z_channels, depth)


class MARModel(ModelMixin, ConfigMixin):
    r"""MAR's encoder / decoder and diffusion head.

    `encode_decode(tokens [B, L, C], mask [B, L] bool (True = unknown), class_embedding [B, D], known_tokens)
    -> z [B, L, D_dec]` conditions every position's head; `head(x_t, t, z)` is the diffusion MLP. Generation (masked
    random order, cosine schedule, CFG) lives in `mmspec.continuous`. `x0_clip` (not in the official models, None =
    MAR's sampler) is the sampling-time clamp of the head's x_0 prediction (`DiffusionSchedule.x0_clip`) that the
    pipeline applies.
    """

    @register_to_config
    def __init__(self, seq_len: int = 256, token_dim: int = 16, num_classes: int = 1000, buffer_size: int = 64,
                 encoder_embed_dim: int = 1024, encoder_depth: int = 16, encoder_num_heads: int = 16,
                 decoder_embed_dim: int = 1024, decoder_depth: int = 16, decoder_num_heads: int = 16,
                 mlp_ratio: float = 4.0, diffloss_d: int = 3, diffloss_w: int = 1024, x0_clip: float | None = None):
        super().__init__()
        D, D_dec = encoder_embed_dim, decoder_embed_dim
        self.class_emb = nn.Embedding(num_classes, D)
        self.fake_latent = nn.Parameter(torch.zeros(1, D))
        self.z_proj = nn.Linear(token_dim, D)
        self.z_proj_ln = nn.LayerNorm(D, eps=1e-6)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, seq_len + buffer_size, D))
        self.encoder_blocks = nn.ModuleList(Block(D, encoder_num_heads, mlp_ratio) for _ in range(encoder_depth))
        self.encoder_norm = nn.LayerNorm(D, eps=1e-6)
        self.decoder_embed = nn.Linear(D, D_dec)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, D_dec))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, seq_len + buffer_size, D_dec))
        self.decoder_blocks = nn.ModuleList(Block(D_dec, decoder_num_heads, mlp_ratio) for _ in range(decoder_depth))
        self.decoder_norm = nn.LayerNorm(D_dec, eps=1e-6)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, seq_len, D_dec))
        self.diffloss = DiffLoss(token_dim, D_dec, diffloss_d, diffloss_w)

    @classmethod
    def preset(cls, name: str, **overrides) -> MARModel:
        """An official size (`mar_base`, `mar_large`, `mar_huge`) with the 256 px / KL-16 token layout."""
        if name not in MAR_PRESETS:
            raise ValueError(f"name must be one of {sorted(MAR_PRESETS)}, got {name!r}")
        return cls(**{**MAR_PRESETS[name], **overrides})

    def class_embedding(self, labels: torch.Tensor | None, batch_size: int) -> torch.Tensor:
        """[B, D]: the class embedding of `labels` [B] long, or the learned unconditional latent when None."""
        if labels is None:
            return self.fake_latent.expand(batch_size, -1)
        return self.class_emb(labels)

    def encode_decode(self, tokens: torch.Tensor, mask: torch.Tensor, class_embedding: torch.Tensor,
                      known_tokens: int | None = None) -> torch.Tensor:
        """z [B, L, D_dec] for every position given the known tokens (mask False) of `tokens` [B, L, C].

        Every row must have the same number of known tokens (MAR drops the unknown ones before the encoder);
        known_tokens: that number, when the caller knows it (else it is read from `mask`, a host read, and checked).
        """
        B, L, _ = tokens.shape
        buffer = self.config.buffer_size
        known = torch.cat([torch.ones(B, buffer, dtype=torch.bool, device=mask.device), ~mask], dim=1)  # [B, buffer+L]
        if known_tokens is None:
            counts = known.sum(1) - buffer
            if not bool((counts == counts[0]).all()):
                raise ValueError(f"every row needs the same number of known tokens, got {counts.tolist()}")
            known_tokens = int(counts[0])
        # the known slots' indices in order (a gather of a static count, where x[known] would read the host)
        kept = (~known).long().argsort(dim=1, stable=True)[:, : buffer + known_tokens, None]
        x = self.z_proj(tokens)
        x = torch.cat([class_embedding[:, None].expand(B, buffer, -1).to(x.dtype), x], dim=1)
        x = self.z_proj_ln(x + self.encoder_pos_embed_learned)
        x = x.gather(1, kept.expand(-1, -1, x.shape[-1]))
        for block in self.encoder_blocks:
            x = block(x)
        x = self.decoder_embed(self.encoder_norm(x))
        full = self.mask_token.to(x.dtype).expand(B, buffer + L, -1).clone()
        full.scatter_(1, kept.expand(-1, -1, x.shape[-1]), x)
        x = full + self.decoder_pos_embed_learned
        for block in self.decoder_blocks:
            x = block(x)
        return self.decoder_norm(x)[:, buffer:] + self.diffusion_pos_embed_learned

    def head(self, x_t: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The diffusion head's output [n, 2C] (eps, v) at noisy tokens x_t [n, C], training timesteps t [n]."""
        return self.diffloss.net(x_t, t, z)

    def diffusion_head(self, z: torch.Tensor, z_uncond: torch.Tensor | None = None,
                       guidance_scale: float | torch.Tensor = 1.0) -> MARHead:
        """The head as `mmspec.continuous` samples it, for tokens conditioned on z [n, D_dec] (see `MARHead`)."""
        return MARHead(self, z, z_uncond, guidance_scale)

    @classmethod
    def from_mar_checkpoint(cls, path, name: str | None = None, weights: str = "model_ema",
                            **overrides) -> MARModel:
        """An official `checkpoint-last.pth` (LTH14/mar's model zoo, or a training run's): its EMA weights by default,
        as MAR's evaluation and demo load them (`weights="model"` for the raw ones).

        name: the size (`mar_base`, `mar_large`, `mar_huge`); None reads it from the file (the `args.model` its
        training script saved, else the widths and depths of its weights). `overrides` change any config field.
        """
        checkpoint = load_checkpoint(path)
        state = state_dict_of(checkpoint, Path(path).name, weights=weights)
        saved = getattr(checkpoint.get("args"), "model", None)
        return cls.from_official_state_dict(state, name or (saved if saved in MAR_PRESETS else None),
                                            source=str(path), **overrides)

    @classmethod
    def from_official_state_dict(cls, state_dict: dict[str, torch.Tensor], name: str | None = None,
                                 source: str = "the state dict", **overrides) -> MARModel:
        """A model loaded from an official checkpoint's `model` / `model_ema` weights: the preset `name`, or (None)
        the config the weights imply (`config_from_state_dict`). Every weight is required and every entry must be
        one of the model's."""
        if name is not None and name not in MAR_PRESETS:
            raise ValueError(f"name must be one of {sorted(MAR_PRESETS)}, got {name!r}")
        if name is not None:
            config = MAR_PRESETS[name]
        else:
            heads = {k: overrides[k] for k in ("encoder_num_heads", "decoder_num_heads") if k in overrides}
            config = cls.config_from_state_dict(state_dict, **heads)
        model = cls(**{**config, **overrides})
        load_weights(model, state_dict, source, what=name or "MAR")
        return model

    @staticmethod
    def config_from_state_dict(state_dict: dict[str, torch.Tensor], encoder_num_heads: int | None = None,
                               decoder_num_heads: int | None = None) -> dict:
        """The config official weights imply: widths, depths, sequence and buffer lengths, class count, token
        channels and the head's size are read from the tensors; the attention head counts, unless given, follow
        from the widths (the official sizes: 768 -> 12 heads, 1024 and 1280 -> 16)."""
        def depth(prefix: str) -> int:
            return len({key[len(prefix):].split(".")[0] for key in state_dict if key.startswith(prefix)})

        if "z_proj.weight" not in state_dict:
            raise ValueError("no 'z_proj.weight' among the weights: not a MAR checkpoint")
        width, token_dim = state_dict["z_proj.weight"].shape
        decoder_width = state_dict["decoder_embed.weight"].shape[0]
        seq_len = state_dict["diffusion_pos_embed_learned"].shape[1]
        official = {config["encoder_embed_dim"]: config["encoder_num_heads"] for config in MAR_PRESETS.values()}
        heads = {}
        for what, dim, given in (("encoder", width, encoder_num_heads), ("decoder", decoder_width, decoder_num_heads)):
            if given is None and dim not in official:
                raise ValueError(f"{what} width {dim} is not an official MAR size ({sorted(official)}); pass name= "
                                 f"or {what}_num_heads=")
            heads[what] = given or official[dim]
        return dict(
            seq_len=seq_len, token_dim=token_dim, num_classes=state_dict["class_emb.weight"].shape[0],
            buffer_size=state_dict["encoder_pos_embed_learned"].shape[1] - seq_len,
            encoder_embed_dim=width, encoder_depth=depth("encoder_blocks."), encoder_num_heads=heads["encoder"],
            decoder_embed_dim=decoder_width, decoder_depth=depth("decoder_blocks."),
            decoder_num_heads=heads["decoder"],
            mlp_ratio=state_dict["encoder_blocks.0.mlp.fc1.weight"].shape[0] / width,
            diffloss_d=depth("diffloss.net.res_blocks."),
            diffloss_w=state_dict["diffloss.net.input_proj.weight"].shape[0],
        )


class MARHead:
    """A MAR model's diffusion head as `mmspec.continuous` samples it, for n tokens conditioned on z [n, D_dec].

    With classifier-free guidance (z_uncond [n, D_dec], guidance_scale != 1) both branches run at the conditional
    x_t, eps is guided (uncond + s * (cond - uncond)) and the variance comes from the conditional branch, as LTH14/mar's
    `forward_with_cfg` and sampler do. `rows` [m] picks which of the n tokens each input row belongs to.
    """

    def __init__(self, model: MARModel, z: torch.Tensor, z_uncond: torch.Tensor | None = None,
                 guidance_scale: float | torch.Tensor = 1.0):
        self.model, self.z, self.z_uncond = model, z, z_uncond
        # one per token, on z's device (a step reads it without a host-to-device copy)
        self.guidance_scale = torch.as_tensor(guidance_scale, dtype=torch.float32, device=z.device).expand(z.shape[0])

    def __call__(self, x_t: torch.Tensor, t: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        C = x_t.shape[-1]
        if self.z_uncond is None:
            out = self.model.head(x_t, t, self.z[rows])
            return out[:, :C].float(), out[:, C:].float()
        out = self.model.head(torch.cat([x_t, x_t]), torch.cat([t, t]), torch.cat([self.z[rows], self.z_uncond[rows]]))
        cond, uncond = out.float().chunk(2)
        scale = self.guidance_scale[rows, None]
        return uncond[:, :C] + scale * (cond[:, :C] - uncond[:, :C]), cond[:, C:]
