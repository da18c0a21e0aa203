"""The exact rule: speculative sampling (Leviathan et al. 2023, arXiv 2211.17192, Alg. 1; Chen et al. 2023, arXiv
2302.01318). Accept a draft x ~ q with probability min(1, p(x)/q(x)); at the first rejection draw the residual
norm(max(p - q, 0)). A deterministic draft (q one-hot) is the special case: accept with probability p(x), residual =
p with x removed. Lossless for every modality; at temperature 0 it is greedy decoding (`mmspec.core.verify`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from mmspec.core.registry import register_rule
from mmspec.core.rules.base import AcceptanceRule

if TYPE_CHECKING:
    import torch

RESIDUAL_EPS = 1e-12  # below this residual mass, rejection had (numerically) zero probability; sample p instead


def accept_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)), elementwise; 0 where q(x) = 0 (such a token cannot have been drawn)."""
    import torch

    ratio = (p_x / q_x.clamp(min=torch.finfo(q_x.dtype).tiny)).clamp(max=1)
    return ratio.where(q_x > 0, 0)


def residual_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)) over the last dim; p itself where that mass is ~0 (a rejection could not have happened).
    Never filtered again: top-k / top-p shaped p and q already."""
    residual = (p - q).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    return (residual / mass.clamp(min=RESIDUAL_EPS)).where(mass > RESIDUAL_EPS, p)


def at_drafts(law: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """law(x) of each draft: law [..., L, V], drafts [..., L] long -> [..., L]."""
    return law.gather(-1, drafts[..., None]).squeeze(-1)


@register_rule
@dataclass(frozen=True)
class Exact(AcceptanceRule):
    """Speculative sampling: accept x ~ q with min(1, p(x)/q(x)), else draw the residual (lossless)."""

    name: ClassVar[str] = "exact"
    modalities: ClassVar[tuple[str, ...]] = ("image", "text", "continuous")
    lossless: ClassVar[bool] = True

    def acceptance(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        return accept_probability(at_drafts(p, drafts), at_drafts(q, drafts))

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return residual_law(p, q)
