"""Frame speculation for action-conditioned next-frame diffusion (NFD, arXiv 2506.01380, "speculative sampling").

A `FrameSession` rolls a next-frame model forward one action at a time. Without speculation each frame costs
`num_inference_steps` Euler steps of the flow ODE over that frame (attending to the cached context) plus one context
pass that writes its keys / values, at the context noise level, into the cache. With `FrameSpeculation(frames=N)` a step
denoises frames k .. k + N - 1 **jointly** (one batched forward per Euler step, block-causal attention) under the
current action, as if the action will persist. The following steps emit those frames at no cost while the incoming
action equals the assumed one; on a change the speculated frames are discarded, the cache rolls back to the last
emitted frame (O(1), `FrameKVCache.rollback`) and the frame is generated under the true action.

Semantics (reference C, "Semantics warning"): the first frame of a block never attends to the later ones, so it is
the sequential frame; frames 2..N are denoised while their predecessors are still noisy, so they are samples of the
model's diffusion-forcing joint law, *not* of sequential next-frame sampling. `FrameSpeculation.strict()` (N = 1)
equals sequential generation; it computes the context pass of the emitted frame inside the next frame's first Euler
step (`context="pipelined"`), which saves a forward per frame and changes no output.

With `graphs` ("cuda" on a GPU) the Euler steps of a block that only read the cache (all of them, or all but the
first when it carries the pipelined context pass) replay as one graph per (block size, frames held): a
`mmspec.core.runtime.capture.CallGraphs` of the session, whose graphs read the session's cache buffers in place. "tape"
replays the same path on a CPU (`TapeGraph`), which the tests compare with the eager steps.

Noise is keyed by (seed, absolute frame index, purpose): the initial noise of a frame and its context noise are pure
functions of those, so discarded frames never shift the stream, and a regenerated frame gets the noise it would have
had. Shapes: B batch, L_f tokens per frame, C latent channels.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from mmspec.core.progress import Halt, Progress
from mmspec.core.rng import keyed_normal
from mmspec.core.runtime.capture import CallGraphs
from mmspec.core.stats import DecodingStats
from mmspec.video.protocol import NextFrameModel

INITIAL_NOISE, CONTEXT_NOISE = 0, 1  # keys of the two draws of a frame


@dataclass
class FrameStats(DecodingStats):
    """`DecodingStats` of a session (target_forwards = model calls, timings["model"] / ["decode"] = seconds in the
    model and, added by a pipeline, in the autoencoder; a frame is video's token) adds its frame accounting: once
    closed, frames_emitted = frames_computed - frames_discarded; rollbacks: speculated blocks dropped because the
    action changed; blocks / block_sizes: the speculated blocks and their frame counts."""

    frames_computed: int = 0
    frames_emitted: int = 0
    frames_discarded: int = 0
    rollbacks: int = 0
    blocks: int = 0
    block_sizes: list[int] = field(default_factory=list)

    def add_time(self, phase: str, seconds: float) -> None:
        self.timings[phase] = self.timings.get(phase, 0.0) + seconds

    @property
    def tokens_per_target_forward(self) -> float:
        """Frames emitted per model call."""
        return self.frames_emitted / max(1, self.target_forwards)

    @property
    def fps(self) -> float:
        """Emitted frames per second of model and decoder time."""
        total = self.timings.get("model", 0.0) + self.timings.get("decode", 0.0)
        return self.frames_emitted / total if total else 0.0

    def as_dict(self) -> dict:
        d = super().as_dict()
        timings = d.pop("timings_s")
        return {**d, "frames_computed": self.frames_computed, "frames_emitted": self.frames_emitted,
                "frames_discarded": self.frames_discarded, "rollbacks": self.rollbacks, "blocks": self.blocks,
                "fps": round(self.fps, 2), "timings_s": timings}


def frame_noise(seeds: torch.Tensor, frames: torch.Tensor, purpose: int, tokens: int, channels: int) -> torch.Tensor:
    """Keyed N(0, 1) [B, n, tokens, channels] for rows with `seeds` [B] and absolute frame indices `frames` [n]."""
    return keyed_normal(seeds[:, None, None], frames[None, :, None], purpose, torch.arange(tokens)[None, None],
                        dim=channels)


@dataclass(kw_only=True)
class FrameProgress(Progress):
    """A rollout's progress (`mmspec.core.progress`) after a frame: step, its index; n_done, the frames emitted;
    frames, their latents ([B, L_f, C] each), and `latents` [B, n_done, L_f, C] (read-only: they sit in the cache)."""

    frames: tuple[torch.Tensor, ...]

    @property
    def latents(self) -> torch.Tensor:
        return torch.stack(self.frames, 1)


class FrameSession:
    """An interactive rollout: `step(actions)` returns the next frame's latents; `close()` ends it.

    model: a `NextFrameModel` (e.g. `mmspec.models.nextframe.NextFrameTransformer`). context: latents [B, k, L_f, C] of
    the first k frames (1 <= k <= the model's attention window), frames 0 .. k - 1. context_actions: [B, k] long, the
    action that led to each context frame (None: "stay", 0). seeds: [B] long, one per row (keys every draw).
    num_inference_steps: Euler steps of the flow ODE per frame.
    context_noise: the flow time at which emitted frames enter the cache (NFD's context noise against drift).
    speculation: the video decoding (`mmspec.video.methods`): `AR()` or `FrameSpeculation(...)`.
    graphs: "cuda" (the model on a CUDA device), "tape" or None (eager): how a block's Euler steps replay.

    Rows of a batch share the cache, so a block is kept only while every row's action matches its assumed one.
    """

    def __init__(self, model: NextFrameModel, context: torch.Tensor, seeds: torch.Tensor,
                 context_actions: torch.Tensor | None = None, num_inference_steps: int = 4, context_noise: float = 0.1,
                 *, speculation, graphs: str | None = None):
        config = model.config
        if context.ndim != 4 or context.shape[2:] != (model.tokens_per_frame, config.latent_channels):
            raise ValueError(f"context must be latents [B, k, {model.tokens_per_frame}, {config.latent_channels}], "
                             f"got {tuple(context.shape)}")
        B, k = context.shape[:2]
        if not 1 <= k <= config.attention_window:
            raise ValueError(f"context holds {k} frames; it must hold 1 to {config.attention_window} (the model's "
                             f"attention window)")
        if isinstance(num_inference_steps, bool) or not isinstance(num_inference_steps, int) or num_inference_steps < 1:
            raise ValueError(f"num_inference_steps must be an int >= 1, got {num_inference_steps!r}")
        if not 0 <= context_noise < 1:
            raise ValueError(f"context_noise must be in [0, 1), got {context_noise!r}")
        seeds = torch.as_tensor(seeds, dtype=torch.long).reshape(-1)
        if len(seeds) != B:
            raise ValueError(f"seeds holds {len(seeds)} values for a batch of {B}")
        if graphs not in (None, "cuda", "tape"):
            raise ValueError(f"graphs must be 'cuda', 'tape' or None, got {graphs!r}")
        if graphs == "cuda" and torch.device(model.device).type != "cuda":
            raise ValueError(f"graphs='cuda' needs the model on a CUDA device, it is on {model.device}")
        self.graphs = None if graphs is None else CallGraphs(cuda=graphs == "cuda")
        self.model, self.seeds, self.context_noise = model, seeds, context_noise
        self.num_inference_steps = num_inference_steps
        self.speculation = speculation
        self.stats = FrameStats()
        self.actions_used: list[torch.Tensor] = []  # [B] per emitted frame: the action it was generated under
        self.cache = model.new_cache(B, max_speculative=max(k, self.speculation.frames))
        self.closed = False
        self._kept = self._changed = 0
        self._last_action: tuple[int, ...] | None = None
        # speculated frames not yet emitted: latents [B, m, L_f, C] and the actions they were generated under [B, m]
        self._queue = context.new_zeros(B, 0, *context.shape[2:])
        self._queue_actions = torch.zeros(B, 0, dtype=torch.long)
        # emitted frames whose context pass is deferred into the next block ("pipelined"): latents, actions
        self._pending = (context.new_zeros(B, 0, *context.shape[2:]), torch.zeros(B, 0, dtype=torch.long))
        self.frame = k  # absolute index of the next frame to emit
        if context_actions is None:
            context_actions = torch.zeros(B, k, dtype=torch.long)
        else:
            self._check_actions(context_actions, "context_actions")
        self._run(self._write_context, context.float(), torch.as_tensor(context_actions, dtype=torch.long), 0)

    @property
    def num_actions(self) -> int:
        return self.model.config.num_actions

    def _check_actions(self, actions, name: str) -> list:
        """The actions' values as Python ints (nested as given; a tensor is read once), checked."""
        values = actions.tolist() if isinstance(actions, torch.Tensor) else actions
        flat = list(_flatten(values))
        wrong = [a for a in flat if isinstance(a, bool) or not isinstance(a, int)]
        if wrong:
            kind = actions.dtype if isinstance(actions, torch.Tensor) else type(wrong[0]).__name__
            raise TypeError(f"{name} must be integers, got {kind}")
        if any(not 0 <= a < self.num_actions for a in flat):
            raise ValueError(f"{name} must be in [0, {self.num_actions}) (the model's action space), got "
                             f"{sorted(set(flat))}")
        return values

    def _run(self, fn, *args):
        start = time.perf_counter()
        with torch.no_grad():
            out = fn(*args)
        self.stats.add_time("model", time.perf_counter() - start)
        return out

    def step(self, actions) -> torch.Tensor:
        """The next frame's latents [B, L_f, C] under `actions` (an int for every row, or [B] long)."""
        if self.closed:
            raise ValueError("this session is closed; start a new one")
        B = len(self.seeds)
        values = self._check_actions(actions, "actions")
        values = tuple(values) if isinstance(values, list) else (values,)
        if len(values) not in (1, B):
            raise ValueError(f"actions must be an int or one per row ({B}), got {len(values)}")
        return self._run(self._step, values * B if len(values) == 1 else values)

    def rollout(self, actions: torch.Tensor) -> Iterator[FrameProgress]:
        """One `step` per column of `actions` [B, T] long, as a run (`mmspec.core.progress`): a `FrameProgress`
        after every frame; `progress.stop()` ends it after that frame. The session stays open."""
        frames, halt = [], Halt()
        for step, action in enumerate(actions.T):
            frames.append(self.step(action))
            yield FrameProgress(step=step, n_done=len(frames), frames=tuple(frames), halt=halt)
            if halt.stopped:
                return

    def close(self) -> FrameStats:
        """End the session; speculated frames still queued are discarded (so emitted = computed - discarded)."""
        if not self.closed:
            self.stats.frames_discarded += self._queue.shape[1]
            self._queue, self._queue_actions = self._queue[:, :0], self._queue_actions[:, :0]
            self.closed = True
        return self.stats

    def _step(self, values: tuple[int, ...]) -> torch.Tensor:
        """The next frame under one action per row (`values`, checked Python ints: the host decides with them)."""
        if self._last_action is not None:
            same = values == self._last_action
            self._kept, self._changed = self._kept + same, self._changed + (not same)
        self._last_action = values
        actions = torch.tensor(values, dtype=torch.long)
        if self._queue.shape[1] and not self._matches(actions):
            self.stats.frames_discarded += self._queue.shape[1]
            self.stats.rollbacks += 1
            self._queue, self._queue_actions = self._queue[:, :0], self._queue_actions[:, :0]
            self.cache.rollback()
        if not self._queue.shape[1]:
            self._speculate(actions, self.speculation.block_size(self._kept, self._changed))
        frame, self._queue = self._queue[:, 0], self._queue[:, 1:]
        self.actions_used.append(self._queue_actions[:, 0])
        self._queue_actions = self._queue_actions[:, 1:]
        self.stats.frames_emitted += 1
        if self.speculation.context == "eager":
            self.cache.commit(1)
        else:
            pending, pending_actions = self._pending
            self._pending = (torch.cat([pending, frame[:, None]], 1), torch.cat([pending_actions, actions[:, None]], 1))
        self.frame += 1
        return frame

    def _matches(self, actions: torch.Tensor) -> bool:
        """Whether the next queued frame was generated under `actions` in every row."""
        return torch.equal(actions, self._queue_actions[:, 0])

    def _forward(self, latents: torch.Tensor, times: float | list[float], actions: torch.Tensor,
                 first_frame: int | torch.Tensor):
        """The model on latents [B, n, L_f, C] under actions [B, n] (both on the model's device) after the cached
        frames -> (velocity, kv); times: the flow time of every frame, or one per frame. Counted by the caller."""
        B, n = actions.shape
        device, dtype = latents.device, self.model.dtype
        timesteps = torch.tensor(times, device=device).expand(B, n) if isinstance(times, list) else torch.full(
            (B, n), times, device=device)
        velocity, kv = self.model(latents.to(dtype), timesteps.to(dtype), actions, first_frame, self.cache,
                                  checked=True)
        return velocity.float(), kv

    def _euler(self, x: torch.Tensor, actions: torch.Tensor, first_frame: int | torch.Tensor,
               start: int) -> torch.Tensor:
        """Euler steps start .. S - 1 of the flow ODE over frames x [B, n, L_f, C] (first_frame ..) under actions
        [B, n], reading the cache only: what a graph holds."""
        for step in range(start, self.num_inference_steps):
            t, t_next = 1 - step / self.num_inference_steps, 1 - (step + 1) / self.num_inference_steps
            x = x + (t_next - t) * self._forward(x, t, actions, first_frame)[0]
        return x

    def _denoise(self, x: torch.Tensor, actions: torch.Tensor, first_frame: int, start: int) -> torch.Tensor:
        """`_euler` eagerly, or replayed from the session's graphs (first_frame then enters as a device tensor, so
        one graph serves every block of its shape)."""
        self.stats.target_forwards += self.num_inference_steps - start
        if self.graphs is None or start == self.num_inference_steps:
            return self._euler(x, actions, first_frame, start)
        first = torch.tensor(first_frame, device=x.device)
        key = (tuple(x.shape), start, self.cache.num_frames)
        return self.graphs(key, lambda x, actions, first: self._euler(x, actions, first, start), x, actions, first)

    def _to_context(self, latents: torch.Tensor, first_frame: int) -> torch.Tensor:
        """Emitted latents [B, n, L_f, C] at the context noise level, with their keyed context noise."""
        frames = torch.arange(first_frame, first_frame + latents.shape[1])
        noise = frame_noise(self.seeds, frames, CONTEXT_NOISE, *latents.shape[2:]).to(latents.device)
        return (1 - self.context_noise) * latents + self.context_noise * noise

    def _append(self, kv, commit: int) -> None:
        self.cache.append([k for k, _ in kv], [v for _, v in kv])
        self.cache.commit(commit)

    def _write_context(self, latents: torch.Tensor, actions: torch.Tensor, first_frame: int) -> None:
        """Context pass: the keys / values of emitted frames (committed at once)."""
        self.stats.target_forwards += 1
        _, kv = self._forward(self._to_context(latents, first_frame), self.context_noise,
                              actions.to(self.model.device), first_frame)
        self._append(kv, latents.shape[1])

    def _speculate(self, actions: torch.Tensor, n: int) -> None:
        """Denoise frames self.frame .. + n - 1 jointly under `actions` [B] and queue them."""
        B, first = len(self.seeds), self.frame
        L_f, C = self.model.tokens_per_frame, self.model.config.latent_channels
        device = self.model.device
        block_actions = actions[:, None].expand(B, n)
        on_device = block_actions.to(device)
        x = frame_noise(self.seeds, torch.arange(first, first + n), INITIAL_NOISE, L_f, C).to(device)
        pending, pending_actions = self._pending
        p, start = pending.shape[1], 0
        if p:  # pipelined: the pending frames' context pass rides on the first Euler step
            t_next = 1 - 1 / self.num_inference_steps
            self.stats.target_forwards += 1
            velocity, kv = self._forward(torch.cat([self._to_context(pending, first - p), x], 1),
                                         [self.context_noise] * p + [1.0] * n,
                                         torch.cat([pending_actions.to(device), on_device], 1), first - p)
            held = p * self.cache.tokens_per_frame
            self._append([(k[:, :, :held], v[:, :, :held]) for k, v in kv], p)
            x = x + (t_next - 1) * velocity[:, p:]
            self._pending = (pending[:, :0], pending_actions[:, :0])
            start = 1
        x = self._denoise(x, on_device, first, start)
        if self.speculation.context == "eager":  # speculative keys / values: committed as emitted, else rolled back
            self.stats.target_forwards += 1
            _, kv = self._forward(self._to_context(x, first), self.context_noise, on_device, first)
            self._append(kv, commit=0)
        self._queue, self._queue_actions = x, block_actions.clone()
        self.stats.blocks += 1
        self.stats.frames_computed += n
        self.stats.block_sizes.append(n)


def _flatten(values):
    if isinstance(values, (list, tuple)):
        for value in values:
            yield from _flatten(value)
    else:
        yield values
