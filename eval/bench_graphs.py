"""What the decoding loop spends outside the target's forward, what its host reads, and what CUDA graphs buy, on the
embedded text-to-image model (mmspec/zoo/shapes).

    python -m mmspec.eval.bench_graphs --device cuda --json eval/results/gpu/bench_graphs.json
    python -m mmspec.eval.bench_graphs --device cpu --quick --json /tmp/graphs.json

Every image decoding of `METHODS` decodes the same held-out prompts and seeds at each batch size, with eager steps
(`pipe.disable_cuda_graphs()`) and, on CUDA, with its whole step captured (`pipe.enable_cuda_graphs()`, which a
pipeline on CUDA does by itself: K iterations per graph, replayed by every later call with the same settings; AR is
captured the same way, so every speedup is against graphed AR). Per mode, method and batch size:
- latency_s: the median latency of a call (no added syncs), speedup_vs_ar (AR in the same mode) and, on CUDA,
  speedup_vs_graphed_ar;
- tokens_per_forward and iterations (target forwards after the prefill, per call); wasted_iterations_share: those
  that ran after every row had finished (a block of iterations runs between two reads of the progress);
- host_reads_per_iteration: the tensor reads that block the host (`mmspec.core.runtime.capture.HostReads`: `.item()`,
  `bool(t)`, `.tolist()`, `.cpu()`, ...) over a whole call (the first batch's), prefill and stats included, per
  iteration;
- outside_share: the share of the call's time spent outside the target's forwards. Eager: from a run of the first
  batch with every phase synchronized (`mmspec.core.stats.synchronized_timings`). Captured: 1 - iterations x (one window
  forward, replayed alone from its own graph) / latency, so the prefill counts as outside.
Per method: `fullgraph`, whether its step traces whole with `torch.compile(fullgraph=True, backend="eager")` (a graph
break is a host read or a data-dependent shape, which no CUDA graph can hold;
`mmspec.core.runtime.capture.trace_checks`).

`loops` does the same for the two other captured loops, at batch 1 (`LOOPS`):
- mar_head / mar_speculative: the embedded MAR (mmspec/zoo/mar_shapes), 64 steps of 100 diffusion steps
  (`--num-iter`, `--diffusion-steps`), AR and
  exact speculative decoding; the captured part is the diffusion head's reverse chain of a step's tokens
  (`mmspec.continuous.graphs`); an iteration is an encoder-decoder pass (target or draft); fullgraph: one chain;
- frame_ar / frame: the embedded next-frame world (mmspec/zoo/nextframe_shapes), 24 frames at 10 % action changes,
  sequential and `FrameSpeculation(frames=4)`; the captured part is a block's Euler steps; latency per frame, an
  iteration is a model forward; fullgraph: one block's Euler steps;
- text_hf_ar / text_ar / `TEXT_DRAFTERS`: the embedded pair (mmspec/zoo/pycode, with the heads it ships), a held-out
  prompt per call, 128 new tokens (`--new-tokens`) at T = 0, batch 1: transformers' `generate` with its KV cache (not
  captured), `speculative_generate` drafting nothing (`NoDrafter`: AR through our loop, the text AR that the others
  are measured against), and every registered text drafter at its defaults: the draft model's chains of 4, layer
  skip, prompt lookup, the draft model's dynamic trees, STAND, EAGLE (chains and its dynamic tree), EAGLE-3 (a random
  head: the zoo ships none), Hydra, the cascade, SpecDec++'s learned length, Kangaroo and S2D; the captured part is
  the whole step (`speculative_generate(graphs=StepGraphs(...))`; a drafter whose step reads the host runs eagerly);
  an iteration is a target forward;
- janus_* / emu3_* / lumina_mgpt_* (`ar`, `sjd`, `mc_sjd`, `frontier`: W 16 random / uncoupled and horizontal /
  maximal, the latter with SJD-PAC's frontier tree of width 2 and depth 2 (20 nodes a forward)): the
  transformers families at tiny configurations with random weights (`family_shapes`: 16 x 16 codes, CFG 3, top-k 8,
  T = 1), on the slot cache their pipelines decode on with CUDA (`mmspec.models.hf_image.on_slot_cache`), the whole
  step captured; an iteration is a target forward. Random weights set the acceptance: their speedups say nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import statistics
import sys
import time

import torch

from mmspec.core.runtime.capture import HostReads, compiles_fullgraph, trace_checks
from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.core.stats import synchronize, synchronized_timings
from mmspec.eval.bench_image import held_out_prompts
from mmspec.eval.devices import machine, seeded, write_json
from mmspec.zoo import IMAGE_T2I

GUIDANCE = 3.0
METHODS = {
    "ar": {"decoding": "ar"},
    "sjd": {"decoding": "sjd", "window": 16, "init": "random", "coupling": "none"},
    "mc_sjd": {"decoding": "sjd", "window": 16, "init": "horizontal", "coupling": "maximal"},
    "sjd_tree": {"decoding": "sjd", "window": 16, "init": "horizontal", "coupling": "maximal", "tree_width": 3},
    "draft": {"decoding": "draft", "draft_length": 2},
    "draft_tree": {"decoding": "draft", "draft_length": 2, "tree_width": 2},
    "pjd": {"decoding": "pjd", "window": 8, "rows": 2},
    "heads": {"decoding": "heads", "kind": "eagle", "draft_length": 2},
    "heads_tree": {"decoding": "heads", "kind": "eagle", "draft_length": 2, "tree_width": 2},
}
WIDTHS = {"ar": 1, "sjd": 16, "mc_sjd": 16, "draft": 3, "heads": 3, "pjd": None, "sjd_tree": None, "draft_tree": None,
          "heads_tree": None}
FAMILIES = ("janus", "emu3", "lumina_mgpt")
FAMILY_METHODS = ("ar", "sjd", "mc_sjd", "frontier")
TEXT_DRAFTERS = {  # row -> (a registered text decoding, its settings): every built-in drafter of `mmspec.text.methods`
    "text_model": ("model", {}),
    "text_layerskip": ("layerskip", {}),
    "text_ngram": ("ngram", {}),
    "text_tree": ("tree", {}),
    "text_stand": ("stand", {}),
    "text_eagle": ("heads", {"kind": "eagle"}),
    "text_eagle3": ("heads", {"kind": "eagle"}),  # its head: `eagle3_head`
    "text_eagle_tree": ("heads", {"kind": "eagle", "tree_size": 16}),
    "text_hydra": ("heads", {"kind": "hydra"}),
    "text_cascade": ("cascade", {}),
    "text_specdecpp": ("model", {"schedule": "learned"}),
    "text_kangaroo": ("kangaroo", {}),
    "text_s2d": ("s2d", {}),
}
TEXT_ROWS = tuple(TEXT_DRAFTERS)
LOOPS = ("mar_head", "mar_speculative", "frame_ar", "frame", "text_hf_ar", "text_ar", *TEXT_ROWS,
         *(f"{family}_{method}" for family in FAMILIES for method in FAMILY_METHODS))
AR_OF = {"mar_head": ("mar_head", "mar_speculative"), "frame_ar": ("frame_ar", "frame"),
         "text_ar": ("text_hf_ar", "text_ar", *TEXT_ROWS),
         **{f"{family}_ar": tuple(f"{family}_{method}" for method in FAMILY_METHODS) for family in FAMILIES}}


def call(pipe, device, options, batch, start):
    generators = seeded(device, range(1000 + start, 1000 + start + len(batch)))
    return pipe(batch, generator=generators, output_type="latent", guidance_scale=GUIDANCE, **options).stats


def forward_seconds(pipe, device, width: int, batch_size: int, repeats: int = 20) -> float:
    """One window forward of `width` tokens for `batch_size` CFG-paired rows, replayed alone (from its CUDA graph
    when the pipeline captures): what a captured iteration's forward costs."""
    adapter = pipe.image_adapter()
    condition = pipe.encode_prompt(["a red circle"] * batch_size, adapter=adapter)
    state, _ = adapter.prefill(condition, cfg=True, max_window=width)
    tokens = torch.zeros(batch_size, width, dtype=torch.long, device=device)
    keep = torch.zeros(batch_size, dtype=torch.long, device=device)
    times = []
    for _ in range(repeats + 2):
        synchronize(device)
        began = time.perf_counter()
        adapter.forward(tokens, state)
        synchronize(device)
        times.append(time.perf_counter() - began)
        adapter.rollback(state, keep)
    return statistics.median(times[2:])


def measure(pipe, device: torch.device, prompts: list[str], batch_size: int, captured: bool) -> dict:
    """method -> latency, tokens per forward, iterations, host reads per iteration and outside share."""
    results = {}
    for method, options in METHODS.items():
        try:
            results[method] = measure_one(pipe, device, prompts, batch_size, captured, method, options)
        except RuntimeError as error:  # reported in the table and the JSON, and the other methods still run
            print(f"{method} (batch {batch_size}, {'captured' if captured else 'eager'}) failed: "
                  f"{str(error).splitlines()[0]}", flush=True)
            results[method] = {"error": str(error).splitlines()[0]}
    for run in results.values():
        if "error" not in run and "error" not in results["ar"]:
            run["speedup_vs_ar"] = round(results["ar"]["latency_s"] / run["latency_s"], 3)
    return results


def measure_one(pipe, device, prompts, batch_size, captured, method, options) -> dict:
    """One method's figures (see `measure`)."""
    call(pipe, device, options, prompts[:batch_size], 0)  # warm-up: graphs are captured on a first call
    latencies, shares, tokens, forwards, needed, calls = [], [], 0, 0, 0, 0
    for start in range(0, len(prompts) - batch_size + 1, batch_size):
        batch = prompts[start : start + batch_size]
        synchronize(device)
        with HostReads() if start == 0 else contextlib.nullcontext() as counted:  # the first batch's reads
            began = time.perf_counter()
            stats = call(pipe, device, options, batch, start)
            synchronize(device)
            latencies.append(time.perf_counter() - began)
        tokens += int(stats.new_tokens.max())
        forwards += stats.target_forwards - stats.prefill_forwards
        needed += int(stats.steps.max())  # iterations some row took part in; the rest ran past the end
        calls += 1
        if start == 0:  # once per method: the synchronized run is slower
            reads, read_iterations = counted.count, stats.target_forwards - stats.prefill_forwards
            if not captured:
                with synchronized_timings(device):
                    timings = call(pipe, device, options, batch, start).timings
                shares.append(1 - timings["target"] / timings["total"])
    latency, iterations = statistics.median(latencies), forwards / calls
    if captured and WIDTHS[method]:
        share = 1 - iterations * forward_seconds(pipe, device, WIDTHS[method], batch_size) / latency
    else:
        share = statistics.median(shares) if shares else None
    return {"latency_s": latency, "tokens_per_forward": round(tokens / forwards, 3), "iterations": round(iterations, 1),
            "host_reads_per_iteration": round(reads / read_iterations, 3),
            "wasted_iterations_share": round(1 - needed / forwards, 3),
            "outside_share": None if share is None else round(share, 3)}


def traced(pipe, device, prompt: str) -> dict:
    """method -> whether its step traces whole (and the first break's reason when not)."""
    found = {}
    for method, options in METHODS.items():
        with trace_checks() as checks:
            call(pipe, device, options, [prompt], 0)
        ok, reason = checks[0]
        found[method] = {"fullgraph": ok, **({} if ok else {"break": reason})}
    return found


MAR_CALL = dict(guidance_scale=3.0, output_type="latent")
MAR_DECODINGS = {"mar_head": {"decoding": "ar"},
                 "mar_speculative": {"decoding": "speculative", "gamma": 16, "prefill_ratio": 0.05}}
FRAMES, FRAME_CHANGE, FRAME_STEPS = 24, 0.1, 4


def measure_loops(device: torch.device, captured: bool, calls: int, num_iter: int = 64, diffusion_steps: int = 100,
                  new_tokens: int = 128) -> dict:
    """LOOPS at batch 1 (see the module docstring): latency (per call; per frame for the frame rows), speedup vs
    the loop's own AR, host reads per iteration, and fullgraph (traced with the eager steps)."""
    results = {}
    runs = {**_mar_runs(device, captured, num_iter, diffusion_steps), **_frame_runs(device, captured),
            **_text_runs(device, captured, new_tokens), **_family_runs(device, captured)}
    for method, run in runs.items():
        try:
            results[method] = _measure_loop(device, run, captured, calls)
        except RuntimeError as error:
            print(f"{method} ({'captured' if captured else 'eager'}) failed: {str(error).splitlines()[0]}", flush=True)
            results[method] = {"error": str(error).splitlines()[0]}
    for ar, methods in AR_OF.items():
        for method in methods:
            if "latency_s" in results[method] and "latency_s" in results[ar]:
                results[method]["speedup_vs_ar"] = round(results[ar]["latency_s"] / results[method]["latency_s"], 3)
    return results


def _measure_loop(device, run, captured: bool, calls: int) -> dict:
    """run(seed, trace) -> (iterations, units the latency is per, fullgraph or None): timed `calls` times after
    warm-up calls (two when captured: a shape's first call runs eagerly, its second captures; an eager one traces)."""
    traced = [run(seed, not captured)[2] for seed in range(2 if captured else 1)][0]
    latencies, reads, iterations = [], 0, 0
    for seed in range(calls):
        synchronize(device)
        with HostReads() as counted:
            began = time.perf_counter()
            done, units, _ = run(seed, False)
            synchronize(device)
            latencies.append((time.perf_counter() - began) / units)
        reads, iterations = reads + counted.count, iterations + done
    row = {"latency_s": statistics.median(latencies), "iterations": iterations / calls,
           "host_reads_per_iteration": round(reads / iterations, 3)}
    if traced is not None:
        ok, reason = traced
        row.update({"fullgraph": ok, **({} if ok else {"break": reason})})
    return row


def _mar_runs(device, captured: bool, num_iter: int, diffusion_steps: int) -> dict:
    from mmspec.continuous.diffusion import DiffusionSchedule, sample_trajectory
    from mmspec.pipelines.mar import MARPipeline
    from mmspec.zoo import MAR_C2I

    pipe = MARPipeline.from_pretrained(MAR_C2I).to(device)
    pipe.set_progress_bar_config(disable=True)
    (pipe.enable_cuda_graphs if captured else pipe.disable_cuda_graphs)()
    model = pipe.transformer

    def chain_traces() -> tuple[bool, str]:
        """One step's reverse chain (two tokens, CFG) through `compiles_fullgraph`."""
        schedule = DiffusionSchedule.cosine(diffusion_steps, x0_clip=model.config.x0_clip)
        z = torch.randn(2, model.config.decoder_embed_dim, device=device)
        x_T = torch.randn(2, model.config.token_dim, device=device)
        noise = torch.randn(schedule.num_steps, *x_T.shape, device=device)
        head = model.diffusion_head(z, z.flip(0), torch.full((2,), 3.0, device=device))
        return compiles_fullgraph(lambda: sample_trajectory(head, schedule, x_T, noise))

    def runner(options):
        def run(seed: int, trace: bool):
            stats = pipe([seed % 10], generator=seeded(device, [1000 + seed]), num_iter=num_iter,
                         num_diffusion_steps=diffusion_steps, **MAR_CALL, **options).stats
            return stats.target_forwards + stats.draft_forwards, 1, chain_traces() if trace else None
        return run

    return {method: runner(options) for method, options in MAR_DECODINGS.items()}


def _frame_runs(device, captured: bool) -> dict:
    from mmspec.pipelines.video import NextFramePipeline
    from mmspec.video import FrameSpeculation
    from mmspec.video.methods import AR
    from mmspec.zoo import VIDEO_WORLD
    from mmspec.zoo.video_world import episode, persistent_actions, rollout

    pipe = NextFramePipeline.from_pretrained(VIDEO_WORLD).to(device)
    pipe.set_progress_bar_config(disable=True)
    (pipe.enable_cuda_graphs if captured else pipe.disable_cuda_graphs)()

    def runner(decoding):
        def run(seed: int, trace: bool):
            actions = persistent_actions(10**6 + seed, FRAMES, FRAME_CHANGE)
            start = rollout(episode(seed, "heldout"), actions[:0])[0][0]
            with pipe.start_session(start, decoding=decoding, num_inference_steps=FRAME_STEPS, output_type="latent",
                                    generator=seeded(device, [1000 + seed])) as session:
                for action in actions:
                    session.step(action)
                inner = session.session
                traced = None
                if trace:  # one block's Euler steps after the frames held now
                    x = torch.randn(1, decoding.frames, inner.model.tokens_per_frame,
                                    inner.model.config.latent_channels, device=device)
                    block_actions = torch.zeros(1, decoding.frames, dtype=torch.long, device=device)
                    first = torch.tensor(inner.cache.end, device=device)
                    traced = compiles_fullgraph(lambda: inner._euler(x, block_actions, first, 0))
            return session.stats.target_forwards, FRAMES, traced
        return run

    return {"frame_ar": runner(AR()), "frame": runner(FrameSpeculation(frames=4))}


def eagle3_head(target) -> torch.nn.Module:
    """An EAGLE-3 head for the embedded target, random weights (the zoo ships none): one decoder layer over the
    target's feature fused with the outputs of its first, middle and last layers. Its host reads and its trace do
    not depend on its weights; its acceptance does, so its speed means nothing."""
    from mmspec.models.heads import EagleHead

    config, layers = target.config, target.config.num_hidden_layers
    torch.manual_seed(0)
    head = EagleHead(feature_size=config.hidden_size, vocab_size=config.vocab_size,
                     n_head=config.num_attention_heads, ffn_hidden=config.intermediate_size,
                     feature_layers=tuple(sorted({0, layers // 2, layers - 1})))
    return head.to(target.device).eval()


def _text_runs(device, captured: bool, new_tokens: int) -> dict:
    from mmspec.core.progress import run_to_end
    from mmspec.core.runtime.capture import StepGraphs
    from mmspec.eval.bench_text import load_heads
    from mmspec.pipelines.text import SpeculativeTextPipeline
    from mmspec.text.ar import ar_steps
    from mmspec.text.drafters import NoDrafter
    from mmspec.text.generate import speculative_steps
    from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET, load_causal_lm
    from mmspec.zoo.text_corpus import held_out_prompts

    target, tokenizer = load_causal_lm(TEXT_TARGET, dtype=torch.float32)
    draft, _ = load_causal_lm(TEXT_DRAFT, dtype=torch.float32)
    target, draft = target.to(device), draft.to(device)
    heads = load_heads(TEXT_TARGET, target)
    pipe = SpeculativeTextPipeline(target, tokenizer, draft, eagle_head=heads["eagle"], hydra_head=heads["hydra"],
                                   acceptance_head=heads["acceptance"], kangaroo_adapter=heads["kangaroo"])
    prompts = held_out_prompts(4)
    common = dict(max_new_tokens=new_tokens, temperature=0.0, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    graphs = StepGraphs(cuda=True) if captured else None  # kept across calls: later calls replay

    def encoded(seed: int):
        enc = tokenizer([prompts[seed % len(prompts)]], return_tensors="pt").to(device)
        return enc["input_ids"], enc["attention_mask"]

    def hf_ar(seed: int, trace: bool):
        stats = run_to_end(ar_steps(target, *encoded(seed), generator=seeded(device, [seed])[0], **common)).stats
        return int(stats.new_tokens.max()), 1, None

    def ours(steps):
        """steps(input_ids, attention_mask, generator): a run of `speculative_steps`."""
        def run(seed: int, trace: bool):
            with trace_checks() if trace else contextlib.nullcontext() as checks:
                stats = run_to_end(steps(*encoded(seed), seeded(device, [seed])[0])).stats
            return stats.target_forwards - stats.prefill_forwards, 1, checks[0] if trace else None
        return run

    given = {"text_eagle3": {"head": eagle3_head(target)}}  # runtime fields, before the pipeline supplies the rest

    def decoded(row: str, name: str, settings: dict):
        decoding = pipe.supplied(dataclasses.replace(pipe.resolve_decoding(name, **settings), **given.get(row, {})))
        return ours(lambda ids, mask, generator: decoding.run(target, draft, ids, mask, graphs=graphs,
                                                                 generator=generator, **common))

    nothing = ours(lambda ids, mask, generator: speculative_steps(target, ids, mask, drafter=NoDrafter(),
                                                                  graphs=graphs, generator=generator, **common))
    return {"text_hf_ar": hf_ar, "text_ar": nothing,
            **{row: decoded(row, name, settings) for row, (name, settings) in TEXT_DRAFTERS.items()}}


def family_shapes() -> dict:
    """The transformers families at tiny configurations (random weights), each image 16 rows of 16 codes, as the
    embedded LlamaGen's (Emu3 and Lumina-mGPT close each row with a forced line token)."""
    from mmspec.eval.real_shapes import Emu3Shape, JanusShape, LuminaShape

    return {"janus": JanusShape.tiny(16), "emu3": Emu3Shape(32, 37, 2, 4, 2, 200, 16, 16, 20, context=6),
            "lumina_mgpt": LuminaShape(32, 37, 2, 4, 2, 200, 16, 16, 16, context=6)}


def family_decodings() -> dict:
    """`FAMILY_METHODS`' decodings (frontier: bench_image's sjd_tree); `mmspec.eval.real_size` times the same."""
    from mmspec.image import AR, SJD

    return {"ar": AR(), "sjd": SJD(16, "random", "none"), "mc_sjd": SJD(16, "horizontal", "maximal"),
            "frontier": SJD(16, "horizontal", "maximal", tree_width=2)}


def _family_runs(device, captured: bool) -> dict:
    """`FAMILIES` x `FAMILY_METHODS` at batch 1 on the slot-cache path their pipelines run on CUDA
    (`mmspec.models.hf_image.on_slot_cache`; eager: its steps uncaptured); an iteration is a target forward."""
    from mmspec.core.probs import SamplingConfig
    from mmspec.core.progress import run_to_end
    from mmspec.core.stats import SpecStats
    from mmspec.models.hf_image import SlotGraphs, on_slot_cache

    decodings = family_decodings()
    sampling = SamplingConfig(temperature=1.0, top_k=8, guidance_scale=GUIDANCE)
    runs = {}
    for family, shape in family_shapes().items():
        with torch.device(device):
            model = shape.model().eval()
        adapter = on_slot_cache(shape.adapter(model), SlotGraphs(cuda=True) if captured else None)
        condition = shape.condition(1, device)

        def run(seed: int, trace: bool, adapter=adapter, condition=condition, decoding=None):
            stats = SpecStats()
            with trace_checks() if trace else contextlib.nullcontext() as checks, torch.no_grad():
                run_to_end(decoding.run(adapter, condition, sampling, seeded(device, [seed])[0], stats))
            return stats.target_forwards - 1, 1, checks[0] if trace else None  # the prefill is not an iteration

        for method in FAMILY_METHODS:
            runs[f"{family}_{method}"] = functools.partial(run, decoding=decodings[method])
    return runs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_arguments(parser, dtype=False)
    parser.add_argument("--quick", action="store_true", help="2 prompts at batch 1 only")
    parser.add_argument("--prompts", type=int, default=None, help="held-out prompts per batch size (default 8)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=None, help="default 1 4 (--quick: 1)")
    parser.add_argument("--num-iter", type=int, default=64, help="MAR steps of the MAR loops (default 64)")
    parser.add_argument("--diffusion-steps", type=int, default=100, help="diffusion steps per MAR token (default 100)")
    parser.add_argument("--new-tokens", type=int, default=128, help="new tokens of the text loops (default 128)")
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args(argv)
    batch_sizes = tuple(args.batch_sizes or ((1,) if args.quick else (1, 4)))
    prompts = args.prompts or (2 if args.quick else 8)
    if min(batch_sizes) < 1 or prompts < max(batch_sizes):
        parser.error(f"--batch-sizes must be positive and at most --prompts ({prompts}), got {list(batch_sizes)}")
    for flag, value in (("--num-iter", args.num_iter), ("--diffusion-steps", args.diffusion_steps),
                        ("--new-tokens", args.new_tokens)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if args.num_iter > 64:
        parser.error(f"--num-iter must be at most the embedded MAR's 64 tokens, got {args.num_iter}")
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
        "modes": {}}
    pipe.disable_cuda_graphs()
    report["methods"] = traced(pipe, device, texts[0])
    print("fullgraph: " + ", ".join(f"{m} {r['fullgraph']}" for m, r in report["methods"].items()), flush=True)
    for mode in modes:
        if mode == "graphs":
            pipe.enable_cuda_graphs()
        report["modes"][mode] = {B: measure(pipe, device, texts, B, mode == "graphs") for B in batch_sizes}
        for B, results in report["modes"][mode].items():
            print(f"{mode} batch {B}: " + ", ".join(f"{m} failed" if "error" in r else
                f"{m} {r['latency_s'] * 1000:.0f} ms ({r['speedup_vs_ar']:.2f}x AR, {r['tokens_per_forward']:.2f} "
                f"tokens / forward, {r['host_reads_per_iteration']:.2f} host reads / iteration"
                + ("" if r["outside_share"] is None else f", {100 * r['outside_share']:.0f} % outside the forward")
                + ")" for m, r in results.items()), flush=True)
    report["loops"] = {}
    for mode in modes:
        loops = report["loops"][mode] = measure_loops(device, mode == "graphs", 1 if args.quick else 3, args.num_iter,
                                                      args.diffusion_steps, args.new_tokens)
        print(f"{mode} loops: " + ", ".join(f"{m} failed" if "error" in r else
            f"{m} {r['latency_s'] * 1000:.1f} ms ({r['speedup_vs_ar']:.2f}x its AR, "
            f"{r['host_reads_per_iteration']:.2f} host reads / iteration"
            + (f", fullgraph {r['fullgraph']}" if "fullgraph" in r else "") + ")" for m, r in loops.items()),
            flush=True)
    if "graphs" in report["modes"]:
        for ar, methods in AR_OF.items():
            graphed = report["loops"]["graphs"][ar].get("latency_s")
            for mode in modes:
                for method in methods:
                    run = report["loops"][mode][method]
                    if graphed and "latency_s" in run:
                        run["speedup_vs_graphed_ar"] = round(graphed / run["latency_s"], 3)
        for B in batch_sizes:
            graphed_ar = report["modes"]["graphs"][B]["ar"].get("latency_s")
            for mode in modes:
                for run in report["modes"][mode][B].values():
                    if graphed_ar and "latency_s" in run:
                        run["speedup_vs_graphed_ar"] = round(graphed_ar / run["latency_s"], 3)
        report["graphs_speedup"] = {B: {m: round(report["modes"]["eager"][B][m]["latency_s"]
                                                 / report["modes"]["graphs"][B][m]["latency_s"], 3) for m in METHODS
                                        if "latency_s" in report["modes"]["graphs"][B][m]}
                                    for B in batch_sizes}
        print("graphs vs eager: " + json.dumps(report["graphs_speedup"]), flush=True)
    else:
        report["graphs"] = "needs CUDA"
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
