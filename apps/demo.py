"""The mmspec Gradio demo: see the acceleration live, side by side with plain AR decoding.

    mmspec demo                       # the embedded models on http://127.0.0.1:7860
    mmspec demo --port 8000 --only world

`build_demo(pipes)` builds the app from pipelines keyed by tab kind (see `mmspec.apps.tabs.TABS`), so tests and users
can pass their own; `serve()` (what `mmspec demo` runs) loads the embedded default models, serves at once and warms
them up in the background, with the progress on the page and in the log.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import gradio as gr

from mmspec.apps.tabs import TABS
from mmspec.apps.tabs.base import COMPUTE, LOG

TITLE = "mmspec: speculative decoding, live"
QUEUE_SIZE = 32  # waiting requests beyond this are refused with a "queue full" message
# Gradio's queue polls for work every 1 ms (progress every 10 ms) while idle: on 2 CPU cores that costs the compute
# thread ~20 % of its speed (median AR latency 3.81 s vs 3.17 s without a server, 3.25 s at 50 ms). 50 ms delays the
# start of a request by at most that.
QUEUE_POLL_S = 0.05
STATUS_POLL_S = 1.0  # how often a page open during warm-up asks whether it is over


class WarmUp:
    """The background warm-up of a demo's tabs: each tab's `warm_up_calls()`, one short call per method, submitted
    one at a time to the compute thread, so that no user request is timed with lazy initialisation (cost curves,
    LANTERN tables). Requests sent meanwhile are answered between its calls; a request for "auto" runs AR until the
    warm-up has timed auto (each tab's `cold` names what it has not run yet). `status()` says how far it is, and the
    log says each call as it starts."""

    def __init__(self, tabs: Mapping[str, object]):
        self.calls = [(kind, name, call) for kind, tab in tabs.items() for name, call in tab.warm_up_calls()]
        self.tabs, self.done, self.finished, self.error = dict(tabs), threading.Event(), 0, None
        for kind, tab in self.tabs.items():
            tab.cold = {name for called_by, name, _ in self.calls if called_by == kind}

    def start(self) -> WarmUp:
        threading.Thread(target=self._run, name="mmspec-warm-up", daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            for kind, name, call in self.calls:
                LOG.info("warm-up %d/%d: the %s tab's %s", self.finished + 1, len(self.calls), kind, name)
                COMPUTE.submit(call).result()
                self.tabs[kind].cold.discard(name)
                self.finished += 1
            LOG.info("warm-up done: ready")
        except Exception as error:  # the demo still serves; each request then reports its own failure
            self.error = error
            LOG.error("warm-up failed (%s: %s); requests run cold", type(error).__name__, error)
        finally:
            for tab in self.tabs.values():
                tab.cold = set()  # a failed warm-up leaves each method to warm on its first request
            self.done.set()

    def status(self) -> str:
        finished = self.finished  # read once: the warm-up thread moves it on
        if not self.done.is_set() and finished < len(self.calls):
            kind, name, _ = self.calls[finished]
            return (f"⏳ Warming up: {finished} of {len(self.calls)} calls done (now: the {kind} tab's {name}). "
                    "Requests are answered meanwhile, between its calls; `auto` runs AR until it has been timed.")
        if not self.done.is_set():
            return "⏳ Warming up: finishing."
        return "" if self.error is None else f"Warm-up failed ({self.error}); the first requests run cold."


def build_demo(pipes: Mapping[str, object], warm_up: bool = False) -> gr.Blocks:
    """A `gr.Blocks` app with one tab per pipeline: `pipes` maps a tab kind ("image", "text", "world", see
    `mmspec.apps.tabs.TABS`) to its pipeline. Events run one at a time per tab and further requests queue. `warm_up`
    starts one short call per method in the background (`WarmUp`); the page shows its status until it is over."""
    if not isinstance(pipes, Mapping) or not pipes:
        raise ValueError(f"pipes must be a non-empty mapping of tab kind to pipeline, kinds: {sorted(TABS)}")
    unknown = sorted(set(pipes) - set(TABS))
    if unknown:
        raise ValueError(f"no demo tab for {unknown}; tab kinds: {sorted(TABS)}")
    tabs = {kind: TABS[kind](pipe) for kind, pipe in pipes.items()}
    warming = WarmUp(tabs).start() if warm_up else None
    with gr.Blocks(title=TITLE, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(f"# {TITLE}")
        if warming is not None:
            status = gr.Markdown(warming.status, elem_id="warm-up-status")
            timer = gr.Timer(STATUS_POLL_S)
            timer.tick(lambda: (warming.status(), gr.Timer(active=not warming.done.is_set())), None,
                       [status, timer], api_visibility="private", show_progress="hidden")
        for kind, tab in tabs.items():
            with gr.Tab(tab.title, id=kind):
                tab.build()
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=1)
    relax_queue_polling(demo)
    return demo


def relax_queue_polling(demo: gr.Blocks, seconds: float = QUEUE_POLL_S) -> None:
    """Poll Gradio's queue every `seconds` while idle instead of every 1 ms (its private attributes; a test checks that
    the installed Gradio still has them)."""
    for name in ("sleep_when_free", "progress_update_sleep_when_free"):
        if hasattr(demo._queue, name):
            setattr(demo._queue, name, seconds)


def load_default_pipes(kinds=tuple(TABS), image_model: str | None = None, text_target: str | None = None,
                       text_draft: str | None = None, video_model: str | None = None, device="cpu",
                       dtype: str = "float32") -> dict[str, object]:
    """The embedded default pipelines (or the given zoo names / folders) for the requested tab kinds, on `device`
    with `dtype` weights."""
    import torch

    from mmspec.pipelines.auto import AutoARImagePipeline
    from mmspec.pipelines.text import SpeculativeTextPipeline
    from mmspec.pipelines.video import NextFramePipeline
    from mmspec.zoo import IMAGE_T2I, TEXT_DRAFT, TEXT_TARGET, VIDEO_WORLD

    weights = getattr(torch, dtype)
    loaders = {
        "image": lambda: AutoARImagePipeline.from_pretrained(image_model or IMAGE_T2I, dtype=weights),
        "text": lambda: SpeculativeTextPipeline.from_pretrained(text_target or TEXT_TARGET,
                                                                draft=text_draft or TEXT_DRAFT, dtype=weights),
        "world": lambda: NextFramePipeline.from_pretrained(video_model or VIDEO_WORLD, dtype=weights),
    }
    return {kind: loaders[kind]().to(device) for kind in kinds}


def serve(kinds=tuple(TABS), image_model: str | None = None, text_target: str | None = None,
          text_draft: str | None = None, video_model: str | None = None, host: str = "127.0.0.1",
          port: int = 7860, device="cpu", dtype: str = "float32", warm_up: bool = True) -> None:
    """Load the pipelines (on the compute thread), serve at once, warm up in the background (unless not
    `warm_up`: each method then initialises on its first request, and "auto" times its candidates then); blocks
    until stopped."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    LOG.info("loading %s", ", ".join(kinds))
    pipes = COMPUTE.submit(load_default_pipes, kinds, image_model, text_target, text_draft, video_model, device,
                           dtype).result()
    for pipe in pipes.values():
        if hasattr(pipe, "set_progress_bar_config"):
            pipe.set_progress_bar_config(disable=True)  # a bar per request would flood the server log
    build_demo(pipes, warm_up=warm_up).launch(server_name=host, server_port=port, show_error=True)
