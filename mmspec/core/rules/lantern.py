"""LANTERN / LANTERN++ relaxed acceptance for visual AR models (lossy, opt-in): LANTERN, Jang et al. 2025, arXiv
2410.03355; LANTERN++, Park et al. 2025, arXiv 2502.06352.

Visual AR models spread probability over many interchangeable codes, so the exact test rejects good drafts. A draft
x is scored with the target mass of A(x): x plus the longest prefix of its nearest codebook neighbours whose summed
mass stays within the budget (delta, and/or (lam - 1) p(x)); accept with f(x) = min(1, p(A(x))/q(x)); at a
rejection draw from Cool-SD's residual G* = norm(max(p - q f, 0)) (Li et al., AAAI 2026, arXiv 2601.09212), which is
the least-distorting one and, since p(A(x)) >= p(x), equals the exact rule's residual norm(max(p - q, 0)). Not the
official code's residual, which zeroes all k + 1 nearest codes and adds distortion. What the budget guarantees is
per candidate: TV(p, p with A(x) moved onto x) <= delta. The emitted law pi is NOT within delta of p; with G*,
exactly

    TV(pi, p) = sum_x [min(q(x), p(A(x))) - p(x)]_+ = alpha_relaxed - alpha_exact <= min(TV(p, q), sum_x N(x)),

N(x) = p(A(x)) - p(x): every unit of extra acceptance is one unit of distortion. `VerifyResult.excess_acceptance`
reports it. The neighbours come from the model's codebook (`mmspec.core.codebook`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from mmspec.core.registry import register_rule
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import accept_probability, at_drafts, residual_law
from mmspec.core.settings import setting

if TYPE_CHECKING:
    import torch

DEFAULT_DELTA = 0.1  # the official CLI's --lantern_delta, used when neither delta nor lam is given
DEFAULT_K_MAX = 1000  # the official CLI's --lantern_k: k defaults to min(it, V - 1)


def check_relaxation(k: int, delta: float | None, lam: float | None, V: int | None = None) -> None:
    """Raise a clear error for LANTERN settings outside their ranges (V: the vocabulary size, when known)."""
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if k < 0 or (V is not None and k > V - 1):
        bound = "" if V is None else f" = [0, {V - 1}]"
        raise ValueError(f"k must be in [0, V - 1]{bound} (neighbours per code), got {k}")
    if delta is None and lam is None:
        raise ValueError("relaxed acceptance needs a budget: delta (LANTERN) and/or lam (LANTERN++)")
    if delta is not None and not 0 <= delta <= 1:
        raise ValueError(f"delta must be in [0, 1] (a total-variation budget), got {delta}")
    if lam is not None and not lam >= 1:
        raise ValueError(f"lam must be >= 1 (p(A(x)) <= lam * p(x)), got {lam}")


@register_rule
@dataclass(frozen=True)
class Lantern(AcceptanceRule):
    """LANTERN / LANTERN++ relaxed acceptance over VQ codebook neighbours (lossy; the stats report its distortion).
    With neither budget given, delta = 0.1 (the official default)."""

    name: ClassVar[str] = "lantern"
    modalities: ClassVar[tuple[str, ...]] = ("image",)
    lossless: ClassVar[bool] = False
    k: int | None = setting(None, "nearest codes that may join a draft's neighbourhood (default min(1000, V - 1))",
                            kind=int, low=0)
    delta: float | None = setting(None, "LANTERN's budget: the mass moved onto a draft, a TV distance per candidate "
                                  "(default 0.1 when lam is not given)", kind=float, low=0, high=1)
    lam: float | None = setting(None, "LANTERN++'s budget: neighbourhood mass <= lam * p(x)", kind=float, low=1)

    @property
    def budget(self) -> tuple[float | None, float | None]:
        """(delta, lam) with the default delta filled in."""
        if self.delta is None and self.lam is None:
            return DEFAULT_DELTA, None
        return self.delta, self.lam

    def check_sampling(self, temperature: float) -> None:
        if temperature == 0:
            raise ValueError(
                f"{type(self).__name__} acceptance samples: with temperature=0 the target law is one-hot and has no "
                "neighbour mass; use a temperature > 0")

    def bind(self, model, vocab_size: int) -> Relaxation:
        """The model's neighbour table at k = `self.k` (default min(1000, V - 1)) with this budget."""
        from mmspec.core.codebook import model_codebook, model_neighbours

        codebook_size = model_codebook(model).shape[0]
        k = min(DEFAULT_K_MAX, vocab_size - 1) if self.k is None else self.k
        check_relaxation(k, *self.budget, V=codebook_size)
        return Relaxation(model_neighbours(model, vocab_size, k), k, *self.budget)


@dataclass(frozen=True)
class Relaxation:
    """LANTERN bound to a model: the chain test's pieces (`TokenTest`).

    neighbours: [V, K] integer tensor; row x holds the token ids of x's K nearest codebook neighbours, nearest first,
    x itself excluded; -1 entries (a whole row for tokens that are not image codes) are never relaxed onto.
    k: how many of them may join A(x), 0 <= k <= K. delta: LANTERN's additive budget, sum of p over A(x) minus x
    <= delta, in [0, 1]. lam: LANTERN++'s multiplicative budget, p(A(x)) <= lam * p(x), lam >= 1. Give delta, lam or
    both (then both hold). k = 0, delta = 0 or lam = 1 is the exact rule.
    """

    distorts: ClassVar[bool] = True
    neighbours: torch.Tensor
    k: int
    delta: float | None = None
    lam: float | None = None

    def __post_init__(self):
        table = self.neighbours
        if not (hasattr(table, "is_floating_point") and table.ndim == 2) or table.is_floating_point():
            raise TypeError("neighbours must be an integer tensor [V, K] of token ids (a neighbour table)")
        V, K = table.shape
        check_relaxation(self.k, self.delta, self.lam, V)
        if self.k > K:
            raise ValueError(
                f"k = {self.k} exceeds the neighbour table's {K} neighbours per code; build it with k_max >= k"
            )

    @property
    def lossless(self) -> bool:
        """True when the settings admit no neighbour mass, so the rule is the exact one."""
        return self.k == 0 or self.delta == 0 or self.lam == 1

    def acceptance(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """min(1, p(A(x))/q(x)) of each draft: p, q [..., L, V], drafts [..., L] -> [..., L]."""
        return accept_probability(relaxed_mass(p, drafts[..., None], self)[0].squeeze(-1), at_drafts(q, drafts))

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The law drawn at a rejection: G* (`relaxed_residual`)."""
        return relaxed_residual(p, q, self)


def relaxed_mass(p: torch.Tensor, tokens: torch.Tensor, relaxation: Relaxation) -> tuple[torch.Tensor, torch.Tensor]:
    """p(A(x)) and |A(x)| - 1 for T tokens per law: p [..., V], tokens [..., T] long -> ([..., T] float, [..., T] long).

    A(x) is x plus the longest prefix of its k nearest neighbours whose cumulative mass under p stays within the
    budget (the cumulative mass is non-decreasing, so the admissible neighbours always form a prefix).
    """
    p_x = p.gather(-1, tokens)
    if relaxation.k == 0:
        return p_x, tokens.new_zeros(tokens.shape)
    neighbours = relaxation.neighbours.to(p.device)[tokens, : relaxation.k].long()  # [..., T, k]
    real = neighbours >= 0
    masses = p.gather(-1, neighbours.clamp(min=0).flatten(-2)).view(neighbours.shape)
    cumulative = masses.masked_fill(~real, 0).cumsum(-1)
    budget = p_x.new_full(p_x.shape, float("inf"))
    if relaxation.delta is not None:
        budget = budget.clamp(max=relaxation.delta)
    if relaxation.lam is not None:
        budget = budget.minimum((relaxation.lam - 1) * p_x)
    inside = cumulative <= budget[..., None]
    n = inside.sum(-1)
    moved = cumulative.gather(-1, (n - 1).clamp(min=0)[..., None]).squeeze(-1).where(n > 0, 0)
    return p_x + moved, (inside & real).sum(-1)


def relaxed_residual(p: torch.Tensor, q: torch.Tensor, relaxation: Relaxation) -> torch.Tensor:
    """Cool-SD's G* = norm(max(p - q f, 0)) with f(y) = min(1, p(A(y))/q(y)): p, q [B, V] -> [B, V].

    G* is the exact rule's residual norm(max(p - q, 0)) whatever the neighbourhoods (`relaxation` changes how often a
    draft is accepted, not what a rejection draws): q f = min(q, p(A(y))) with p(A(y)) >= p(y), so where q <= p,
    q f = q, and where q > p, q f >= p and the term is 0. No [B, V, k] neighbour masses are needed.
    """
    return residual_law(p, q)
