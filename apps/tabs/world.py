"""The world tab: play the next-frame world model with the arrow buttons. Each action steps two sessions from the same
start frame and seed, one generating frame by frame and one speculating frames under the current action; both frames
are shown with the running frame accounting (computed, discarded, rollbacks) and the FPS of each."""

from __future__ import annotations

import time
from collections.abc import Callable

import gradio as gr
import numpy as np
import PIL.Image
import torch

from mmspec.apps.tabs.base import COMPUTE, StreamedImages, check_number, shows_errors
from mmspec.apps.tabs.settings import decoding_controls
from mmspec.core.component import component_from
from mmspec.video import FrameSpeculation
from mmspec.zoo.video_world import ACTIONS, episode, render_frame

BUTTONS = (("left", "←"), ("up", "↑"), ("down", "↓"), ("right", "→"), ("stay", "stay"))
WORLD_HEADERS = ["method", "frames emitted", "computed", "discarded", "rollbacks", "model forwards / frame", "FPS",
                 "speedup"]
SHOWN_SIZE = 256
MAX_FRAMES = 8  # frames speculated per pass the tab allows: a larger block makes a single press slow


class WorldSessions:
    """A user's pair of sessions and the wall-clock seconds each spent stepping."""

    def __init__(self, pipe, start: np.ndarray, speculation: FrameSpeculation, seed: int, steps: int):
        def session(spec):
            return pipe.start_session(start, decoding=spec, num_inference_steps=steps,
                                      generator=torch.Generator(pipe.device).manual_seed(seed))

        self.sessions = {"sequential": session(None), "speculative": session(speculation)}
        self.seconds = dict.fromkeys(self.sessions, 0.0)
        self.frames = {name: PIL.Image.fromarray(start) for name in self.sessions}

    def step(self, action: int) -> None:
        for name, session in self.sessions.items():
            began = time.perf_counter()
            self.frames[name] = session.step(action)
            self.seconds[name] += time.perf_counter() - began

    def rows(self) -> list[list[str]]:
        fps = {name: s.stats.frames_emitted / self.seconds[name] if self.seconds[name] else 0.0
               for name, s in self.sessions.items()}
        rows = []
        for name, session in self.sessions.items():
            stats, emitted = session.stats, max(1, session.stats.frames_emitted)
            speedup = fps[name] / fps["sequential"] if fps["sequential"] else 0.0
            rows.append([name, str(stats.frames_emitted), str(stats.frames_computed), str(stats.frames_discarded),
                         str(stats.rollbacks), f"{stats.target_forwards / emitted:.2f}", f"{fps[name]:.1f}",
                         f"{speedup:.2f}"])
        return rows


class WorldTab:
    """Interactive rollouts of a `NextFramePipeline`, sequential next to speculative."""

    title = "World"

    def __init__(self, pipe):
        self.pipe = pipe
        self.images = StreamedImages()
        self.cold: set[str] = set()  # what the warm-up has not run yet (none without one)
        self.controls = decoding_controls("video")  # frame speculation's settings (frames, adaptive, ...)

    def build(self) -> None:
        gr.Markdown(
            "Steer the player with the arrows. Every press generates the next frame twice from the same start and "
            "seed: **sequentially** (one frame per pass) and with **frame speculation** (N frames per pass under the "
            "current action; while you repeat it they are shown at no cost, a new action discards them and rolls "
            "the cache back). The first frame of each speculated block is the sequential frame; the later ones come "
            "from the model's joint law, so the two rollouts drift apart."
        )
        with gr.Row():
            start_episode = gr.Number(label="Start: held-out episode", value=0, precision=0)
            steps = gr.Slider(1, 8, value=4, step=1, label="Euler steps per frame")
            seed = gr.Number(label="Seed", value=0, precision=0)
            start = gr.Button("Start", variant="primary", elem_id="world-start")
        with gr.Row():
            settings = [control.build(visible=True) for control in self.controls]
        with gr.Row():
            buttons = {name: gr.Button(label, elem_id=f"world-{name}") for name, label in BUTTONS}
        with gr.Row():
            sequential = gr.Image(label="Sequential", type="filepath", interactive=False, elem_id="world-sequential")
            speculative = gr.Image(label="Speculative", type="filepath", interactive=False,
                                   elem_id="world-speculative")
        stats = gr.Dataframe(headers=WORLD_HEADERS, datatype="str", interactive=False, label="Stats",
                             elem_id="world-stats")
        status = gr.Markdown(elem_id="world-status")
        state = gr.State(None)
        outputs = [state, sequential, speculative, stats, status]
        start.click(self.start, [start_episode, steps, seed, *settings], outputs, api_name="start_world",
                    concurrency_limit=1)
        for name, button in buttons.items():
            button.click(self.stepper(name), [state], outputs, api_name=f"world_{name}", concurrency_limit=1)

    def shown(self, frame: PIL.Image.Image) -> str:
        return self.images.save(frame.resize((SHOWN_SIZE, SHOWN_SIZE), PIL.Image.NEAREST))

    def outputs(self, world: WorldSessions, status: str):
        self.images.next_yield()  # Gradio has copied the previous call's files
        return (world, self.shown(world.frames["sequential"]), self.shown(world.frames["speculative"]),
                world.rows(), status)

    def open_world(self, index: int, speculation: FrameSpeculation, seed: int, steps: int) -> WorldSessions:
        """Both sessions from the first frame of held-out episode `index`, built on the compute thread."""
        world = episode(index, "heldout")
        start = render_frame(world, world.start)
        return COMPUTE.submit(WorldSessions, self.pipe, start, speculation, seed, steps).result()

    @shows_errors
    def start(self, episode_index, steps, seed, *values):
        """Open both sessions; values: frame speculation's controls (`self.controls`), in their order."""
        index = check_number("Start: held-out episode", episode_index, 0, 10**6, integer=True)
        steps = check_number("Euler steps per frame", steps, 1, 8, integer=True)
        seed = check_number("Seed", seed, 0, 2**31 - 1, integer=True)
        settings = {c.field: c.read(v) for c, v in zip(self.controls, values, strict=True)}
        check_number("speculative frames", settings["frames"], 1, MAX_FRAMES, integer=True)
        speculation = component_from(FrameSpeculation.name, "video", **settings)
        return self.outputs(self.open_world(index, speculation, seed, steps), f"Episode {index}: press an arrow.")

    def stepper(self, name: str):
        action = ACTIONS.index(name)

        @shows_errors
        def step(world: WorldSessions | None):
            if world is None:
                raise ValueError("Press Start first: no world is running.")
            spec = world.sessions["speculative"].stats
            before = (spec.frames_computed, spec.rollbacks)
            COMPUTE.submit(world.step, action).result()
            if spec.rollbacks > before[1]:
                what = "the action changed: speculated frames discarded, cache rolled back, a new block generated"
            elif spec.frames_computed > before[0]:
                what = f"a new block of {spec.block_sizes[-1]} frame(s) generated"
            else:
                what = "a speculated frame shown, no model call"
            return self.outputs(world, f"Frame {spec.frames_emitted} ({name}): {what}.")

        return step

    def warm_up_calls(self) -> list[tuple[str, Callable[[], object]]]:
        def rollout():
            world = episode(0, "heldout")
            sessions = WorldSessions(self.pipe, render_frame(world, world.start),
                                     FrameSpeculation(frames=4, context="pipelined"), 0, 4)
            for action in (4, 4, 1):
                sessions.step(action)

        return [("speculation", rollout)]
