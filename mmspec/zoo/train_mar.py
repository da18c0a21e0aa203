"""Train the embedded MAR world offline: a KL autoencoder for 64 px scenes of the shapes world, a class-conditioned
MAR target and a smaller draft MAR over its latents, saved together as the zoo's `mar_shapes` pipeline.

    python -m mmspec.zoo.train_mar                 # every stage below, in order (resumable)
    python -m mmspec.zoo.train_mar --only vae      # KL autoencoder: 64 px -> 8 x 8 x 8 latents (64 MAR tokens)
    python -m mmspec.zoo.train_mar --only tokens   # encode the scene pools (scaled mean latents) and class labels
    python -m mmspec.zoo.train_mar --only target   # class-conditioned MAR target
    python -m mmspec.zoo.train_mar --only draft    # the smaller draft MAR
    python -m mmspec.zoo.train_mar --only export   # write mmspec/zoo/mar_shapes (MARPipeline layout, fp16)

`--device cuda` trains under bfloat16 autocast; `--vae-from mmspec/zoo/mar_shapes` keeps the shipped autoencoder.

Classes: the first object's shape x the background (5 x 6 = 30), read off each scene's caption. Scene pools are the
image world's cached ones (`--work-dir`, shared with `mmspec.zoo.train_image`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mmspec.continuous.diffusion import DiffusionSchedule, training_loss
from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.models.mar import KLAutoencoder, MARModel
from mmspec.zoo import ZOO_DIR
from mmspec.zoo.pixels import encode_tokens, psnr, round_trip, to_model_range
from mmspec.zoo.shapes import class_label
from mmspec.zoo.train_image import add_pool_arguments, load_pools
from mmspec.zoo.training import (
    add_autoencoder_arguments,
    add_minutes_argument,
    add_stage_arguments,
    autoencoder_config,
    budgeted_steps,
    check_minutes,
    copy_stage,
    index_entry,
    save_stage,
    train_loop,
)

logger = logging.getLogger(__name__)

VAE_CONFIG = dict(embed_dim=8, ch=32, ch_mult=(1, 2, 2, 4), num_res_blocks=1, encoder_attn_resolutions=(8,),
                  decoder_attn_resolutions=(), resolution=64)
KL_WEIGHT = 1e-6  # on the summed KL per image, as LDM's KL autoencoders (reconstruction dominates)
X0_CLIP = 6.0  # sampling clamp of x_0 (scaled tokens: |x| < 5.5 for 99.99 % of them); see DiffusionSchedule.x0_clip
MAR_CONFIGS = {
    "target": dict(seq_len=64, num_classes=30, buffer_size=8, encoder_embed_dim=192, encoder_depth=4,
                   encoder_num_heads=6, decoder_embed_dim=192, decoder_depth=4, decoder_num_heads=6, diffloss_d=3,
                   diffloss_w=192, x0_clip=X0_CLIP),
    "draft": dict(seq_len=64, num_classes=30, buffer_size=8, encoder_embed_dim=96, encoder_depth=2,
                  encoder_num_heads=4, decoder_embed_dim=96, decoder_depth=2, decoder_num_heads=4, diffloss_d=2,
                  diffloss_w=128, x0_clip=X0_CLIP),
}
LABEL_DROP = 0.1  # classifier-free guidance: the class is replaced by the unconditional latent this often
DIFFUSION_BATCH_MUL = 4  # noise levels drawn per token and step (MAR's diffusion_batch_mul)
STAGE_SEEDS = {"vae": 11, "target": 12, "draft": 13}


def kl_divergence(mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, exp(logvar)) || N(0, I)) summed over the latent, per image [B]."""
    return 0.5 * (mean.square() + logvar.exp() - 1 - logvar).flatten(1).sum(1)


def vae_metrics(vae: KLAutoencoder, images: torch.Tensor) -> dict:
    """Held-out PSNR of mean-latent reconstructions and the latents' std (MAR scales latents by 1 / std)."""
    latents, recon = round_trip(vae, images)
    return {"held_out_psnr_db": round(psnr(recon, images).mean().item(), 2),
            "latent_std": round(latents.std().item(), 4)}


def train_kl_autoencoder(work: Path, config: dict, name: str, folder: str, pool: torch.Tensor, held_out: torch.Tensor,
                         args, seed: int) -> KLAutoencoder:
    """Train `KLAutoencoder(**config)` on uint8 images pool [N, H, W, 3] (--vae-steps or --vae-minutes,
    --vae-batch-size, --vae-lr; checkpoint `ckpt-<name>.pt`), set its scaling factor to 1 / the held-out latents' std
    and save it in `<work>/<folder>` with its held-out metrics. Shared by the MAR and the video world."""
    torch.manual_seed(args.seed)
    vae = KLAutoencoder(**config)

    def batch_fn(generator):
        return to_model_range(pool[torch.randint(0, len(pool), (args.vae_batch_size,), generator=generator)])

    def loss_fn(model, x):
        mean, logvar = model.encode(x)
        latents = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)
        mse = F.mse_loss(model.decode(latents), x)
        return mse + KL_WEIGHT * kl_divergence(mean, logvar).mean(), mse

    steps = budgeted_steps(name, args.vae_minutes, args.vae_steps, vae, loss_fn, batch_fn, work, args.device)
    seconds = train_loop(name, vae, steps=steps, lr=args.vae_lr, loss_fn=loss_fn, batch_fn=batch_fn, work_dir=work,
                         seed=seed, ckpt_every=args.ckpt_every, weight_decay=0.0, device=args.device)
    metrics = vae_metrics(vae, held_out)
    vae.register_to_config(scaling_factor=round(1 / metrics["latent_std"], 4))
    save_stage(vae, work / folder, metrics, steps, args.vae_batch_size, seconds)
    return vae


def mask_ratios(batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """MAR's masking ratios: a normal of mean 1, std 0.25 truncated to [0.7, 1] (by inverse CDF)."""
    low, high = torch.special.ndtr(torch.tensor((0.7 - 1) / 0.25)), torch.special.ndtr(torch.tensor(0.0))
    u = low + (high - low) * torch.rand(batch_size, generator=generator)
    return 1 + 0.25 * torch.special.ndtri(u)


def mar_loss(model: MARModel, tokens: torch.Tensor, labels: torch.Tensor, generator: torch.Generator,
             schedule: DiffusionSchedule) -> torch.Tensor:
    """MAR's training loss on a batch (tokens [B, L, C] and labels [B] on the model's device; the randomness is drawn
    from the CPU `generator`): random orders, one masking ratio per batch (every row masks as many tokens),
    classes dropped for CFG, the head's hybrid diffusion loss on the masked tokens, DIFFUSION_BATCH_MUL noise levels
    each."""
    B, L, C = tokens.shape
    device = tokens.device
    orders = torch.rand(B, L, generator=generator).argsort(1).to(device)
    n_masked = math.ceil(L * mask_ratios(1, generator).item())
    masked_positions = orders[:, :n_masked]
    mask = torch.zeros(B, L, dtype=torch.bool, device=device).scatter_(1, masked_positions, True)
    drop = (torch.rand(B, generator=generator) < LABEL_DROP).to(device)
    embedding = torch.where(drop[:, None], model.class_embedding(None, B), model.class_embedding(labels, B))
    z = model.encode_decode(tokens, mask, embedding)
    z = z.gather(1, masked_positions[..., None].expand(-1, -1, z.shape[-1])).flatten(0, 1)
    x0 = tokens.gather(1, masked_positions[..., None].expand(-1, -1, C)).flatten(0, 1)
    z, x0 = z.repeat(DIFFUSION_BATCH_MUL, 1), x0.repeat(DIFFUSION_BATCH_MUL, 1)
    t = torch.randint(0, schedule.num_steps, (len(x0),), generator=generator).to(device)
    noise = torch.randn(x0.shape, generator=generator).to(device)

    def predict(x_t, timesteps):
        out = model.head(x_t, timesteps, z)
        return out[:, :C], out[:, C:]

    mse, vb = training_loss(predict, x0, t, noise, schedule)
    return (mse + vb).mean()


def train_mar(work: Path, role: str, args) -> MARModel:
    """Train MAR_CONFIGS[role] on the cached tokens (their channels are its token_dim); saves `<work>/mar_<role>`
    with its held-out loss."""
    data = {split: (torch.from_numpy(np.load(work / f"mar-{split}-tokens.npy")).float(),
                    torch.from_numpy(np.load(work / f"mar-{split}-labels.npy")).long())
            for split in ("train", "heldout")}
    torch.manual_seed(args.seed + STAGE_SEEDS[role])
    model = MARModel(**MAR_CONFIGS[role], token_dim=data["train"][0].shape[-1])
    schedule = DiffusionSchedule.cosine(1000)
    steps, batch_size = getattr(args, f"{role}_steps"), getattr(args, f"{role}_batch_size")

    def batch_fn(generator):
        rows = torch.randint(0, len(data["train"][0]), (batch_size,), generator=generator)
        return data["train"][0][rows], data["train"][1][rows], generator

    def loss_fn(model, batch):
        loss = mar_loss(model, *batch, schedule)
        return loss, loss

    steps = budgeted_steps(f"mar-{role}", getattr(args, f"{role}_minutes"), steps, model, loss_fn, batch_fn, work,
                           args.device)
    seconds = train_loop(f"mar-{role}", model, steps=steps, lr=getattr(args, f"{role}_lr"), loss_fn=loss_fn,
                         batch_fn=batch_fn, work_dir=work, seed=args.seed + STAGE_SEEDS[role],
                         ckpt_every=args.ckpt_every, weight_decay=0.02, device=args.device)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        tokens, labels = (t.to(args.device) for t in data["heldout"])
        held_out = sum(mar_loss(model, tokens[i : i + 64], labels[i : i + 64], generator, schedule).item()
                       for i in range(0, len(tokens), 64)) / math.ceil(len(tokens) / 64)
    save_stage(model, work / f"mar_{role}", {"held_out_loss": round(held_out, 4)}, steps, batch_size, seconds)
    return model


PIPELINE_COMPONENTS = {"vae": ("vae", KLAutoencoder), "transformer": ("target", MARModel),
                       "draft_transformer": ("draft", MARModel)}


def save_pipeline(work: Path, out: Path) -> None:
    """Write the `MARPipeline.from_pretrained` layout (model_index.json + vae/, transformer/, draft_transformer/) with
    fp16 weights and every stage's training metrics. `model_index.json` is written here because the engine does not
    import `pipelines` (docs/architecture.md)."""
    import diffusers

    out.mkdir(parents=True, exist_ok=True)
    index = {"_class_name": "MARPipeline", "_diffusers_version": diffusers.__version__}
    metrics = {}
    for component, (stage, cls) in PIPELINE_COMPONENTS.items():
        # x0_clip: stages trained before it was a config field get it here
        extra = {"x0_clip": X0_CLIP} if cls is MARModel else {}
        cls.from_pretrained(work / f"mar_{stage}", **extra).to(torch.float16).save_pretrained(out / component)
        index[component] = index_entry(cls)
        metrics[stage] = json.loads((work / f"mar_{stage}" / "training_metrics.json").read_text())
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    logger.info("saved the MAR pipeline to %s", out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pool_arguments(parser)
    parser.add_argument("--only", choices=["vae", "tokens", "target", "draft", "export"], default=None)
    parser.add_argument("--out-dir", default=str(ZOO_DIR / "mar_shapes"))
    for stage, steps, lr in (("vae", 2000, 1e-3), ("target", 3000, 1e-3), ("draft", 3000, 1.5e-3)):
        add_stage_arguments(parser, stage, steps, 32, lr)
    for stage in ("vae", *MAR_CONFIGS):
        add_minutes_argument(parser, stage)
    add_autoencoder_arguments(parser, "MAR", VAE_CONFIG)
    add_device_arguments(parser, dtype=False)  # on CUDA the forwards run under bfloat16 autocast
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.device = resolve_device(parser, args.device)
    check_minutes(parser, args, ("vae", *MAR_CONFIGS))
    vae_config = autoencoder_config(parser, args, VAE_CONFIG)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work, (pool, train_captions), (held_out, held_out_captions) = load_pools(args)
    if args.vae_from is not None:
        copy_stage(Path(args.vae_from), "vae", KLAutoencoder, "vae", work / "mar_vae")
    elif args.only in (None, "vae"):
        train_kl_autoencoder(work, vae_config, "vae", "mar_vae", pool, held_out, args, args.seed + STAGE_SEEDS["vae"])
    if args.only in (None, "tokens"):
        vae = KLAutoencoder.from_pretrained(work / "mar_vae").to(args.device)
        for split, images, captions in (("train", pool, train_captions), ("heldout", held_out, held_out_captions)):
            np.save(work / f"mar-{split}-tokens.npy", encode_tokens(vae, images).half().numpy())
            np.save(work / f"mar-{split}-labels.npy", np.array([class_label(c) for c in captions], dtype=np.int16))
            logger.info("encoded %s: %d scenes", split, len(images))
    for role in ("target", "draft"):
        if args.only in (None, role):
            train_mar(work, role, args)
    if args.only in (None, "export"):
        save_pipeline(work, Path(args.out_dir))


if __name__ == "__main__":
    main()
