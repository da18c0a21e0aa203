"""Projected speedups at real model sizes: the cost of a window forward measured on random-weight models of the real
configurations, combined with the acceptance measured on the embedded model.

    python -m mmspec.eval.cost_model --device cpu --quick --json eval/results/cost_model_cpu.json
    python -m mmspec.eval.cost_model --device cuda --dtype bfloat16 --json eval/results/gpu/cost_model.json
    python -m mmspec.eval.cost_model --models llamagen-b --batch-sizes 1 --windows 1 2 4 8   # a part
    python -m mmspec.eval.cost_model --models mar-l mar-h nfd-310m --batch-sizes 1 8         # MAR and next-frame

A forward's cost does not depend on the weights' values, so a model with random weights of the real shapes costs what
the real model costs. For each model of `REAL_SHAPES` that fits in the device's memory (the others are skipped with a
line saying so) the script measures the cost curve cost(W, B) / cost(1, B): one KV-cached forward of a W-token window
for B samples and their CFG rows, plus the processing of its logits, after half the image is cached — the measurement
behind the automatic default (`mmspec.image.policy.measure_cost_curve`). The draft path's drafter at a real size is
the target's width with `real_shapes.DRAFT_LAYERS` decoder layers (an EAGLE / LANTERN drafter's size); its one-token
forward is timed the same way, and it is also what one call of a draft head costs at a real size (the head path: one
decoder layer at the target's width read out through the target's LM head). On the embedded model the draft GPT's
one-token forward and the EAGLE head's call are timed apart.

Acceptance comes from the embedded text-to-image model (`mmspec/zoo/shapes`), decoded on the same device with the
same held-out prompts and seeds: for each method of `METHODS` and each window W (draft length W - 1 for the draft
and the head path) the step compression c(W, B) = image tokens / batch target forwards after the prefill, and
o(W, B), the seconds per target forward spent outside it (drafting, verification, bookkeeping; for the draft and head
paths less their drafter's calls; on CUDA from a second run with synchronized phase timings), which do not grow with
the model. With t(W, B) the seconds of a W-token forward and d(B) the drafter's one-token forward (the head's call for
the head path), the projected speedup of a method on a model at batch B is the best over W of

    SJD-type:           c(W, B) * (t(1, B) + o_AR(B)) / (t(W, B) + o(W, B))
    draft, head paths:  c(W, B) * (t(1, B) + o_AR(B)) / (t(W, B) + (W - 1) d(B) + o(W, B))

The embedded model is its own test of the projection: its cost curve is measured like the real shapes', its wall
clock is measured on the same runs that give the acceptance, and `projection_relative_error` is the largest
|projected - measured| / measured over the lossless methods at the first batch size (each at the window the
projection picks). The prefill, which every method pays alike, is left out of the projection.

MAR-B / L / H (`mmspec.eval.cost_mar`: continuous speculative decoding, MAR-B drafting for MAR-L and MAR-H) and the
NFD-size next-frame transformer (`mmspec.eval.cost_video`: frame speculation) are projected the same way from their
own embedded models, under the report's "mar" and "video" keys, each with its own projection check.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from mmspec.core.probs import SamplingConfig
from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.core.runtime.measured import median_seconds
from mmspec.core.stats import synchronize, synchronized_timings
from mmspec.eval.bench_image import held_out_prompts
from mmspec.eval.cost_mar import MAR_SHAPES, measure_mar
from mmspec.eval.cost_mar import format_table as format_mar_table
from mmspec.eval.cost_video import VIDEO_SHAPES, measure_video
from mmspec.eval.devices import machine, seeded, write_json
from mmspec.eval.real_shapes import REAL_SHAPES, RealShape
from mmspec.image.policy import measure_cost_curve
from mmspec.zoo import IMAGE_T2I
from mmspec.zoo.shapes import class_label, scenes

WINDOWS = (1, 2, 4, 8, 16, 32, 64)
DRAFT_WINDOWS = (2, 3, 5)  # the draft and head paths' windows (draft lengths 1, 2, 4): one token per drafter call
BATCH_SIZES = (1, 4, 8)
GUIDANCE = 3.0  # the embedded model's CFG scale: every forward carries its unconditional rows
METHODS = {  # method -> the decoding settings at window W (the draft path: W - 1 drafted tokens)
    "sjd": lambda W: {"decoding": "sjd", "window": W, "init": "random", "coupling": "none"},
    "mc_sjd": lambda W: {"decoding": "sjd", "window": W, "init": "horizontal", "coupling": "maximal"},
    "lantern": lambda W: {"decoding": "sjd", "window": W, "init": "horizontal", "coupling": "maximal",
                          "acceptance": "lantern", "lantern_k": 100, "lantern_delta": 0.1},
    "draft": lambda W: {"decoding": "draft", "draft_length": W - 1},
    "heads": lambda W: {"decoding": "heads", "kind": "eagle", "draft_length": W - 1},
}
DRAFTED = ("draft", "heads")  # the methods whose W - 1 drafts cost one drafter call each
LOSSLESS = ("sjd", "mc_sjd", "draft", "heads")
ALL_SHAPES = [*REAL_SHAPES, *MAR_SHAPES, *VIDEO_SHAPES]
VIDEO_EPISODES, VIDEO_FRAMES = 3, 32  # the embedded world model's rollouts (bench_video --quick's)
QUICK = {"models": ("llamagen-b", "llamagen-l"), "batch_sizes": (1, 4), "prompts": 4, "repeats": 5}


def curve_windows(windows) -> tuple[int, ...]:
    """The widths a cost curve is measured at: the SJD windows and the draft path's."""
    return tuple(sorted({*windows, *DRAFT_WINDOWS}))


def available_bytes(device: torch.device) -> int:
    """Memory free for a model on `device`: the GPU's free memory, or the machine's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as info:
        fields = dict(line.split(":", 1) for line in info)
    return int(fields["MemAvailable"].split()[0]) * 1024


def relative(curve: dict[int, float]) -> dict[int, float]:
    return {W: round(seconds / curve[1], 3) for W, seconds in curve.items()}


def projected_speedups(curve: dict[int, float], draft_steps: dict[str, float], embedded: dict) -> dict:
    """Per method: the window the projection picks and its projected speedup over AR at one batch size.

    curve: W -> seconds of the target's W-token forward; draft_steps: per method of `DRAFTED`, seconds of one call of
    its drafter; embedded: the embedded model's runs at this batch size (`run_embedded`): per method and W the step
    compression and the seconds per target forward spent outside the forwards the projection counts (`overhead_s`),
    and AR's."""
    ar = curve[1] + embedded["ar"]["overhead_s"]
    projected = {"ar": {"window": 1, "speedup": 1.0}}
    for method in METHODS:
        speedups = {}
        for W, run in embedded[method].items():
            if W in curve:
                forward = curve[W] + (W - 1) * draft_steps.get(method, 0.0)
                speedups[W] = run["compression"] * ar / (forward + run["overhead_s"])
        best = max(speedups, key=speedups.get)
        projected[method] = {"window": best, "speedup": round(speedups[best], 3)}
    return projected


def measure_real_shape(name: str, shape: RealShape, device: torch.device, dtype: torch.dtype,
                       batch_sizes, windows, repeats: int) -> dict:
    """`measure_curves` of a real shape's random-weight models, or why the model was skipped."""
    needed, free = shape.bytes_needed(dtype, max(batch_sizes), max(windows)), available_bytes(device)
    if needed > 0.8 * free:
        return {"skipped": f"needs about {needed / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free on {device}"}
    began = time.perf_counter()
    target, drafter = shape.build(device, dtype)
    entry = measure_curves(name, target, drafter, lambda B: shape.condition(B, device), batch_sizes, windows, repeats)
    del target, drafter
    return {"parameters": shape.parameters(), "shape": repr(shape), **entry,
            "seconds": round(time.perf_counter() - began, 1)}


def measure_curves(name: str, target, drafter, condition_of, batch_sizes, windows, repeats: int) -> dict:
    """Per batch size B: the target's cost curve (`forward_seconds`: W -> seconds of a W-token forward with its CFG
    rows and logits processing; `cost_curve`: the same relative to W = 1) and the drafter's one-token forward
    (`draft_step_seconds`). target, drafter: adapters; condition_of(B): a condition for B samples."""
    sampling = SamplingConfig(guidance_scale=GUIDANCE)
    curves, draft_steps = {}, {}
    for B in batch_sizes:
        condition = condition_of(B)
        curves[B] = measure_cost_curve(target, condition, sampling, curve_windows(windows), repeats)
        draft_steps[B] = measure_cost_curve(drafter, condition, sampling, (1,), repeats)[1]
        print(describe_curve(name, B, curves[B], draft_steps[B]), flush=True)
    return {"forward_seconds": curves, "draft_step_seconds": draft_steps,
            "cost_curve": {B: relative(c) for B, c in curves.items()}}


def projections(entry: dict, runs: dict) -> dict:
    """Per batch size: `projected_speedups` of a model's `measure_curves` entry with the embedded runs of that size."""
    return {B: projected_speedups(curve, drafter_steps(entry, B), runs[B])
            for B, curve in entry["forward_seconds"].items()}


def drafter_steps(entry: dict, batch_size: int) -> dict[str, float]:
    """Seconds of one drafter call per method of `DRAFTED` at `batch_size`: the drafter's one-token forward, and for
    the head path the head's call where it was timed (the embedded model), else the same forward (a real size)."""
    draft = entry["draft_step_seconds"][batch_size]
    return {"draft": draft, "heads": entry.get("head_call_seconds", {}).get(batch_size, draft)}


def head_call_seconds(pipe, batch_size: int, repeats: int) -> float:
    """Median seconds of one call of the pipeline's EAGLE head for `batch_size` samples and their CFG rows: one pair
    through its decoder layer, attending over half the image's cached pairs, read out through the target's LM head
    (what one drafted token costs the head path, `HeadProposer`'s bookkeeping aside)."""
    head, adapter, device = pipe.eagle_head, pipe.image_adapter(), pipe.device
    head.bind(*adapter.feature_readout())
    c = head.config
    rows, cached = 2 * batch_size, c.grid_size**2 // 2
    k = torch.zeros(rows, c.n_head, cached + 1, c.feature_size // c.n_head, device=device, dtype=head.dtype)
    pair = (torch.zeros(rows, 1, dtype=torch.long, device=device), torch.zeros(rows, 1, c.feature_size, device=device),
            torch.full((rows, 1), cached, device=device))
    mask = torch.ones(rows, 1, 1, cached + 1, dtype=torch.bool, device=device)
    slots = torch.full((rows, 1), cached, device=device)
    with torch.no_grad():
        return median_seconds(lambda: head.logits(head(*pair, mask, (k, torch.zeros_like(k)), slots)), device,
                              repeats, warmup=2)


def describe_curve(name: str, batch_size: int, curve: dict[int, float], draft_step: float) -> str:
    return (f"{name} batch {batch_size}: one token {1000 * curve[1]:.1f} ms; "
            + ", ".join(f"W={W}: {c:.2f}x" for W, c in relative(curve).items())
            + f"; drafter {draft_step / curve[1]:.2f}x")


def run_embedded(pipe, device: torch.device, prompts: list[str], batch_size: int, windows,
                 draft_steps: dict[str, float]) -> dict:
    """Step compression and wall-clock speedup over AR of every method and window on the embedded model: on each
    batch of prompts AR runs first, then every method at every window (so drift of the machine hits them alike); a
    method's speedup is the median over batches of AR's latency / its latency. draft_steps: seconds of one drafter
    call per method of `DRAFTED` (`drafter_steps`)."""
    def call(options: dict, batch: list[str], start: int):
        generators = seeded(device, range(1000 + start, 1000 + start + len(batch)))
        # a head reads the target's features from eager forwards: its calls pause the pipeline's CUDA graphs (the
        # steps the others captured are kept for them)
        paused = pipe.cuda_graphs, pipe.window_graphs
        if options.get("decoding") == "heads":
            pipe.cuda_graphs, pipe.window_graphs = False, {}
        try:
            return pipe(batch, generator=generators, output_type="latent", guidance_scale=GUIDANCE, **options).stats
        finally:
            pipe.cuda_graphs, pipe.window_graphs = paused

    def timed(options: dict, batch: list[str], start: int):
        """(seconds, stats) of a call; on CUDA the stats (whose phase timings give the overhead) come from a second
        call with the same seeds and every phase synchronized, so that they time the work, not its launch."""
        synchronize(device)
        began = time.perf_counter()
        stats = call(options, batch, start)
        synchronize(device)
        seconds = time.perf_counter() - began
        if device.type == "cuda":
            with synchronized_timings(device):
                stats = call(options, batch, start)
        return seconds, stats

    settings = {(method, W): make(W) for method, make in METHODS.items()
                for W in (DRAFT_WINDOWS if method in DRAFTED else windows) if W > 1}
    forwards, tokens, outside, ratios = {}, {}, {}, {}
    for start in range(0, len(prompts) - batch_size + 1, batch_size):
        batch = prompts[start : start + batch_size]
        ar_seconds, stats = timed({"decoding": "ar"}, batch, start)
        outside.setdefault("ar", []).append(overhead_seconds(stats, 0.0))
        for (method, W), options in settings.items():
            seconds, stats = timed(options, batch, start)
            key = method, W
            forwards[key] = forwards.get(key, 0) + stats.target_forwards - stats.prefill_forwards
            tokens[key] = tokens.get(key, 0) + int(stats.new_tokens.max())
            outside.setdefault(key, []).append(overhead_seconds(stats, draft_steps.get(method, 0.0)))
            ratios.setdefault(key, []).append(ar_seconds / seconds)
    results = {"ar": {"overhead_s": statistics.median(outside["ar"])}} | {method: {} for method in METHODS}
    for (method, W) in settings:
        results[method][W] = {"compression": round(tokens[method, W] / forwards[method, W], 3),
                              "overhead_s": statistics.median(outside[method, W]),
                              "measured_speedup": round(statistics.median(ratios[method, W]), 3)}
    for method in METHODS:
        runs = results[method]
        print(f"embedded batch {batch_size} {method}: " + ", ".join(
            f"W={W}: c {r['compression']:.2f}, {r['measured_speedup']:.2f}x" for W, r in runs.items()), flush=True)
    return results


def overhead_seconds(stats, draft_step: float) -> float:
    """Seconds per target forward a decoding spent outside its target forwards (drafting, verification,
    bookkeeping), less its drafter's calls at `draft_step` seconds each (the projection counts those itself)."""
    outside = stats.timings["total"] - stats.timings.get("target", 0.0) - stats.draft_forwards * draft_step
    return outside / stats.target_forwards


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
    adapter = pipe.image_adapter()
    embedded = measure_curves("embedded", adapter, pipe.draft_adapter(),
                              lambda B: pipe.encode_prompt(held_out_prompts(B), None, adapter), batch_sizes, windows,
                              repeats)
    embedded["head_call_seconds"] = {B: head_call_seconds(pipe, B, repeats) for B in batch_sizes}
    print("embedded EAGLE head call: " + ", ".join(
        f"batch {B} {seconds / embedded['forward_seconds'][B][1]:.2f}x a one-token forward"
        for B, seconds in embedded["head_call_seconds"].items()), flush=True)
    embedded["runs"] = {B: run_embedded(pipe, device, texts, B, windows, drafter_steps(embedded, B))
                        for B in batch_sizes}
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
                             f"{QUICK['prompts']} prompts, {QUICK['repeats']} timed forwards per window")
    parser.add_argument("--models", nargs="+", choices=ALL_SHAPES, default=None,
                        help="real shapes to measure (default: all; --quick: LlamaGen-B and -L)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=None, help=f"default {BATCH_SIZES}")
    parser.add_argument("--windows", nargs="+", type=int, default=list(WINDOWS),
                        help="window widths to measure (must include 1)")
    parser.add_argument("--prompts", type=int, default=None,
                        help="held-out prompts the embedded model decodes per batch size (default 8, --quick 4)")
    parser.add_argument("--repeats", type=int, default=None, help="timed forwards per window (default 5)")
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--plot", default=None, help="write the plot here (docs/images/cost_model_<device>.png)")
    args = parser.parse_args(argv)
    if 1 not in args.windows or min(args.windows) < 1:
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
    windows = tuple(sorted(set(args.windows)))

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
