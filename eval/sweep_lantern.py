"""LANTERN sweep on the embedded text-to-image model: speed against quality for relaxed acceptance, on two paths.

    python -m mmspec.eval.sweep_lantern          # full grid (about 40 min on 2 CPU cores)
    python -m mmspec.eval.sweep_lantern --quick  # a sub-grid, fewer images (< 10 min)
    python -m mmspec.eval.sweep_lantern --json eval/results/sweep_lantern.json --plot docs/images/lantern_sweep.png

Paths: "sjd" (speculative Jacobi decoding, window 16, horizontal init, maximal coupling: our best exact SJD) and
"draft" (the zoo's draft GPT drafts `--draft-length` tokens, the target verifies the chain). On each: the exact mode,
then LANTERN with delta in {0.05, 0.1, 0.2, 0.4} and LANTERN++ with lam in {2, 3, 5}, each for k in {10, 100, 1000}.
Plain AR (KV cache) is the speed baseline; AR with other seeds measures seed-to-seed spread of the quality figures.

Speed: batch 1, the same held-out captions and per-image seeds for every setting (image i: seed 1000 + i), after a
warm-up; median latency per image; speedup vs AR and vs the same path's exact mode, all in this one process.
Quality (until the evaluation issue lands its in-domain FID / CLIP): a small CNN probe trained on rendered training
scenes (`mmspec.eval.image_zoo_card`) gives (a) "FD-probe", the Frechet distance between its 128-d features of the
generated images and of real held-out scenes — an FID computed with an in-domain feature extractor, not Inception; lower
is better, biased upward at small n, so only compare values at the same n — and (b) caption match, the mean over four
attributes of how often the probe reads back what the caption says. Realised distortion: `excess_acceptance`,
alpha_relaxed - alpha_exact per tested position (= the per-position TV of the output law, G* residual), and its sum
per image. `best_speedup_over_exact_at_fid_plus10pct`: per path, the best speedup over that path's exact mode among
the LANTERN settings whose FD-probe is at most 1.1x the exact mode's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from mmspec.eval.bench_image import forward_seconds
from mmspec.eval.image_zoo_card import labels_of, train_probe
from mmspec.eval.metrics import frechet_distance
from mmspec.pipelines.auto import AutoARImagePipeline
from mmspec.zoo import IMAGE_T2I
from mmspec.zoo.pixels import to_model_range, to_uint8
from mmspec.zoo.shapes import scenes

# outputs, relative to the working directory (the repository root regenerates the committed files)
RESULTS = Path("eval") / "results"
PLOT = Path("docs") / "images" / "lantern_sweep.png"
PATHS = {
    "sjd": {"decoding": "sjd", "window": 16, "init": "horizontal", "coupling": "maximal"},
    "draft": {"decoding": "draft"},
}
GRID = {"delta": (0.05, 0.1, 0.2, 0.4), "lam": (2.0, 3.0, 5.0), "k": (10, 100, 1000)}
QUICK_GRID = {"delta": (0.1, 0.4), "lam": (3.0,), "k": (10, 1000)}


def settings(grid: dict) -> list[tuple[str, dict]]:
    """(label, pipeline options) of the exact mode and every LANTERN setting of the grid."""
    out = [("exact", {})]
    for k in grid["k"]:
        lantern = {"acceptance": "lantern", "lantern_k": k}
        out += [(f"delta={d:g},k={k}", {**lantern, "lantern_delta": d}) for d in grid["delta"]]
        out += [(f"lam={m:g},k={k}", {**lantern, "lantern_lam": m}) for m in grid["lam"]]
    return out


class ProbeQuality:
    """FD-probe and caption match of generated images for their captions (see the module docstring)."""

    def __init__(self, n_train_scenes: int, steps: int, n_reference: int):
        self.probe = train_probe(n_train_scenes, steps)
        reference, _ = scenes(0, n_reference, "heldout")
        self.reference = self.features(reference)

    @torch.no_grad()
    def features(self, images: np.ndarray) -> torch.Tensor:
        """float64 [N, 128] probe features of uint8 images [N, H, W, 3]."""
        return torch.cat([self.probe.features(to_model_range(chunk)) for chunk in np.array_split(images, 8)]).double()

    @torch.no_grad()
    def __call__(self, images: np.ndarray, captions: list[str]) -> dict:
        predictions = [out.argmax(-1) for out in self.probe(to_model_range(images))]
        labels = labels_of(captions)
        match = np.mean([(pred == labels[:, i]).float().mean().item() for i, pred in enumerate(predictions)])
        return {"fd_probe": round(frechet_distance(self.reference, self.features(images)), 4),
                "caption_match": round(float(match), 4)}


def generate(pipe, captions: list[str], seed: int, options: dict, batch_size: int = 8) -> tuple[np.ndarray, dict]:
    """uint8 images [n, H, W, 3] for the captions (image i: seed + i) and the summed distortion / acceptance stats."""
    images, excess_sum, accepted, drafted = [], 0.0, 0, 0
    for start in range(0, len(captions), batch_size):
        chunk = captions[start : start + batch_size]
        generators = [torch.Generator().manual_seed(seed + start + i) for i in range(len(chunk))]
        out = pipe(chunk, generator=generators, output_type="latent", **options)
        grid = (pipe.transformer.config.grid_size,) * 2
        images.append(to_uint8(pipe.vqvae.decode(out.images, grid)).numpy())
        stats = out.stats
        if stats.excess_acceptance is not None:
            excess_sum += stats.excess_per_sample * len(chunk)
        accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
    summary = {"acceptance_rate": round(accepted / max(1, drafted), 4)}
    if options.get("acceptance") == "lantern":
        summary["distortion_per_image"] = round(excess_sum / len(captions), 4)
    return np.concatenate(images), summary


def speed(pipe, captions: list[str], options: dict) -> dict:
    """Batch-1 median latency per image and step compression over the captions (after one warm-up call)."""
    pipe(captions[0], generator=torch.Generator().manual_seed(0), output_type="latent", **options)
    latencies, tokens, row_forwards, excess = [], 0, 0, []
    for i, caption in enumerate(captions):
        began = time.perf_counter()
        stats = pipe(caption, generator=torch.Generator().manual_seed(1000 + i), output_type="latent", **options).stats
        latencies.append(time.perf_counter() - began)
        tokens += int(stats.new_tokens.sum())
        row_forwards += int(stats.steps.sum()) + stats.prefill_forwards
        if stats.excess_acceptance is not None:
            excess.append(stats.excess_acceptance)
    out = {"latency_s": round(statistics.median(latencies), 4), "step_compression": round(tokens / row_forwards, 3)}
    if excess:
        out["excess_acceptance"] = round(float(np.mean(excess)), 4)
    return out


def draft_cost_ratio(pipe, repeats: int = 200) -> float:
    """Seconds of a cached 1-token CFG forward of the draft GPT over the target's, batch 1."""
    draft = forward_seconds(pipe, pipe.draft_transformer, 1, repeats=repeats)[1]
    return round(draft / forward_seconds(pipe, pipe.transformer, 1, repeats=repeats)[1], 3)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, metric, label in ((axes[0], "fd_probe", "FD-probe (in-domain FID; lower is better)"),
                              (axes[1], "caption_match", "caption match (higher is better)")):
        for path_name, marker in (("sjd", "o"), ("draft", "s")):
            points = [r for r in rows if r["path"] == path_name]
            for kind, color in (("exact", "black"), ("delta", "tab:blue"), ("lam", "tab:orange")):
                chosen = [r for r in points if r["setting"].startswith(kind)]
                ax.scatter([r[metric] for r in chosen], [r["speedup_vs_ar"] for r in chosen], c=color, marker=marker,
                           label=f"{path_name} {kind}", s=28)
        ar = next(r for r in rows if r["path"] == "ar")
        ax.axvline(ar[metric], color="grey", ls=":", lw=1, label="AR")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xlabel(label)
        ax.set_ylabel("speedup vs AR (batch 1)")
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("LANTERN on the embedded shapes model: speed vs quality (o = SJD, s = draft model)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=IMAGE_T2I)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--draft-length", type=int, default=4)
    parser.add_argument("--json", default=None, help="write the results here (default: eval/results/sweep_lantern"
                                                     "[_quick].json)")
    parser.add_argument("--plot", default=None, help="PNG of speedup vs quality (default: docs/images/lantern_sweep"
                                                     "[_quick].png)")
    args = parser.parse_args(argv)
    suffix = "_quick" if args.quick else ""
    json_path = Path(args.json or RESULTS / f"sweep_lantern{suffix}.json")
    plot_path = Path(args.plot or PLOT.with_name(f"lantern_sweep{suffix}.png"))
    n_speed, n_quality = (3, 16) if args.quick else (6, 64)
    grid = QUICK_GRID if args.quick else GRID
    torch.manual_seed(0)

    pipe = AutoARImagePipeline.from_pretrained(args.model, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    if pipe.draft_transformer is None:
        raise SystemExit(f"{args.model} has no draft_transformer: train one with python -m mmspec.zoo.train_image "
                         "--only draft")
    cost_ratio = draft_cost_ratio(pipe)
    _, captions = scenes(0, max(n_quality, n_speed), "heldout")
    quality = ProbeQuality(2000 if args.quick else 6000, 150 if args.quick else 600, 512 if args.quick else 1024)
    paths = {name: {**options, **({"draft_length": args.draft_length} if name == "draft" else {})}
             for name, options in PATHS.items()}
    jobs = [("ar", "seeds 1000+", {"decoding": "ar"}, 1000), ("ar", "seeds 5000+", {"decoding": "ar"}, 5000)]
    jobs += [(name, label, {**options, **extra}, 1000) for name, options in paths.items() for label, extra in
             settings(grid)]
    rows = []
    for path_name, label, options, seed in tqdm(jobs, desc="sweep"):
        images, summary = generate(pipe, captions[:n_quality], seed, options)
        row = {"path": path_name, "setting": label, **quality(images, captions[:n_quality]), **summary}
        if seed == 1000:
            row.update(speed(pipe, captions[:n_speed], options))
        rows.append(row)
        tqdm.write(json.dumps(row))
    ar = rows[0]
    for row in rows:
        exact = next(r for r in rows if r["path"] == row["path"] and r["setting"] in ("exact", "seeds 1000+"))
        if "latency_s" in row:
            row["speedup_vs_ar"] = round(ar["latency_s"] / row["latency_s"], 3)
            row["speedup_vs_exact"] = round(exact["latency_s"] / row["latency_s"], 3)
    best = {name: best_within(rows, name, caption_match_floor=False) for name in paths}
    strict = {name: best_within(rows, name, caption_match_floor=True) for name in paths}
    report = {
        "model": args.model, "quick": args.quick, "images_per_setting": n_quality, "speed_prompts": n_speed,
        "sampling": "CFG 3, temperature 1, no top-k / top-p (pipeline defaults)", "paths": paths,
        "quality_metric": "FD-probe: Frechet distance of an in-domain CNN probe's features (not Inception FID); "
                          "caption match: probe accuracy on 4 caption attributes",
        "draft_target_cost_ratio": cost_ratio,
        "ar_seed_spread_fd_probe": round(abs(rows[0]["fd_probe"] - rows[1]["fd_probe"]), 4),
        "best_speedup_over_exact_at_fid_plus10pct": best,
        "best_speedup_over_exact_at_fid_plus10pct_and_caption_match_minus10pct": strict,
        "rows": rows,
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    plot([r for r in rows if "speedup_vs_ar" in r], plot_path)
    print(markdown_table(rows))
    print(json.dumps({"best_speedup_over_exact_at_fid_plus10pct": best}, indent=2))
    print(f"wrote {json_path} and {plot_path}")


def best_within(rows: list[dict], path: str, caption_match_floor: bool) -> dict | None:
    """The fastest LANTERN setting of `path` relative to its exact mode among those whose FD-probe is at most 1.1x
    the exact mode's (and, with caption_match_floor, whose caption match is at least 0.9x its)."""
    exact = next(r for r in rows if r["path"] == path and r["setting"] == "exact")
    within = [r for r in rows if r["path"] == path and r["setting"] != "exact"
              and r["fd_probe"] <= 1.1 * exact["fd_probe"]
              and (not caption_match_floor or r["caption_match"] >= 0.9 * exact["caption_match"])]
    top = max(within, key=lambda r: r["speedup_vs_exact"], default=None)
    if top is None:
        return None
    keys = ("setting", "speedup_vs_exact", "speedup_vs_ar", "fd_probe", "caption_match")
    return {**{key: top[key] for key in keys}, "exact_fd_probe": exact["fd_probe"],
            "exact_caption_match": exact["caption_match"]}


def markdown_table(rows: list[dict]) -> str:
    head = ("| path | setting | step compression | speedup vs AR | speedup vs exact | distortion / position | "
            "distortion / image | FD-probe | caption match |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        cells = [r["path"], r["setting"], r.get("step_compression", ""), r.get("speedup_vs_ar", ""),
                 r.get("speedup_vs_exact", ""), r.get("excess_acceptance", ""), r.get("distortion_per_image", ""),
                 r["fd_probe"], r["caption_match"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
