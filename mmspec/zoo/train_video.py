"""Train the embedded next-frame world model offline: a per-frame KL autoencoder for the 32 px frames of the video
world (`mmspec.zoo.video_world`) and an action-conditioned next-frame transformer (NFD architecture) trained with flow
matching over its latents, saved together as the zoo's `nextframe_shapes` pipeline.

    python -m mmspec.zoo.train_video                 # every stage below, in order (resumable)
    python -m mmspec.zoo.train_video --only data     # rollouts of random persistent actions (uint8 frames, actions)
    python -m mmspec.zoo.train_video --only vae      # KL autoencoder: 32 px -> 8 x 8 x 4 latents per frame
                                                     # (--latent-channels N: 8 x 8 x N)
    python -m mmspec.zoo.train_video --only latents  # encode every frame (scaled mean latents)
    python -m mmspec.zoo.train_video --only model    # the next-frame transformer (2 x 2 patches: 16 tokens / frame)
    python -m mmspec.zoo.train_video --only export   # write mmspec/zoo/nextframe_shapes (NextFramePipeline, fp16)

`--device cuda` trains under bfloat16 autocast; `--vae-from mmspec/zoo/nextframe_shapes` keeps the shipped
autoencoder.

Training clips are CLIP_FRAMES consecutive frames. Half of them get an independent logit-normal flow time per frame
(diffusion forcing, NFD's training); the other half look like sampling: a prefix of context frames at a small noise
level (the context noise of sampling) followed by a block of frames that share one time (sequential generation is a
block of one, frame speculation a block of N). Frame f's action is the action that led to it; frame 0 gets "stay".
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.models.mar import KLAutoencoder
from mmspec.models.nextframe import NextFrameTransformer
from mmspec.zoo import ZOO_DIR
from mmspec.zoo.pixels import encode_tokens
from mmspec.zoo.train_mar import train_kl_autoencoder
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
from mmspec.zoo.video_world import episode, persistent_actions, rollout

logger = logging.getLogger(__name__)

VAE_CONFIG = dict(embed_dim=4, ch=32, ch_mult=(1, 2, 4), num_res_blocks=1, encoder_attn_resolutions=(8,),
                  decoder_attn_resolutions=(), resolution=32)
MODEL_CONFIG = dict(latent_channels=4, latent_size=8, num_actions=5, dim=192, depth=6, num_heads=6,
                    attention_window=4, patch_size=2)
CLIP_FRAMES = 6  # a frame and up to attention_window frames before it, plus one
ROLLOUT_ACTIONS = 24  # actions per training rollout (25 frames)
ACTION_CHANGE_PROB = 0.25  # of the training rollouts' persistent actions
MAX_CONTEXT_NOISE = 0.2  # context frames of sampling-like clips get a flow time in [0, MAX_CONTEXT_NOISE]
STAGE_SEEDS = {"vae": 21, "model": 22}
ROLLOUT_CHUNK = 250  # episodes per worker task


def make_rollouts(split: str, episodes: int, num_actions: int = ROLLOUT_ACTIONS) -> tuple[np.ndarray, np.ndarray]:
    """(frames [E, T + 1, 32, 32, 3] uint8, per-frame actions [E, T + 1] int8) of episodes 0 .. E - 1 of `split`
    under persistent random actions; frame f's action led to it, frame 0's is "stay" (0)."""
    starts = range(0, episodes, ROLLOUT_CHUNK)
    with ProcessPoolExecutor() as pool:
        chunks = list(tqdm(pool.map(rollout_chunk, starts, [min(s + ROLLOUT_CHUNK, episodes) for s in starts],
                                    repeat(split), repeat(num_actions)), total=len(starts), desc=f"rollouts {split}"))
    return np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks])


def rollout_chunk(start: int, stop: int, split: str, num_actions: int) -> tuple[np.ndarray, np.ndarray]:
    """`make_rollouts` for episodes start .. stop - 1 (one worker's share)."""
    offset = 0 if split == "train" else 10**6  # action seeds disjoint between the splits, as the episodes are
    frames, actions = [], []
    for index in range(start, stop):
        taken = persistent_actions(offset + index, num_actions, ACTION_CHANGE_PROB)
        frames.append(rollout(episode(index, split), taken)[0])
        actions.append([0, *taken])
    return np.stack(frames), np.array(actions, dtype=np.int8)


def encode_frames(vae: KLAutoencoder, frames: np.ndarray) -> torch.Tensor:
    """uint8 frames [E, T, H, W, 3] -> latent tokens [E, T, h*w, C]: scaled mean latents in raster order."""
    tokens = encode_tokens(vae, torch.from_numpy(frames.reshape(-1, *frames.shape[2:])))
    return tokens.reshape(*frames.shape[:2], *tokens.shape[1:])


def clip_timesteps(batch_size: int, frames: int, generator: torch.Generator) -> torch.Tensor:
    """Flow times [B, frames]: half the rows independent logit-normal per frame, half a context prefix at
    U[0, MAX_CONTEXT_NOISE] followed by a block sharing one logit-normal time."""
    independent = torch.sigmoid(torch.randn(batch_size, frames, generator=generator))
    block = torch.sigmoid(torch.randn(batch_size, 1, generator=generator)).expand(-1, frames)
    context = MAX_CONTEXT_NOISE * torch.rand(batch_size, frames, generator=generator)
    prefix = torch.randint(1, frames, (batch_size, 1), generator=generator)
    sampling_like = torch.where(torch.arange(frames)[None] < prefix, context, block)
    return torch.where(torch.rand(batch_size, 1, generator=generator) < 0.5, independent, sampling_like)


def flow_loss(model: NextFrameTransformer, latents: torch.Tensor, actions: torch.Tensor,
              generator: torch.Generator) -> torch.Tensor:
    """Flow matching on clips latents [B, T, L_f, C] under actions [B, T] (on the model's device; the randomness is
    drawn from the CPU `generator`): x_t = (1 - t) x_0 + t eps, target velocity
    eps - x_0. Clips sit at frames 0 .. T - 1: rotary positions are relative, so where a clip came from is moot."""
    B, T = latents.shape[:2]
    t = clip_timesteps(B, T, generator).to(latents.device)
    noise = torch.randn(latents.shape, generator=generator).to(latents.device)
    x_t = (1 - t[..., None, None]) * latents + t[..., None, None] * noise
    velocity, _ = model(x_t, t, actions)
    return F.mse_loss(velocity, noise - latents)


def load_latents(work: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.from_numpy(np.load(work / f"video-{split}-latents.npy")).float(),
            torch.from_numpy(np.load(work / f"video-{split}-actions.npy")).long())


def train_model(work: Path, args) -> NextFrameTransformer:
    """Train the next-frame transformer on random clips of the cached latents (their channels are its
    latent_channels); saves `<work>/video_model` with its held-out loss."""
    torch.manual_seed(args.seed + STAGE_SEEDS["model"])
    latents, actions = load_latents(work, "train")
    model = NextFrameTransformer(**{**MODEL_CONFIG, "latent_channels": latents.shape[-1]})
    E, T = actions.shape

    def batch_fn(generator):
        rows = torch.randint(0, E, (args.model_batch_size, 1), generator=generator)
        frames = torch.randint(0, T - CLIP_FRAMES + 1, (len(rows), 1), generator=generator) + torch.arange(CLIP_FRAMES)
        return latents[rows, frames], actions[rows, frames], generator

    def loss_fn(model, batch):
        loss = flow_loss(model, *batch)
        return loss, loss

    steps = budgeted_steps("video-model", args.model_minutes, args.model_steps, model, loss_fn, batch_fn, work,
                           args.device)
    seconds = train_loop("video-model", model, steps=steps, lr=args.model_lr, loss_fn=loss_fn,
                         batch_fn=batch_fn, work_dir=work, seed=args.seed + STAGE_SEEDS["model"],
                         ckpt_every=args.ckpt_every, weight_decay=0.02, device=args.device)
    held_latents, held_actions = (t.to(args.device) for t in load_latents(work, "heldout"))
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        losses = [flow_loss(model, held_latents[i : i + 64, :CLIP_FRAMES], held_actions[i : i + 64, :CLIP_FRAMES],
                            generator).item() for i in range(0, len(held_latents), 64)]
    save_stage(model, work / "video_model", {"held_out_loss": round(sum(losses) / len(losses), 4)}, steps,
               args.model_batch_size, seconds)
    return model


PIPELINE_COMPONENTS = {"vae": ("video_vae", KLAutoencoder), "transformer": ("video_model", NextFrameTransformer)}


def save_pipeline(work: Path, out: Path) -> None:
    """Write the `NextFramePipeline.from_pretrained` layout (model_index.json + vae/, transformer/) with fp16 weights
    and every stage's training metrics (model_index.json is written here: the engine does not import `pipelines`)."""
    import diffusers

    out.mkdir(parents=True, exist_ok=True)
    index = {"_class_name": "NextFramePipeline", "_diffusers_version": diffusers.__version__}
    metrics = {}
    for component, (stage, cls) in PIPELINE_COMPONENTS.items():
        cls.from_pretrained(work / stage).to(torch.float16).save_pretrained(out / component)
        index[component] = index_entry(cls)
        metrics[stage] = json.loads((work / stage / "training_metrics.json").read_text())
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    logger.info("saved the next-frame pipeline to %s", out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["data", "vae", "latents", "model", "export"], default=None)
    parser.add_argument("--work-dir", default=str(Path.home() / ".cache" / "mmspec" / "train_video"))
    parser.add_argument("--out-dir", default=str(ZOO_DIR / "nextframe_shapes"))
    parser.add_argument("--train-episodes", type=int, default=3000)
    parser.add_argument("--held-out-episodes", type=int, default=256)
    add_stage_arguments(parser, "vae", 1500, 32, 1e-3)
    add_stage_arguments(parser, "model", 3500, 32, 6e-4)
    for stage in ("vae", "model"):
        add_minutes_argument(parser, stage)
    add_autoencoder_arguments(parser, "next-frame", VAE_CONFIG)
    add_device_arguments(parser, dtype=False)  # on CUDA the forwards run under bfloat16 autocast
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.device = resolve_device(parser, args.device)
    check_minutes(parser, args, ("vae", "model"))
    vae_config = autoencoder_config(parser, args, VAE_CONFIG)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    splits = {"train": args.train_episodes, "heldout": args.held_out_episodes}
    if args.only in (None, "data"):
        for split, episodes in splits.items():
            frames, actions = make_rollouts(split, episodes)
            np.save(work / f"video-{split}-frames.npy", frames)
            np.save(work / f"video-{split}-actions.npy", actions)
    if args.vae_from is not None:
        copy_stage(Path(args.vae_from), "vae", KLAutoencoder, "video_vae", work / "video_vae")
    elif args.only in (None, "vae"):
        frames = {split: np.load(work / f"video-{split}-frames.npy") for split in splits}
        pool = torch.from_numpy(frames["train"].reshape(-1, *frames["train"].shape[2:]))
        held_out = torch.from_numpy(frames["heldout"][:, :: math.ceil(ROLLOUT_ACTIONS / 4)].reshape(
            -1, *frames["heldout"].shape[2:]))
        train_kl_autoencoder(work, vae_config, "video-vae", "video_vae", pool, held_out, args,
                             args.seed + STAGE_SEEDS["vae"])
    if args.only in (None, "latents"):
        vae = KLAutoencoder.from_pretrained(work / "video_vae").to(args.device)
        for split in splits:
            tokens = encode_frames(vae, np.load(work / f"video-{split}-frames.npy"))
            np.save(work / f"video-{split}-latents.npy", tokens.half().numpy())
            logger.info("encoded %s: %s", split, tuple(tokens.shape))
    if args.only in (None, "model"):
        train_model(work, args)
    if args.only in (None, "export"):
        save_pipeline(work, Path(args.out_dir))


if __name__ == "__main__":
    main()
