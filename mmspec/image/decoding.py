"""Decoding methods for discrete image AR models, behind one interface so pipelines take `decoding="name"`.

A decoding is called with a model adapter, the condition, the sampling settings and the caller's generator, and yields
a `DecodeStep` after every target forward, so a pipeline can drive progress bars, callbacks and interruption. This
module holds the plain AR baseline; `mmspec.image.registry` names every method.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from mmspec.core.component import DecodingComponent
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.rng import Generators, check_generators, sample
from mmspec.core.stats import PhaseTimer, SpecStats
from mmspec.core.verify import VerifyResult
from mmspec.image.protocol import DiscreteImageModel, ImageLogits

PAD_ID = -1  # not-yet-generated positions of DecodeStep.tokens


@dataclass(frozen=True)
class DecodeStep:
    """Progress after one target forward.

    step: 0-based iteration index; tokens: [B, N] long, a snapshot of the committed image tokens, PAD_ID where not
    generated yet;
    n_committed: [B] long, committed tokens per row (tokens[b, :n_committed[b]] are final); min_committed: the
    smallest of them as a host int (for progress bars, without a device sync).
    """

    step: int
    tokens: torch.Tensor
    n_committed: torch.Tensor
    min_committed: int


class ImageDecoding(Protocol):
    """A decoding method. `lossless` says whether its output law equals AR sampling's."""

    name: str
    lossless: bool

    def __call__(
        self, model: DiscreteImageModel, condition: Any, sampling: SamplingConfig, generator: Generators,
        stats: SpecStats,
    ) -> Iterator[DecodeStep]: ...


def image_span(model: DiscreteImageModel) -> tuple[int, int, torch.Tensor | None]:
    """(N image tokens, V image-token ids, forced tokens [N] long or None) of a model adapter."""
    grid, V = getattr(model, "grid", None), getattr(model, "vocab_size", None)
    if not (isinstance(grid, tuple) and len(grid) == 2 and all(isinstance(x, int) and x > 0 for x in grid)):
        raise TypeError(
            f"model must be an image adapter exposing its image span as `grid` = (h, w) positive ints, got "
            f"{type(model).__name__} with grid={grid!r}"
        )
    if not (isinstance(V, int) and V > 0):
        raise TypeError(f"model must expose `vocab_size` (image-token ids 0..V-1) as a positive int, got {V!r}")
    N = grid[0] * grid[1]
    forced = getattr(model, "forced_tokens", None)
    if forced is not None and (forced.shape != (N,) or forced.max() >= V):
        raise ValueError(
            f"model.forced_tokens must be [{N}] long with ids < {V} (-1 = free), got shape {tuple(forced.shape)}"
        )
    return N, V, forced


def forced_at(forced: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The forced token at each of `positions` [B, W] (absolute; >= N is scratch past the image), -1 where free."""
    N = forced.shape[0]
    return torch.where(positions < N, forced[positions.clamp(max=N - 1)], -1)


def probs_of(
    logits: ImageLogits, sampling: SamplingConfig, positions: torch.Tensor, forced: torch.Tensor | None = None
) -> torch.Tensor:
    """Processed probabilities [B, W, V] of (CFG-paired) logits [B, W, V] that predict the image tokens at
    `positions` [B, W]; where `forced` [N] names a token the law is that token's one-hot (positions >= N are
    scratch and left as they are)."""
    p = process_logits(logits.cond, sampling, logits.uncond)
    if forced is None:
        return p
    token = forced_at(forced, positions)  # [B, W]
    one_hot = torch.nn.functional.one_hot(token.clamp(min=0), p.shape[-1]).to(p.dtype)
    return torch.where((token >= 0)[..., None], one_hot, p)


@dataclass(frozen=True)
class Opening:
    """What every image decoding starts from: the image span (N tokens, V ids, forced tokens [N] or None), the
    model's state after the condition prefill, image token 0 of each row ([B] long, drawn from the prefill's
    law first_law [B, V] with the caller's generator), the dtype of the processed laws (float32, or float64 for a
    float64 model), the phase timer of `stats` and the start time."""

    N: int
    V: int
    forced: torch.Tensor | None
    state: Any
    first_token: torch.Tensor
    first_law: torch.Tensor
    dtype: torch.dtype
    timer: PhaseTimer
    started: float


def open_decoding(model: DiscreteImageModel, condition: Any, sampling: SamplingConfig, generator: Generators,
                  stats: SpecStats, max_window: int = 1) -> Opening:
    """Check the span, prefill the condition (one target forward, counted) and draw image token 0."""
    started = time.perf_counter()
    timer = PhaseTimer(stats.timings)
    N, V, forced = image_span(model)
    with timer("target"):
        state, logits = model.prefill(condition, cfg=sampling.guidance_scale != 1.0, max_window=max_window)
    stats.target_forwards += 1
    stats.prefill_forwards += 1
    B, device = logits.cond.shape[0], logits.cond.device
    check_generators(generator, B)
    with timer("sample"):
        p0 = probs_of(logits.at(slice(-1, None)), sampling, torch.zeros(B, 1, dtype=torch.long, device=device), forced)
        first_token = sample(p0[:, 0], generator)
    return Opening(N, V, forced, state, first_token, p0[:, 0], p0.dtype, timer, started)


class Commits:
    """Per-row progress of a speculative image decoding: the committed token buffer, committed lengths, and the
    stats that follow them (steps, acceptance map, totals). Shared by the decodings that verify windows of drafts.

    seq: [B, N + extra] long, committed tokens then whatever the decoding keeps past them (drafts, scratch);
    committed: [B] long, tokens committed per row; minimum: its smallest value as a host int.
    """

    def __init__(self, first_tokens: torch.Tensor, N: int, extra: int, stats: SpecStats):
        B, device = first_tokens.shape[0], first_tokens.device
        self.N, self.stats, self.step = N, stats, 0
        self.seq = torch.zeros(B, N + extra, dtype=torch.long, device=device)
        self.seq[:, 0] = first_tokens
        self.committed = torch.ones(B, dtype=torch.long, device=device)
        self.minimum = 1
        self._positions = torch.arange(N, device=device)
        stats.steps = torch.zeros(B, dtype=torch.long, device=device)
        stats.acceptance_map = torch.zeros(B, N, dtype=torch.long, device=device)

    @property
    def active(self) -> torch.Tensor:
        """[B] bool, rows still generating."""
        return self.committed < self.N

    def draft_lengths(self, W: int) -> torch.Tensor:
        """[B] long, real drafts of a window of W target positions (those that predict an image token)."""
        return ((self.N - self.committed).clamp(max=W) - 1).clamp(min=0)

    def advance(self, result: VerifyResult, lengths: torch.Tensor) -> None:
        """Commit each active row's accepted drafts plus the closing token (the caller wrote them into seq) and record
        the step: who committed what (acceptance map) and the acceptance counts. No host sync."""
        self.step += 1
        active = self.active
        advanced = torch.where(active, self.committed + result.n_accepted + 1, self.committed)
        newly = (self._positions >= self.committed[:, None]) & (self._positions < advanced[:, None])
        self.stats.acceptance_map.masked_fill_(newly, self.step)
        self.stats.record_step(result, lengths, active=active)
        self.committed = advanced

    def progress(self) -> DecodeStep:
        """Sync the smallest committed length to the host (the loop's bound) and snapshot the committed tokens."""
        self.minimum = int(self.committed.min())
        tokens = torch.where(self._positions < self.committed[:, None], self.seq[:, : self.N], PAD_ID)
        return DecodeStep(self.step, tokens, self.committed.clone(), self.minimum)

    def finish(self, start: float) -> None:
        """Fold the stats once the decoding ends (also when the caller stops early)."""
        self.stats.new_tokens = self.committed.clamp(max=self.N).cpu()
        self.stats.steps = self.stats.steps.cpu()
        self.stats.timings["total"] = time.perf_counter() - start
        self.stats.finalize()


@dataclass(frozen=True)
class AR(DecodingComponent):
    """Plain autoregressive sampling with a KV cache: one token per target forward (the baseline every speedup is
    measured against)."""

    name: ClassVar[str] = "ar"
    modality: ClassVar[str] = "image"

    @torch.no_grad()
    def __call__(self, model, condition, sampling, generator, stats):
        stats.speculative = False
        opening = open_decoding(model, condition, sampling, generator, stats)
        N, forced, state, timer = opening.N, opening.forced, opening.state, opening.timer
        B, device = opening.first_token.shape[0], opening.first_token.device
        tokens = torch.full((B, N), PAD_ID, dtype=torch.long, device=device)
        tokens[:, 0] = opening.first_token
        done = 1
        try:
            yield DecodeStep(0, tokens.clone(), torch.ones(B, dtype=torch.long, device=device), done)
            for i in range(1, N):
                with timer("target"):
                    logits = model.forward(tokens[:, i - 1 : i], state)
                stats.target_forwards += 1
                with timer("sample"):
                    p = probs_of(logits.at(slice(-1, None)), sampling, torch.full((B, 1), i, device=device), forced)
                    tokens[:, i] = sample(p[:, 0], generator)
                done = i + 1
                yield DecodeStep(i, tokens.clone(), torch.full((B,), done, dtype=torch.long, device=device), done)
        finally:  # also when the caller stops early (closes this generator): count what was generated
            stats.steps = torch.full((B,), done - 1, dtype=torch.long)
            stats.new_tokens = torch.full((B,), done, dtype=torch.long)
            stats.acceptance_map = torch.arange(N).expand(B, N)  # forward i (0 = the prefill) commits token i
            stats.timings["total"] = time.perf_counter() - opening.started
            stats.finalize()
