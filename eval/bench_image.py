"""Image decoding benchmark on the embedded text-to-image model (mmspec/zoo/shapes), in one process.

    python -m mmspec.eval.bench_image          # full: 32 held-out prompts, batch 1 and 8, 2 repeats
    python -m mmspec.eval.bench_image --quick  # 1.5-5 minutes on 2 CPU cores: 4 prompts, 1 repeat, batch 1 and 4
    python -m mmspec.eval.bench_image --json eval/results/bench_image.json
    python -m mmspec.eval.bench_image --quick --methods heads heads_lantern  # these methods and AR only
    python -m mmspec.eval.bench_image --sweep  # windows x inits per coupling at batch 1 (how BEST was chosen)
    python -m mmspec.eval.bench_image --default-policy --json eval/results/bench_default_policy.json
    python -m mmspec.eval.bench_image --measure-prior  # rewrite mmspec/image/compression_prior.json

`--default-policy` compares the pipelines' default (`decoding="auto"`, `mmspec.image.policy`) with plain AR, with SJD at
each fixed window and with a fixed frontier tree, at batch 1, 2, 4 and 8: the methods run one after the other on each
batch of prompts, and the speed ratio of a method is the median over batches of AR's latency / its latency.
`--measure-prior` measures the step compression SJD reaches on the embedded model at every window and batch size, the
acceptance prior of the policy (a count of forwards, not a timing: it does not depend on the machine).

Every method decodes the same held-out captions with the same per-image seeds (image i: seed 1000 + i), CFG 3,
temperature 1, no top-k / top-p (the pipeline defaults), after a warm-up call of each method, the methods one after
the other on each batch of prompts (so the machine's drift slows them alike): plain AR with its KV
cache, SJD as published (window 16, random init, independent redrafts), our exact modes with their best settings
(`BEST`, chosen by `--sweep`), the draft GPT's chains and full tree (`DRAFT`; exact, counted apart: the summary gives
the full tree's step compression over the best chain's), the draft heads (`HEADS`: EAGLE's chains and full tree exact,
its chain with LANTERN, Hydra; and the positional trees of POSITIONAL_NODES nodes of both drafters, `positional_tree`;
the summary gives the best exact head configuration's step compression over the draft GPT's best) and every other
registered decoding at its defaults (parallel Jacobi decoding: lossy, never counted as the best exact method; a
decoding you register, `registered_methods`). Columns: target forwards per image, step compression (image tokens per
target forward a row took part in, the prefill included), median latency of a call, speedup of the median latency
against AR at the same batch size, and the share of decoding time spent outside the target forward (drafting,
verification, bookkeeping). A second table gives the cost of one target forward of a W-token window relative to W = 1:
on a CPU the window forward is compute-bound, which is what caps wall-clock speedup below step compression.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from functools import partial

import torch

from mmspec.core.registry import decodings
from mmspec.core.runtime.devices import add_device_arguments, resolve_device
from mmspec.core.runtime.measured import median_seconds
from mmspec.core.stats import synchronize
from mmspec.eval.devices import machine, seeded, write_json
from mmspec.image import COUPLINGS, INITS, get_decoding
from mmspec.image.policy import PRIOR_FILE, SJD_SETTINGS, TREES, WINDOWS, candidate_sjd, tree_key
from mmspec.models.llamagen.adapter import LlamaGenAdapter
from mmspec.pipelines.auto import AutoARImagePipeline
from mmspec.zoo import IMAGE_T2I
from mmspec.zoo.shapes import scene

PUBLISHED_SJD = {"decoding": "sjd", "window": 16, "init": "random", "coupling": "none"}
BEST = {  # the best wall-clock settings of each coupling in `--sweep` on this machine; L = 32 for step compression
    "sjd_maximal": {"decoding": "sjd", "window": 16, "init": "horizontal", "coupling": "maximal"},
    "sjd_gumbel": {"decoding": "sjd", "window": 24, "init": "horizontal", "coupling": "gumbel"},
    "sjd_maximal_L32": {"decoding": "sjd", "window": 32, "init": "vertical", "coupling": "maximal"},
    # SJD-PAC's frontier tree on the maximal coupling: 2 candidates at each of the first 2 draft positions (20 nodes)
    "sjd_tree": {"decoding": "sjd", "window": 16, "init": "horizontal", "coupling": "maximal", "tree_width": 2,
                 "tree_depth": 2},
    # the most tokens per exact forward found here: a wide frontier tree on a long window (8 candidates at each of the
    # first 2 draft positions, 134 nodes); slow on a CPU, where the forward is compute-bound
    "sjd_tree_wide": {"decoding": "sjd", "window": 64, "init": "vertical", "coupling": "maximal", "tree_width": 8,
                      "tree_depth": 2},
}
DRAFT = {  # the draft GPT: its best wall-clock chain (1 token), a chain of 3, and the binary tree 3 levels deep
    "draft": {"decoding": "draft", "draft_length": 1},
    "draft_L3": {"decoding": "draft", "draft_length": 3},
    "draft_tree": {"decoding": "draft", "draft_length": 3, "tree_width": 2},
}
HEADS = {  # draft heads on the target's own features: EAGLE's chains and full tree exact, its chain with LANTERN (the
    # LANTERN papers' setting, lossy: k = 100 of this model's 1,024 codes, where the paper's k = 1,000 of LlamaGen's
    # 16,384 is 6 %, and the largest delta whose FD-CLIP stayed within 10 % of AR's and of the exact heads' in two
    # `eval.quality` runs of 3 seed sets each), Hydra's chain of 3
    "heads": {"decoding": "heads", "kind": "eagle", "draft_length": 4},
    "heads_L2": {"decoding": "heads", "kind": "eagle", "draft_length": 2},
    "heads_tree": {"decoding": "heads", "kind": "eagle", "draft_length": 3, "tree_width": 2},
    "heads_lantern": {"decoding": "heads", "kind": "eagle", "draft_length": 4, "acceptance": "lantern",
                      "lantern_k": 100, "lantern_delta": 0.3},
    "heads_hydra": {"decoding": "heads", "kind": "hydra", "draft_length": 3},
}
# The positional trees of the draft GPT and the EAGLE head (`positional_tree`): POSITIONAL_NODES nodes built for the
# rates at which the walks of the drafter's wide calibration tree (CALIBRATION_TREE) accept each child rank, on
# held-out prompts no method decodes (as many as the benchmark's, up to 4): "draft_tree_n60" and "heads_tree_n60"
# compare the two drafters at one tree, at batch 1 (on a CPU a batch of 61-token rows runs at a fraction of AR's speed)
POSITIONAL_NODES = 60
CALIBRATION_TREE = {"draft_length": 3, "tree_width": 4}
POSITIONAL = {"draft_tree_n60": {"decoding": "draft"}, "heads_tree_n60": {"decoding": "heads", "kind": "eagle"}}
PRESETS = {"sjd_published": PUBLISHED_SJD, **BEST, **DRAFT, **HEADS}  # tuned configurations of registered decodings


def registered_methods() -> dict[str, dict]:
    """AR, the presets, and every other registered image decoding at its defaults (parallel Jacobi decoding, a
    decoding you register): whatever is registered is benchmarked."""
    tuned = {options["decoding"] for options in PRESETS.values()}
    others = {name: {"decoding": name} for name in decodings("image") if name not in tuned | {"ar"}}
    return {"ar": {"decoding": "ar"}, **PRESETS, **others}


METHODS = registered_methods()
CHOICES = [name for name in (*METHODS, *POSITIONAL) if name != "ar"]  # --methods
SWEEP_WINDOWS = (8, 12, 16, 24, 32)
POLICY_BATCH_SIZES = (1, 2, 4, 8)
POLICY_WINDOWS = (2, 4, 8, 16, 32)  # the fixed windows the default is compared with
POLICY_TREES = ((16, 2, 2),)  # and the fixed frontier trees
COST_WINDOWS = (1, 2, 4, 8, 16, 32)  # the window widths whose forward cost is reported


@dataclass
class Row:
    method: str
    batch_size: int
    forwards_per_image: float
    step_compression: float
    median_latency_s: float
    overhead_share: float
    speedup_vs_ar: float = 1.0


def held_out_prompts(n: int) -> list[str]:
    return [scene(i, "heldout")[1] for i in range(n)]


def measure(pipe, name: str, options: dict, prompts: list[str], batch_size: int, repeats: int) -> Row:
    """One method's row on its own (`sweep`)."""
    return measure_in_turn(pipe, {name: options}, prompts, batch_size, repeats)[name]


def measure_in_turn(pipe, methods: dict[str, dict], prompts: list[str], batch_size: int, repeats: int) -> dict:
    """name -> Row: the methods decode each batch of prompts one after the other, so a machine whose speed drifts
    during the run slows them alike; forwards and compression from the first repeat, the median latency over all."""
    latencies = {name: [] for name in methods}
    totals = {name: dict.fromkeys(("forwards", "tokens", "row_forwards", "outside", "total"), 0) for name in methods}
    for repeat in range(repeats):
        for start in range(0, len(prompts), batch_size):
            batch = prompts[start : start + batch_size]
            for name, options in methods.items():
                generators = seeded(pipe.device, range(1000 + start, 1000 + start + len(batch)))
                began = time.perf_counter()
                stats = pipe(batch, generator=generators, output_type="latent", **options).stats
                synchronize(pipe.device)
                latencies[name].append(time.perf_counter() - began)
                total = totals[name]
                if repeat == 0:
                    total["forwards"] += stats.target_forwards * len(batch)
                    total["tokens"] += int(stats.new_tokens.sum())
                    total["row_forwards"] += int(stats.steps.sum()) + stats.prefill_forwards * len(batch)
                total["outside"] += stats.timings["total"] - stats.timings["target"]
                total["total"] += stats.timings["total"]
    return {name: Row(name, batch_size, t["forwards"] / len(prompts), t["tokens"] / t["row_forwards"],
                      statistics.median(latencies[name]), t["outside"] / t["total"])
            for name, t in totals.items()}


def tokens_per_forward(options: dict) -> int:
    """The tokens one target forward of a method scores per row (a frontier tree's nodes, parallel row windows and
    its slot for a closing token, the draft path's chain or tree; 1 for AR)."""
    return getattr(get_decoding(**options), "forward_width", 1)


def window_forward_cost(pipe, batch_size: int, windows=COST_WINDOWS, repeats: int = 20) -> dict[int, float]:
    """Seconds of one CFG target forward of a W-token window after 128 cached image tokens, relative to W = 1."""
    seconds = forward_seconds(pipe, pipe.transformer, batch_size, windows, repeats)
    return {W: round(s / seconds[windows[0]], 2) for W, s in seconds.items()}


def forward_seconds(pipe, transformer, batch_size: int, windows=(1,), repeats: int = 20) -> dict[int, float]:
    """Median seconds of one CFG forward of `transformer` (the pipeline's target or draft GPT) over a W-token window
    after 128 cached image tokens, per W."""
    adapter = LlamaGenAdapter(transformer, pipe.vqvae)
    condition = pipe.encode_prompt(["a red circle"] * batch_size)
    device = pipe.device
    seconds = {}
    with torch.no_grad():
        for W in windows:
            state, _ = adapter.prefill(condition, cfg=True, max_window=max(windows))
            adapter.forward(torch.zeros(batch_size, 128, dtype=torch.long, device=device), state)
            keep = torch.full((batch_size,), 128, device=device)
            tokens = torch.zeros(batch_size, W, dtype=torch.long, device=device)
            seconds[W] = median_seconds(partial(adapter.forward, tokens, state), device, repeats,
                                        after=partial(adapter.rollback, state, keep))
    return seconds


def format_table(rows: list[Row]) -> str:
    columns = ["method", "batch", "target forwards / image", "step compression", "median latency (s)", "speedup vs AR",
               "outside forward"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append(f"| {r.method} | {r.batch_size} | {r.forwards_per_image:.1f} | {r.step_compression:.2f} | "
                     f"{r.median_latency_s:.3f} | {r.speedup_vs_ar:.2f} | {100 * r.overhead_share:.1f} % |")
    return "\n".join(lines)


def positional_tree(pipe, drafter: dict, prompts: list[str]) -> dict:
    """The options of `drafter`'s (a `POSITIONAL` entry's) positional tree of POSITIONAL_NODES nodes, for the child
    acceptance its CALIBRATION_TREE reaches on `prompts` (untimed)."""
    generators = seeded(pipe.device, range(len(prompts)))
    stats = pipe(prompts, generator=generators, output_type="latent", **drafter, **CALIBRATION_TREE).stats
    print(f"{drafter['decoding']}'s positional acceptance (k-th child):",
          [round(rate, 3) for rate in stats.child_acceptance])
    return {**drafter, "tree_size": POSITIONAL_NODES, "tree_rates": stats.child_acceptance}


def summary(rows: list[Row], costs: dict[int, dict[int, float]], methods: dict[str, dict]) -> dict:
    """The headline figures; one whose methods did not run (`--methods`) is left out. `speedup_bound_bs1`: each
    exact method's step compression / cost of its forward (the speedup a decoding with no overhead outside the forward
    would reach on this machine). methods: what ran."""
    at = {(r.method, r.batch_size): r for r in rows}
    result = {}
    if ("sjd_published", 1) in at:
        result["sjd_step_compression"] = round(at[("sjd_published", 1)].step_compression, 3)
        result["sjd_speedup_vs_ar_bs1"] = round(at[("sjd_published", 1)].speedup_vs_ar, 3)
    ours = [r for r in rows if r.method in BEST]
    if ours:
        best_bs1 = max((r for r in ours if r.batch_size == 1), key=lambda r: r.speedup_vs_ar)
        best_compression = max(r.step_compression for r in ours if r.batch_size == 1)
        result |= {
            "best_exact_step_compression": round(best_compression, 3),
            "best_exact_method_bs1": best_bs1.method,
            "best_exact_speedup_vs_ar_bs1": round(best_bs1.speedup_vs_ar, 3),
            "overhead_share": round(best_bs1.overhead_share, 4),
            "best_exact_speedup_bound_bs1": round(
                best_bs1.step_compression / costs[1][tokens_per_forward(methods[best_bs1.method])], 3),
            "speedup_bound_bs1": {r.method: round(r.step_compression /
                                                  costs[1][tokens_per_forward(methods[r.method])], 3)
                                  for r in ours if r.batch_size == 1},
        }
        if "sjd_step_compression" in result:
            result["best_over_sjd_step_compression"] = round(best_compression / result["sjd_step_compression"], 3)
        if any(r.batch_size == 8 for r in ours):
            result["best_exact_speedup_vs_ar_bs8"] = round(max(r.speedup_vs_ar for r in ours if r.batch_size == 8),
                                                           3)
    drafts = [name for name, options in methods.items() if options["decoding"] == "draft"]
    chains = [name for name in drafts if name in DRAFT and "tree" not in name]
    if ("draft_tree", 1) in at and chains:
        best_chain = max(at[(name, 1)].step_compression for name in chains)
        result["draft_tree_over_chain_step_compression_bs1"] = round(at[("draft_tree", 1)].step_compression /
                                                                     best_chain, 3)
    heads = [name for name, options in methods.items() if options["decoding"] == "heads"]
    for name in heads:
        result[f"{name}_step_compression_bs1"] = round(at[(name, 1)].step_compression, 3)
        result[f"{name}_speedup_vs_ar_bs1"] = round(at[(name, 1)].speedup_vs_ar, 3)
    exact = [name for name in heads if methods[name].get("acceptance", "exact") == "exact"]
    if exact and drafts:  # the best exact head configuration over the draft GPT's best
        best_heads, best_draft = (max(at[(name, 1)].step_compression for name in names) for names in (exact, drafts))
        result["heads_over_draft_step_compression_bs1"] = round(best_heads / best_draft, 3)
    if ("heads", 1) in at and ("heads_lantern", 1) in at:
        result["heads_lantern_over_heads_speed_bs1"] = round(at[("heads_lantern", 1)].speedup_vs_ar /
                                                             at[("heads", 1)].speedup_vs_ar, 3)
    for name in METHODS.keys() - PRESETS.keys() - {"ar"}:  # the other registered decodings, reported apart
        if (name, 1) in at:
            result[f"{name}_step_compression_bs1"] = round(at[(name, 1)].step_compression, 3)
            result[f"{name}_speedup_vs_ar_bs1"] = round(at[(name, 1)].speedup_vs_ar, 3)
    return result


def sweep(pipe, prompts: list[str]) -> None:
    base = measure(pipe, "ar", METHODS["ar"], prompts, 1, 1)
    print(f"ar: {base.median_latency_s:.3f} s")
    for coupling in COUPLINGS:
        for init in INITS:
            for window in SWEEP_WINDOWS:
                options = {"decoding": "sjd", "window": window, "init": init, "coupling": coupling}
                row = measure(pipe, "sweep", options, prompts, 1, 1)
                print(f"{coupling:8s} {init:10s} L={window:3d}  compression {row.step_compression:.2f}  "
                      f"speedup {base.median_latency_s / row.median_latency_s:.2f}", flush=True)


def measure_prior(pipe, prompts: list[str], batch_sizes=POLICY_BATCH_SIZES, candidates=WINDOWS) -> dict:
    """Step compression c(W, B) of exact SJD (the policy's settings): N / mean batch forwards (prefill excluded) over
    the prompts decoded in batches of B, per batch size and candidate: a window W, or a frontier tree (W, K, D) keyed
    "WxKxD"."""
    compression = {}
    for batch_size in batch_sizes:
        compression[batch_size] = {}
        for candidate in candidates:
            tree = isinstance(candidate, tuple)
            forwards, batches, N = 0, 0, None
            for start in range(0, len(prompts) - batch_size + 1, batch_size):
                generators = seeded(pipe.device, range(1000 + start, 1000 + start + batch_size))
                out = pipe(prompts[start : start + batch_size], generator=generators, output_type="latent",
                           decoding=candidate_sjd(candidate))
                forwards += out.stats.target_forwards - out.stats.prefill_forwards
                batches, N = batches + 1, out.images.shape[1]
            key = tree_key(candidate) if tree else candidate
            compression[batch_size][key] = round(N * batches / forwards, 3)
            print(f"batch {batch_size} {'tree' if tree else 'window'} {key}: compression "
                  f"{compression[batch_size][key]}", flush=True)
    return compression


def compare_default_policy(pipe, prompts: list[str], batch_sizes=POLICY_BATCH_SIZES, windows=POLICY_WINDOWS,
                           trees=POLICY_TREES) -> dict:
    """Per batch size: median latency per image of AR, the default, SJD at each fixed window and with each fixed
    frontier tree (the methods run in turn on every batch of prompts, so drift of the machine hits them alike), each
    one's median over batches of AR's latency / its latency, what the default chose, the speedup it predicted and
    the prediction's relative error against the measured one."""
    methods = {"ar": {"decoding": "ar"}, "default": {},
               **{f"sjd_w{W}": {"decoding": "sjd", "window": W, **SJD_SETTINGS} for W in windows},
               **{f"sjd_tree{tree_key(tree)}": {"decoding": candidate_sjd(tree)} for tree in trees}}
    results = {}
    for batch_size in batch_sizes:
        latency = {name: [] for name in methods}
        chosen, predicted = set(), []
        for start in range(0, len(prompts) - batch_size + 1, batch_size):
            batch = prompts[start : start + batch_size]
            for name, options in methods.items():
                generators = seeded(pipe.device, range(1000 + start, 1000 + start + batch_size))
                began = time.perf_counter()
                stats = pipe(batch, generator=generators, output_type="latent", **options).stats
                synchronize(pipe.device)
                latency[name].append((time.perf_counter() - began) / batch_size)
                if name == "default":
                    chosen.add(stats.chosen_by)
                    predicted.append(stats.predicted_speedup)
        ratio = {name: statistics.median(a / b for a, b in zip(latency["ar"], seconds, strict=True))
                 for name, seconds in latency.items()}
        best = max((name for name in methods if name.startswith("sjd")), key=ratio.get, default=None)
        prediction = statistics.median(predicted)
        results[batch_size] = {"median_latency_per_image_s": {n: round(statistics.median(s), 4)
                                                               for n, s in latency.items()},
                               "speed_vs_ar": {n: round(r, 3) for n, r in ratio.items()},
                               "best_fixed_window": best, "default_chose": sorted(chosen),
                               "default_predicted_vs_ar": round(prediction, 3),
                               "prediction_error": round(abs(prediction - ratio["default"]) / ratio["default"], 3)}
        print(f"batch {batch_size}: default {ratio['default']:.2f}x AR (predicted {prediction:.2f}x)"
              + ("" if best is None else f", best fixed {best} {ratio[best]:.2f}x") + f"; {sorted(chosen)[0]}"
              + (f" (+{len(chosen) - 1} more)" if len(chosen) > 1 else ""), flush=True)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=IMAGE_T2I, help="zoo name or saved pipeline folder")
    parser.add_argument("--quick", action="store_true", help="4 prompts, 1 repeat, batch 1 and 4 (with "
                                                             "--default-policy: 8 prompts, the default against AR "
                                                             "only)")
    parser.add_argument("--sweep", action="store_true", help="sweep windows and inits per coupling instead")
    parser.add_argument("--default-policy", action="store_true",
                        help="compare the default decoding with AR and fixed windows at batch 1, 2, 4, 8 instead")
    parser.add_argument("--measure-prior", action="store_true",
                        help=f"measure SJD's step compression per window and batch size into {PRIOR_FILE.name}")
    parser.add_argument("--prompts", type=int, default=None, help="held-out prompts (default: 32, 16 with "
                                                                   "--measure-prior, 8 with --sweep, 4 with --quick)")
    parser.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                        help="these methods only (default: all; AR always runs): " + ", ".join(CHOICES))
    parser.add_argument("--json", default=None, help="write the rows and the summary here")
    add_device_arguments(parser, dtype=False)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.methods or ()) - set(CHOICES))
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(CHOICES)}")
    if args.methods and (args.sweep or args.default_policy or args.measure_prior):
        parser.error("--methods picks the rows of the method table; --sweep, --default-policy and --measure-prior "
                     "run their own")
    device = resolve_device(parser, args.device)
    pipe = AutoARImagePipeline.from_pretrained(args.model, dtype=torch.float32).to(device)
    pipe.set_progress_bar_config(disable=True)
    if args.measure_prior:
        prompts = held_out_prompts(args.prompts or 16)
        report = {"model": args.model, "prompts": len(prompts), "settings": SJD_SETTINGS,
                  "command": "python -m mmspec.eval.bench_image --measure-prior",
                  "compression": measure_prior(pipe, prompts),
                  "tree_compression": measure_prior(pipe, prompts, candidates=TREES)}
        PRIOR_FILE.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {PRIOR_FILE}")
        return report
    if args.default_policy:
        prompts = held_out_prompts(args.prompts or (8 if args.quick else 32))
        # --quick: the default against AR only, at batch 1 and 4
        batch_sizes = (1, 4) if args.quick else POLICY_BATCH_SIZES
        for options in ({"decoding": "ar"}, {}):  # warm-up, and the default's cost curves for every batch size
            for batch_size in batch_sizes:
                pipe(prompts[:batch_size], output_type="latent", **options)
        results = compare_default_policy(pipe, prompts, batch_sizes, *(((), ()) if args.quick else ()))
        report = {"model": args.model, "prompts": len(prompts), "torch_threads": torch.get_num_threads(),
                  **machine(device), "batch_sizes": results,
                  **{f"default_vs_ar_bs{B}": r["speed_vs_ar"]["default"] for B, r in results.items()},
                  "policy_prediction_error": max(r["prediction_error"] for r in results.values())}
        print(json.dumps({k: v for k, v in report.items() if k.startswith(("default_vs", "policy"))}, indent=1))
        if args.json:
            write_json(args.json, report)
        return report
    prompts = held_out_prompts(args.prompts or (4 if args.quick else 8 if args.sweep else 32))
    repeats = 1 if args.quick else 2
    batch_sizes = (1, 4) if args.quick else (1, 8)
    # draft heads read the target's features from eager forwards: a pipeline replaying CUDA graphs refuses them
    chosen = {"ar", *(CHOICES if args.methods is None else args.methods)}
    chosen -= {name for name, options in {**METHODS, **POSITIONAL}.items()
               if pipe.replays_graphs() and options["decoding"] == "heads"}
    methods = {name: options for name, options in METHODS.items() if name in chosen}
    if not args.sweep:
        calibration = held_out_prompts(len(prompts) + min(4, len(prompts)))[len(prompts):]
        methods.update({name: positional_tree(pipe, drafter, calibration) for name, drafter in POSITIONAL.items()
                        if name in chosen})
    for options in methods.values():  # warm-up
        pipe(prompts[:1], output_type="latent", **options)
    if args.sweep:
        sweep(pipe, prompts)
        return {}

    rows = []
    for batch_size in batch_sizes:  # a 61-node positional tree per row: batch 1 only
        timed = {name: options for name, options in methods.items() if batch_size == 1 or name not in POSITIONAL}
        measured = measure_in_turn(pipe, timed, prompts, batch_size, repeats)
        for name, row in measured.items():
            row.speedup_vs_ar = measured["ar"].median_latency_s / row.median_latency_s
            rows.append(row)
            print(f"{name} batch {batch_size}: {row.median_latency_s:.3f} s", flush=True)
    widths = sorted(set(COST_WINDOWS) | {tokens_per_forward(options) for options in methods.values()})
    costs = {batch_size: window_forward_cost(pipe, batch_size, widths) for batch_size in batch_sizes}
    report = {"model": args.model, "prompts": len(prompts), "repeats": repeats,
              "torch_threads": torch.get_num_threads(), **machine(device), "methods": methods,
              "rows": [vars(r) for r in rows],
              "window_forward_cost": costs, "summary": summary(rows, costs, methods)}
    print(format_table(rows))
    print("\nforward cost of a W-token window relative to W = 1 (CFG, 128 cached tokens):")
    for batch_size, cost in costs.items():
        print(f"  batch {batch_size}: " + ", ".join(f"W={W}: {c:.2f}x" for W, c in cost.items()))
    print("\n" + json.dumps(report["summary"], indent=1))
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
