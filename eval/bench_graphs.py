"""What the decoding loop spends outside the target's forward, and what CUDA graphs buy, on the embedded text-to-image
model (mmspec/zoo/shapes).

    python -m mmspec.eval.bench_graphs --device cuda --json eval/results/gpu/bench_graphs.json
    python -m mmspec.eval.bench_graphs --device cpu --quick   # eager only: graphs need CUDA (says so)

On a GPU a small model's forward is bound by kernel launches, so a decode step costs about the same whatever its
window, and what the loop does around the forward (drafting, verification, bookkeeping, the one host sync) is a
large share of it. Every method of `METHODS` decodes the same held-out prompts and seeds at each batch size, first
with eager forwards, then (on CUDA) with `pipe.enable_cuda_graphs()`: each window width's forward captured once and
replayed. Per mode, method and batch size: the median latency of a call (no added syncs), its speedup over AR in the
same mode, tokens per target forward, and `outside_share`, the share of the decode loop's time spent outside the
target's forwards, from a second run with every phase synchronized (`mmspec.core.stats.synchronized_timings`);
`graphs_speedup` is eager latency / graphed latency per method. On a CPU the graphs mode is skipped with a line
saying so (`"graphs": "needs CUDA"` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from mmspec.core.devices import add_device_arguments, resolve_device
from mmspec.core.measured import synchronize
from mmspec.core.stats import synchronized_timings
from mmspec.eval.bench_image import held_out_prompts
from mmspec.eval.devices import machine, seeded, write_json
from mmspec.zoo import IMAGE_T2I

GUIDANCE = 3.0
METHODS = {
    "ar": {"decoding": "ar"},
    "sjd_w16": {"decoding": "sjd", "window": 16, "init": "random", "coupling": "none"},
    "mc_sjd_w16": {"decoding": "sjd", "window": 16, "init": "horizontal", "coupling": "maximal"},
    "draft_w3": {"decoding": "draft", "draft_length": 2},
}


def measure(pipe, device: torch.device, prompts: list[str], batch_size: int) -> dict:
    """method -> median latency, tokens per target forward and outside share over the batches of `prompts`."""
    def call(options, batch, start):
        generators = seeded(device, range(1000 + start, 1000 + start + len(batch)))
        return pipe(batch, generator=generators, output_type="latent", guidance_scale=GUIDANCE, **options).stats

    results = {}
    for method, options in METHODS.items():
        call(options, prompts[:batch_size], 0)  # warm-up: a graph is captured on its width's first use
        latencies, shares, tokens, forwards = [], [], 0, 0
        for start in range(0, len(prompts) - batch_size + 1, batch_size):
            batch = prompts[start : start + batch_size]
            synchronize(device)
            began = time.perf_counter()
            stats = call(options, batch, start)
            synchronize(device)
            latencies.append(time.perf_counter() - began)
            tokens += int(stats.new_tokens.max())
            forwards += stats.target_forwards - stats.prefill_forwards
            with synchronized_timings(device):
                timings = call(options, batch, start).timings
            shares.append(1 - timings["target"] / timings["total"])
        results[method] = {"latency_s": statistics.median(latencies), "tokens_per_forward": round(tokens / forwards, 3),
                           "outside_share": round(statistics.median(shares), 3)}
    for run in results.values():
        run["speedup_vs_ar"] = round(results["ar"]["latency_s"] / run["latency_s"], 3)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_arguments(parser, dtype=False)
    parser.add_argument("--quick", action="store_true", help="2 prompts at batch 1 only")
    parser.add_argument("--prompts", type=int, default=None, help="held-out prompts per batch size (default 8)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=None, help="default 1 4 (--quick: 1)")
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args(argv)
    batch_sizes = tuple(args.batch_sizes or ((1,) if args.quick else (1, 4)))
    prompts = args.prompts or (2 if args.quick else 8)
    if min(batch_sizes) < 1 or prompts < max(batch_sizes):
        parser.error(f"--batch-sizes must be positive and at most --prompts ({prompts}), got {list(batch_sizes)}")
    device = resolve_device(parser, args.device)

    from mmspec.pipelines.auto import AutoARImagePipeline

    pipe = AutoARImagePipeline.from_pretrained(IMAGE_T2I, dtype=torch.float32).to(device)
    pipe.set_progress_bar_config(disable=True)
    texts = held_out_prompts(prompts)
    modes = ["eager"] + (["graphs"] if device.type == "cuda" else [])
    if device.type != "cuda":
        print(f"graphs: skipped, CUDA graphs need a CUDA device (--device {args.device})", flush=True)
    report = {**machine(device), "command": "python -m mmspec.eval.bench_graphs " + " ".join(
        sys.argv[1:] if argv is None else argv), "batch_sizes": list(batch_sizes), "prompts": prompts,
        "modes": {}, "graphs_speedup": {}}
    for mode in modes:
        if mode == "graphs":
            pipe.enable_cuda_graphs()
        report["modes"][mode] = {B: measure(pipe, device, texts, B) for B in batch_sizes}
        for B, results in report["modes"][mode].items():
            print(f"{mode} batch {B}: " + ", ".join(
                f"{m} {r['latency_s'] * 1000:.0f} ms ({r['speedup_vs_ar']:.2f}x AR, {r['tokens_per_forward']:.2f} "
                f"tokens / forward, {100 * r['outside_share']:.0f} % outside the forward)" for m, r in results.items()),
                flush=True)
    if "graphs" in report["modes"]:
        report["graphs_speedup"] = {B: {m: round(report["modes"]["eager"][B][m]["latency_s"]
                                                 / report["modes"]["graphs"][B][m]["latency_s"], 3) for m in METHODS}
                                    for B in batch_sizes}
        print("graphs vs eager: " + json.dumps(report["graphs_speedup"]), flush=True)
    else:
        report["graphs"] = "needs CUDA"
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
