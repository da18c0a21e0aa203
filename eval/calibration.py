"""Token-level exactness of generated images: are their tokens draws from the model's own conditional laws?

    python -m mmspec.eval.calibration eval/out/quality/ar/set0 eval/out/quality/tree/set0   # folders of the store

For an exact sampler every token x_i of an image is a draw from p(. | prompt, x_<i), the model's processed law (CFG,
temperature, top-k / top-p as the image was made). With the vocabulary ordered by that law's probabilities (largest
first), the randomized probability integral transform u_i = F(x_i) - U p(x_i), U uniform, is then uniform on [0, 1]
and independent across positions, whatever the model: one teacher-forced pass per image gives all N of them. A
sampler that sharpens the law (prefers likely tokens) pushes u towards 0, one that flattens it towards 1. Per folder
(images of `mmspec.eval.samples.SampleStore`, whose records keep the prompt and the token ids, and whose
`method.json` the sampling settings): the mean of u (0.5 under exactness, with its standard error), the mean over
the first and the last quarter of the positions, and the Kolmogorov-Smirnov test of all u against uniform. This
tests each conditional given the image's own prefix, N times per image, so a few dozen images already test
thousands of draws, where an image-level test of the joint law (`quality`'s permutation test) has one per image;
and the correlation of u at neighbouring positions (0 under exactness), which catches randomness reused across
positions, which uniform u alone would not.
LlamaGen pipelines (a teacher-forced forward).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from scipy.stats import kstest

from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.eval.devices import write_json
from mmspec.pipelines.auto import add_image_model_arguments, image_pipeline_from_arguments


def read_folder(folder: Path) -> tuple[list[str], torch.Tensor, dict]:
    """(prompts, token ids [images, N], the store's sampling settings) of a store folder (`<label>/set<s>`)."""
    images = sorted(folder.glob("*.png"))
    spec = folder.parent / "method.json"
    if not images or not spec.exists():
        raise ValueError(f"{folder}: not a sample-store folder (PNGs of one method and seed set, method.json beside)")
    prompts, tokens = [], []
    for path in images:
        with Image.open(path) as image:
            record = json.loads(image.text["mmspec"])
        prompts.append(record["prompt"])
        tokens.append([int(t) for t in record["token_ids"].split()])
    return prompts, torch.tensor(tokens), json.loads(spec.read_text())["sampling"]


@torch.no_grad()
def pit_values(pipe, prompts: list[str], tokens: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator, batch_size: int = 16) -> np.ndarray:
    """u [images, N] float64 of image tokens [images, N] under `pipe.transformer`'s processed conditional laws."""
    model, values = pipe.transformer, []
    for start in range(0, len(prompts), batch_size):
        ids = tokens[start : start + batch_size].to(pipe.device)
        condition = pipe.encode_prompt(prompts[start : start + batch_size], None, None)
        uncond = None
        if sampling.guidance_scale != 1.0:
            null = model.unconditional(len(ids), ids.device)
            uncond = model(ids, null, model.unconditional_mask(condition.mask))
        probs = process_logits(model(ids, condition.states, condition.mask), sampling, uncond).double()  # [b, N, V]
        ordered, order = probs.sort(-1, descending=True)
        rank = order.argsort(-1).gather(-1, ids[..., None])  # [b, N, 1]: x's place in the ordered vocabulary
        upper = ordered.cumsum(-1).gather(-1, rank).squeeze(-1)
        p = ordered.gather(-1, rank).squeeze(-1)
        values.append(upper.cpu() - torch.rand(p.shape, generator=generator, dtype=torch.float64) * p.cpu())
    return torch.cat(values).numpy()


def summary(u: np.ndarray) -> dict:
    """The figures of u [images, N]. lag1_correlation: of u at neighbouring positions of an image (0 under
    exactness, with its standard error 1 / sqrt(pairs)): uniform u at every position can still come from a sampler
    that reuses its randomness across positions, which keeps each conditional and breaks the joint law."""
    quarter = u.shape[1] // 4
    centred = u - 0.5
    pairs = centred[:, 1:] * centred[:, :-1]
    return {"images": u.shape[0], "draws": u.size, "mean_u": round(float(u.mean()), 4),
            "standard_error": round(float(u.std() / np.sqrt(u.size)), 4),
            "mean_u_first_quarter": round(float(u[:, :quarter].mean()), 4),
            "mean_u_last_quarter": round(float(u[:, -quarter:].mean()), 4),
            "ks_p": float(kstest(u.ravel(), "uniform").pvalue),
            "lag1_correlation": round(float(12 * pairs.mean()), 4),  # var(u) = 1 / 12 under exactness
            "lag1_standard_error": round(float(1 / np.sqrt(pairs.size)), 4)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="store folders <out-dir>/<label>/set<s>")
    add_image_model_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="of the U draws")
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args(argv)
    stores = {}
    for folder in args.folders:
        try:
            stores[folder] = read_folder(folder)
        except ValueError as error:
            parser.error(str(error))
    pipe = image_pipeline_from_arguments(args)
    if not hasattr(pipe, "transformer") or not hasattr(pipe.transformer, "unconditional"):
        parser.error(f"--model: a LlamaGen pipeline is needed (a teacher-forced forward), got {type(pipe).__name__}")
    generator, report = torch.Generator().manual_seed(args.seed), {"command": "python -m mmspec.eval.calibration "
                                                                   + " ".join(sys.argv[1:] if argv is None else argv)}
    for folder, (prompts, tokens, settings) in stores.items():
        sampling = SamplingConfig(
            temperature=settings["temperature"], top_p=settings["top_p"],
            top_k=pipe.default_top_k if settings["top_k"] is None else settings["top_k"],
            guidance_scale=pipe.default_guidance_scale if settings["guidance_scale"] is None
            else settings["guidance_scale"])
        report[str(folder)] = summary(pit_values(pipe, prompts, tokens, sampling, generator))
        r = report[str(folder)]
        print(f"{folder}: {r['images']} images, mean u {r['mean_u']:.4f} ± {r['standard_error']:.4f} (exact: 0.5), "
              f"first / last quarter {r['mean_u_first_quarter']:.4f} / {r['mean_u_last_quarter']:.4f}, "
              f"KS p {r['ks_p']:.3g}, lag-1 correlation {r['lag1_correlation']:+.4f} ± {r['lag1_standard_error']:.4f}",
              flush=True)
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
