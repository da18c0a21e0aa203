"""The text tab: a completion by the target's own `generate` (AR, KV cache) and by speculative decoding, with the
accepted draft tokens highlighted by the target forward that accepted them, and the stats table."""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from functools import partial

import gradio as gr
import torch

from mmspec.apps.tabs.base import (
    COMPUTE,
    STATS_HEADERS,
    check_number,
    check_prompt,
    shows_errors,
    stats_row,
    while_cold,
)
from mmspec.apps.tabs.settings import Control, decoding_controls
from mmspec.core.registry import rules
from mmspec.text.kinds import ONLINE_DRAFTERS
from mmspec.text.methods import described

# one background per forward, cycled, so that neighbouring forwards' accepted drafts are told apart
FORWARD_COLOURS = ["#fde68a", "#bfdbfe", "#bbf7d0", "#fbcfe8", "#ddd6fe", "#fed7aa"]
MAX_NEW_TOKENS = 256


def highlight_pieces(pieces) -> str:
    """HTML of a completion's `TokenPiece`s: accepted draft tokens on a background that changes with the forward that
    accepted them, tokens the target drew itself (one per forward) plain; hovering shows the forward."""
    spans = []
    for piece in pieces:
        text = html.escape(piece.text)
        if piece.from_draft:
            colour = FORWARD_COLOURS[piece.step % len(FORWARD_COLOURS)]
            spans.append(f'<span class="draft" style="background:{colour}" title="forward {piece.step}: accepted '
                         f'draft token">{text}</span>')
        else:
            spans.append(f'<span class="target" title="forward {piece.step}: drawn by the target">{text}</span>')
    return ('<pre class="mmspec-tokens" style="white-space:pre-wrap;font-family:monospace;color:#111">'
            + "".join(spans) + "</pre>")


class TextTab:
    """Text completion with a `SpeculativeTextPipeline`."""

    title = "Text"

    def __init__(self, pipe):
        self.pipe = pipe
        self.cold: set[str] = set()  # what the warm-up has not run yet (none without one)
        speculative = [m for m in pipe.methods if m != "ar"]
        if not speculative:
            raise ValueError("the text pipeline offers no speculative method")
        # each method's label is its phrase ("ngram: prompt lookup"), else its docstring's first sentence
        self.methods = [("auto: the fastest exact method here", "auto")] + [(f"{m}: {described(m)}", m)
                                                                            for m in speculative]
        self.controls = self.text_controls()
        # the registered rules whose runtime parts (a judge rule's head) this pipeline supplies
        self.rules = [name for name, rule in rules("text").items()
                      if not pipe.supplied(rule()).unsupplied()]

    @staticmethod
    def text_controls() -> list[Control]:
        """The tab's drafter settings, in the order its complete handler takes them (after prompt, method,
        temperature, new tokens and seed)."""
        return decoding_controls("text", fields_skipped=("acceptance",))

    @staticmethod
    def reads(control: Control, method: str) -> bool:
        """Whether `method` reads the control's setting (auto: none, it chooses)."""
        return control.owner == method

    def build(self) -> None:
        gr.Markdown(
            "The target's own `generate` (one token per forward, KV cache) and speculative decoding complete the same "
            "prompt. Highlighted tokens are **accepted draft tokens**, one colour per target forward; plain tokens "
            "were drawn by the target itself (one per forward). At temperature 0 both completions are identical."
        )
        with gr.Row():
            prompt = gr.Textbox(label="Prompt", value="def fibonacci(n):\n", lines=4, elem_id="text-prompt", scale=4)
            generate = gr.Button("Complete", variant="primary", elem_id="text-generate", scale=1)
        with gr.Row():
            method = gr.Radio(self.methods, value=self.methods[0][1], label="Drafter")
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
            max_new_tokens = gr.Slider(8, MAX_NEW_TOKENS, value=96, step=8, label="New tokens")
            seed = gr.Number(label="Seed", value=0, precision=0)
        with gr.Row():
            settings = [control.build(visible=False) for control in self.controls]
        learners = any(self.pipe.online_source(drafter) is not None for drafter in ONLINE_DRAFTERS)
        online = gr.Checkbox(value=False, visible=learners, elem_id="text-online",
                             label="Online drafting: the drafter keeps learning from the target between requests "
                                   "(the draft LM, or the chosen kind of head; exact)")
        acceptance = gr.Radio(self.rules, value="exact", elem_id="text-acceptance",
                              label="Acceptance of a chain drafter's drafts (exact: lossless; the others lossy)")
        with gr.Row():
            ar_text = gr.Textbox(label="AR (target.generate)", lines=8, interactive=False, elem_id="text-ar")
            fast_text = gr.HTML(label="Speculative", elem_id="text-fast")
        stats = gr.Dataframe(headers=STATS_HEADERS, datatype="str", interactive=False, label="Stats",
                             elem_id="text-stats")
        status = gr.Markdown(elem_id="text-status")
        method.change(lambda m: [gr.update(visible=self.reads(c, m)) for c in self.controls], method, settings,
                      api_visibility="private")
        inputs = [prompt, method, temperature, max_new_tokens, seed, *settings, online, acceptance]
        generate.click(self.generate, inputs, [ar_text, fast_text, stats, status], api_name="complete_text",
                       concurrency_limit=1)

    @shows_errors
    def generate(self, prompt, method, temperature, max_new_tokens, seed, *values):
        """Yield (AR completion, highlighted speculative completion, stats rows, status) after each run. values: the
        drafter settings' controls, then the online-drafting checkbox and the acceptance rule."""
        *values, online, acceptance = values
        if acceptance not in self.rules:
            raise ValueError(f"acceptance must be one of {self.rules}, got {acceptance!r}")
        prompt = check_prompt(prompt)
        labels = {value: name for name, value in self.methods}
        if method not in labels:
            raise ValueError(f"drafter must be one of {list(labels)}, got {method!r}")
        sampling = {
            "temperature": check_number("Temperature", temperature, 0.0, 2.0),
            "max_new_tokens": check_number("New tokens", max_new_tokens, 1, MAX_NEW_TOKENS, integer=True),
        }
        seed = check_number("Seed", seed, 0, 2**31 - 1, integer=True)
        settings = {c.field: c.read(v) for c, v in zip(self.controls, values, strict=True) if self.reads(c, method)}
        if acceptance != "exact":
            settings["acceptance"] = acceptance

        COMPUTE.submit(self.learn_online, bool(online), self.pipe.online_drafter_for(method, settings)).result()
        ar, ar_latency = self.timed(prompt, "ar", seed, **sampling)
        rows = [stats_row("AR (target.generate)", ar.stats, ar_latency, ar_latency)]
        yield ar.texts[0], "", rows, f"AR: {int(ar.stats.new_tokens[0])} tokens in {ar_latency:.2f} s."
        method, cold = while_cold(self, method)
        fast, latency = self.timed(prompt, method, seed, **settings, **sampling)
        rows.append(stats_row(labels[method], fast.stats, latency, ar_latency))
        rate = fast.stats.acceptance_rate
        status = (f"Speculative: {int(fast.stats.new_tokens[0])} tokens in {fast.stats.target_forwards} target "
                  f"forwards, acceptance rate {'— (nothing drafted)' if rate is None else f'{rate:.2f}'}, "
                  f"**{ar_latency / latency:.2f}x** AR's speed.")
        if sampling["temperature"] == 0:
            status += " Greedy: " + ("identical to AR." if fast.texts == ar.texts else "**differs from AR**.")
        if acceptance != "exact" and fast.stats.excess_acceptance is not None:
            status += (f" Lossy ({acceptance}): {fast.stats.excess_acceptance:.3f} excess acceptance per position "
                       "(its distortion bound).")
        if self.pipe.online is not None:
            learner = "draft LM" if self.pipe.online_drafter == "model" else f"{self.pipe.online_drafter} head"
            status += (f" Online drafting: {self.pipe.online.requests} requests recorded, {self.pipe.online.updates} "
                       f"updates of the {learner} swapped in.")
        yield ar.texts[0], highlight_pieces(fast.pieces[0]), rows, status + cold

    def learn_online(self, on: bool, learner: str) -> None:
        """Turn the pipeline's online drafting of `learner` ("model", "eagle" or "hydra") on (OSD's defaults), if the
        pipeline has it, or off, on the compute thread; a learner of another drafter stops first (keeping what it
        learned)."""
        if self.pipe.online is not None and not (on and self.pipe.online_drafter == learner):
            self.pipe.disable_online_drafting()
        if on and self.pipe.online is None and self.pipe.online_source(learner) is not None:
            self.pipe.enable_online_drafting(learner)

    def timed(self, prompt: str, method: str, seed: int, **options):
        """(output, seconds) of one pipeline call on the compute thread."""
        def call():
            start = time.perf_counter()
            generator = torch.Generator(self.pipe.device).manual_seed(seed)
            out = self.pipe(prompt, decoding=method, generator=generator, **options)
            return out, time.perf_counter() - start

        return COMPUTE.submit(call).result()

    def warm_up_calls(self) -> list[tuple[str, Callable[[], object]]]:
        return [(method, partial(self.pipe, "def f(x):\n", decoding=method, max_new_tokens=8))
                for method in dict.fromkeys(("ar", *(m for _, m in self.methods)))]
