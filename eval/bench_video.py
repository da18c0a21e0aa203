"""Frame speculation benchmark on the embedded next-frame world model (mmspec/zoo/nextframe_shapes), in one process.

    python -m mmspec.eval.bench_video          # full: 8 held-out episodes x 64 frames per change probability
    python -m mmspec.eval.bench_video --quick  # under 10 minutes on 2 CPU cores: 3 episodes x 32 frames
    python -m mmspec.eval.bench_video --json eval/results/bench_video.json --plot docs/images/video_speculation.png \
        --strip docs/images/video_rollouts.png

Each episode of the held-out video world starts from its true first frame and is rolled out interactively (batch 1,
one `session.step(action)` per frame, every frame decoded as it is emitted) under persistent random actions whose
per-frame change probability is swept over --change-probs; every method sees the same episodes, actions and seeds,
after an untimed warm-up. Methods (`mmspec.video.FrameSpeculation`):

    sequential     one frame per step, its context pass after it: the baseline (a KV cache, no speculation)
    strict         one frame per step, the context pass pipelined into the next step: the sequential law exactly
    spec4          4 frames per block under the current action (NFD's speculative sampling), eager context passes
    spec4_pipe     the same, with the context pass of the emitted frames pipelined into the next block
    adaptive       up to 8 frames per block, N chosen from the observed action persistence (pipelined)

Columns per (method, change probability): FPS (emitted frames / wall-clock seconds of the stepping loop, decoding
included), the speedup against `sequential` and against `strict` (the faster way to generate without speculation:
one forward fewer per frame) in the same run, the time split (model-only FPS: the DiT's Euler steps and cache
updates; autoencoder decoding in ms per frame), model forwards per frame, frames discarded, rollbacks, and quality
against the ground-truth rollout of the world's physics: PSNR and SSIM of every generated frame (frames 2..N of a
block are joint samples, so speculation may change quality; the sequential row is the reference). JSON key
`speedup_at_change_rate_0.1` is the headline method's (--headline) FPS over `strict`'s: speculation's own gain, with
the context-pass pipelining that both use factored out.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.core.runtime.measured import median_seconds
from mmspec.core.stats import synchronize
from mmspec.eval.devices import machine, seeded, write_json
from mmspec.pipelines.video import NextFramePipeline
from mmspec.video import FrameSpeculation
from mmspec.zoo import VIDEO_WORLD
from mmspec.zoo.video_world import episode, persistent_actions, rollout

METHODS = {
    "sequential": FrameSpeculation(frames=1),
    "strict": FrameSpeculation.strict(),
    "spec4": FrameSpeculation(frames=4),
    "spec4_pipe": FrameSpeculation(frames=4, context="pipelined"),
    "adaptive": FrameSpeculation(frames=8, adaptive=True, context="pipelined"),
}
CHANGE_PROBS = (0.0, 0.05, 0.1, 0.2, 0.5)


@dataclass
class Row:
    method: str
    change_prob: float
    fps: float
    model_fps: float
    decode_ms_per_frame: float
    forwards_per_frame: float
    frames_discarded: int
    rollbacks: int
    psnr_db: float
    ssim: float
    speedup_vs_sequential: float = 1.0
    speedup_vs_strict: float = 1.0


def ground_truth(episodes: int, frames: int, change_prob: float) -> list[tuple[np.ndarray, list[int]]]:
    """(true frames [T + 1, H, W, 3] uint8, actions [T]) of held-out episodes 0 .. episodes - 1."""
    out = []
    for index in range(episodes):
        actions = persistent_actions(10**6 + index, frames, change_prob)
        out.append((rollout(episode(index, "heldout"), actions)[0], actions))
    return out


def psnr_ssim(frames: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-frame PSNR (dB) and SSIM of frames vs truth, both float [T, H, W, 3] in [0, 1]."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    mse = ((frames - truth) ** 2).reshape(len(frames), -1).mean(1)
    psnr = 10 * np.log10(1.0 / np.maximum(mse, 1e-10))
    frames, truth = (torch.from_numpy(x).permute(0, 3, 1, 2).double() for x in (frames, truth))
    ssim = structural_similarity_index_measure(frames, truth, data_range=1.0, kernel_size=7, reduction="none")
    return psnr, ssim.numpy()


def rollout_session(pipe, start: np.ndarray, actions: list[int], speculation, seed: int, steps: int,
                    context_noise: float = 0.1):
    """Step one episode interactively; returns (frames [T, H, W, 3] in [0, 1], wall seconds, stats)."""
    session = pipe.start_session(start, decoding=speculation, num_inference_steps=steps, context_noise=context_noise,
                                 generator=seeded(pipe.device, [seed])[0], output_type="np")
    began = time.perf_counter()
    frames = [session.step(action) for action in actions]
    synchronize(pipe.device)
    seconds = time.perf_counter() - began
    return np.concatenate(frames), seconds, session.close()


def run(pipe, methods: list[str], episodes, change_prob: float, args) -> tuple[list[Row], dict, dict]:
    """Every method on every episode, interleaved (episode by episode, so that drifts of the machine's speed hit every
    method alike); returns the rows, per method the per-frame PSNR [episodes, T] and episode 0's frames."""
    totals = {m: dict(frames=0, seconds=0.0, forwards=0, discarded=0, rollbacks=0, model=0.0, decode=0.0)
              for m in methods}
    psnrs, ssims, first_videos = {m: [] for m in methods}, {m: [] for m in methods}, {}
    for index, (truth, actions) in enumerate(episodes):
        for method in methods:
            video, wall, stats = rollout_session(pipe, truth[0], actions, METHODS[method], 1000 + index, args.steps,
                                                 args.context_noise)
            psnr, ssim = psnr_ssim(video, truth[1:].astype(np.float64) / 255)
            psnrs[method].append(psnr)
            ssims[method].append(ssim)
            total = totals[method]
            total["frames"] += len(actions)
            total["seconds"] += wall
            total["forwards"] += stats.target_forwards
            total["discarded"] += stats.frames_discarded
            total["rollbacks"] += stats.rollbacks
            total["model"] += stats.timings["model"]
            total["decode"] += stats.timings["decode"]
            if index == 0:
                first_videos[method] = video
    rows = []
    for method, t in totals.items():
        rows.append(Row(method, change_prob, t["frames"] / t["seconds"], t["frames"] / t["model"],
                        1000 * t["decode"] / t["frames"], t["forwards"] / t["frames"], t["discarded"],
                        t["rollbacks"], float(np.mean(psnrs[method])), float(np.mean(ssims[method]))))
    return rows, {m: np.stack(v) for m, v in psnrs.items()}, first_videos


@torch.no_grad()
def pass_costs(model, frames=(1, 2, 4, 8), repeats: int = 30) -> dict[int, float]:
    """Median ms of one forward over n new frames after a full cache (batch 1), per n: what a block of n costs per
    Euler step, and where `FrameSpeculation.frame_cost` comes from."""
    window, tokens, channels = model.config.attention_window, model.tokens_per_frame, model.config.latent_channels
    device, dtype = model.device, model.dtype
    costs = {}
    for n in frames:
        with torch.device(device):
            cache = model.new_cache(1, max_speculative=max(n, window))
            _, kv = model(torch.zeros(1, window, tokens, channels, dtype=dtype), torch.zeros(1, window),
                          torch.zeros(1, window, dtype=torch.long), 0, cache)
            cache.append([k for k, _ in kv], [v for _, v in kv])
            cache.commit(window)
            latents, times = torch.zeros(1, n, tokens, channels, dtype=dtype), torch.ones(1, n)
            actions = torch.zeros(1, n, dtype=torch.long)
        seconds = median_seconds(partial(model, latents, times, actions, window, cache), device, repeats, warmup=3)
        costs[n] = round(1000 * seconds, 3)
    return costs


def print_table(rows: list[Row]) -> None:
    print("| method | change prob | FPS | speedup vs sequential | vs strict | model-only FPS | decode ms / frame | "
          "forwards / frame | discarded | rollbacks | PSNR (dB) | SSIM |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.method} | {r.change_prob:g} | {r.fps:.1f} | {r.speedup_vs_sequential:.2f} | "
              f"{r.speedup_vs_strict:.2f} | {r.model_fps:.1f} | {r.decode_ms_per_frame:.1f} | "
              f"{r.forwards_per_frame:.2f} | {r.frames_discarded} | {r.rollbacks} | {r.psnr_db:.2f} | {r.ssim:.3f} |")


def plot(rows: list[Row], psnr_curves: dict[str, np.ndarray], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, quality) = plt.subplots(1, 2, figsize=(11, 4))
    for method in dict.fromkeys(r.method for r in rows):
        mine = [r for r in rows if r.method == method]
        speed.plot([r.change_prob for r in mine], [r.fps for r in mine], marker="o", label=method)
        if method in psnr_curves:
            curve = psnr_curves[method]
            quality.plot(np.arange(1, len(curve) + 1), curve, label=method)
    speed.set(xlabel="action change probability per frame", ylabel="FPS (batch 1, decoding included)",
              title="Frame speculation: throughput")
    quality.set(xlabel="frame", ylabel="PSNR vs ground truth (dB)", title="Quality along the rollout (change 0.1)")
    for ax in (speed, quality):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save_strip(truth: np.ndarray, videos: dict[str, np.ndarray], path: Path, frames: int = 16) -> None:
    """PNG: a row per rollout (ground truth, then each method) of episode 0's first `frames` frames, 2x nearest."""
    from PIL import Image

    rows = [truth[1 : frames + 1] / 255] + [video[:frames] for video in videos.values()]
    strip = np.concatenate([np.concatenate(list(row), axis=1) for row in rows], axis=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray((strip * 255).round().astype(np.uint8))
    image.resize((image.width * 2, image.height * 2), Image.NEAREST).save(path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=VIDEO_WORLD, help="zoo name or saved NextFramePipeline folder")
    parser.add_argument("--quick", action="store_true", help="3 episodes x 32 frames")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="Euler steps per frame")
    parser.add_argument("--context-noise", type=float, default=0.1, help="flow time of emitted frames in the cache")
    parser.add_argument("--change-probs", type=float, nargs="+", default=list(CHANGE_PROBS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--headline", default="spec4_pipe", choices=list(METHODS))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="PNG: FPS vs change probability, PSNR per frame")
    parser.add_argument("--strip", type=Path, default=None,
                        help="PNG: episode 0 at change probability 0.1, ground truth then each method, 16 frames")
    add_device_arguments(parser, dtype=False)
    args = parser.parse_args(argv)
    device = resolve_device(parser, args.device)
    if args.quick:
        args.episodes, args.frames = 3, 32
    pipe = NextFramePipeline.from_pretrained(args.model, dtype=torch.float32).to(device)
    pipe.set_progress_bar_config(disable=True)
    warm = ground_truth(1, 8, 0.2)[0]
    for method in args.methods:  # untimed warm-up of every code path
        rollout_session(pipe, warm[0][0], warm[1], METHODS[method], 0, args.steps)

    costs = pass_costs(pipe.transformer)
    print("ms per forward by frames in the pass: " + ", ".join(f"{n}: {ms:.2f}" for n, ms in costs.items()))
    rows, curves, strip_videos = [], {}, {}
    for change_prob in args.change_probs:
        episodes = ground_truth(args.episodes, args.frames, change_prob)
        prob_rows, psnrs, first_videos = run(pipe, args.methods, episodes, change_prob, args)
        rows += prob_rows
        if change_prob == 0.1:
            curves = {m: p.mean(0) for m, p in psnrs.items()}
            strip_videos, strip_truth = first_videos, episodes[0][0]
        print(", ".join(f"{r.method} {r.fps:.1f} FPS" for r in prob_rows) + f" @ change {change_prob:g}", flush=True)
    for row in rows:
        for baseline in ("sequential", "strict"):
            base = next((r for r in rows if r.method == baseline and r.change_prob == row.change_prob), None)
            setattr(row, f"speedup_vs_{baseline}", float("nan") if base is None else row.fps / base.fps)
    print_table(rows)
    if args.plot:
        plot(rows, curves, args.plot)
    if args.strip and strip_videos:
        save_strip(strip_truth, strip_videos, args.strip)

    result = {"settings": {k: v for k, v in vars(args).items() if k not in ("json", "plot", "strip")},
              **machine(device),
              "pass_ms_by_frames": costs, "rows": [asdict(r) for r in rows],
              "psnr_per_frame_at_change_0.1": {m: [round(float(v), 3) for v in c] for m, c in curves.items()}}
    for row in rows:
        if row.method == args.headline:
            result[f"speedup_at_change_rate_{row.change_prob:g}"] = round(row.speedup_vs_strict, 4)
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
