"""The next-frame video decodings, registered by name (`mmspec.core.registry.decodings("video")`): `AR()`, one
frame per step, and `FrameSpeculation(...)`, several frames per pass under the current action. Every video component
runs the same way, as an interactive session:

    component.run(model, context, seeds, context_actions, num_inference_steps, context_noise) -> FrameSession
    session.step(actions) -> the next frame's latents; session.close() -> FrameStats

A component tells the session how many frames a block holds (`block_size`) and when their keys / values enter the
cache (`context`). The settings live here, without torch; running imports the engine (`mmspec.video.speculation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.component import DecodingComponent
from mmspec.core.registry import register_decoding
from mmspec.core.settings import setting

CONTEXT_MODES = ("eager", "pipelined")


@dataclass(frozen=True)
class VideoDecoding(DecodingComponent):
    """Base of the video decodings (see the module docstring)."""

    modality: ClassVar[str] = "video"

    @property
    def frames(self) -> int:
        """The most frames a block holds."""
        return 1

    @property
    def context(self) -> str:
        """When a block's keys / values enter the cache: "eager" (right after it) or "pipelined"."""
        return "eager"

    def block_size(self, kept: int, changed: int) -> int:
        """Frames in the next block, given how many ticks so far kept / changed the action."""
        return self.frames

    def run(self, model, context, seeds, context_actions=None, num_inference_steps: int = 4,
            context_noise: float = 0.1, graphs: str | None = None):
        """A `FrameSession` from the context latents [B, k, L_f, C] (see its docstring; graphs: "cuda", "tape" or
        None, how its Euler steps replay)."""
        from mmspec.video.speculation import FrameSession

        return FrameSession(model, context, seeds, context_actions, num_inference_steps, context_noise,
                            speculation=self, graphs=graphs)


@register_decoding
@dataclass(frozen=True)
class AR(VideoDecoding):
    """The non-speculative baseline: one frame per step, its context pass after it."""

    name: ClassVar[str] = "ar"


@register_decoding
@dataclass(frozen=True)
class FrameSpeculation(VideoDecoding):
    """How many frames a step speculates under the current action: the decoding component of next-frame video.

    frames: N >= 1, the frames denoised jointly per block (the most, when adaptive).
    adaptive: choose N per block from the observed action persistence: with q the estimated probability that the
        action is kept for another frame (Beta(1, 1) posterior over the ticks seen), N maximises the expected frames
        emitted, sum_{j < N} q^j, per unit of cost, 1 + frame_cost * (N - 1).
    frame_cost: the cost of one more frame in a pass relative to a one-frame pass (measure it with
        `python -m mmspec.eval.bench_video`; the default is this CPU's, where a pass is mostly fixed overhead).
    context: "eager" writes the block's keys / values into the cache right after it is denoised (NFD's design: the
        speculative frames sit in the cache and are rolled back on a mismatch); "pipelined" defers the context pass
        of the emitted frames into the next block's first forward (no extra forward; discarded frames never get one).
    """

    name: ClassVar[str] = "speculative"
    frames: int = setting(4, "frames denoised jointly per block (the most, when adaptive)", low=1)
    adaptive: bool = setting(False, "choose the block size from the observed action persistence")
    frame_cost: float = setting(0.2, "one more frame's cost in a pass relative to a one-frame pass", low=0)
    context: str = setting("eager", "'eager': write a block's keys / values right after it; 'pipelined': in the next "
                           "block's first forward", choices=CONTEXT_MODES)

    @property
    def lossless(self) -> bool:
        """One frame per block samples the sequential law; frames 2..N of a block sample the model's joint law."""
        return self.frames == 1

    @classmethod
    def strict(cls) -> FrameSpeculation:
        """One frame per step with the context pass pipelined into the next step: the sequential law, exactly."""
        return cls(frames=1, context="pipelined")

    def block_size(self, kept: int, changed: int) -> int:
        """N for the next block, given how many ticks so far kept / changed the action."""
        if not self.adaptive:
            return self.frames
        q = (kept + 1) / (kept + changed + 2)
        value = [sum(q**j for j in range(n)) / (1 + self.frame_cost * (n - 1)) for n in range(1, self.frames + 1)]
        return 1 + max(range(self.frames), key=value.__getitem__)
