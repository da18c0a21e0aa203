"""Quality next to speed for decoding methods on one text-to-image pipeline: FID / KID / CLIP score with AR's
seed-to-seed spread, beside target forwards, step compression, latency and speedup vs AR, from one command.

    python -m mmspec.eval.quality --quick --json eval/results/quality_quick.json  # < 10 min on 2 CPU cores
    python -m mmspec.eval.quality --json eval/results/quality.json --plot docs/images/quality.png
    accelerate launch --multi_gpu --num_processes 4 -m mmspec.eval.quality --json ...  # sharded: same images, numbers

Defaults: the embedded model (zoo `shapes`); prompts = captions of the world's held-out scenes, one real scene per
caption as the reference ("data"); methods `ar` (plain AR with its KV cache), `sjd` (our best exact mode: window 16,
horizontal init, maximal coupling) and `lantern` (the same SJD with LANTERN relaxed acceptance, k = 100,
delta = 0.1: lossy). Other methods: every registered image decoding by name (`draft`, parallel rows, yours), every
registered lossy rule on the same SJD (`gsd`: GSD's grouped acceptance, the official settings) and `tree` (the same SJD
with a frontier tree of width 2, depth 2: exact; `mmspec.eval.samples.presets`), or `label=preset:key=value,...` to
override a preset's options, e.g. `--methods ar sjd lantern d02=lantern:lantern_delta=0.2
L32=sjd:window=32,init=vertical`.

Images: `--images-per-prompt` K per prompt, image k of prompt i in seed set s seeded with
`--seed` + 1e6 s + K i + k, one generator per row, so an image does not depend on its batch or process. They are
written as PNGs (with the stats of the call that made them) under `--out-dir`; a second run skips what exists.
`--prompts FILE` takes plain text (one prompt per line), TSV (a `caption` column) or JSON (a list, or COCO caption
annotations); the reference is then `--reference DIR` (a folder of images) or `--reference LABEL` (a method's images).

Quality: FD-CLIP, the Frechet distance of CLIP image embeddings (the zoo's in-domain `shapes_clip` by default, or
`--clip-model DIR`), and KID in the same space; the standard Inception FID / KID as well with `--inception-weights
FILE`; CLIP score (100 x cosine) of each image with its prompt. Honesty: AR is generated with `--ar-seed-sets` S
independent seed sets; their spread (std, range, the distance between two AR sets) and a 95 % prediction interval
for one more seed set (mean +- t(0.975, S-1) std sqrt(1 + 1/S)) say how much a number moves when only the seeds
change. An exact mode samples AR's distribution, so its numbers should fall inside; a lossy mode's shift is reported
against it. `--method-seed-sets` M >= 2 gives the other methods M seed sets as well (mean +- std, Welch's test
against AR's sets). Frechet distances are biased upward at small N: compare values at the same N only.

Speed (from the same calls): target forwards per call, step compression (image tokens per target forward a row took
part in, prefill included), median seconds per call of `--batch-size` rows, speedup = AR's median / the method's.
Each method gets an untimed warm-up call. Sharded runs time processes that share the machine: take speed claims from
one process (or `mmspec.eval.bench_image`).
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

import numpy as np
from scipy.stats import t, ttest_ind

from mmspec.core.files import read_prompts
from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.eval.devices import write_json
from mmspec.eval.metrics import (
    clip_score,
    frechet_distance,
    image_features,
    kernel_distance,
    load_clip,
    load_inception,
    paired_mmd_test,
)
from mmspec.eval.samples import Method, SampleStore, generate, speed_summary
from mmspec.pipelines.auto import add_image_model_arguments, image_pipeline_from_arguments
from mmspec.zoo import IMAGE_CLIP

DEFAULT_OUT = Path("eval") / "out" / "quality"  # relative to the working directory
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_image_model_arguments(parser)
    parser.add_argument("--methods", nargs="+", default=["ar", "sjd", "lantern"])
    parser.add_argument("--prompts", default=None, help="prompt file (.txt, .tsv, .json); default: the world's "
                                                         "held-out captions")
    parser.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts (default: 256, "
                                                                       "quick 64; all of a --prompts file)")
    parser.add_argument("--images-per-prompt", type=int, default=1)
    parser.add_argument("--ar-seed-sets", type=int, default=None, help="AR seed sets for the spread (default 4, "
                                                                        "quick 3)")
    parser.add_argument("--method-seed-sets", type=int, default=1, help="seed sets of every other method (>= 2 adds "
                                                                         "its spread and a Welch test against AR's)")
    parser.add_argument("--reference", default=None, help="'data' (the world's real scenes), a folder of images, or "
                                                          "a method label")
    parser.add_argument("--clip-model", default=IMAGE_CLIP, help="CLIP folder (CLIPModel + CLIPProcessor) or "
                                                                     "zoo name")
    parser.add_argument("--inception-weights", default=None, help="weights-inception-2015-12-05-6726825d.pth, for "
                                                                  "the standard FID / KID")
    parser.add_argument("--batch-size", type=int, default=1, help="rows per pipeline call (latency is per call)")
    parser.add_argument("--guidance-scale", type=float, default=None, help="default: the family's (3 embedded)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None, help="default: the family's (0 embedded)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=str(DEFAULT_OUT), help="where the images are kept (resumable)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--quick", action="store_true", help="64 prompts, 3 AR seed sets")
    add_device_arguments(parser, dtype=False)
    args = parser.parse_args(argv)
    args.device = resolve_device(parser, args.device)
    for name in ("images_per_prompt", "batch_size", "num_prompts", "method_seed_sets"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"{name}: must be >= 1, got {getattr(args, name)}")
    if args.ar_seed_sets is not None and args.ar_seed_sets < 2:
        raise ValueError(f"ar_seed_sets: at least 2 are needed to measure the seed spread, got {args.ar_seed_sets}")
    return args


def world_scenes(n: int):
    """(uint8 images [n, 64, 64, 3], captions) of the embedded world's first n held-out scenes."""
    from mmspec.zoo.shapes import scenes

    return scenes(0, n, "heldout")


def read_image_folder(folder: Path):
    from PIL import Image

    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if len(paths) < 2:
        raise ValueError(f"reference: {str(folder)!r} holds {len(paths)} images; FID / KID need at least 2")
    return [Image.open(p).convert("RGB") for p in paths]


def resolve_reference(reference: str | None, methods: list[Method], world_images) -> tuple[str, object]:
    """(name, uint8 images or the Method whose images are the reference) for `--reference`."""
    labels = [m.label for m in methods]
    if reference in (None, "data"):
        if world_images is None:
            raise ValueError("reference: 'data' (the default) is the embedded world's scenes, for its default prompts; "
                             "with --prompts give a folder of reference images or a method label")
        return "data", world_images
    if reference in labels:
        return reference, methods[labels.index(reference)]
    if Path(reference).is_dir():
        return "reference", read_image_folder(Path(reference))
    raise ValueError(f"reference: {reference!r} is neither 'data', a method label {labels} nor a folder")


def spread(values: list[float]) -> dict:
    """Seed-to-seed spread of one metric over S seed sets, with the 95 % prediction interval of one more set."""
    mean, std = statistics.fmean(values), statistics.stdev(values)
    half = t.ppf(0.975, len(values) - 1) * std * (1 + 1 / len(values)) ** 0.5
    return {"values": values, "mean": mean, "std": std, "range": max(values) - min(values),
            "prediction_interval_95": [mean - half, mean + half]}


def world_resampled(captions: list[str]) -> np.ndarray:
    """Another real scene for each caption of the embedded world (a fresh rendering): what a perfect model would
    draw, so its scores against the reference are the floor / ceiling at this N. uint8 [N, 64, 64, 3]."""
    from mmspec.zoo.shapes import parse_caption, render

    return np.stack([render(parse_caption(caption), random.Random(f"mmspec-eval/resample/{i}"))
                     for i, caption in enumerate(captions)])


def set_quality(images, captions: list[str], spaces: dict, reference_features: dict, embedder) -> tuple[dict, dict]:
    """({"clip_score", "fd_<space>", "kid_<space>"}, {space: features}) of one image set against the reference."""
    row, features = {"clip_score": clip_score(embedder, images, captions)}, {}
    for space, extractor in spaces.items():
        features[space] = image_features(extractor, images)
        row[f"fd_{space}"] = frechet_distance(reference_features[space], features[space])
        row[f"kid_{space}"] = kernel_distance(reference_features[space], features[space])[0]
    return row, features


def evaluate(store: SampleStore, plan: list[tuple[Method, int]], reference, spaces: dict, embedder,
             resampled_real=None) -> dict:
    """Quality and speed of every method in `plan` against `reference` (uint8 images, or a Method whose seed set 0
    is the reference): means over a method's seed sets (and their std and a Welch test against AR's sets when it
    has several), and each method's paired test against AR's seed set 0 (AR itself: its set 1 against set 0,
    what the test gives when the law is the same). `resampled_real`: real images for the same prompts, scored the
    same way as a perfect model's row."""
    if isinstance(reference, Method):
        reference = store.read(reference, 0)[0]
    reference_features = {space: image_features(extractor, reference) for space, extractor in spaces.items()}
    per_set, records, features = {}, {}, {}
    for method, seed_set in plan:
        images, set_records = store.read(method, seed_set)
        records.setdefault(method.label, []).extend(set_records)
        per_set[method.label, seed_set], set_features = set_quality(images, [r["prompt"] for r in set_records],
                                                                    spaces, reference_features, embedder)
        features.update({(method.label, seed_set, space): f for space, f in set_features.items()})
    metrics = list(next(iter(per_set.values())))
    ar = next(m for m, _ in plan if m.is_ar)
    ar_sets = [s for m, s in plan if m == ar]
    ar_spread = {metric: spread([per_set[ar.label, s][metric] for s in ar_sets]) for metric in metrics}
    for space in spaces:
        ar_spread[f"fd_{space}_ar_set0_vs_set1"] = frechet_distance(features[ar.label, 0, space],
                                                                   features[ar.label, 1, space])
    ar_speed = speed_summary(records[ar.label])
    methods = {}
    for method in dict.fromkeys(m for m, _ in plan):
        sets = [per_set[method.label, s] for m, s in plan if m == method]
        quality = {metric: statistics.fmean(row[metric] for row in sets) for metric in metrics}
        spread_of_method = {metric: statistics.stdev(row[metric] for row in sets) if len(sets) > 1 else None
                            for metric in metrics}
        speed = speed_summary(records[method.label])
        speed["speedup_vs_ar"] = ar_speed["median_latency_s"] / speed["median_latency_s"]
        entry = {"options": method.options, "lossless": method.lossless, "seed_sets": len(sets),
                 "images": len(records[method.label]), "quality": quality, "seed_spread": spread_of_method,
                 "speed": speed}
        if not method.is_ar:
            entry["within_ar_spread"] = {metric: bool(lo <= quality[metric] <= hi) for metric in metrics
                                         for lo, hi in [ar_spread[metric]["prediction_interval_95"]]}
        if not method.is_ar and len(sets) > 1:  # several seed sets: compare means with AR's (Welch's t-test)
            entry["vs_ar_welch_p"] = {metric: ttest_ind(ar_spread[metric]["values"], [row[metric] for row in sets],
                                                        equal_var=False).pvalue.item() for metric in metrics}
        entry["same_law_as_ar"] = {space: paired_mmd_test(features[ar.label, 0, space],
                                                          features[method.label, 1 if method.is_ar else 0, space])
                                   for space in spaces}
        methods[method.label] = entry
    report = {"methods": methods, "ar_seed_spread": ar_spread}
    if resampled_real is not None:
        report["real_resampled"] = set_quality(resampled_real, store.prompts, spaces, reference_features, embedder)[0]
    return report


def headline(report: dict, primary: str, reference_name: str) -> dict:
    """The flat keys, in the primary feature space, of every method by its label (`speedup_gsd_vs_ar`,
    `fid_gsd_vs_data`, `gsd_same_law_as_ar_p`, ...) and of three roles: `ar`, `exact` (the first exact non-AR mode)
    and `lantern` (the first lossy mode)."""
    methods = report["methods"]
    ar = next(label for label, m in methods.items() if m["options"]["decoding"] == "ar")
    picks = {"ar": ar}
    exact = [label for label, m in methods.items() if m["lossless"] and label != ar]
    lossy = [label for label, m in methods.items() if not m["lossless"]]
    picks.update({"exact": exact[0]} if exact else {})
    picks.update({"lantern": lossy[0]} if lossy else {})
    spread_fd = report["ar_seed_spread"][f"fd_{primary}"]
    out = {"fid_ar_seed_spread": spread_fd["std"], "fid_ar_seed_range": spread_fd["range"],
           "fid_ar_prediction_interval_95": spread_fd["prediction_interval_95"],
           "clip_ar_seed_spread": report["ar_seed_spread"]["clip_score"]["std"], "methods_compared": picks}
    if "real_resampled" in report:
        out[f"fid_real_resampled_vs_{reference_name}"] = report["real_resampled"][f"fd_{primary}"]
        out["clip_real_resampled"] = report["real_resampled"]["clip_score"]
    for role, label in {**{label: label for label in methods}, **picks}.items():
        out[f"fid_{role}_vs_{reference_name}"] = methods[label]["quality"][f"fd_{primary}"]
        out[f"clip_{role}"] = methods[label]["quality"]["clip_score"]
        out[f"{role}_same_law_as_ar_p"] = methods[label]["same_law_as_ar"][primary]["p_value"]
        if role != "ar":
            out[f"speedup_{role}_vs_ar"] = methods[label]["speed"]["speedup_vs_ar"]
            out[f"fid_{role}_within_ar_spread"] = methods[label]["within_ar_spread"][f"fd_{primary}"]
            out[f"clip_{role}_within_ar_spread"] = methods[label]["within_ar_spread"]["clip_score"]
            if "vs_ar_welch_p" in methods[label]:
                out[f"fid_{role}_vs_ar_welch_p"] = methods[label]["vs_ar_welch_p"][f"fd_{primary}"]
    return out


def format_table(report: dict, spaces: dict, batch_size: int) -> str:
    spread_of = report["ar_seed_spread"]
    metrics = [("clip_score", "CLIP score ↑", 1)]
    for space, description in spaces.items():
        kid = "KID (Inception)" if space == "inception" else "KID-CLIP"
        metrics = [(f"fd_{space}", f"{description} ↓", 1), (f"kid_{space}", f"{kid} ×10³ ↓", 1e3)] + metrics
    columns = ["method", "lossless", "images", "target forwards / call", "step compression",
               f"latency (s / call of {batch_size})", "speedup vs AR", *(name for _, name, _ in metrics),
               "p (same law as AR)"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for label, m in report["methods"].items():
        speed, quality = m["speed"], m["quality"]
        cells = [label, "yes" if m["lossless"] else "no", str(m["images"]), f"{speed['target_forwards_per_call']:.1f}",
                 f"{speed['step_compression']:.2f}", f"{speed['median_latency_s']:.3f}",
                 f"{speed['speedup_vs_ar']:.2f}"]
        for key, _, scale in metrics:
            cell = f"{scale * quality[key]:.2f}"
            if m["seed_sets"] > 1:
                cell += f" ± {scale * m['seed_spread'][key]:.2f}"
            if "vs_ar_welch_p" in m:
                cell += f" (Welch p {m['vs_ar_welch_p'][key]:.2f})"
            elif "within_ar_spread" in m and not m["within_ar_spread"][key]:
                cell += " (outside AR spread)"
            cells.append(cell)
        cells.append(" / ".join(f"{m['same_law_as_ar'][space]['p_value']:.3f}" for space in spaces))
        lines.append("| " + " | ".join(cells) + " |")
    if "real_resampled" in report:
        real = report["real_resampled"]
        cells = ["real scenes (re-rendered)", "—", str(report["prompts"]), "", "", "", "",
                 *(f"{scale * real[key]:.2f}" for key, _, scale in metrics), ""]
        lines.append("| " + " | ".join(cells) + " |")
    ar_sets = len(spread_of["clip_score"]["values"])
    lines.append(f"\nRows with several seed sets: mean ± std over them (AR: {ar_sets}), with Welch's test of equal "
                 "means against AR's sets; single-set rows are marked when outside AR's 95 % prediction interval "
                 "for one more seed set.")
    for key, name, scale in metrics:
        lo, hi = spread_of[key]["prediction_interval_95"]
        lines.append(f"- {name}: AR seed sets {[round(scale * v, 2) for v in spread_of[key]['values']]}, "
                     f"95 % interval [{scale * lo:.2f}, {scale * hi:.2f}]")
    for space in spaces:
        lines.append(f"- {spaces[space]} between two AR seed sets: {spread_of[f'fd_{space}_ar_set0_vs_set1']:.2f}")
    lines.append(f"- p (same law as AR): paired permutation MMD test ({' / '.join(spaces.values())} features) of the "
                 "method's images against AR seed set 0, pair = same prompt; the AR row tests AR set 1. Exact at any "
                 "N; a lossless mode should not give small p-values more often than chance.")
    return "\n".join(lines)


def plot(report: dict, primary: str, description: str, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, name in ((axes[0], f"fd_{primary}", f"{description}, lower is better"),
                          (axes[1], "clip_score", "CLIP score, higher is better")):
        lo, hi = report["ar_seed_spread"][key]["prediction_interval_95"]
        ax.axhspan(lo, hi, color="0.85", label="AR 95 % seed interval")
        if "real_resampled" in report:
            ax.axhline(report["real_resampled"][key], color="0.3", linestyle="--", label="real scenes (re-rendered)")
        for label, m in report["methods"].items():
            x, y = m["speed"]["speedup_vs_ar"], m["quality"][key]
            err = m["seed_spread"][key]
            ax.errorbar(x, y, yerr=err, fmt="o" if m["lossless"] else "s", capsize=3)
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
        ax.set_xlabel("speedup vs AR (median latency)")
        ax.set_ylabel(name)
        handles, names = ax.get_legend_handles_labels()
        for marker, law in (("o", "lossless (same law as AR)"), ("s", "lossy")):
            handles.append(plt.Line2D([], [], color="0.4", marker=marker, linestyle=""))
            names.append(law)
        ax.legend(handles, names, fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict | None:
    from accelerate import PartialState

    args = parse_args(argv)
    state = PartialState(cpu=args.device.type == "cpu")  # on CPU the processes shard over gloo
    methods = [Method.parse(text) for text in args.methods]
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels):
        raise ValueError(f"methods: labels must be unique, got {labels}")
    if not any(m.is_ar for m in methods):
        raise ValueError("methods: include 'ar', the baseline of speedup and of the seed spread")
    n_prompts = args.num_prompts or (None if args.prompts else (64 if args.quick else 256))
    if args.prompts:
        prompts, world_images = read_prompts(args.prompts)[:n_prompts], None
    else:
        world_images, prompts = world_scenes(n_prompts)
    if len(prompts) * args.images_per_prompt < 2:
        raise ValueError(f"N = prompts x images_per_prompt = {len(prompts) * args.images_per_prompt}; FID / KID need "
                         "at least 2 images per method")
    reference_name, reference = resolve_reference(args.reference, methods, world_images)

    ar_seed_sets = args.ar_seed_sets or (3 if args.quick else 4)
    plan = [(m, s) for m in methods for s in range(ar_seed_sets if m.is_ar else args.method_seed_sets)]
    sampling = {"guidance_scale": args.guidance_scale, "temperature": args.temperature, "top_k": args.top_k,
                "top_p": args.top_p}
    store = SampleStore(args.out_dir, prompts, args.images_per_prompt, args.seed, sampling)
    embedder = load_clip(args.clip_model)
    tokenizer = embedder.processor.tokenizer
    unknown = [p for p, ids in zip(prompts, tokenizer(prompts).input_ids, strict=True) if tokenizer.unk_token_id in ids]
    if unknown:
        raise ValueError(f"clip_model: {args.clip_model!r} does not know every word of the prompts (e.g. "
                         f"{unknown[0]!r}); pass --clip-model DIR with a CLIP that covers them")
    spaces = {"clip": embedder.to(state.device)}
    if args.inception_weights:
        spaces["inception"] = load_inception(args.inception_weights).to(state.device)

    pipe = image_pipeline_from_arguments(args).to(state.device)
    pipe.set_progress_bar_config(disable=True)
    made = generate(pipe, store, plan, args.batch_size, args.model, state.process_index, state.num_processes)
    state.wait_for_everyone()
    if not state.is_main_process:
        return None

    descriptions = {"clip": f"FD-CLIP ({Path(args.clip_model).name})", "inception": "FID (Inception)"}
    descriptions = {space: descriptions[space] for space in spaces}
    resampled = world_resampled(prompts) if reference_name == "data" and args.images_per_prompt == 1 else None
    report = evaluate(store, plan, reference, spaces, embedder, resampled)
    primary = "inception" if "inception" in spaces else "clip"
    report = {
        "model": args.model, "prompts": len(prompts), "images_per_prompt": args.images_per_prompt,
        "ar_seed_sets": ar_seed_sets, "method_seed_sets": args.method_seed_sets, "batch_size": args.batch_size,
        "sampling": sampling, "seed": args.seed,
        "reference": reference_name, "clip_model": args.clip_model, "feature_spaces": descriptions,
        "processes": state.num_processes, "images_made_by_main_process": made,
        **headline(report, primary, reference_name), **report,
    }
    report["fid_feature_space"] = descriptions[primary]
    print(format_table(report, descriptions, args.batch_size))
    if args.json:
        write_json(args.json, report)
    if args.plot:
        plot(report, primary, descriptions[primary], args.plot)
    return report


if __name__ == "__main__":
    main()
