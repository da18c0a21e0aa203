"""Medusa's typical acceptance (Cai et al. 2024, arXiv 2401.10774; lossy, opt-in, text): accept a draft x iff
p(x) > min(epsilon, delta * exp(-H(p))), a threshold that falls as the target law spreads; at the first rejection
sample p itself (no residual)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from mmspec.core.registry import register_rule
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import at_drafts
from mmspec.core.settings import setting

if TYPE_CHECKING:
    import torch


@register_rule
@dataclass(frozen=True)
class Typical(AcceptanceRule):
    """Medusa's typical acceptance (lossy): accept x iff p(x) > min(epsilon, delta * exp(-H(p))); at the first
    rejection sample p. Medusa's defaults."""

    name: ClassVar[str] = "typical"
    modalities: ClassVar[tuple[str, ...]] = ("text",)
    lossless: ClassVar[bool] = False
    epsilon: float = setting(0.09, "the acceptance threshold's ceiling", low=0, high=1, low_open=True)
    delta: float = setting(0.3, "the threshold's scale on exp(-entropy)", low=0, low_open=True)

    def acceptance(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """1 where p(x) clears the threshold, else 0: [..., L]."""
        entropy = -(p * p.clamp(min=1e-30).log()).sum(-1)
        threshold = (self.delta * (-entropy).exp()).clamp(max=self.epsilon)
        return (at_drafts(p, drafts) > threshold).to(p.dtype)

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """p itself: typical acceptance resamples the target at the first rejection."""
        return p
