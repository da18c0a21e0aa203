"""Projected speedups at real model sizes: the seconds of each method's decoding step measured on random-weight models
of the real configurations, combined with the acceptance measured on the embedded model.

    python -m mmspec.eval.cost_model --device cpu --quick --json eval/results/cost_model_cpu.json
    python -m mmspec.eval.cost_model --device cuda --dtype bfloat16 --json eval/results/gpu/cost_model.json
    python -m mmspec.eval.cost_model --models llamagen-b --batch-sizes 1 --windows 1 2 4 8   # a part
    python -m mmspec.eval.cost_model --models mar-l mar-h nfd-310m --batch-sizes 1 8         # MAR and next-frame

A step's cost does not depend on the weights' values, so a model with random weights of the real shapes costs what
the real model costs. For each model of `REAL_SHAPES` that fits in the device's memory (the others are skipped with a
line saying so) and each batch size B, the script times one iteration of every method's whole step at every window
(`mmspec.image.policy.time_iterations`: the window forward for B samples and their CFG rows, the drafting,
verification, commit and rollback around it) as the method's pipeline runs it: on CUDA replayed from the step's CUDA
graph, as the pipelines capture it (LlamaGen's `WindowGraphs`, the transformers families' slot cache), elsewhere
eagerly. The draft
path's drafter at a real size is the target's width with `real_shapes.DRAFT_LAYERS` decoder layers (an EAGLE /
LANTERN drafter's size), its head an EAGLE head of one decoder layer at the target's width (`RealShape.head`). A
step has fixed shapes, so an iteration costs the same whatever it accepts: the iteration is the unit of the price,
with the forward and the work around it measured together, as they run. The cost curve cost(W, B) / cost(1, B) of
one eager W-token forward and its logits processing with half the image cached
(`mmspec.image.policy.measure_cost_curve`) is reported beside it.

Acceptance comes from the embedded text-to-image model (`mmspec/zoo/shapes`), decoded on the same device with the
same held-out prompts and seeds: for each method of `METHODS` and each window W (draft length W - 1 for the draft
and the head path) the step compression c(W, B) = image tokens / batch target forwards after the prefill. With
s(W, B) a method's seconds per iteration, s_AR(B) AR's, P(B) the seconds of opening a decoding (the condition's
prefill and token 0) and N the image's tokens, the projected speedup of a method on a model at batch B is the best
over W of

    (P(B) + N s_AR(B)) / (P(B) + N / c(W, B) s(W, B))

as the automatic default (`mmspec.image.policy`) predicts a decoding's time.

The embedded model is its own test of the projection: its iterations are timed like the real shapes', its wall
clock is measured on the same runs that give the acceptance, and `projection_relative_error` is the largest
|projected - measured| / measured over the lossless methods at the first batch size (each at the window the
projection picks). The text encoder, which every method pays alike, is left out of the projection.

MAR-B / L / H (`mmspec.eval.cost_mar`: continuous speculative decoding, MAR-B drafting for MAR-L and MAR-H) and the
NFD-size next-frame transformer (`mmspec.eval.cost_video`: frame speculation) are projected the same way from their
own embedded models, under the report's "mar" and "video" keys, each with its own projection check.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

from mmspec.core.probs import SamplingConfig
from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.core.stats import synchronize
from mmspec.eval.bench_image import held_out_prompts
from mmspec.eval.cost_mar import MAR_SHAPES, measure_mar
from mmspec.eval.cost_mar import format_table as format_mar_table
from mmspec.eval.cost_video import VIDEO_SHAPES, measure_video
from mmspec.eval.devices import machine, seeded, write_json
from mmspec.eval.real_shapes import REAL_SHAPES, Adapters, RealShape
from mmspec.image.methods import get_decoding
from mmspec.image.policy import measure_cost_curve, measure_prefill, time_iterations
from mmspec.zoo import IMAGE_T2I
from mmspec.zoo.shapes import class_label, scenes

WINDOWS = (1, 2, 4, 8, 16, 32, 64)
DRAFT_WINDOWS = (2, 3, 5)  # the draft and head paths' windows (draft lengths 1, 2, 4): one token per drafter call
BATCH_SIZES = (1, 4, 8)
GUIDANCE = 3.0  # the embedded model's CFG scale: every forward carries its unconditional rows
SAMPLING = SamplingConfig(guidance_scale=GUIDANCE)
BLOCK = 4  # iterations per replayed block when an iteration is timed
METHODS = {  # method -> the decoding settings at window W (the draft path: W - 1 drafted tokens)
    "sjd": lambda W: {"decoding": "sjd", "window": W, "init": "random", "coupling": "none"},
    "mc_sjd": lambda W: {"decoding": "sjd", "window": W, "init": "horizontal", "coupling": "maximal"},
    "lantern": lambda W: {"decoding": "sjd", "window": W, "init": "horizontal", "coupling": "maximal",
                          "acceptance": "lantern", "lantern_k": 100, "lantern_delta": 0.1},
    "draft": lambda W: {"decoding": "draft", "draft_length": W - 1},
    "heads": lambda W: {"decoding": "heads", "kind": "eagle", "draft_length": W - 1},
}
DRAFTED = ("draft", "heads")  # the methods whose windows are `DRAFT_WINDOWS`
LOSSLESS = ("sjd", "mc_sjd", "draft", "heads")
ALL_SHAPES = [*REAL_SHAPES, *MAR_SHAPES, *VIDEO_SHAPES]
VIDEO_EPISODES, VIDEO_FRAMES = 3, 32  # the embedded world model's rollouts (bench_video --quick's)
QUICK = {"models": ("llamagen-b", "llamagen-l"), "batch_sizes": (1, 4), "windows": (1, 2, 4, 8, 16), "prompts": 4,
         "repeats": 3}


def settings(windows) -> dict[tuple[str, int], dict]:
    """(method, W) -> the decoding settings of every method at each of its windows (`DRAFT_WINDOWS` for the draft
    and the head path, the SJD windows of `windows` past 1 for the others)."""
    return {(method, W): make(W) for method, make in METHODS.items()
            for W in (DRAFT_WINDOWS if method in DRAFTED else windows) if W > 1}


def decoding_on(options: dict, adapters: Adapters):
    """A method's decoding from the settings of `METHODS`: the draft path with the adapters' drafter, the head path
    with their head."""
    decoding = get_decoding(options["decoding"], **{k: v for k, v in options.items() if k != "decoding"})
    runtime = {"draft": {"drafter": adapters.drafter}, "heads": {"head": adapters.head}}.get(decoding.name, {})
    return dataclasses.replace(decoding, **runtime)


def available_bytes(device: torch.device) -> int:
    """Memory free for a model on `device`: the GPU's free memory, or the machine's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as info:
        fields = dict(line.split(":", 1) for line in info)
    return int(fields["MemAvailable"].split()[0]) * 1024


def relative(curve: dict[int, float]) -> dict[int, float]:
    return {W: round(seconds / curve[1], 3) for W, seconds in curve.items()}


def projected_speedups(iterations: dict, prefill: float, tokens: int, embedded: dict) -> dict:
    """Per method: the window the projection picks and its projected speedup over AR at one batch size.

    iterations: seconds of one iteration, AR's under "ar" and per method and W (`measure_iterations`); prefill:
    seconds of opening a decoding; tokens: the image's N tokens; embedded: the embedded model's runs at this batch
    size (`run_embedded`), per method and W the step compression c. An image takes prefill + N / c iterations."""
    ar = prefill + tokens * iterations["ar"]
    projected = {"ar": {"window": 1, "speedup": 1.0}}
    for method in METHODS:
        speedups = {W: ar / (prefill + tokens / run["compression"] * iterations[method][W])
                    for W, run in embedded[method].items() if W in iterations.get(method, {})}
        best = max(speedups, key=speedups.get)
        projected[method] = {"window": best, "speedup": round(speedups[best], 3)}
    return projected


def measure_real_shape(name: str, shape: RealShape, device: torch.device, dtype: torch.dtype,
                       batch_sizes, windows, repeats: int, captured: bool | None = None) -> dict:
    """`measure_iterations` of a real shape's random-weight models, or why the model was skipped. captured: time
    the steps replayed from their graphs (CUDA graphs on a GPU, their CPU tape elsewhere); None: as the pipelines
    run them on `device` (captured on CUDA only)."""
    needed, free = shape.bytes_needed(dtype, max(batch_sizes), max(windows)), available_bytes(device)
    if needed > 0.8 * free:
        return {"skipped": f"needs about {needed / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free on {device}"}
    began = time.perf_counter()
    adapters = shape.build(device, dtype, device.type == "cuda" if captured is None else captured)
    entry = measure_iterations(name, adapters, lambda B: shape.condition(B, device), batch_sizes, windows, repeats)
    del adapters
    return {"parameters": shape.parameters(), "shape": repr(shape), **entry,
            "seconds": round(time.perf_counter() - began, 1)}


def measure_iterations(name: str, adapters: Adapters, condition_of, batch_sizes, windows, repeats: int) -> dict:
    """Per batch size B: seconds of opening a decoding (`prefill_seconds`) and of one iteration of AR's step and of
    every method's at each window (`time_iterations`), the target's eager cost curve (`forward_seconds`: W -> seconds
    of a W-token forward with its CFG rows and logits processing; `cost_curve`: the same relative to W = 1).
    condition_of(B): a condition for B samples."""
    wanted = settings(windows)
    widths = sorted({1, *(W for _, W in wanted)})
    grid = adapters.target.grid
    entry = {"image_tokens": grid[0] * grid[1], "prefill_seconds": {}, "iteration_seconds": {}, "forward_seconds": {},
             "cost_curve": {}}
    for B in batch_sizes:
        condition = condition_of(B)
        entry["prefill_seconds"][B] = measure_prefill(adapters.target, condition, SAMPLING, repeats)
        curve = measure_cost_curve(adapters.eager, condition, SAMPLING, widths, repeats)
        runs = {"ar": (adapters.target, get_decoding("ar"))} | {
            key: (adapters.target, decoding_on(options, adapters)) for key, options in wanted.items()}
        timed = time_iterations(runs, condition, SAMPLING, BLOCK, repeats)
        seconds = {"ar": timed.pop("ar")}
        for (method, W), s in timed.items():
            seconds.setdefault(method, {})[W] = s
        entry["iteration_seconds"][B], entry["forward_seconds"][B], entry["cost_curve"][B] = (
            seconds, curve, relative(curve))
        print(describe_iterations(name, B, seconds), flush=True)
    return entry


def projections(entry: dict, runs: dict) -> dict:
    """Per batch size: `projected_speedups` of a model's `measure_iterations` entry with the embedded runs of that
    size."""
    return {B: projected_speedups(seconds, entry["prefill_seconds"][B], entry["image_tokens"], runs[B])
            for B, seconds in entry["iteration_seconds"].items()}


def describe_iterations(name: str, batch_size: int, seconds: dict) -> str:
    return (f"{name} batch {batch_size}: AR iteration {1000 * seconds['ar']:.1f} ms; in AR iterations: "
            + "; ".join(f"{method} " + ", ".join(f"W={W} {s / seconds['ar']:.2f}" for W, s in by_window.items())
                        for method, by_window in seconds.items() if method != "ar"))


def embedded_adapters(pipe) -> Adapters:
    """The embedded pipeline's adapters as its decodings run them (its captured steps on CUDA)."""
    from mmspec.models.llamagen.adapter import LlamaGenAdapter

    eager = LlamaGenAdapter(pipe.transformer, pipe.vqvae)
    return Adapters(pipe.image_adapter(), pipe.draft_adapter(), eager, pipe.eagle_head)


def run_embedded(pipe, device: torch.device, prompts: list[str], batch_size: int, windows) -> dict:
    """Step compression and wall-clock speedup over AR of every method and window on the embedded model: on each
    batch of prompts AR runs first, then every method at every window (so drift of the machine hits them alike); a
    method's speedup is the median over batches of AR's latency / its latency."""
    def timed(options: dict, batch: list[str], start: int):
        """(seconds, stats) of a call."""
        generators = seeded(device, range(1000 + start, 1000 + start + len(batch)))
        synchronize(device)
        began = time.perf_counter()
        stats = pipe(batch, generator=generators, output_type="latent", guidance_scale=GUIDANCE, **options).stats
        synchronize(device)
        return time.perf_counter() - began, stats

    wanted = settings(windows)
    forwards, tokens, ratios = {}, {}, {}
    for start in range(0, len(prompts) - batch_size + 1, batch_size):
        batch = prompts[start : start + batch_size]
        ar_seconds, _ = timed({"decoding": "ar"}, batch, start)
        for key, options in wanted.items():
            seconds, stats = timed(options, batch, start)
            forwards[key] = forwards.get(key, 0) + stats.target_forwards - stats.prefill_forwards
            tokens[key] = tokens.get(key, 0) + int(stats.new_tokens.max())
            ratios.setdefault(key, []).append(ar_seconds / seconds)
    results = {method: {} for method in METHODS}
    for method, W in wanted:
        results[method][W] = {"compression": round(tokens[method, W] / forwards[method, W], 3),
                              "measured_speedup": round(statistics.median(ratios[method, W]), 3)}
    for method in METHODS:
        runs = results[method]
        print(f"embedded batch {batch_size} {method}: " + ", ".join(
            f"W={W}: c {r['compression']:.2f}, {r['measured_speedup']:.2f}x" for W, r in runs.items()), flush=True)
    return results


def format_table(report: dict) -> str:
    methods = ["ar", *METHODS]
    lines = ["| model | batch | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for name, entry in report["models"].items():
        if "skipped" in entry:
            lines.append(f"| {name} | – | skipped: {entry['skipped']} |")
            continue
        for B, projected in entry["projected"].items():
            cells = [f"{projected[m]['speedup']:.2f}x (W {projected[m]['window']})" for m in methods]
            lines.append(f"| {name} | {B} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = {name: entry for name, entry in report["models"].items() if "skipped" not in entry}
    figure, (curves, bars) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, entry in measured.items():
        for B, curve in entry["cost_curve"].items():
            curves.plot(list(curve), list(curve.values()), marker="o", label=f"{name}, batch {B}")
    curves.set(xscale="log", xlabel="window W (tokens per forward)", ylabel="cost(W) / cost(1)",
               title=f"window forward cost, {report['device']['name']}")
    curves.set_xticks(report["windows"], [str(W) for W in report["windows"]])
    curves.legend(fontsize=7)
    methods = list(METHODS)
    width = 0.8 / len(measured)
    for i, (name, entry) in enumerate(measured.items()):
        projected = entry["projected"][min(entry["projected"])]
        bars.bar([m + i * width for m in range(len(methods))], [projected[m]["speedup"] for m in methods], width,
                 label=f"{name} (batch {min(entry['projected'])})")
    bars.axhline(1.0, color="black", linewidth=0.8)
    bars.set_xticks([m + 0.4 - width / 2 for m in range(len(methods))],
                    [m if m in LOSSLESS else f"{m} (lossy)" for m in methods])
    bars.set(ylabel="projected speedup vs AR", title="projected from real shapes x embedded acceptance")
    bars.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def measure_image(names, device: torch.device, dtype: torch.dtype, batch_sizes, windows, prompts: int,
                  repeats: int) -> dict:
    """The discrete-image part of the report: the embedded model's curves, runs and projection check, and each of
    `names` (`REAL_SHAPES`) measured or skipped, with its projections."""
    from mmspec.pipelines.auto import AutoARImagePipeline

    pipe = AutoARImagePipeline.from_pretrained(IMAGE_T2I, dtype=torch.float32).to(device)
    pipe.set_progress_bar_config(disable=True)
    texts = held_out_prompts(prompts)
    pipe(texts[:1], output_type="latent", decoding="ar")  # warm-up
    adapters = embedded_adapters(pipe)
    embedded = measure_iterations("embedded", adapters,
                                  lambda B: pipe.encode_prompt(held_out_prompts(B), None, adapters.target),
                                  batch_sizes, windows, repeats)
    embedded["runs"] = {B: run_embedded(pipe, device, texts, B, windows) for B in batch_sizes}
    embedded["projected"] = projections(embedded, embedded["runs"])
    errors = {}
    for method in LOSSLESS:
        window = embedded["projected"][batch_sizes[0]][method]["window"]
        measured = embedded["runs"][batch_sizes[0]][method][window]["measured_speedup"]
        projected = embedded["projected"][batch_sizes[0]][method]["speedup"]
        errors[method] = {"window": window, "projected": projected, "measured": measured,
                          "relative_error": round(abs(projected - measured) / measured, 3)}
    report = {"models": {"embedded (shapes)": embedded}, "projection_check": errors,
              "projection_relative_error": max(e["relative_error"] for e in errors.values())}
    for name in names:
        entry = measure_real_shape(name, REAL_SHAPES[name], device, dtype, batch_sizes, windows, repeats)
        if "skipped" in entry:
            print(f"{name}: skipped, {entry['skipped']}", flush=True)
        else:
            entry["projected"] = projections(entry, embedded["runs"])
        report["models"][name] = entry
    print("\nprojected speedup vs AR (window picked per method):")
    print(format_table(report))
    print(f"\nprojection check on the embedded model, batch {batch_sizes[0]}: "
          + ", ".join(f"{m} projected {e['projected']:.2f}x, measured {e['measured']:.2f}x" for m, e in errors.items())
          + f"; projection_relative_error {report['projection_relative_error']:.3f}")
    return report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_arguments(parser)
    parser.add_argument("--quick", action="store_true",
                        help=f"models {', '.join(QUICK['models'])}, batch sizes {QUICK['batch_sizes']}, "
                             f"windows {QUICK['windows']}, {QUICK['prompts']} prompts, {QUICK['repeats']} timed rounds")
    parser.add_argument("--models", nargs="+", choices=ALL_SHAPES, default=None,
                        help="real shapes to measure (default: all; --quick: LlamaGen-B and -L)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=None, help=f"default {BATCH_SIZES}")
    parser.add_argument("--windows", nargs="+", type=int, default=None,
                        help=f"window widths to measure (must include 1; default {WINDOWS}, --quick "
                             f"{QUICK['windows']})")
    parser.add_argument("--prompts", type=int, default=None,
                        help="held-out prompts the embedded model decodes per batch size (default 8, --quick 4)")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"timed rounds of each window forward and each step ({BLOCK} iterations a round; default "
                             f"5, --quick {QUICK['repeats']})")
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--plot", default=None, help="write the plot here (docs/images/cost_model_<device>.png)")
    args = parser.parse_args(argv)
    windows = tuple(sorted(set(args.windows or (QUICK["windows"] if args.quick else WINDOWS))))
    if 1 not in windows or min(windows) < 1:
        parser.error(f"--windows must be positive and include 1, got {args.windows}")
    batch_sizes = tuple(args.batch_sizes or (QUICK["batch_sizes"] if args.quick else BATCH_SIZES))
    if min(batch_sizes) < 1:
        parser.error(f"--batch-sizes must be positive, got {list(batch_sizes)}")
    prompts = args.prompts or (QUICK["prompts"] if args.quick else 8)
    if prompts < max(batch_sizes):
        parser.error(f"--prompts must be at least the largest batch size ({max(batch_sizes)}), got {prompts}")
    models = args.models or (QUICK["models"] if args.quick else ALL_SHAPES)
    repeats = args.repeats or (QUICK["repeats"] if args.quick else 5)
    device, dtype = resolve_device(parser, args.device), getattr(torch, args.dtype)

    report = {**machine(device), "dtype": args.dtype,
              "command": "python -m mmspec.eval.cost_model " + " ".join(sys.argv[1:] if argv is None else argv),
              "batch_sizes": list(batch_sizes), "windows": list(windows)}
    if image := [m for m in models if m in REAL_SHAPES]:
        report |= measure_image(image, device, dtype, batch_sizes, windows, prompts, repeats)
    if mar := [m for m in models if m in MAR_SHAPES]:
        labels = [class_label(caption) for caption in scenes(0, prompts, "heldout")[1]]
        report["mar"] = measure_mar(mar, device, dtype, batch_sizes, labels, repeats)
        print("\nMAR: projected speedup of continuous speculative decoding vs the target's AR:")
        print(format_mar_table(report["mar"]))
    if video := [m for m in models if m in VIDEO_SHAPES]:
        report["video"] = measure_video(video, device, dtype, VIDEO_EPISODES, VIDEO_FRAMES, repeats)
    if args.json:
        write_json(args.json, report)
    if args.plot and "models" in report:
        plot(report, Path(args.plot))
    return report


if __name__ == "__main__":
    main()
