"""Decoding methods for discrete image AR models, behind one interface so pipelines take `decoding="name"`.

A decoding is called with a model adapter, the condition, the sampling settings and the caller's generator, and yields
a `DecodeStep` after every target forward, so a pipeline can drive progress bars, callbacks and interruption. This
module holds the plain AR baseline; speculative methods register beside it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.rng import Generators, check_generators, sample
from mmspec.core.stats import PhaseTimer, SpecStats
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


def probs_of(logits: ImageLogits, sampling: SamplingConfig) -> torch.Tensor:
    """Processed probabilities [..., V] of (CFG-paired) logits."""
    return process_logits(logits.cond, sampling, logits.uncond)


class ARDecoding:
    """Plain autoregressive sampling with a KV cache: one token per target forward (the baseline every speedup is
    measured against)."""

    name = "ar"
    lossless = True

    def __call__(self, model, condition, sampling, generator, stats):
        start = time.perf_counter()
        timer = PhaseTimer(stats.timings)
        with timer("target"):
            state, logits = model.prefill(condition, cfg=sampling.guidance_scale != 1.0)
        stats.target_forwards += 1
        stats.prefill_forwards += 1
        B, N = logits.cond.shape[0], model.grid[0] * model.grid[1]
        check_generators(generator, B)
        device = logits.cond.device
        tokens = torch.full((B, N), PAD_ID, dtype=torch.long, device=device)
        done = 0
        try:
            for i in range(N):
                with timer("sample"):
                    tokens[:, i] = sample(probs_of(logits.at(-1), sampling), generator)
                done = i + 1
                if done < N:
                    with timer("target"):
                        logits = model.forward(tokens[:, i : i + 1], state)
                    stats.target_forwards += 1
                yield DecodeStep(i, tokens.clone(), torch.full((B,), done, dtype=torch.long, device=device), done)
        finally:  # also when the caller stops early (closes this generator): count what was generated
            stats.steps = torch.full((B,), max(done - 1, 0), dtype=torch.long)
            stats.new_tokens = torch.full((B,), done, dtype=torch.long)
            stats.timings["total"] = time.perf_counter() - start
            stats.finalize()


DECODINGS: dict[str, type] = {"ar": ARDecoding}


def get_decoding(decoding: str | ImageDecoding) -> ImageDecoding:
    """A decoding instance from its name (see `DECODINGS`) or an already-built decoding object."""
    if isinstance(decoding, str):
        if decoding not in DECODINGS:
            raise ValueError(f"decoding must be one of {sorted(DECODINGS)} or a decoding object, got {decoding!r}")
        return DECODINGS[decoding]()
    if not callable(decoding) or not hasattr(decoding, "name"):
        raise TypeError(f"decoding must be a name or an ImageDecoding object, got {type(decoding).__name__}")
    return decoding
