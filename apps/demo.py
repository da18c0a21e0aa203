"""The mmspec Gradio demo: see the acceleration live, side by side with plain AR decoding.

    mmspec demo                       # the embedded models on http://127.0.0.1:7860
    mmspec demo --port 8000 --only world

`build_demo(pipes)` builds the app from pipelines keyed by tab kind (see `mmspec.apps.tabs.TABS`), so tests and users
can pass their own; `main()` loads the embedded default models, warms them up and launches.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

import gradio as gr

from mmspec.apps.tabs import TABS
from mmspec.apps.tabs.base import COMPUTE

TITLE = "mmspec: speculative decoding, live"
QUEUE_SIZE = 32  # waiting requests beyond this are refused with a "queue full" message
# Gradio's queue polls for work every 1 ms (progress every 10 ms) while idle: on 2 CPU cores that costs the compute
# thread ~20 % of its speed (median AR latency 3.81 s vs 3.17 s without a server, 3.25 s at 50 ms). 50 ms delays the
# start of a request by at most that.
QUEUE_POLL_S = 0.05


def build_demo(pipes: Mapping[str, object], warm_up: bool = False) -> gr.Blocks:
    """A `gr.Blocks` app with one tab per pipeline: `pipes` maps a tab kind ("image", "text", "world", see
    `mmspec.apps.tabs.TABS`) to its pipeline. Events run one at a time per tab and further requests queue. `warm_up`
    runs one short call per method first, so the first request is not timed with lazy initialisation."""
    if not isinstance(pipes, Mapping) or not pipes:
        raise ValueError(f"pipes must be a non-empty mapping of tab kind to pipeline, kinds: {sorted(TABS)}")
    unknown = sorted(set(pipes) - set(TABS))
    if unknown:
        raise ValueError(f"no demo tab for {unknown}; tab kinds: {sorted(TABS)}")
    tabs = [TABS[kind](pipe) for kind, pipe in pipes.items()]
    if warm_up:
        for tab in tabs:
            tab.warm_up()
    with gr.Blocks(title=TITLE, delete_cache=(3600, 3600)) as demo:
        gr.Markdown(f"# {TITLE}")
        for kind, tab in zip(pipes, tabs, strict=True):
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
                       text_draft: str | None = None, video_model: str | None = None) -> dict[str, object]:
    """The embedded default pipelines (or the given zoo names / folders) for the requested tab kinds."""
    import torch

    from mmspec.pipelines.auto import AutoARImagePipeline
    from mmspec.pipelines.text import SpeculativeTextPipeline
    from mmspec.pipelines.video import NextFramePipeline
    from mmspec.zoo import IMAGE_T2I, TEXT_DRAFT, TEXT_TARGET, VIDEO_WORLD

    loaders = {
        "image": lambda: AutoARImagePipeline.from_pretrained(image_model or IMAGE_T2I, dtype=torch.float32),
        "text": lambda: SpeculativeTextPipeline.from_pretrained(text_target or TEXT_TARGET,
                                                                draft=text_draft or TEXT_DRAFT),
        "world": lambda: NextFramePipeline.from_pretrained(video_model or VIDEO_WORLD, dtype=torch.float32),
    }
    return {kind: loaders[kind]() for kind in kinds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mmspec demo", description="Launch the Gradio demo.")
    parser.add_argument("--only", choices=tuple(TABS), default=None, help="show one tab only")
    parser.add_argument("--image-model", default=None, help="zoo name or saved pipeline folder (default: shapes)")
    parser.add_argument("--text-target", default=None, help="zoo name or transformers folder (default: pycode)")
    parser.add_argument("--text-draft", default=None, help="draft for the text target (default: the pycode draft)")
    parser.add_argument("--video-model", default=None, help="zoo name or saved NextFramePipeline folder (default: "
                        "nextframe_shapes)")
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0 = every interface)")
    parser.add_argument("--port", type=int, default=7860)
    args = parser.parse_args(argv)
    kinds = (args.only,) if args.only else tuple(TABS)
    pipes = COMPUTE.submit(load_default_pipes, kinds, args.image_model, args.text_target, args.text_draft,
                           args.video_model).result()
    build_demo(pipes, warm_up=True).launch(server_name=args.host, server_port=args.port, show_error=True)


if __name__ == "__main__":
    main()
