"""The service under load: throughput with 1 and 2 replicas and latency at 16 concurrent requests, in one run.

    python -m mmspec.eval.bench_serve                       # the embedded image model, 16 requests x 3 rounds
    python -m mmspec.eval.bench_serve --replicas 1 2 4 --json eval/results/serve_cpu.json

For each replica count the script starts `mmspec serve`'s application on a local Ray instance (loopback), lets it
choose what "auto" stands for, sends one request per replica to warm up, then `--rounds` rounds of `--requests`
concurrent requests (one image each, seeds of their own). It reports images per second over each round's wall clock
(the median round), and the p50 / p99 latency of every request of every round. The baseline is the same images
decoded in this process by direct pipeline calls of `--max-batch-size` images with the same decoding, on every core:
what the service costs or gains over a loop of batched calls. The ratios are within this one run, on this machine.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.serving import client
from mmspec.serving.calls import answer_group
from mmspec.serving.models import served_model
from mmspec.serving.requests import image_request
from mmspec.zoo import IMAGE_T2I

PROMPTS = ("a red circle above a blue square", "two small green triangles on a striped background",
           "a yellow star on the left")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def bodies(count: int, offset: int) -> list[dict]:
    return [{"prompt": PROMPTS[i % len(PROMPTS)], "seed": offset + i} for i in range(count)]


def served_round(url: str, count: int, offset: int) -> tuple[float, list[float]]:
    """(the round's wall-clock seconds, each request's latency) of `count` concurrent requests."""
    def timed(body: dict) -> float:
        started = time.perf_counter()
        status, raw = client.post(url, body)
        if status != 200:
            raise RuntimeError(f"the service answered {status}: {raw[:300]!r}")
        return time.perf_counter() - started

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        latencies = list(pool.map(timed, bodies(count, offset)))
    return time.perf_counter() - started, latencies


def measure_service(model, replicas: int, args, port: int) -> tuple[dict, dict]:
    """The service's figures at `replicas` replicas, and the decoding "auto" chose."""
    from mmspec.serving.models import connect, gpu_share
    from mmspec.serving.service import APP_NAME, Limits, build_app, start, stop, warm_up

    threads = max(1, (os.cpu_count() or 1) // replicas)
    limits = Limits(max_batch_size=args.max_batch_size, batch_wait_ms=args.batch_wait_ms)
    gpus = gpu_share(replicas, connect()) if "cuda" in model.device else 0.0
    start(build_app([replace(model, threads=threads)], replicas, limits, gpus), port=port)
    chosen = next(iter(warm_up().values()))
    url = f"http://127.0.0.1:{port}/v1/images/generations"
    served_round(url, replicas, offset=10_000)  # each replica's first call, untimed
    walls, latencies = [], []
    for round_index in range(args.rounds):
        wall, each = served_round(url, args.requests, offset=round_index * args.requests)
        walls.append(wall)
        latencies += each
    stop(APP_NAME)
    wall = statistics.median(walls)
    figures = {"replicas": replicas, "threads_per_replica": threads, "images_per_s": round(args.requests / wall, 3),
               "round_s": [round(w, 3) for w in walls], "p50_latency_s": round(percentile(latencies, 0.5), 3),
               "p99_latency_s": round(percentile(latencies, 0.99), 3)}
    return figures, chosen


def measure_direct(model, decoding: dict, args) -> dict:
    """The same images by direct calls of `--max-batch-size` images in this process, on every core."""
    pipe = replace(model, threads=os.cpu_count() or 1).load()
    requests = [replace(image_request(body, args.max_batch_size, 0), decoding=decoding)
                for body in bodies(args.requests, 0)]
    answer_group(pipe, requests[: args.max_batch_size])  # warm-up
    walls = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        for first in range(0, len(requests), args.max_batch_size):
            answer_group(pipe, requests[first : first + args.max_batch_size])
        walls.append(time.perf_counter() - started)
    wall = statistics.median(walls)
    return {"images_per_s": round(args.requests / wall, 3), "round_s": [round(w, 3) for w in walls]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=IMAGE_T2I, help="zoo name or folder of an image pipeline")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--requests", type=int, default=16, help="concurrent requests per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--batch-wait-ms", type=float, default=50.0)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--json", default=None, metavar="PATH")
    add_device_arguments(parser, dtype=False, default="cpu")
    args = parser.parse_args(argv)
    from mmspec.serving.service import stop

    device = resolve_device(parser, args.device)
    model = served_model(args.model, device=str(device))
    runs, chosen = [], None
    for replicas in args.replicas:
        figures, chosen = measure_service(model, replicas, args, args.port)
        runs.append(figures)
        print(f"{replicas} replica(s): {figures['images_per_s']:.2f} images/s, p50 {figures['p50_latency_s']:.2f} s, "
              f"p99 {figures['p99_latency_s']:.2f} s", flush=True)
    stop()
    direct = measure_direct(model, chosen, args)
    print(f"direct calls of {args.max_batch_size} images in this process: {direct['images_per_s']:.2f} images/s")
    for figures in runs:
        figures["vs_one_replica"] = round(figures["images_per_s"] / runs[0]["images_per_s"], 3)
        figures["vs_direct_calls"] = round(figures["images_per_s"] / direct["images_per_s"], 3)
    report = {"date": time.strftime("%Y-%m-%d"), "model": args.model, "device": str(device),
              "cpu_count": os.cpu_count(), "decoding": chosen,
              "requests": args.requests, "rounds": args.rounds, "max_batch_size": args.max_batch_size,
              "batch_wait_ms": args.batch_wait_ms, "service": runs, "direct": direct}
    if args.json:
        from mmspec.core.files import write_atomically

        write_atomically(lambda file: Path(file).write_text(json.dumps(report, indent=1) + "\n"), args.json)
    return report


if __name__ == "__main__":
    main()
