"""FID, KID and CLIP score of image sets, offline, computed by torchmetrics with pluggable feature extractors.

Feature spaces (always name the one a number comes from):
- **FD-CLIP** (in-domain): Frechet distance in the image-embedding space of a CLIP model. For the embedded world that is
  the zoo's `shapes_clip`, trained on the synthetic scenes; it is not comparable with published FIDs.
- **FID** (standard): Inception-v3 pool features (`mmspec.eval.inception.FIDInceptionV3`) from a local weights file.

Images are uint8 [N, 3, H, W] tensors throughout (torchmetrics' convention for custom extractors). Features of a set
are extracted once (`image_features`) and compared with any other set's: the FID / KID metrics get them through a
pass-through extractor, so a reference set is never re-encoded. Metrics are computed where they are called (no
cross-process sync: in a sharded run only the main process evaluates).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mmspec.zoo import IMAGE_CLIP, resolve_model


def as_image_tensor(images) -> torch.Tensor:
    """uint8 [N, 3, H, W] from a uint8 tensor of that shape, a uint8 array [N, H, W, 3] or a list of PIL images."""
    if isinstance(images, list):
        images = np.stack([np.asarray(image.convert("RGB")) for image in images])
    if isinstance(images, np.ndarray):
        images = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
        raise TypeError("images: expected uint8 [N, 3, H, W] (tensor), uint8 [N, H, W, 3] (array) or PIL images")
    return images


class CLIPEmbedder(nn.Module):
    """A transformers `CLIPModel` with the interface torchmetrics' CLIPScore calls, safe on transformers 5 (whose
    `get_*_features` return a model output, not a tensor: torchmetrics 1.9.0 then fails on `.norm()`), and a
    feature extractor for FID / KID: forward(uint8 [N, 3, H, W]) -> image embeddings [N, projection_dim].

    The extractor preprocesses in torch as the processor does: bicubic resize of the shortest side (antialiased),
    centre crop, rescale to [0, 1], normalise with the processor's mean and std.
    """

    def __init__(self, model, processor):
        super().__init__()
        self.model, self.processor = model.eval(), processor
        image_processor = processor.image_processor
        self.size = image_processor.size.get("shortest_edge") or image_processor.size["height"]
        self.crop = image_processor.crop_size["height"], image_processor.crop_size["width"]
        self.register_buffer("mean", torch.tensor(image_processor.image_mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(image_processor.image_std).view(1, 3, 1, 1), persistent=False)
        self.num_features = model.config.projection_dim

    @property
    def config(self):
        return self.model.config

    @staticmethod
    def _embedding(output) -> torch.Tensor:
        return output if isinstance(output, torch.Tensor) else output.pooler_output

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self._embedding(self.model.get_image_features(pixel_values=pixel_values))

    def get_text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._embedding(self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask))

    def pixel_values(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.mean.device, torch.float32)
        h, w = x.shape[-2:]
        if min(h, w) != self.size:
            scale = self.size / min(h, w)
            x = F.interpolate(x, size=(round(h * scale), round(w * scale)), mode="bicubic", antialias=True)
        top, left = (x.shape[-2] - self.crop[0]) // 2, (x.shape[-1] - self.crop[1]) // 2
        x = x[..., top : top + self.crop[0], left : left + self.crop[1]]
        return ((x / 255).clamp(0, 1) - self.mean) / self.std

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.get_image_features(self.pixel_values(images))


def load_clip(name_or_path: str | Path = IMAGE_CLIP) -> CLIPEmbedder:
    """A CLIP model folder (`CLIPModel` + `CLIPProcessor` files: a local copy of `openai/clip-vit-large-patch14`, or a
    zoo name such as "shapes_clip") as a CLIPEmbedder in float32, eval mode."""
    from transformers import CLIPModel, CLIPProcessor

    path = resolve_model(name_or_path, argument="clip_model")
    if isinstance(path, Path) and not (path / "config.json").is_file():
        raise ValueError(f"clip_model: {str(path)!r} has no config.json (expected a saved CLIPModel + CLIPProcessor)")
    model = CLIPModel.from_pretrained(path, dtype=torch.float32)
    return CLIPEmbedder(model, CLIPProcessor.from_pretrained(path))


def load_inception(weights: str | Path) -> nn.Module:
    """FID's Inception-v3 from a local `weights-inception-2015-12-05-6726825d.pth` (see `mmspec.eval.inception`)."""
    from mmspec.eval.inception import FIDInceptionV3

    return FIDInceptionV3.from_weights(weights)


@torch.no_grad()
def image_features(extractor: nn.Module, images, batch_size: int = 64) -> torch.Tensor:
    """float64 [N, D] features of uint8 images (see `as_image_tensor`) by `extractor`, in batches."""
    images = as_image_tensor(images)
    device = next(extractor.parameters()).device
    return torch.cat([extractor(chunk.to(device)).double().cpu() for chunk in images.split(batch_size)])


class PassThrough(nn.Module):
    """The 'feature extractor' torchmetrics gets for features that are already extracted: [N, D] -> [N, D]."""

    def __init__(self, num_features: int):
        super().__init__()
        self.num_features = num_features

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features


def _check_pair(real: torch.Tensor, fake: torch.Tensor) -> None:
    if real.dim() != 2 or fake.dim() != 2 or real.shape[1] != fake.shape[1]:
        raise ValueError(f"features: expected [N, D] and [M, D], got {list(real.shape)} and {list(fake.shape)}")
    if min(len(real), len(fake)) < 2:
        raise ValueError(f"FID / KID need at least 2 images per set, got {len(real)} and {len(fake)}")


def frechet_distance(real: torch.Tensor, fake: torch.Tensor) -> float:
    """Frechet distance between Gaussians fitted to two feature sets [N, D], [M, D] (torchmetrics, float64).
    Biased upward at small N (more so for large D): compare values computed at the same N only."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    _check_pair(real, fake)
    metric = FrechetInceptionDistance(feature=PassThrough(real.shape[1]), sync_on_compute=False)
    metric.set_dtype(torch.float64)
    metric.update(real, real=True)
    metric.update(fake, real=False)
    return metric.compute().item()


def kernel_distance(real: torch.Tensor, fake: torch.Tensor, subset_size: int = 1000, subsets: int = 100,
                    seed: int = 0) -> tuple[float, float]:
    """KID (unbiased squared MMD, cubic polynomial kernel): mean and std over `subsets` random subsets of
    min(subset_size, N, M) features per side, drawn reproducibly from `seed` (torchmetrics draws them from the
    global RNG, which is forked here)."""
    from torchmetrics.image.kid import KernelInceptionDistance

    _check_pair(real, fake)
    metric = KernelInceptionDistance(feature=PassThrough(real.shape[1]), subsets=subsets,
                                     subset_size=min(subset_size, len(real), len(fake)), sync_on_compute=False)
    metric.update(real, real=True)
    metric.update(fake, real=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mean, std = metric.compute()
    return mean.item(), std.item()


def paired_mmd_test(a: torch.Tensor, b: torch.Tensor, permutations: int = 2000, seed: int = 0) -> dict:
    """Permutation test of "a and b come from the same law", for paired sets: row i of `a` and of `b` [N, D] are
    features of images made for the same prompt (by two methods, or two seed sets). Statistic: the unbiased MMD^2
    with KID's kernel ((x.y / D + 1)^3). Under the null, swapping the two members of a pair leaves the joint law
    unchanged, so p = (1 + #{permuted >= observed}) / (1 + permutations) is exact at any N — unlike an interval from
    a few seed sets, it needs no normality and no large-N approximation."""
    if a.shape != b.shape or a.dim() != 2 or len(a) < 2:
        raise ValueError(f"features: expected two paired [N, D] sets with N >= 2, got {list(a.shape)} and "
                         f"{list(b.shape)}")
    n = len(a)
    x = torch.cat([a, b]).double()
    kernel = (x @ x.T / x.shape[1] + 1) ** 3
    kernel.fill_diagonal_(0)
    swap = torch.rand(permutations + 1, n, generator=torch.Generator().manual_seed(seed)) < 0.5
    swap[0] = False  # the observed labelling
    in_a = torch.cat([~swap, swap], dim=1).double()  # [P + 1, 2N]: which rows form set a
    in_b = 1 - in_a
    to_a = in_a @ kernel
    mmd2 = ((to_a * in_a).sum(1) + ((in_b @ kernel) * in_b).sum(1)) / (n * (n - 1)) - 2 * (to_a * in_b).sum(1) / n**2
    p_value = (1 + (mmd2[1:] >= mmd2[0]).sum().item()) / (1 + permutations)
    return {"mmd2": mmd2[0].item(), "p_value": p_value}


@torch.no_grad()
def clip_score(embedder: CLIPEmbedder, images, captions: list[str], batch_size: int = 64) -> float:
    """torchmetrics CLIPScore (100 * cosine of image and caption embeddings, floored at 0, averaged) of images for
    their captions, through the callable (model, processor) route."""
    from torchmetrics.multimodal.clip_score import CLIPScore

    images = as_image_tensor(images)
    if len(images) != len(captions):
        raise ValueError(f"captions: expected one per image ({len(images)}), got {len(captions)}")
    metric = CLIPScore(lambda: (embedder, embedder.processor), sync_on_compute=False).to(embedder.mean.device)
    images = images.to(embedder.mean.device)
    for start in range(0, len(captions), batch_size):
        metric.update(list(images[start : start + batch_size]), captions[start : start + batch_size])
    return metric.compute().item()
