"""Continuous speculative decoding benchmark on the embedded MAR pair (mmspec/zoo/mar_shapes), in one process.

    python -m mmspec.eval.bench_continuous          # full: 8 images at batch 1, 128 at batch 8, FD on the latter
    python -m mmspec.eval.bench_continuous --quick  # under 10 minutes on 2 CPU cores: 2 and 16 images
    python -m mmspec.eval.bench_continuous --json eval/results/bench_continuous.json --grid docs/images/mar_samples.png

Every method generates the same classes (those of the first held-out scenes) with the same per-image seeds (image i:
seed 1000 + i), 64 AR steps (one token each), 100 diffusion steps, CFG 3 (MAR's linear schedule), temperature 1,
gamma 16, pre-fill 5 % of the steps (CSpD's demo setting), after an untimed warm-up call of each method:

    ar            the target alone on MAR's cosine schedule of `num_iter` steps: the baseline
    exact         speculative, exact trajectory-level acceptance: samples the target on the *coarsened* schedule
    paper         speculative, the released CSpD rule: approximate, not distribution-preserving
    ar_coarsened  the target alone on the coarsened schedule: the law `exact` samples, at the target's own cost
    draft         the draft alone on the cosine schedule: the quality floor of accepting every draft

Columns: target / draft encoder-decoder passes per call, acceptance rate of drafted tokens, mean residual proposals per
rejected token (and fallbacks at the try cap), median latency of a call, speedup of that median against `ar` at the
same batch size, and FD-CLIP: the Frechet distance between in-domain CLIP features (mmspec/zoo/shapes_clip) of the
batch-8 images and of the real held-out scenes they were asked for (a "vae reconstruction" row gives the autoencoder's
floor; FD is biased upward at small N, so compare rows of one run only). `--grid` saves, for the first 8 batch-8
images, a row per image: the real held-out scene, then each method's sample (same class and seed).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from mmspec.continuous.mar_decoding import coarsen, cosine_plan
from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.core.stats import synchronize
from mmspec.eval.devices import machine, seeded, write_json
from mmspec.pipelines.mar import MARPipeline
from mmspec.zoo import MAR_C2I
from mmspec.zoo.pixels import encode_tokens
from mmspec.zoo.shapes import class_label, scenes

METHODS = ("ar", "exact", "paper", "ar_coarsened", "draft")


@dataclass
class Row:
    method: str
    batch_size: int
    target_passes: float
    draft_passes: float
    acceptance_rate: float | None
    mean_residual_tries: float | None
    fallbacks: int
    median_latency_s: float
    speedup_vs_ar: float = 1.0


def method_options(method: str, pipes: dict, args) -> tuple[object, dict]:
    """(the pipeline to call, its keyword arguments) for a method; pipes: {"target": pipeline with its draft,
    "draft": the draft alone}."""
    common = dict(num_iter=args.num_iter, num_diffusion_steps=args.diffusion_steps, guidance_scale=args.guidance)
    speculative = dict(decoding="speculative", gamma=args.gamma, prefill_ratio=args.prefill_ratio)
    plan = cosine_plan(pipes["target"].transformer.config.seq_len, args.num_iter)
    n_prefill = math.floor(args.num_iter * args.prefill_ratio)
    if method == "ar":
        return pipes["target"], common
    if method in ("exact", "paper"):
        return pipes["target"], {**common, **speculative, "acceptance": method}
    if method == "ar_coarsened":
        return pipes["target"], {**common, "plan": coarsen(plan, n_prefill, args.gamma)}
    if method == "draft":
        return pipes["draft"], common
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def run(method: str, pipes: dict, labels: list[int], batch_size: int, args) -> tuple[Row, np.ndarray]:
    """Generate one image per label in batches; returns the row and the images uint8 [N, H, W, 3]."""
    pipe, options = method_options(method, pipes, args)
    pipe(labels[:batch_size], generator=seeded(pipe.device, [0])[0], output_type="latent", **options)  # warm-up
    latencies, images, totals = [], [], dict(target=0, draft=0, drafted=0, accepted=0, fallbacks=0)
    tries = []
    for start in range(0, len(labels), batch_size):
        batch = labels[start : start + batch_size]
        generators = seeded(pipe.device, range(1000 + start, 1000 + start + len(batch)))
        began = time.perf_counter()
        out = pipe(batch, generator=generators, output_type="np", **options)
        synchronize(pipe.device)
        latencies.append(time.perf_counter() - began)
        images.append((out.images * 255).round().astype(np.uint8))
        stats = out.stats
        totals["target"] += stats.target_forwards
        totals["draft"] += stats.draft_forwards
        totals["drafted"] += stats.drafted
        totals["accepted"] += stats.accepted
        totals["fallbacks"] += stats.fallbacks
        if stats.residual_tries is not None:
            tries.append(stats.residual_tries)
    calls = len(latencies)
    speculative = options.get("decoding") == "speculative"
    all_tries = torch.cat(tries) if tries else torch.zeros(0)
    row = Row(method, batch_size, totals["target"] / calls, totals["draft"] / calls,
              totals["accepted"] / max(1, totals["drafted"]) if speculative else None,
              all_tries.double().mean().item() if speculative and all_tries.numel() else None,
              totals["fallbacks"], statistics.median(latencies))
    return row, np.concatenate(images)


def fd_clip(images: np.ndarray, reference_features: torch.Tensor, clip) -> float:
    from mmspec.eval.metrics import frechet_distance, image_features

    return frechet_distance(reference_features, image_features(clip, images))


def vae_reconstructions(pipe, real: np.ndarray) -> np.ndarray:
    """The autoencoder's round trip of the real scenes (mean latents), uint8 [N, H, W, 3]."""
    tokens = encode_tokens(pipe.vae, torch.from_numpy(real).to(pipe.device))
    return (pipe.decode_tokens(tokens, "np") * 255).round().astype(np.uint8)


def print_table(rows: list[Row], fds: dict[str, float]) -> None:
    def cell(value, digits=2):
        return "–" if value is None else f"{value:.{digits}f}"

    print("| method | batch | target passes | draft passes | acceptance | residual tries (fallbacks) | "
          "median latency (s) | speedup vs ar | FD-CLIP |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        tries = "–" if row.mean_residual_tries is None else f"{row.mean_residual_tries:.2f} ({row.fallbacks})"
        fd = cell(fds.get(row.method)) if row.batch_size == max(r.batch_size for r in rows) else ""
        print(f"| {row.method} | {row.batch_size} | {row.target_passes:.1f} | {row.draft_passes:.1f} | "
              f"{cell(row.acceptance_rate, 3)} | {tries} | {row.median_latency_s:.3f} | {row.speedup_vs_ar:.2f} | "
              f"{fd} |")
    if "vae_reconstruction" in fds:
        print(f"| vae reconstruction (floor) | | | | | | | | {fds['vae_reconstruction']:.2f} |")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=MAR_C2I, help="zoo name or saved MARPipeline folder")
    parser.add_argument("--quick", action="store_true", help="2 images at batch 1, 16 at batch 8")
    parser.add_argument("--images-bs1", type=int, default=8)
    parser.add_argument("--images-bs8", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--num-iter", type=int, default=64)
    parser.add_argument("--diffusion-steps", type=int, default=100)
    parser.add_argument("--gamma", type=int, default=16)
    parser.add_argument("--prefill-ratio", type=float, default=0.05)
    parser.add_argument("--guidance", type=float, default=3.0)
    parser.add_argument("--no-fd", action="store_true", help="skip FD-CLIP")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--grid", type=Path, default=None, help="PNG: real scene + each method's sample, 8 rows")
    add_device_arguments(parser, dtype=False)
    args = parser.parse_args(argv)
    device = resolve_device(parser, args.device)
    if args.quick:
        args.images_bs1, args.images_bs8 = 2, 16
    target = MARPipeline.from_pretrained(args.model, dtype=torch.float32).to(device)
    pipes = {"target": target, "draft": MARPipeline(target.draft_transformer, target.vae)}
    real, captions = scenes(0, max(args.images_bs1, args.images_bs8), "heldout")
    labels = [class_label(c) for c in captions]

    rows, fds, images_bs8 = [], {}, {}
    for batch_size, count in ((1, args.images_bs1), (8, args.images_bs8)):
        for method in args.methods if count else ():
            row, images = run(method, pipes, labels[:count], batch_size, args)
            rows.append(row)
            if batch_size == 8:
                images_bs8[method] = images
            print(f"{method} bs {batch_size}: {row.median_latency_s:.3f} s / call", flush=True)
    for row in rows:
        ar = next((r for r in rows if r.method == "ar" and r.batch_size == row.batch_size), None)
        row.speedup_vs_ar = math.nan if ar is None else ar.median_latency_s / row.median_latency_s
    if not args.no_fd and args.images_bs8 >= 2:
        from mmspec.eval.metrics import image_features, load_clip

        clip = load_clip()
        reference = image_features(clip, real[: args.images_bs8])
        for method, images in images_bs8.items():
            fds[method] = fd_clip(images, reference, clip)
        fds["vae_reconstruction"] = fd_clip(vae_reconstructions(target, real[: args.images_bs8]), reference, clip)
    print_table(rows, fds)
    if args.grid and images_bs8:
        from diffusers.utils import make_image_grid
        from PIL import Image

        columns = [real] + list(images_bs8.values())
        shown = min(8, args.images_bs8)
        tiles = [Image.fromarray(column[i]) for i in range(shown) for column in columns]
        args.grid.parent.mkdir(parents=True, exist_ok=True)
        grid = make_image_grid(tiles, rows=shown, cols=len(columns))
        grid.resize((64 * 2 * len(columns), 64 * 2 * shown), Image.NEAREST).save(args.grid)

    settings = {k: v for k, v in vars(args).items() if k not in ("json", "grid")}
    result = {"settings": settings, **machine(device),
              "rows": [asdict(r) for r in rows], "fd_clip": fds}
    for row in rows:  # e.g. exact_speedup_vs_target_bs1: against the target alone on the cosine schedule ("ar")
        if row.method != "ar":
            result[f"{row.method}_speedup_vs_target_bs{row.batch_size}"] = round(row.speedup_vs_ar, 4)
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
