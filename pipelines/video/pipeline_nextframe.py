"""Action-conditioned video with a next-frame diffusion model: start frame(s) + actions -> frames, offline (`__call__`
with the whole action sequence) or interactively (`start_session(...).step(action) -> frame`). Both take
`decoding=`: `AR()` (frame by frame, the default) or `mmspec.video.FrameSpeculation(frames=N)` (frames speculated
under the current action and kept while it holds; see `mmspec.video.speculation` for what frames 2..N of a block
sample); the pipeline holds and saves its own (`pipe.decoding`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import PIL.Image
import torch
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils import BaseOutput

from mmspec.core.component import DecodingComponent
from mmspec.core.rng import Generators, check_generators, sample_seeds
from mmspec.models.mar import KLAutoencoder
from mmspec.models.nextframe import NextFrameTransformer
from mmspec.pipelines.base import MMSpecPipeline
from mmspec.video import methods  # noqa: F401  registers the video decodings
from mmspec.video.speculation import FrameSession, FrameStats

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


@dataclass
class NextFramePipelineOutput(BaseOutput):
    """frames: per video, the generated frames (not the start frames): a list of lists of PIL images, an array
    [B, T, H, W, 3] / tensor [B, T, 3, H, W] in [0, 1], or latents [B, T, L_f, C]; `export_to_video(frames[0], path)`
    writes video 0. stats: `FrameStats`, a SpecStats with frames computed / emitted / discarded, rollbacks, model
    forwards, timings and FPS."""

    frames: list[list[PIL.Image.Image]] | np.ndarray | torch.Tensor
    stats: FrameStats


class NextFrameSession:
    """An interactive rollout from `NextFramePipeline.start_session`: `step(action)` returns the next frame of every
    video (decoded at once), `close()` ends the session and returns its stats. Usable as a context manager."""

    def __init__(self, pipeline: NextFramePipeline, session: FrameSession, output_type: str):
        self.pipeline, self.session, self.output_type = pipeline, session, output_type

    @property
    def stats(self) -> FrameStats:
        return self.session.stats

    def step(self, action):
        """The next frame under `action` (an int for every video, or one per video): a PIL image (a list with
        several videos), an array [B, H, W, 3] / tensor [B, 3, H, W] in [0, 1], or latents [B, L_f, C]."""
        latents = self.session.step(action)[:, None]
        frames = self.pipeline.decode_latents(latents, self.output_type, self.stats)
        if self.output_type == "pil":
            return frames[0][0] if len(frames) == 1 else [video[0] for video in frames]
        return frames[:, 0]

    def close(self) -> FrameStats:
        return self.session.close()

    def __enter__(self) -> NextFrameSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NextFramePipeline(MMSpecPipeline):
    r"""Next-frame diffusion (NFD architecture) over per-frame autoencoder latents, with frame speculation.

    Components:
        transformer ([`NextFrameTransformer`]): the block-causal, action-conditioned flow model over frame latents.
        vae ([`KLAutoencoder`]): encodes the start frames and decodes generated latents (x its scaling factor).
        decoding (`AR()` or `FrameSpeculation(...)`, a name or a config dict; defaults to `AR()`): what calls and
            sessions decode with unless they say otherwise; saved with the pipeline, swappable (`pipe.decoding = ...`).

    On a CUDA device each session replays its blocks' Euler steps from CUDA graphs, one per (block size, frames
    held), captured in the session (`FrameSession(graphs="cuda")`); `disable_cuda_graphs()` turns that off.
    """

    model_cpu_offload_seq = "transformer->vae"
    modality = "video"
    _callback_tensor_inputs = ["latents"]

    def __init__(self, transformer: NextFrameTransformer, vae: KLAutoencoder,
                 decoding: DecodingComponent | str | dict = "ar"):
        super().__init__()
        self.register_modules(transformer=transformer, vae=vae)
        self.decoding = decoding
        self.image_processor = VaeImageProcessor(vae_scale_factor=vae.downsample_factor, do_normalize=True)

    @property
    def frame_size(self) -> int:
        return self.transformer.config.latent_size * self.vae.downsample_factor

    def _context_pixels(self, image) -> torch.Tensor:
        """image -> uint8 [B, k, H, W, 3]."""
        if isinstance(image, PIL.Image.Image):
            image = [image]
        if isinstance(image, list) and image and all(isinstance(i, PIL.Image.Image) for i in image):
            image = np.stack([np.asarray(i.convert("RGB")) for i in image])[:, None]
        if isinstance(image, np.ndarray):
            image = torch.from_numpy(np.array(image))  # a copy: arrays of PIL images are read-only
        if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8:
            raise TypeError("image must be a PIL image, a list of them (one per video), or a uint8 array / tensor "
                            f"[H, W, 3], [B, H, W, 3] or [B, k, H, W, 3]; got {type(image).__name__}"
                            + (f" of {image.dtype}" if isinstance(image, (torch.Tensor, np.ndarray)) else ""))
        while image.ndim < 5:
            image = image[None] if image.ndim == 3 else image[:, None]
        size = self.frame_size
        if image.shape[2:] != (size, size, 3):
            raise ValueError(f"image frames must be {size} x {size} RGB, got shape {tuple(image.shape)}")
        return image

    @torch.no_grad()
    def encode_frames(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 frames [B, k, H, W, 3] -> latents [B, k, L_f, C] (scaled posterior means, raster order)."""
        B, k = pixels.shape[:2]
        x = pixels.flatten(0, 1).permute(0, 3, 1, 2).to(self.device, self.vae.dtype) / 127.5 - 1
        mean, _ = self.vae.encode(x)
        tokens = (mean.float() * self.vae.config.scaling_factor).flatten(2).transpose(1, 2)
        return tokens.reshape(B, k, *tokens.shape[1:])

    @torch.no_grad()
    def decode_latents(self, latents: torch.Tensor, output_type: str = "pil", stats: FrameStats | None = None):
        """Frames of latents [B, T, L_f, C] as lists of PIL images / [B, T, H, W, 3] array / [B, T, 3, H, W] tensor in
        [0, 1] (latents returned as they are for "latent"); the time spent is added to `stats.timings["decode"]`."""
        if output_type == "latent":
            return latents
        start = time.perf_counter()
        B, T, L, C = latents.shape
        side = self.transformer.config.latent_size
        grid = latents.flatten(0, 1).transpose(1, 2).reshape(B * T, C, side, side) / self.vae.config.scaling_factor
        frames = self.image_processor.postprocess(self.vae.decode(grid.to(self.vae.dtype)).float(),
                                                  output_type=output_type)
        if output_type == "pil":
            frames = [frames[b * T : (b + 1) * T] for b in range(B)]
        else:
            frames = frames.reshape(B, T, *frames.shape[1:])
        if stats is not None:
            stats.add_time("decode", time.perf_counter() - start)
        return frames

    def _check_call(self, output_type, generator, batch_size):
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")
        check_generators(generator, batch_size)

    def _session(self, image, decoding, num_inference_steps, context_noise, generator, context_actions,
                 output_type, settings: dict) -> FrameSession:
        decoding = self.decoding_for_call(decoding, settings)
        pixels = self._context_pixels(image)
        self._check_call(output_type, generator, len(pixels))
        seeds = sample_seeds(generator, len(pixels))
        session = decoding.run(self.transformer, self.encode_frames(pixels), seeds, context_actions,
                               num_inference_steps, context_noise, "cuda" if self.replays_graphs() else None)
        session.stats.describe(decoding)
        return session

    def start_session(self, image, decoding: DecodingComponent | str | dict | None = None,
                      num_inference_steps: int = 4, context_noise: float = 0.1, generator: Generators = None,
                      context_actions=None, output_type: str = "pil", **decoding_settings) -> NextFrameSession:
        """An interactive session from start frame(s) `image` (see `__call__`); `session.step(action)` -> frame."""
        return NextFrameSession(self, self._session(image, decoding, num_inference_steps, context_noise, generator,
                                                    context_actions, output_type, decoding_settings), output_type)

    @torch.no_grad()
    def __call__(self, image, actions, decoding: DecodingComponent | str | dict | None = None,
                 num_inference_steps: int = 4,
                 context_noise: float = 0.1, generator: Generators = None, context_actions=None,
                 output_type: str = "pil", return_dict: bool = True,
                 callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
                 callback_on_step_end_tensor_inputs: list[str] | None = None, **decoding_settings):
        r"""Roll the model out from start frame(s) under a sequence of actions, one frame per action.

        Args:
            image: the start: a PIL image, a list of them (one per video), or a uint8 array / tensor [H, W, 3],
                [B, H, W, 3] or [B, k, H, W, 3] of k context frames (1 <= k <= the model's attention window).
            actions: per frame, the action that leads to it: a list of ints (every video), or [B, T] ints.
            decoding (component, name or config dict, *optional*): defaults to the pipeline's `decoding` (`AR()`,
                frame by frame, unless set or saved otherwise); `FrameSpeculation(frames=N)` speculates N frames per
                pass while the action holds (`adaptive=True` picks N from the observed action persistence);
                `FrameSpeculation.strict()` is sequential generation exactly. A name plus the settings as keyword
                arguments is the same call (`decoding="speculative", frames=2`).
            **decoding_settings: the named decoding's settings (`FrameSpeculation`'s: frames, adaptive, frame_cost,
                context), or without a name the pipeline's own component's.
            num_inference_steps (`int`, defaults to 4): Euler steps of the flow ODE per frame.
            context_noise (`float`, defaults to 0.1): flow time at which emitted frames enter the cache (against drift).
            generator (`torch.Generator` or list): one per video makes each video depend on its own seed only.
            context_actions: [B, k] ints, the actions that led to the context frames (default "stay", 0).
            output_type (`str`): `"pil"`, `"np"`, `"pt"` or `"latent"`.
            callback_on_step_end (`Callable`, *optional*): called after every emitted frame as
                `callback_on_step_end(pipe, step, n_frames, callback_kwargs)`; `callback_kwargs` holds the tensors named
                in `callback_on_step_end_tensor_inputs` (`"latents"`: [B, n_frames, L_f, C], the frames so far;
                read-only: they sit in the model's cache). Set `pipe._interrupt = True` to stop after this frame.
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): see above; defaults to `["latents"]`.

        The actions are fed one at a time, as an interactive user would: speculation never looks ahead.
        """
        names = self.callback_tensor_inputs(callback_on_step_end, callback_on_step_end_tensor_inputs)  # "latents"
        actions = torch.as_tensor(actions)
        session = self._session(image, decoding, num_inference_steps, context_noise, generator, context_actions,
                                output_type, decoding_settings)
        B = len(session.seeds)
        if actions.ndim == 1:
            actions = actions[None].expand(B, -1)
        if actions.ndim != 2 or actions.shape[0] != B or actions.shape[1] < 1:
            raise ValueError(f"actions must be a non-empty list of ints or [{B}, T] ints, got shape "
                             f"{tuple(actions.shape)}")
        latents = self.run_decoding(session.rollout(actions), callback_on_step_end, names,
                                    total=actions.shape[1]).latents
        stats = session.close()
        video = self.decode_latents(latents, output_type, stats)
        self.maybe_free_model_hooks()
        if not return_dict:
            return video, stats
        return NextFramePipelineOutput(frames=video, stats=stats)
