"""Measure whether the embedded class-to-image MAR model draws the class it is asked, for its model card: its class
accuracy by a small classifier trained on the shapes world, beside two ceilings: the classifier's accuracy on real
held-out scenes, and on the same scenes after a round trip through the pipeline's autoencoder (what a MAR model that
generates its latents perfectly would show), and a grid of samples for docs/images.

Two classifiers read every image: one trained on the rendered scenes, and one trained on their round trips through
the pipeline's autoencoder. Samples are drawn by that autoencoder's decoder, which keeps no pixel noise and blurs
fine stripes; the first classifier, which never saw such images, misreads many that still show their class (it
reads the class of only part of the real scenes' round trips), while the second reads images as the autoencoder
draws them. The card reports both.

    python -m mmspec.eval.mar_zoo_card            # 4 samples of each of the 30 classes (a few minutes on 2 CPU cores)
    python -m mmspec.eval.mar_zoo_card --quick    # 1 sample per class, a shorter classifier training

The classifier is trained once per machine and kept in mmspec's cache (`cached_probe`).

A class of `mar_shapes` is the first object group's shape and the background (`mmspec.zoo.shapes.class_label`). Which
group a caption names first cannot be read from pixels, so an image shows its class when the classifier reads its
background as the class's and finds the class's shape among the objects: the classifier has a background head (6
kinds) and a head per shape that says whether it is present (`ClassProbe`).
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.utils import make_image_grid
from PIL import Image
from torch import nn
from tqdm.auto import tqdm

from mmspec.core.paths import cache_root
from mmspec.eval.devices import write_json
from mmspec.pipelines.mar import MARPipeline
from mmspec.zoo import MAR_C2I
from mmspec.zoo.pixels import round_trip, to_model_range
from mmspec.zoo.shapes import BACKGROUNDS, SHAPES, class_label, parse_caption, scenes

RESULTS = Path("eval") / "results" / "mar_zoo_card.json"
GRID_PATH = Path("docs") / "images" / "mar_classes.png"
CLASSES = len(SHAPES) * len(BACKGROUNDS)


def targets_of(captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(background index [N], shapes present [N, 5] as 0 / 1) of each caption's scene."""
    backgrounds, present = [], torch.zeros(len(captions), len(SHAPES))
    for row, caption in enumerate(captions):
        spec = parse_caption(caption)
        backgrounds.append(BACKGROUNDS.index(spec.background))
        for group in (spec.first, spec.second):
            if group is not None:
                present[row, SHAPES.index(group.shape)] = 1.0
    return torch.tensor(backgrounds), present


def class_of(label: int) -> tuple[int, int]:
    """(shape index, background index) of a `mar_shapes` class label."""
    return divmod(label, len(BACKGROUNDS))


class ClassProbe(nn.Module):
    """A small CNN: background logits [N, 6] and per-shape presence logits [N, 5] of 64 px images in [-1, 1]."""

    def __init__(self):
        super().__init__()
        layers, channels = [], 3
        for width in (32, 64, 128, 128):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.GroupNorm(8, width), nn.SiLU(),
                       nn.Conv2d(width, width, 3, stride=2, padding=1), nn.GroupNorm(8, width), nn.SiLU()]
            channels = width
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.background = nn.Linear(channels, len(BACKGROUNDS))
        self.shapes = nn.Linear(channels, len(SHAPES))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.features(x)
        return self.background(h), self.shapes(h)


def train_probe(scene_count: int, steps: int, seed: int = 0, autoencoder=None) -> ClassProbe:
    """The classifier, trained on `scene_count` rendered training scenes (with `autoencoder`, on their round trips
    through it) for `steps` batches of 64."""
    torch.manual_seed(seed)
    images, captions = scenes(0, scene_count, "train")
    if autoencoder is not None:
        _, images = round_trip(autoencoder, torch.from_numpy(images))
    x, (background, present) = to_model_range(images), targets_of(captions)
    probe = ClassProbe()
    optimizer = torch.optim.AdamW(probe.parameters(), lr=2e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-3, total_steps=steps)
    generator = torch.Generator().manual_seed(seed)
    for _ in tqdm(range(steps), desc="training the classifier"):
        rows = torch.randint(0, len(x), (64,), generator=generator)
        flips = torch.rand(64, generator=generator) < 0.5  # a mirrored scene shows the same class
        batch = torch.where(flips[:, None, None, None], x[rows].flip(-1), x[rows])
        background_logits, shape_logits = probe(batch)
        loss = F.cross_entropy(background_logits, background[rows])
        loss = loss + F.binary_cross_entropy_with_logits(shape_logits, present[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return probe.eval()


PROBE_VERSION = 1  # in the cache's file names: bump it when ClassProbe or its training changes


def fingerprint(module: nn.Module) -> str:
    """12 hex digits that change with any of `module`'s weights."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:12]


def cached_probe(scene_count: int, steps: int, seed: int = 0, autoencoder=None) -> ClassProbe:
    """`train_probe(scene_count, steps, seed, autoencoder)`, trained once per machine (and per autoencoder, told by
    its weights): kept under the mmspec cache ($MMSPEC_CACHE_DIR, default ~/.cache/mmspec) in `probes/`, so a second
    card of a retrained MAR model costs the sampling alone."""
    seen = "" if autoencoder is None else f"-through-{fingerprint(autoencoder)}"
    path = cache_root() / "probes" / f"mar_class_probe-v{PROBE_VERSION}-{scene_count}-{steps}-{seed}{seen}.pt"
    if path.is_file():
        probe = ClassProbe()
        probe.load_state_dict(torch.load(path, weights_only=True))
        return probe.eval()
    probe = train_probe(scene_count, steps, seed, autoencoder)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save(probe.state_dict(), partial)
    partial.replace(path)  # whole or not at all: a run stopped mid-save leaves no probe to load
    return probe


@torch.no_grad()
def shows_class(probe: ClassProbe, images: np.ndarray, labels: list[int]) -> dict[str, np.ndarray]:
    """Per image [N, 64, 64, 3] uint8 and asked class: whether the background matches, the shape is present, both."""
    background_logits, shape_logits = probe(to_model_range(images))
    asked = np.array([class_of(label) for label in labels])
    background = background_logits.argmax(-1).numpy() == asked[:, 1]
    shape = shape_logits.sigmoid().numpy()[np.arange(len(labels)), asked[:, 0]] > 0.5
    return {"background": background, "shape": shape, "class": background & shape}


def shares(found: dict[str, np.ndarray]) -> dict[str, float]:
    return {name: round(float(hit.mean()), 4) for name, hit in found.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-class", type=int, default=4, help="samples of each class")
    parser.add_argument("--num-iter", type=int, default=64, help="MAR steps (the pipeline's default)")
    parser.add_argument("--diffusion-steps", type=int, default=100, help="the pipeline's default")
    parser.add_argument("--guidance-scale", type=float, default=3.0)
    parser.add_argument("--probe-scenes", type=int, default=20000)
    parser.add_argument("--probe-steps", type=int, default=3000)
    parser.add_argument("--quick", action="store_true", help="1 sample per class, 16 MAR steps, a short probe")
    parser.add_argument("--json", default=str(RESULTS), help="where to write the figures")
    parser.add_argument("--image", default=str(GRID_PATH), help="where to write the grid of samples")
    args = parser.parse_args(argv)
    if min(args.per_class, args.num_iter, args.diffusion_steps, args.probe_scenes, args.probe_steps) < 1:
        parser.error("counts must be >= 1")
    if args.quick:
        args.per_class, args.num_iter, args.diffusion_steps = 1, 16, 25
        args.probe_scenes, args.probe_steps = 4000, 400
    pipe = MARPipeline.from_pretrained(MAR_C2I, dtype=torch.float32)
    probe = cached_probe(args.probe_scenes, args.probe_steps)
    round_trip_probe = cached_probe(args.probe_scenes, args.probe_steps, autoencoder=pipe.vae)
    held_images, held_captions = scenes(0, 512, "heldout")
    background, present = targets_of(held_captions)
    with torch.no_grad():
        background_logits, shape_logits = probe(to_model_range(held_images))
    report = {"model": MAR_C2I, "classifier_on_real_held_out_scenes": {
        "background": round(float((background_logits.argmax(-1) == background).float().mean()), 4),
        "shapes_present": round(float(((shape_logits > 0) == present.bool()).float().mean()), 4),
    }}
    held_labels = list(map(class_label, held_captions))
    # the same scenes through the autoencoder: the ceiling of any MAR model that generates its latents
    _, held_recon = round_trip(pipe.vae, torch.from_numpy(held_images))
    ceilings = {"real_held_out_scenes": (held_images, held_labels),
                "autoencoder_round_trip": (held_recon.numpy(), held_labels)}
    report.update({name: shares(shows_class(probe, *read)) for name, read in ceilings.items()})
    through = {name: shares(shows_class(round_trip_probe, *read)) for name, read in ceilings.items()}

    pipe.set_progress_bar_config(disable=True)
    asked = [label for label in range(CLASSES) for _ in range(args.per_class)]
    images = []
    for start in tqdm(range(0, len(asked), 30), desc="sampling the MAR model"):
        chunk = asked[start : start + 30]
        out = pipe(chunk, num_iter=args.num_iter, num_diffusion_steps=args.diffusion_steps,
                   guidance_scale=args.guidance_scale, decoding="ar", output_type="np",
                   generator=[torch.Generator().manual_seed(start + i) for i in range(len(chunk))])
        images.append(np.round(np.asarray(out.images) * 255).clip(0, 255).astype(np.uint8))
    images = np.concatenate(images)
    report["samples"] = {"per_class": args.per_class, "num_iter": args.num_iter,
                         "diffusion_steps": args.diffusion_steps, "guidance_scale": args.guidance_scale,
                         **shares(shows_class(probe, images, asked))}
    through["samples"] = shares(shows_class(round_trip_probe, images, asked))
    report["read_by_the_classifier_trained_on_round_trips"] = through
    print(report)
    write_json(args.json, report)
    first = [Image.fromarray(images[label * args.per_class]) for label in range(CLASSES)]
    Path(args.image).parent.mkdir(parents=True, exist_ok=True)
    make_image_grid(first, rows=len(SHAPES), cols=len(BACKGROUNDS)).save(args.image)
    print(f"wrote {args.json} and {args.image} (rows: {', '.join(SHAPES)}; columns: {', '.join(BACKGROUNDS)})")
    return report


if __name__ == "__main__":
    main()
