"""Decoding time at real model size, end to end: random-weight models of the published configurations
(`mmspec.eval.real_shapes`) on the slot cache their pipelines decode on with CUDA, each step captured whole, with
only the acceptance borrowed from the embedded model.

    python -m mmspec.eval.real_size --device cuda --dtype bfloat16 --models janus-pro-7b lumina-mgpt-7b \\
        --batch-sizes 1 4 --json eval/results/gpu/real_size.json
    python -m mmspec.eval.real_size --device cpu --quick --json /tmp/real_size.json   # tiny configurations

For each model and batch size B (B samples, each with its CFG row):
- graphed AR: AR on the slot cache, its steps captured in CUDA graphs (on a CPU the same static-buffer steps run
  uncaptured): milliseconds per AR token, against the weight-bandwidth floor (the decoder's weight bytes over the
  device's measured copy bandwidth: what reading the weights once per forward costs, `weights_read`);
- eager AR: the same adapter on transformers' dynamic cache, one forward per token, the loop transformers'
  `generate` runs (the ecosystem baseline; `tests/models` checks it decodes what `generate` decodes);
- each exact method of `METHODS`: the seconds of one iteration of its captured step. An image then takes the
  prefill plus N / c iterations, where N is the model's image tokens and c the method's step compression (image
  tokens per target forward) measured on the embedded text-to-image model with the same settings and batch size
  (`--compression METHOD=C` gives one instead). c is the only borrowed number: random weights never stand in for
  acceptance, and the report marks it `borrowed`.

Why seconds per iteration: a captured step has fixed shapes (the window, the tree, the cache's capacity), so an
iteration costs the same whatever it accepts; each decoding runs ITERATIONS iterations (in blocks of BLOCK, so
that a warm-up call captures every block the timed call replays) or to the image's end if that comes first.
`outside_share` is the part of an iteration spent outside the target's forward: 1 - (an eager W-token forward with
its logits processing) / (the captured iteration).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from mmspec.core.probs import SamplingConfig
from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.core.runtime.measured import median_seconds
from mmspec.core.stats import SpecStats, synchronize
from mmspec.eval.bench_graphs import family_decodings, family_shapes
from mmspec.eval.devices import machine, seeded, write_json
from mmspec.eval.real_shapes import REAL_SHAPES, RealShape
from mmspec.image.policy import measure_cost_curve
from mmspec.models.hf_image import SlotGraphs, on_slot_cache

METHODS = tuple(method for method in family_decodings() if method != "ar")  # bench_graphs' family rows' exact ones
FAMILIES = ("janus-pro-1b", "janus-pro-7b", "emu3-8b", "lumina-mgpt-7b")  # the shapes on a transformers slot cache
SAMPLING = SamplingConfig(temperature=1.0, top_k=2000, guidance_scale=3.0)
ITERATIONS, BLOCK = 64, 8
QUICK = {"batch_sizes": (1, 2), "iterations": 16, "prompts": 2}


def copy_bandwidth(device: torch.device, mib: int) -> float:
    """Bytes per second a device copy moves (read and write) over `mib` MiB: the weight-bandwidth floor's unit."""
    source = torch.ones(mib * 2**20 // 4, device=device)
    target = torch.empty_like(source)
    seconds = median_seconds(lambda: target.copy_(source), device, repeats=10, warmup=2)
    return 2 * source.numel() * source.element_size() / seconds


def weights_read(backbone: torch.nn.Module) -> int:
    """Bytes of the decoder's weights a forward reads whole: every parameter but the embedding tables' (a forward
    reads a few of their rows). The image head is left out too (1-2 % of a 7B model's weights), so the floor is a
    little below what a forward must read."""
    embeddings = {id(p) for module in backbone.modules() if isinstance(module, torch.nn.Embedding)
                  for p in module.parameters()}
    return sum(p.numel() * p.element_size() for p in backbone.parameters() if id(p) not in embeddings)


def timed_iterations(decoding, adapter, condition, device: torch.device, iterations: int) -> dict:
    """One decoding of `condition` run for `iterations` iterations (or to its end): seconds of the prefill and of an
    iteration after it."""
    stats = SpecStats()
    synchronize(device)
    began = time.perf_counter()
    steps = decoding.run(adapter, condition, SAMPLING, seeded(device, [0])[0], stats, block=BLOCK)
    with torch.no_grad():
        for progress in steps:
            if progress.step == 0:
                synchronize(device)
                opened = time.perf_counter()
            if progress.step >= iterations:
                progress.stop()
        synchronize(device)
    ended = time.perf_counter()
    done = stats.target_forwards - stats.prefill_forwards
    return {"prefill_s": opened - began, "iteration_s": (ended - opened) / done, "iterations": done}


def measure_model(name: str, shape: RealShape, device: torch.device, dtype: torch.dtype, batch_sizes,
                  iterations: int, compression: dict, bandwidth: float) -> dict:
    """Per batch size: graphed and eager AR, and each method's captured iteration with its borrowed compression."""
    with torch.device(device):
        model = shape.model().to(dtype).eval()
    eager = shape.adapter(model)
    weight_bytes = weights_read(eager.backbone)
    graphed = on_slot_cache(shape.adapter(model), SlotGraphs(cuda=True) if device.type == "cuda" else None)
    N = shape.image_tokens
    decodings = family_decodings()
    entry = {"parameters": shape.parameters(), "weight_bytes": weight_bytes, "image_tokens": N, "batch_sizes": {}}
    floor_ms = 1000 * weight_bytes / bandwidth
    for B in batch_sizes:
        condition = shape.condition(B, device)
        widths = sorted({decoding.forward_width for decoding in decodings.values()})
        forward = measure_cost_curve(eager, condition, SAMPLING, widths, 3)
        runs = {}
        for method, decoding in decodings.items():
            timed_iterations(decoding, graphed, condition, device, iterations)  # captures what the next replays
            runs[method] = timed_iterations(decoding, graphed, condition, device, iterations)
            runs[method]["outside_share"] = round(1 - forward[decoding.forward_width] / runs[method]["iteration_s"], 3)
        eager_ar = timed_iterations(decodings["ar"], eager, condition, device, iterations)
        ar_image = runs["ar"]["prefill_s"] + N * runs["ar"]["iteration_s"]
        eager_image = eager_ar["prefill_s"] + N * eager_ar["iteration_s"]
        row = {"graphed_ar": {"ms_per_token": round(1000 * runs["ar"]["iteration_s"], 3),
                              "floor_ms_per_token": float(f"{floor_ms:.4g}"),
                              "over_floor": round(1000 * runs["ar"]["iteration_s"] / floor_ms, 3),
                              "image_s": round(ar_image, 4), "outside_share": runs["ar"]["outside_share"]},
               "eager_ar": {"ms_per_token": round(1000 * eager_ar["iteration_s"], 3), "image_s": round(eager_image, 4)},
               "methods": {}}
        for method in METHODS:
            run, c = runs[method], compression[B][method]
            image = run["prefill_s"] + N / c * run["iteration_s"]
            row["methods"][method] = {
                "compression": c, "borrowed": True, "iteration_ms": round(1000 * run["iteration_s"], 3),
                "iteration_over_ar": round(run["iteration_s"] / runs["ar"]["iteration_s"], 3),
                "image_s": round(image, 4), "speedup_vs_graphed_ar": round(ar_image / image, 3),
                "speedup_vs_eager_ar": round(eager_image / image, 3), "outside_share": run["outside_share"]}
        entry["batch_sizes"][B] = row
        print(describe(name, B, row), flush=True)
    return entry


def describe(name: str, B: int, row: dict) -> str:
    ar = row["graphed_ar"]
    return (f"{name} batch {B}: graphed AR {ar['ms_per_token']:.2f} ms a token ({ar['over_floor']:.2f}x the weight "
            f"floor), eager AR {row['eager_ar']['ms_per_token']:.2f} ms; " + ", ".join(
                f"{m} {r['speedup_vs_graphed_ar']:.2f}x graphed AR ({r['speedup_vs_eager_ar']:.2f}x eager, "
                f"c {r['compression']:.2f} borrowed)" for m, r in row["methods"].items()))


def embedded_compression(device: torch.device, batch_sizes, prompts: int) -> dict:
    """Per batch size and method: image tokens per target forward of the embedded text-to-image model (its slowest
    row's, as a batch's iterations are), over `prompts` held-out captions at `SAMPLING`'s guidance."""
    from mmspec.eval.bench_image import held_out_prompts
    from mmspec.pipelines.auto import AutoARImagePipeline
    from mmspec.zoo import IMAGE_T2I

    pipe = AutoARImagePipeline.from_pretrained(IMAGE_T2I, dtype=torch.float32).to(device)
    pipe.set_progress_bar_config(disable=True)
    texts, decodings = held_out_prompts(prompts), family_decodings()
    result = {"source": f"embedded text-to-image model ({Path(IMAGE_T2I).name}), {prompts} held-out prompts"}
    for B in batch_sizes:
        result[B] = {}
        for method in METHODS:
            tokens = forwards = 0
            for start in range(0, prompts - B + 1, B):
                stats = pipe(texts[start:start + B], generator=seeded(device, range(start, start + B)),
                             output_type="latent", guidance_scale=SAMPLING.guidance_scale,
                             decoding=decodings[method]).stats
                tokens, forwards = tokens + int(stats.new_tokens.max()), forwards + stats.target_forwards - 1
            result[B][method] = round(tokens / forwards, 3)
        print(f"embedded batch {B}: step compression " + ", ".join(f"{m} {c:.2f}" for m, c in result[B].items()),
              flush=True)
    return result


def parse_compression(parser: argparse.ArgumentParser, given: list[str]) -> dict[str, float]:
    """`--compression METHOD=C ...` -> {method: C}; one line naming the flag on a bad entry."""
    parsed = {}
    for item in given:
        method, _, value = item.partition("=")
        try:
            parsed[method] = float(value)
        except ValueError:
            parser.error(f"--compression takes METHOD=C (C a number), got {item!r}")
        if method not in METHODS or parsed[method] < 1:
            parser.error(f"--compression takes METHOD=C with METHOD one of {', '.join(METHODS)} and C >= 1, "
                         f"got {item!r}")
    if parsed and set(parsed) != set(METHODS):
        parser.error(f"--compression must give every method ({', '.join(METHODS)}), got {', '.join(parsed)}")
    return parsed


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_arguments(parser)
    parser.add_argument("--quick", action="store_true",
                        help=f"the tiny configurations of bench_graphs ({', '.join(family_shapes())}), batch sizes "
                             f"{QUICK['batch_sizes']}, {QUICK['iterations']} iterations, {QUICK['prompts']} prompts")
    parser.add_argument("--models", nargs="+", choices=FAMILIES, default=None,
                        help="real shapes to time (default: all of them; --quick: tiny ones)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=None, help="default 1 4")
    parser.add_argument("--iterations", type=int, default=None, help=f"iterations timed per decoding (default "
                                                                      f"{ITERATIONS})")
    parser.add_argument("--prompts", type=int, default=None,
                        help="held-out prompts the embedded model decodes per batch size (default 8)")
    parser.add_argument("--compression", nargs="+", default=[], metavar="METHOD=C",
                        help="each method's step compression, instead of the embedded model's")
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args(argv)
    batch_sizes = tuple(args.batch_sizes or (QUICK["batch_sizes"] if args.quick else (1, 4)))
    if min(batch_sizes) < 1:
        parser.error(f"--batch-sizes must be positive, got {list(batch_sizes)}")
    iterations = args.iterations if args.iterations is not None else (QUICK["iterations"] if args.quick else
                                                                        ITERATIONS)
    if iterations < 1:
        parser.error(f"--iterations must be >= 1, got {iterations}")
    prompts = args.prompts if args.prompts is not None else (QUICK["prompts"] if args.quick else 8)
    if prompts < max(batch_sizes):
        parser.error(f"--prompts must be at least the largest batch size ({max(batch_sizes)}), got {prompts}")
    given = parse_compression(parser, args.compression)
    device, dtype = resolve_device(parser, args.device), getattr(torch, args.dtype)
    shapes = family_shapes() if args.quick else {m: REAL_SHAPES[m] for m in args.models or FAMILIES}

    compression = ({"source": "--compression", **{B: given for B in batch_sizes}} if given
                   else embedded_compression(device, batch_sizes, prompts))
    bandwidth = copy_bandwidth(device, 1024 if device.type == "cuda" else 256)
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s", flush=True)
    report = {**machine(device), "dtype": args.dtype,
              "command": "python -m mmspec.eval.real_size " + " ".join(sys.argv[1:] if argv is None else argv),
              "sampling": {"temperature": SAMPLING.temperature, "top_k": SAMPLING.top_k,
                           "guidance_scale": SAMPLING.guidance_scale},
              "iterations": iterations, "copy_bandwidth_gb_s": round(bandwidth / 1e9, 2), "compression": compression,
              "models": {}}
    for name, shape in shapes.items():
        report["models"][name] = measure_model(name, shape, device, dtype, batch_sizes, iterations, compression,
                                               bandwidth)
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
