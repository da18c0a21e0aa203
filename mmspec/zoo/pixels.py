"""Pixels of the embedded worlds: uint8 scenes [N, H, W, 3] <-> the models' range ([-1, 1], [N, 3, H, W]), PSNR, and
the round trips through the zoo's autoencoders that training, the model cards and the benchmarks share."""

from __future__ import annotations

import numpy as np
import torch


def to_model_range(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 [N, H, W, 3] -> float [N, 3, H, W] in [-1, 1]."""
    return torch.as_tensor(images).permute(0, 3, 1, 2).float() / 127.5 - 1


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """float [N, 3, H, W], roughly in [-1, 1] -> uint8 [N, H, W, 3] (clamped, rounded)."""
    return ((images.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1)


def psnr(images: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR [N] in dB between uint8 images [N, H, W, 3], on the [0, 255] scale."""
    mse = (images.double() - reference.double()).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(255.0**2 / mse.clamp_min(1e-10))


@torch.no_grad()
def reconstruct(vq, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images [N, H, W, 3] -> (code ids [N, h*w], uint8 reconstructions [N, H, W, 3]) through a
    `LlamaGenVQModel`."""
    vq.eval()
    grid = (images.shape[1] // vq.downsample_factor, images.shape[2] // vq.downsample_factor)
    ids, recon = [], []
    for chunk in images.split(64):
        ids.append(vq.encode(to_model_range(chunk)))
        recon.append(to_uint8(vq.decode(ids[-1], grid)))
    return torch.cat(ids), torch.cat(recon)


@torch.no_grad()
def mean_latents(vae, images: torch.Tensor) -> torch.Tensor:
    """uint8 images [N, H, W, 3] -> a `KLAutoencoder`'s posterior means [N, C, h, w] on the CPU (the encoder runs on
    the vae's device)."""
    vae.eval()
    device = next(vae.parameters()).device
    return torch.cat([vae.encode(to_model_range(chunk.to(device)))[0].cpu() for chunk in images.split(128)])


@torch.no_grad()
def round_trip(vae, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images [N, H, W, 3] -> (`mean_latents` [N, C, h, w], uint8 reconstructions [N, H, W, 3] decoded from
    them, as MAR's tokens are)."""
    latents = mean_latents(vae, images)
    device = next(vae.parameters()).device
    return latents, torch.cat([to_uint8(vae.decode(chunk.to(device))).cpu() for chunk in latents.split(128)])


def encode_tokens(vae, images: torch.Tensor) -> torch.Tensor:
    """uint8 scenes [N, H, W, 3] -> MAR tokens [N, h*w, C] through a `KLAutoencoder`: scaled `mean_latents`, raster
    order (patch size 1), on the CPU."""
    return (mean_latents(vae, images) * vae.config.scaling_factor).flatten(2).transpose(1, 2)
