"""Measure the embedded text-to-image model for its model card: VQ reconstruction PSNR, AR latency per image, mean
per-token entropy of the sampling law, held-out caption match, and a sample grid.

    python -m mmspec.eval.image_zoo_card          # full run (~10 min on 2 CPU cores)
    python -m mmspec.eval.image_zoo_card --quick  # fewer captions and repeats

Caption match: a small CNN probe is trained (a few minutes, seeded) on rendered *training* scenes to read four
attributes back from pixels: background kind, and count, colour and shape of the first object group. It is then
applied to real held-out scenes (its own accuracy, the ceiling) and to images generated for the same held-out
captions; an attribute matches when the probe reads back what the caption says. Chance is 1/6, 1/3, 1/8, 1/5.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.utils import make_image_grid
from torch import nn

from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.eval.devices import write_json
from mmspec.pipelines.auto import AutoARImagePipeline
from mmspec.zoo import IMAGE_T2I
from mmspec.zoo.pixels import psnr, reconstruct, to_model_range, to_uint8
from mmspec.zoo.shapes import BACKGROUNDS, COLORS, SHAPES, parse_caption, scenes

# outputs, relative to the working directory (the repository root regenerates the committed files)
RESULTS = Path("eval") / "results"
GRID_PATH = Path("docs") / "images" / "shapes_samples.png"
ATTRIBUTES = {
    "background": (BACKGROUNDS, lambda spec: spec.background),
    "count": ((1, 2, 3), lambda spec: spec.first.count),
    "color": (tuple(COLORS), lambda spec: spec.first.color),
    "shape": (SHAPES, lambda spec: spec.first.shape),
}


def labels_of(captions: list[str]) -> torch.Tensor:
    """[N, 4] class indices of the probed attributes."""
    rows = []
    for caption in captions:
        spec = parse_caption(caption)
        rows.append([choices.index(read(spec)) for choices, read in ATTRIBUTES.values()])
    return torch.tensor(rows)


class CaptionProbe(nn.Module):
    """A small CNN with one classification head per attribute."""

    def __init__(self):
        super().__init__()
        layers, channels = [], 3
        for width in (32, 64, 128, 128):
            layers += [nn.Conv2d(channels, width, 3, stride=2, padding=1), nn.GroupNorm(8, width), nn.SiLU()]
            channels = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.heads = nn.ModuleList(nn.Linear(channels, len(choices)) for choices, _ in ATTRIBUTES.values())

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.features(x)
        return [head(h) for head in self.heads]


def train_probe(n_scenes: int, steps: int, seed: int = 0) -> CaptionProbe:
    torch.manual_seed(seed)
    images, captions = scenes(0, n_scenes, "train")
    x, y = to_model_range(images), labels_of(captions)
    probe = CaptionProbe()
    optimizer = torch.optim.AdamW(probe.parameters(), lr=2e-3)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        rows = torch.randint(0, len(x), (64,), generator=generator)
        logits = probe(x[rows])
        loss = sum(F.cross_entropy(out, y[rows, i]) for i, out in enumerate(logits))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return probe.eval()


@torch.no_grad()
def probe_accuracy(probe: CaptionProbe, images, captions: list[str]) -> dict[str, float]:
    predictions = [out.argmax(-1) for out in probe(to_model_range(images))]
    labels = labels_of(captions)
    return {name: round((pred == labels[:, i]).float().mean().item(), 3) for i, (name, pred) in
            enumerate(zip(ATTRIBUTES, predictions, strict=True))}


@torch.no_grad()
def mean_token_entropy(pipe, captions: list[str], tokens: torch.Tensor, guidance_scale: float) -> float:
    """Mean entropy (nats) of the temperature-1 sampling law at each generated position (teacher-forced)."""
    condition = pipe.encode_prompt(captions)
    model = pipe.transformer
    cond = model(tokens, condition.states, condition.mask)
    uncond = None
    if guidance_scale != 1.0:
        uncond = model(tokens, model.unconditional(len(captions), tokens.device),
                       model.unconditional_mask(condition.mask))
    p = process_logits(cond, SamplingConfig(guidance_scale=guidance_scale), uncond)
    return (-(p * p.clamp_min(1e-30).log()).sum(-1)).mean().item()


@torch.no_grad()
def generate_for(pipe, captions: list[str], guidance_scale: float) -> tuple[torch.Tensor, np.ndarray]:
    """One image per caption (seed = its index), in batches of 8: (tokens [N, h*w], uint8 images [N, H, W, 3])."""
    tokens, images = [], []
    for start in range(0, len(captions), 8):
        chunk = captions[start : start + 8]
        gens = [torch.Generator().manual_seed(start + i) for i in range(len(chunk))]
        out = pipe(chunk, guidance_scale=guidance_scale, generator=gens, output_type="latent", decoding="sjd")
        pixels = pipe.vqvae.decode(out.images, (pipe.transformer.config.grid_size,) * 2)
        tokens.append(out.images)
        images.append(to_uint8(pixels).numpy())
    return torch.cat(tokens), np.concatenate(images)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=IMAGE_T2I)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--guidance-scale", type=float, default=3.0)
    parser.add_argument("--json", default=str(RESULTS / "image_zoo_card.json"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    n_captions, repeats = (16, 2) if args.quick else (64, 5)

    pipe = AutoARImagePipeline.from_pretrained(args.model, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    held_images, held_captions = scenes(0, max(n_captions, 256), "heldout")
    report = {"model": args.model, "guidance_scale": args.guidance_scale}
    _, reconstructed = reconstruct(pipe.vqvae, torch.from_numpy(held_images))
    report["vq_held_out_psnr_db"] = round(psnr(reconstructed, torch.from_numpy(held_images)).mean().item(), 2)

    # latency: batch 1, default sampling, warm-up first
    prompt = held_captions[0]
    pipe(prompt, guidance_scale=args.guidance_scale, generator=torch.Generator().manual_seed(0), decoding="ar")
    times = []
    for seed in range(repeats):
        start = time.perf_counter()
        pipe(prompt, guidance_scale=args.guidance_scale, generator=torch.Generator().manual_seed(seed), decoding="ar")
        times.append(time.perf_counter() - start)
    report["ar_seconds_per_image_bs1"] = round(statistics.median(times), 3)

    # generate one image per held-out caption, with and without guidance; probe what the images show
    captions = held_captions[:n_captions]
    probe = train_probe(n_scenes=2000 if args.quick else 8000, steps=150 if args.quick else 800)
    report["mean_token_entropy_nats"] = {}
    report["caption_match"] = {
        "real_held_out_images": probe_accuracy(probe, held_images[:n_captions], captions),
        "vq_reconstructed_held_out_images": probe_accuracy(probe, reconstructed[:n_captions], captions),
        "chance": {name: round(1 / len(choices), 3) for name, (choices, _) in ATTRIBUTES.items()},
    }
    for guidance_scale in sorted({args.guidance_scale, 1.0}, reverse=True):
        tokens, images = generate_for(pipe, captions, guidance_scale)
        key = f"cfg_{guidance_scale:g}" if guidance_scale != 1.0 else "cfg_off"
        report["mean_token_entropy_nats"][key] = round(mean_token_entropy(pipe, captions, tokens, guidance_scale), 3)
        report["caption_match"][f"generated_{key}"] = probe_accuracy(probe, images, captions)

    if not args.quick:  # sample grid: a real held-out scene, then 4 samples for its caption
        from PIL import Image

        rows = []
        for i in range(6):
            gens = [torch.Generator().manual_seed(100 + 4 * i + j) for j in range(4)]
            samples = pipe(captions[i], num_images_per_prompt=4, guidance_scale=args.guidance_scale,
                           generator=gens, decoding="sjd").images
            rows += [Image.fromarray(held_images[i]), *samples]
        GRID_PATH.parent.mkdir(parents=True, exist_ok=True)
        grid = make_image_grid(rows, rows=6, cols=5)
        grid.resize((grid.width * 2, grid.height * 2), Image.NEAREST).save(GRID_PATH)
        report["grid_captions"] = captions[:6]

    write_json(args.json, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
