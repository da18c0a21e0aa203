"""The cost model's next-frame part: frame speculation projected to an NFD-size world model, from a random-weight
transformer of that size and the embedded world model's rollouts.

    python -m mmspec.eval.cost_model --models nfd-310m --batch-sizes 1

Every model forward of a rollout (a denoising step over a block of n frames, or the context pass that caches them)
costs what a forward over n new frames after a full cache costs, c(n) (`bench_video.pass_costs`). Forward hooks log
the n of every forward in the embedded model's rollouts (bench_video's held-out episodes at change probability
`CHANGE_PROB`, every method of `bench_video.METHODS`) and the seconds inside them; the rest of a rollout's wall clock,
decoding excluded, is its overhead o (sessions, rollbacks, bookkeeping), which does not grow with the model. A
method's rollout then costs T = sum over its forwards of c(n) + o on any model, and its projected speedup over
`sequential` is T_sequential / T (model time: the autoencoder that decodes the frames is not part of it). The embedded
model is the projection's test: its own c(n) projects the speedups its rollouts measured (`projection_relative_error`).

`NFD_SHAPE`: NFD's 310 M parameters (Cheng et al. 2025) as our architecture's 16 blocks x 1024 (305 M), frames of
384 x 224 px as an 18 x 18 grid of latent tokens (NFD's 24 x 14 = 336 at 16x downsampling, made square), its
32-frame context window. The paper gives the size and the context, not the depth and width.
"""

from __future__ import annotations

import torch

from mmspec.eval.bench_video import METHODS, ground_truth, pass_costs, rollout_session
from mmspec.eval.timed_spans import TimedSpans
from mmspec.models.nextframe import NextFrameTransformer

NFD_SHAPE = {"latent_channels": 16, "latent_size": 18, "num_actions": 16, "dim": 1024, "depth": 16, "num_heads": 16,
             "attention_window": 32, "patch_size": 1}
VIDEO_SHAPES = {"nfd-310m": NFD_SHAPE}
CHANGE_PROB = 0.1
STEPS = 4  # Euler steps per block, bench_video's default


def run_embedded(pipe, episodes: int, frames: int) -> dict:
    """Per method of `METHODS`: every forward's frame count, the seconds inside the forwards, and the overhead (wall
    clock less forwards and decoding), summed over `episodes` held-out episodes of `frames` frames."""
    runs = {m: {"frames": [], "inside_s": 0.0, "overhead_s": 0.0} for m in METHODS}
    for index, (truth, actions) in enumerate(ground_truth(episodes, frames, CHANGE_PROB)):
        for method, speculation in METHODS.items():
            model = pipe.transformer
            log = TimedSpans(pipe.device, {"frames": (model, model, lambda args: args[0].shape[1])})
            _, wall, stats = rollout_session(pipe, truth[0], actions, speculation, 1000 + index, STEPS)
            logged = log.remove()
            runs[method]["frames"] += logged["frames"]
            runs[method]["inside_s"] += logged["inside_s"]
            runs[method]["overhead_s"] += wall - logged["inside_s"] - stats.timings["decode"]
    for run in runs.values():
        run["model_s"] = run["inside_s"] + run["overhead_s"]
    return runs


def projected_speedups(runs: dict, costs_ms: dict[int, float]) -> dict:
    """method -> T_sequential / T for a model's forward cost c(n) (ms, per frame count n)."""
    def total(run):
        return sum(costs_ms[n] for n in run["frames"]) / 1000 + run["overhead_s"]

    sequential = total(runs["sequential"])
    return {method: round(sequential / total(run), 3) for method, run in runs.items()}


def measure_video(names, device: torch.device, dtype: torch.dtype, episodes: int, frames: int, repeats: int,
                  shapes: dict | None = None) -> dict:
    """The next-frame section of the cost model's report: the embedded model's rollouts and projection check, and per
    name of `VIDEO_SHAPES` (or `shapes`: name -> NextFrameTransformer keyword arguments) its parameters, cost curve
    c(n) (ms) and projected speedups."""
    from mmspec.pipelines.video import NextFramePipeline
    from mmspec.zoo import VIDEO_WORLD

    pipe = NextFramePipeline.from_pretrained(VIDEO_WORLD, dtype=torch.float32).to(device)
    pipe.set_progress_bar_config(disable=True)
    rollout_session(pipe, ground_truth(1, 4, CHANGE_PROB)[0][0][0], [0] * 4, METHODS["spec4"], 0, STEPS)  # warm-up
    runs = run_embedded(pipe, episodes, frames)
    widths = sorted({n for run in runs.values() for n in run["frames"]})
    own = projected_speedups(runs, pass_costs(pipe.transformer, widths, repeats))
    measured = {m: round(runs["sequential"]["model_s"] / run["model_s"], 3) for m, run in runs.items()}
    check = {m: {"projected": own[m], "measured": measured[m],
                 "relative_error": round(abs(own[m] - measured[m]) / measured[m], 3)} for m in METHODS}
    print("embedded world model: " + ", ".join(f"{m} projected {c['projected']:.2f}x, measured {c['measured']:.2f}x"
                                               for m, c in check.items()), flush=True)
    section = {"embedded (nextframe_shapes)": {
        "forwards": {m: {n: count for n in widths if (count := run["frames"].count(n))} for m, run in runs.items()},
        "overhead_s": {m: round(run["overhead_s"], 3) for m, run in runs.items()}, "check": check}}
    del pipe
    for name, config in (shapes or {n: VIDEO_SHAPES[n] for n in names}).items():
        with torch.device(device):
            model = NextFrameTransformer(**config).eval()
        model = model if model.dtype == dtype else model.to(dtype)
        costs = pass_costs(model, widths, repeats)
        section[name] = {"parameters": sum(p.numel() for p in model.parameters()), "config": config,
                         "forward_ms": costs, "projected": projected_speedups(runs, costs)}
        print(f"{name}: forward over n frames " + ", ".join(f"n={n} {ms:.1f} ms" for n, ms in costs.items())
              + "; projected vs sequential "
              + ", ".join(f"{m} {s:.2f}x" for m, s in section[name]["projected"].items()),
              flush=True)
        del model
    section["projection_relative_error"] = max(c["relative_error"] for c in check.values())
    return section
