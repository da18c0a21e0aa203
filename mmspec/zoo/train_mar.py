"""Train the embedded MAR world offline: a KL autoencoder for 64 px scenes of the shapes world, then (next stages) a
class-conditioned MAR target and a smaller draft over its latents.

    python -m mmspec.zoo.train_mar --only vae      # KL autoencoder: 64 px -> 8 x 8 x 8 latents (64 MAR tokens)

Classes: the first object's shape x the background (5 x 6 = 30), read off each scene's caption. Scene pools are the
image world's cached ones (`--work-dir`, shared with `mmspec.zoo.train_image`).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch
import torch.nn.functional as F

from mmspec.models.mar import KLAutoencoder
from mmspec.zoo.shapes import BACKGROUNDS, SHAPES, parse_caption
from mmspec.zoo.train_image import add_pool_arguments, load_pools, psnr, to_model_range, to_uint8
from mmspec.zoo.training import train_loop

logger = logging.getLogger(__name__)

VAE_CONFIG = dict(embed_dim=8, ch=32, ch_mult=(1, 2, 2, 4), num_res_blocks=1, encoder_attn_resolutions=(8,),
                  decoder_attn_resolutions=(), resolution=64)
KL_WEIGHT = 1e-6  # on the summed KL per image, as LDM's KL autoencoders (reconstruction dominates)
STAGE_SEEDS = {"vae": 11}


def class_label(caption: str) -> int:
    """The scene's class: first object's shape x background, 0 .. 29."""
    spec = parse_caption(caption)
    return SHAPES.index(spec.first.shape) * len(BACKGROUNDS) + BACKGROUNDS.index(spec.background)


def kl_divergence(mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, exp(logvar)) || N(0, I)) summed over the latent, per image [B]."""
    return 0.5 * (mean.square() + logvar.exp() - 1 - logvar).flatten(1).sum(1)


@torch.no_grad()
def vae_metrics(vae: KLAutoencoder, images: torch.Tensor) -> dict:
    """Held-out PSNR of mean-latent reconstructions and the latents' std (MAR scales latents by 1 / std)."""
    vae.eval()
    recon, latents = [], []
    for chunk in images.split(128):
        mean, _ = vae.encode(to_model_range(chunk))
        latents.append(mean)
        recon.append(to_uint8(vae.decode(mean)))
    latents = torch.cat(latents)
    return {"held_out_psnr_db": round(psnr(torch.cat(recon), images).mean().item(), 2),
            "latent_std": round(latents.std().item(), 4)}


def train_vae(work: Path, pool: torch.Tensor, held_out: torch.Tensor, args) -> KLAutoencoder:
    torch.manual_seed(args.seed)
    vae = KLAutoencoder(**VAE_CONFIG)

    def batch_fn(generator):
        return to_model_range(pool[torch.randint(0, len(pool), (args.vae_batch_size,), generator=generator)])

    def loss_fn(model, x):
        mean, logvar = model.encode(x)
        latents = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)
        mse = F.mse_loss(model.decode(latents), x)
        return mse + KL_WEIGHT * kl_divergence(mean, logvar).mean(), mse

    seconds = train_loop("vae", vae, steps=args.vae_steps, lr=args.vae_lr, loss_fn=loss_fn, batch_fn=batch_fn,
                         work_dir=work, seed=args.seed + STAGE_SEEDS["vae"], ckpt_every=args.ckpt_every,
                         weight_decay=0.0)
    metrics = vae_metrics(vae, held_out)
    vae.register_to_config(scaling_factor=round(1 / metrics["latent_std"], 4))
    metrics.update(parameters=sum(p.numel() for p in vae.parameters()), steps=args.vae_steps,
                   batch_size=args.vae_batch_size, train_cpu_seconds=round(seconds, 1))
    logger.info("vae: %s", metrics)
    vae.save_pretrained(work / "mar_vae")
    (work / "mar_vae" / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return vae


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pool_arguments(parser)
    parser.add_argument("--only", choices=["vae"], default=None)
    parser.add_argument("--vae-steps", type=int, default=3000)
    parser.add_argument("--vae-batch-size", type=int, default=32)
    parser.add_argument("--vae-lr", type=float, default=1e-3)
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work, (pool, _), (held_out, _) = load_pools(args)
    if args.only in (None, "vae"):
        train_vae(work, pool, held_out, args)


if __name__ == "__main__":
    main()
