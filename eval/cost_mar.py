"""The cost model's MAR part: continuous speculative decoding (CSpD) projected to MAR-L and MAR-H with MAR-B drafting
(the paper's pairs), from random-weight models of the official sizes and the embedded MAR pair's runs.

    python -m mmspec.eval.cost_model --models mar-l mar-h --batch-sizes 1 8

A MAR call spends its time in two kinds of work whose cost grows with the model: encoder-decoder passes (one per AR
step of the target or the draft, over all 2B rows with CFG) and diffusion-head evaluations (one per diffusion step, over
the rows of the tokens being sampled or verified; the residual draws of rejected tokens add more). Forward hooks log
both on the embedded pair (`mmspec/zoo/mar_shapes`, decoded with bench_continuous's settings `SETTINGS`): the passes of
each model, the rows of every head call, and the seconds inside them; the rest of the wall clock (acceptance math,
bookkeeping) is the overhead o, which does not grow with the model. With e the seconds of one encoder-decoder pass and
h(r) those of one head call over r rows (measured on each model, interpolated between measured row counts), a
method's call costs

    T = sum over target and draft of [passes * e + sum over head calls of h(rows * s)] + o,

s = 256 / the embedded model's tokens (a real MAR writes 256 tokens in the same 64 AR steps, so every head call has s
times the rows). The projected speedup of CSpD's exact and released (`paper`) rules over the target's AR is
T_ar / T. The embedded pair is the formula's test: its own e and h give the projection it is checked against its
measured speedup (`projection_relative_error`). Not projected: how acceptance changes with the models' sizes (the
embedded pair's is used as measured).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from mmspec.core.runtime.measured import median_seconds
from mmspec.core.stats import synchronize
from mmspec.eval.devices import seeded
from mmspec.eval.timed_spans import TimedSpans
from mmspec.models.mar.model import MAR_PRESETS, MARModel

MAR_SHAPES = {"mar-b": "mar_base", "mar-l": "mar_large", "mar-h": "mar_huge"}  # our name -> MARModel.preset
PAIRS = {"mar-l": "mar-b", "mar-h": "mar-b"}  # target -> draft, CSpD's
REAL_SEQ_LEN = 256  # 256 px through the KL-16 tokenizer
SETTINGS = {"num_iter": 64, "num_diffusion_steps": 100, "guidance_scale": 3.0}
SPECULATIVE = {"decoding": "speculative", "gamma": 16, "prefill_ratio": 0.05}
METHODS = ("exact", "paper")
HEAD_ROWS_MEASURED = 8192  # beyond, a head call's cost is extrapolated linearly in its rows


def call_log(model: MARModel) -> TimedSpans:
    """Hooks on a `MARModel`: its encoder-decoder passes (`passes`: z_proj's input to decoder_norm's output), the rows
    of each diffusion-head call (`head_rows`), and the seconds inside both."""
    head = model.diffloss.net
    return TimedSpans(model.device, {"passes": (model.z_proj, model.decoder_norm, None),
                                     "head_rows": (head, head, lambda args: args[0].shape[0])})


def run_embedded(pipe, labels: list[int], batch_size: int, settings: dict = SETTINGS) -> dict:
    """AR, then each of `METHODS`, on each batch of `labels` (same seeds), with `call_log`s on the target and the
    draft: per method the pipeline calls, the logs and the wall clock summed over them, and the measured speedup
    over AR."""
    models = {"target": pipe.transformer, "draft": pipe.draft_transformer}
    options = {"ar": settings} | {m: {**settings, **SPECULATIVE, "acceptance": m} for m in METHODS}
    pipe(labels[:batch_size], generator=seeded(pipe.device, [0])[0], output_type="latent", **settings)  # warm-up
    starts = range(0, len(labels) - batch_size + 1, batch_size)
    runs = {m: {"calls": len(starts), "wall_s": 0.0}
            | {role: {"passes": 0, "head_rows": [], "inside_s": 0.0} for role in models} for m in options}
    for start in starts:
        for method, kwargs in options.items():
            logs = {role: call_log(model) for role, model in models.items()}
            synchronize(pipe.device)
            began = time.perf_counter()
            pipe(labels[start : start + batch_size], output_type="latent",
                 generator=seeded(pipe.device, range(1000 + start, 1000 + start + batch_size)), **kwargs)
            synchronize(pipe.device)
            runs[method]["wall_s"] += time.perf_counter() - began
            for role, log in logs.items():
                logged = log.remove()
                total = runs[method][role]
                total["passes"] += len(logged["passes"])
                total["head_rows"] += logged["head_rows"]
                total["inside_s"] += logged["inside_s"]
    for run in runs.values():
        run["overhead_s"] = run["wall_s"] - sum(run[role]["inside_s"] for role in models)
        run["measured_speedup"] = round(runs["ar"]["wall_s"] / run["wall_s"], 3)
    return runs


def head_rows_needed(runs: dict, scale: int) -> int:
    return scale * max(max(run[role]["head_rows"], default=1) for run in runs.values() for role in ("target", "draft"))


def measure_components(model: MARModel, batch_size: int, max_rows: int, repeats: int) -> dict:
    """Seconds of one encoder-decoder pass over 2B rows (CFG) with half the tokens known (`pass_s`), and of one
    head call over r rows for r = 2, 8, 32, ... up to the first power of 4 (times 2) >= min(max_rows,
    `HEAD_ROWS_MEASURED`) (`head_s`; calls of up to 512 rows are short: at least 10 timed each)."""
    config, device, dtype = model.config, model.device, model.dtype
    generator = torch.Generator().manual_seed(0)
    rows, L, C = 2 * batch_size, config.seq_len, config.token_dim
    tokens = torch.randn(rows, L, C, generator=generator).to(device, dtype)
    unknown = torch.zeros(rows, L, dtype=torch.bool)
    unknown[:, torch.randperm(L, generator=generator)[: L // 2]] = True
    embedding = model.class_embedding(torch.zeros(rows, dtype=torch.long, device=device), rows)

    def seconds(fn, times: int) -> float:
        return median_seconds(fn, device, times, warmup=1)

    with torch.no_grad():
        pass_s = seconds(lambda: model.encode_decode(tokens, unknown.to(device), embedding), repeats)
        head_s, r = {}, 2
        while True:
            x = torch.randn(r, C, generator=generator).to(device, dtype)
            z = torch.randn(r, config.decoder_embed_dim, generator=generator).to(device, dtype)
            t = torch.randint(0, 1000, (r,), generator=generator).to(device)
            head_s[r] = seconds(lambda x=x, t=t, z=z: model.head(x, t, z), max(repeats, 10) if r <= 512 else repeats)
            if r >= min(max_rows, HEAD_ROWS_MEASURED) and len(head_s) > 1:
                break
            r *= 4
    return {"pass_s": pass_s, "head_s": head_s}


def call_seconds(components: dict, log: dict, scale: int) -> float:
    """The seconds a model's logged work costs at a model's `measure_components`, every head call with `scale` times
    its rows: interpolated linearly between the measured row counts, and beyond the last along the line through the
    last two (a head call of thousands of rows costs in proportion to its rows)."""
    (r0, s0), (r1, s1) = list(components["head_s"].items())[-2:]
    rows = scale * np.asarray(log["head_rows"], dtype=np.float64)
    measured = components["head_s"]
    head = np.where(rows <= r1, np.interp(rows, list(measured), list(measured.values())),
                    s1 + (rows - r1) * (s1 - s0) / (r1 - r0))
    return log["passes"] * components["pass_s"] + float(head.sum())


def projected_speedups(runs: dict, target: dict, draft: dict, scale: int) -> dict:
    """method -> T_ar / T (see the module docstring) for a target and draft's `measure_components`."""
    def total(run):
        return call_seconds(target, run["target"], scale) + call_seconds(draft, run["draft"], scale) + run["overhead_s"]

    ar = total(runs["ar"])
    return {method: round(ar / total(runs[method]), 3) for method in METHODS}


def measure_mar(names, device: torch.device, dtype: torch.dtype, batch_sizes, labels: list[int], repeats: int,
                presets: dict | None = None, settings: dict = SETTINGS) -> dict:
    """The MAR section of the cost model's report: the embedded pair's runs, its projection check, and for each of
    `names` (and the drafts of their pairs) the measured components, the projected seconds of an AR call
    (`ar_call_s`), and for the targets of `PAIRS` the projected speedups. presets: our name -> `MARModel` keyword
    arguments (default the official sizes, `MAR_PRESETS`, at 256 px); settings: the embedded pair's decoding (the tests
    shorten it)."""
    from mmspec.pipelines.mar import MARPipeline
    from mmspec.zoo import MAR_C2I

    pipe = MARPipeline.from_pretrained(MAR_C2I, dtype=torch.float32).to(device)
    pipe.set_progress_bar_config(disable=True)
    scale = REAL_SEQ_LEN // pipe.transformer.config.seq_len
    embedded = {"runs": {}, "check": {}}
    for B in batch_sizes:
        runs = run_embedded(pipe, labels, B, settings)
        rows = head_rows_needed(runs, 1)
        own = {role: measure_components(model, B, rows, repeats)
               for role, model in (("target", pipe.transformer), ("draft", pipe.draft_transformer))}
        projected = projected_speedups(runs, own["target"], own["draft"], 1)
        embedded["runs"][B] = {m: {k: v for k, v in run.items() if k not in ("target", "draft")}
                               | {role: {"passes": run[role]["passes"], "head_calls": len(run[role]["head_rows"]),
                                         "head_rows": sum(run[role]["head_rows"])} for role in ("target", "draft")}
                               for m, run in runs.items()}
        embedded["check"][B] = {m: {"projected": projected[m], "measured": runs[m]["measured_speedup"],
                                    "relative_error": round(abs(projected[m] - runs[m]["measured_speedup"])
                                                            / runs[m]["measured_speedup"], 3)} for m in METHODS}
        embedded["runs"][B]["logs"] = runs  # kept for the real sizes below, dropped before the report is written
        print(f"embedded MAR batch {B}: " + ", ".join(
            f"{m} projected {c['projected']:.2f}x, measured {c['measured']:.2f}x"
            for m, c in embedded["check"][B].items()), flush=True)
    del pipe
    wanted = list(dict.fromkeys([*names, *(PAIRS[n] for n in names if n in PAIRS)]))
    presets = presets or {name: MAR_PRESETS[MAR_SHAPES[name]] for name in wanted}
    entries = {}
    for name in wanted:
        with torch.device(device):
            model = MARModel(**presets[name]).eval()
        model = model if model.dtype == dtype else model.to(dtype)
        entry = {"parameters": sum(p.numel() for p in model.parameters()), "components": {}, "ar_call_s": {}}
        for B in batch_sizes:
            logs = embedded["runs"][B]["logs"]
            components = measure_components(model, B, head_rows_needed(logs, scale), repeats)
            entry["components"][B] = components
            ar = logs["ar"]
            entry["ar_call_s"][B] = round((call_seconds(components, ar["target"], scale) + ar["overhead_s"])
                                          / ar["calls"], 3)
            print(f"{name} batch {B}: encoder-decoder pass {1000 * components['pass_s']:.1f} ms, head call "
                  + ", ".join(f"{r} rows {1000 * s:.2f} ms" for r, s in components["head_s"].items())
                  + f"; AR call {entry['ar_call_s'][B]:.1f} s", flush=True)
        entries[name] = entry
        del model
    for name, draft in PAIRS.items():
        if name in entries:
            entries[name]["draft"] = draft
            entries[name]["projected"] = {
                B: projected_speedups(embedded["runs"][B]["logs"], entries[name]["components"][B],
                                      entries[draft]["components"][B], scale) for B in batch_sizes}
    for B in batch_sizes:
        del embedded["runs"][B]["logs"]
    error = max(c["relative_error"] for check in embedded["check"].values() for c in check.values())
    return {"embedded (mar_shapes)": embedded, **entries, "projection_relative_error": error}


def format_table(section: dict) -> str:
    lines = ["| target / draft | batch | AR call (s) | " + " | ".join(METHODS) + " |",
             "|---|---|---|" + "---|" * len(METHODS)]
    for name, entry in section.items():
        for B, projected in (entry.get("projected", {}) if isinstance(entry, dict) else {}).items():
            lines.append(f"| {name} / {entry['draft']} | {B} | {entry['ar_call_s'][B]:.2f} | "
                         + " | ".join(f"{projected[m]:.2f}x" for m in METHODS) + " |")
    return "\n".join(lines)
