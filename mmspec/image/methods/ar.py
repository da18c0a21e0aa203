"""`AR()`: plain autoregressive sampling with a KV cache, one token per target forward — the baseline every speedup
is measured against. Every pipeline takes it (`decoding=AR()`, `decoding="ar"`) and runs its own modality's AR."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.registry import register_decoding
from mmspec.image.methods.base import ImageDecoding


@register_decoding
@dataclass(frozen=True)
class AR(ImageDecoding):
    """Plain autoregressive sampling with a KV cache: one token per target forward."""

    name: ClassVar[str] = "ar"

    def step(self, model, opening, sampling, generator, stats):
        from mmspec.image.loop import ARStep

        return ARStep(model, opening, sampling, generator, stats)
