"""The image tab: plain AR and an accelerated decoding draw the same prompt with the same seed, one after the other,
streamed side by side: partial images as tokens are committed, the acceptance map (which target forward committed each
token) and a stats table with the speedup.

Latency is the pipeline call's wall clock minus the time spent rendering previews, so streaming costs both methods
nothing; the two runs are sequential, never concurrent, so neither slows the other.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import gradio as gr
import numpy as np
import PIL.Image
import torch

from mmspec.apps.tabs.base import (
    COMPUTE,
    STATS_HEADERS,
    StreamedImages,
    check_number,
    check_prompt,
    shows_errors,
    stats_row,
    while_cold,
)
from mmspec.apps.tabs.settings import decoding_controls, rule_controls
from mmspec.core.registry import decodings, rules
from mmspec.core.stats import SpecStats
from mmspec.image import methods  # noqa: F401  registers the image decodings

PREVIEW_INTERVAL_S = 0.15  # at most one partial image per run and interval
DISPLAY_SIZE = 256  # pixels of the displayed images and maps (nearest-neighbour enlargement)
EXAMPLES = [
    "two small red triangles above a blue circle on a striped background",
    "three large orange crosses left of a small blue circle on a plain background",
    "a large white square on a checkered background",
]
# viridis at 0, 1/4, 1/2, 3/4, 1: forward index / tokens, the same scale for both maps
VIRIDIS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64)
NOT_YET = np.array([128, 128, 128], dtype=np.float64)  # cells no forward has committed yet (as in partial images)


@dataclass(frozen=True)
class Preview:
    """A running decoding's state: the partial image, the acceptance map [h, w] (-1 = not committed yet) and the
    number of committed tokens."""

    image: PIL.Image.Image
    acceptance_map: np.ndarray
    committed: int


@dataclass(frozen=True)
class Result:
    """A finished decoding: its image, exact acceptance map [h, w], counters and latency (s, previews excluded)."""

    image: PIL.Image.Image
    acceptance_map: np.ndarray
    stats: SpecStats
    latency: float


def acceptance_heatmap(acceptance_map: np.ndarray, num_tokens: int, size: int = DISPLAY_SIZE) -> PIL.Image.Image:
    """An RGB picture of an acceptance map [h, w]: colour = the forward that committed the token on one scale for
    every method (0 .. num_tokens - 1, AR's forwards), every other forward slightly darker so that the tokens one
    forward committed stand out as a run; grey = not committed yet."""
    position = np.clip(acceptance_map / max(num_tokens - 1, 1), 0, 1) * (len(VIRIDIS) - 1)
    low = np.floor(position).astype(int).clip(max=len(VIRIDIS) - 2)
    weight = (position - low)[..., None]
    rgb = VIRIDIS[low] * (1 - weight) + VIRIDIS[low + 1] * weight
    rgb *= np.where(acceptance_map % 2 == 1, 0.8, 1.0)[..., None]
    rgb = np.where((acceptance_map < 0)[..., None], NOT_YET, rgb)
    return PIL.Image.fromarray(rgb.round().astype(np.uint8)).resize((size, size), PIL.Image.NEAREST)


def enlarge(image: PIL.Image.Image, size: int = DISPLAY_SIZE) -> PIL.Image.Image:
    return image.resize((size, size), PIL.Image.NEAREST)


def stream_decoding(pipe, prompt: str, seed: int, options: dict,
                    preview_interval: float = PREVIEW_INTERVAL_S) -> Iterator[Preview | Result]:
    """Run `pipe(prompt, **options)` on the compute thread and yield a `Preview` at most every `preview_interval`
    seconds, then the `Result`. Closing the iterator early interrupts the pipeline at its next forward."""
    grid = pipe.transformer.config.grid_size
    events: queue.Queue = queue.Queue()
    stop = threading.Event()
    live_map = torch.full((grid * grid,), -1, dtype=torch.long)
    clock = {"last_preview": 0.0, "preview_seconds": 0.0}

    def on_step(pipe_, step, committed, tensors):
        tokens = tensors["tokens"][:1]  # [1, N], -1 where not committed yet; the tab shows one image
        live_map.masked_fill_((tokens[0].cpu() >= 0) & (live_map < 0), step)  # the map lives on the host
        start = time.perf_counter()
        if start - clock["last_preview"] >= preview_interval:
            image = pipe_.decode_tokens(tokens)[0]
            events.put(Preview(image, live_map.view(grid, grid).numpy().copy(), committed))
            clock["last_preview"] = time.perf_counter()
            clock["preview_seconds"] += clock["last_preview"] - start
        pipe_._interrupt = stop.is_set()
        return {}

    def work():
        try:
            start = time.perf_counter()
            out = pipe(prompt, generator=torch.Generator(pipe.device).manual_seed(seed),
                       callback_on_step_end=on_step, callback_on_step_end_tensor_inputs=["tokens"], **options)
            latency = time.perf_counter() - start - clock["preview_seconds"]
            final_map = out.stats.acceptance_map[0].view(grid, grid).numpy()
            events.put(Result(out.images[0], final_map, out.stats, latency))
        except Exception as error:  # handed to the consuming thread, which raises it there
            events.put(error)

    running = COMPUTE.submit(work)
    try:
        while True:
            event = events.get()
            if isinstance(event, Exception):
                raise event
            yield event
            if isinstance(event, Result):
                return
    finally:
        stop.set()
        running.result()


def setting_controls():
    """The tab's decoding controls, in the order its generate handler takes them (after prompt, seed, guidance,
    temperature, top-k, method and acceptance): every registered image decoding's settings, then its rules'."""
    return decoding_controls("image", fields_skipped=("acceptance",)) + rule_controls("image")


class ImageTab:
    """Text-to-image with a `LlamaGenPipeline`: AR against an accelerated decoding — auto, or any registered image
    decoding with its settings and acceptance rule (the controls are generated from them)."""

    title = "Image"

    def __init__(self, pipe, preview_interval: float = PREVIEW_INTERVAL_S):
        self.pipe, self.preview_interval = pipe, preview_interval
        self.cold: set[str] = set()  # what the warm-up has not run yet (none without one)
        self.vocab_size = pipe.transformer.config.vocab_size
        self.num_tokens = pipe.num_timesteps
        # the decodings this pipeline can run: it supplies their runtime parts (a draft model, a draft head)
        available = [name for name, cls in decodings("image").items() if name != "ar"
                     and not pipe.supplied(cls()).unsupplied()]
        self.methods = [("auto: the fastest exact decoding here", "auto")] + [
            (f"{decodings('image')[name].__name__} ({name})", name) for name in available]
        self.controls = setting_controls()

    def build(self) -> None:
        gr.Markdown(
            "AR decoding (one token per target forward, with a KV cache) and the accelerated method draw the **same "
            "prompt with the same seed**, one after the other. Exact methods sample the same distribution as AR; "
            "their images still differ from AR's because the random numbers are spent differently. The maps show "
            "which target forward committed each token (dark: early, bright: late, on one scale for both)."
        )
        with gr.Row():
            prompt = gr.Textbox(label="Prompt", value=EXAMPLES[0], elem_id="image-prompt", scale=4)
            generate = gr.Button("Generate", variant="primary", elem_id="image-generate", scale=1)
        with gr.Row():
            seed = gr.Number(label="Seed", value=0, precision=0, elem_id="image-seed")
            guidance = gr.Slider(1.0, 10.0, value=3.0, step=0.5, label="Guidance scale (1 = off)")
            temperature = gr.Slider(0.0, 2.0, value=1.0, step=0.05, label="Temperature (0 = greedy)")
            top_k = gr.Slider(0, self.vocab_size, value=0, step=1, label="Top-k (0 = all codes)")
        with gr.Row():
            method = gr.Radio(self.methods, value="auto", label="Accelerated method")
            acceptance = gr.Radio([(f"{name} ({'lossless' if rule.lossless else 'lossy'})", name)
                                   for name, rule in rules("image").items()], value="exact", label="Acceptance")
        with gr.Row():
            settings = [control.build(visible=False) for control in self.controls]
        gr.Examples(EXAMPLES, inputs=[prompt])
        with gr.Row():
            ar_image = gr.Image(label="AR", type="filepath", elem_id="image-ar", height=DISPLAY_SIZE)
            fast_image = gr.Image(label="Accelerated", type="filepath", elem_id="image-fast",
                                  height=DISPLAY_SIZE)
            ar_map = gr.Image(label="AR: forward per token", type="filepath", elem_id="map-ar",
                              height=DISPLAY_SIZE)
            fast_map = gr.Image(label="Accelerated: forward per token", type="filepath", elem_id="map-fast",
                                height=DISPLAY_SIZE)
        stats = gr.Dataframe(headers=STATS_HEADERS, datatype="str", interactive=False, label="Stats",
                             elem_id="image-stats")
        status = gr.Markdown(elem_id="image-status")

        def shown(method, acceptance):  # a setting is shown with its decoding; a rule's with the rule, if it takes one
            takes = method in decodings("image") and "acceptance" in decodings("image")[method].settings()
            return [gr.update(visible=c.owner == method or (takes and c.owner == acceptance)) for c in self.controls]

        for trigger in (method, acceptance):
            trigger.change(shown, [method, acceptance], settings, api_visibility="private")
        generate.click(self.generate, [prompt, seed, guidance, temperature, top_k, method, acceptance, *settings],
                       [ar_image, fast_image, ar_map, fast_map, stats, status], api_name="generate_image",
                       concurrency_limit=1)

    def options(self, method, acceptance, values) -> dict:
        """The accelerated call's pipeline options from the controls (checked): the decoding by name with its
        settings, the acceptance rule with its settings."""
        choices = [value for _, value in self.methods]
        if method not in choices:
            raise ValueError(f"method must be one of {choices}, got {method!r}")
        if acceptance not in rules("image"):
            raise ValueError(f"acceptance must be one of {tuple(rules('image'))}, got {acceptance!r}")
        settings = {control: control.read(value) for control, value in zip(self.controls, values, strict=True)}
        if method == "auto":
            if acceptance != "exact":
                raise ValueError(f"auto chooses among the exact decodings: pick a method to use {acceptance}")
            return {"decoding": "auto"}
        cls = decodings("image")[method]
        if acceptance != "exact" and "acceptance" not in cls.settings():
            raise ValueError(f"{cls.__name__} takes exact acceptance only")
        options = {"decoding": method, **{c.field: v for c, v in settings.items() if c.owner == method}}
        if acceptance != "exact":
            options.update(acceptance=acceptance, **{c.key: v for c, v in settings.items() if c.owner == acceptance})
        return options

    @shows_errors
    def generate(self, prompt, seed, guidance, temperature, top_k, method, acceptance, *values):
        """Stream (AR image, accelerated image, AR map, accelerated map, stats rows, status) as both runs progress."""
        prompt = check_prompt(prompt)
        seed = check_number("Seed", seed, 0, 2**31 - 1, integer=True)
        sampling = {
            "guidance_scale": check_number("Guidance scale", guidance, 1.0, 10.0),
            "temperature": check_number("Temperature", temperature, 0.0, 2.0),
            "top_k": check_number("Top-k", top_k, 0, self.vocab_size, integer=True),
        }
        fast = self.options(method, acceptance, values)
        self.warn_unknown_words(prompt)
        method, cold = while_cold(self, method)
        if cold:
            fast = {"decoding": method}
        label = method if method in ("auto", "ar") else decodings("image")[method].__name__
        label += "" if acceptance == "exact" else f" + {rules('image')[acceptance].__name__}"

        shown = [None, None, None, None]
        rows: list[list[str]] = []
        runs = [("AR", {"decoding": "ar"}, 0), (label, fast, 1)]
        ar_latency = None
        with StreamedImages() as files:
            for name, options, side in runs:
                for event in stream_decoding(self.pipe, prompt, seed, {**sampling, **options}, self.preview_interval):
                    shown[side] = enlarge(event.image)
                    shown[2 + side] = acceptance_heatmap(event.acceptance_map, self.num_tokens)
                    if isinstance(event, Preview):
                        status = f"{name}: {event.committed} / {self.num_tokens} tokens committed"
                    else:
                        ar_latency = ar_latency or event.latency
                        rows.append(stats_row(name, event.stats, event.latency, ar_latency))
                        status = self.summary(name, event, ar_latency) + (cold if side else "")
                    yield *(files.save(image) for image in shown), rows, status
                    files.next_yield()

    def summary(self, name: str, result: Result, ar_latency: float) -> str:
        stats = result.stats
        text = (f"**{name}**: {int(stats.new_tokens.sum())} tokens in {stats.target_forwards} target forwards "
                f"({stats.tokens_per_target_forward:.2f} tokens per forward), {result.latency:.2f} s")
        if name != "AR":
            text += f", **{ar_latency / result.latency:.2f}x** AR's speed"
        if stats.chosen_by:
            text += f" ({stats.chosen_by})"
        if stats.excess_acceptance is not None:
            text += (f". Realised distortion: {stats.excess_acceptance:.3f} per tested position (the output law's TV "
                     f"distance from the model's per position), {stats.excess_per_sample:.1f} summed over the image")
        return text + "."

    def warn_unknown_words(self, prompt: str) -> None:
        tokenizer = self.pipe.tokenizer
        if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in tokenizer(prompt)["input_ids"]:
            gr.Warning("Some words are not in the model's vocabulary and are read as unknown; the embedded model "
                       "knows the words of its captions, e.g. the examples below the controls.")

    def warm_up_calls(self) -> list[tuple[str, Callable[[], object]]]:
        """One short call per decoding and per lossy rule (lazy initialisation: cost curves, the LANTERN neighbour
        table) before anyone is timed."""
        calls = {"ar": {"decoding": "ar"}} | {name: {"decoding": name} for _, name in self.methods}
        takers = [name for _, name in self.methods if name in decodings("image")
                  and "acceptance" in decodings("image")[name].settings()]
        calls |= {rule: {"decoding": takers[0], "acceptance": rule} for rule in rules("image")
                  if rule != "exact" and takers}
        return [(name, partial(self.pipe, EXAMPLES[0], generator=torch.Generator(self.pipe.device).manual_seed(0),
                               output_type="latent", **options)) for name, options in calls.items()]
