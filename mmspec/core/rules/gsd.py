"""GSD's grouped acceptance (So et al., ICCV 2025, arXiv 2508.07747; lossy, opt-in): a draft is tested on the mass of
its group rather than its own.

Visual AR models spread probability over many interchangeable codes, so the exact test min(1, p(x)/q(x)) rejects
drafts that are as good as the token the target would have drawn. GSD groups x with the tokens ranked next to it by
the target (`group_size` ranks around x's, x included), keeps those whose target probability is within
`p_threshold` of p(x) and whose codebook vector is within cosine distance `d_threshold` of x's, and accepts with
min(1, p(C)/q(C)); a rejection draws the exact residual norm(max(p - q, 0)). The group is found anew for every
draft from the current p (dynamic clusters), unlike LANTERN's fixed neighbour table. The emitted law moves mass onto
accepted drafts; `VerifyResult.excess_acceptance` reports min(1, p(C)/q(C)) - min(1, p(x)/q(x)) summed over the
tested positions. A group of one token is the exact rule, token for token. The code vectors come from the model's
codebook (`mmspec.core.codebook.token_embeddings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from mmspec.core.registry import register_rule
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import accept_probability, residual_law
from mmspec.core.settings import setting

if TYPE_CHECKING:
    import torch


@register_rule
@dataclass(frozen=True)
class GSD(AcceptanceRule):
    """Grouped speculative decoding: a draft x is accepted with min(1, p(C)/q(C)) over its group C; at a rejection
    the exact residual is drawn. group_size 1 is the exact rule. Defaults: the official code's (x's rank +- 7, 0.15,
    0.5)."""

    name: ClassVar[str] = "gsd"
    modalities: ClassVar[tuple[str, ...]] = ("image",)
    lossless: ClassVar[bool] = False
    group_size: int = setting(15, "tokens per group, the draft included, ranked around it by the target", low=1)
    p_threshold: float = setting(0.15, "a group member's target probability is within this of the draft's", low=0,
                                 high=1)
    d_threshold: float = setting(0.5, "a group member's code is within this cosine distance of the draft's", low=0,
                                 high=2)

    def check_sampling(self, temperature: float) -> None:
        if temperature == 0:
            raise ValueError(f"{type(self).__name__} acceptance samples: with temperature=0 the target law is one-hot "
                             "and has no group mass")

    def bind(self, model, vocab_size: int) -> Grouping:
        """The model's code vectors in token space with these settings."""
        from mmspec.core.codebook import model_codebook, token_embeddings

        embeddings = token_embeddings(model_codebook(model), vocab_size, getattr(model, "codebook_token_ids", None))
        return Grouping(embeddings, self)


@dataclass(frozen=True)
class Grouping:
    """GSD bound to a model: the chain test's pieces (`TokenTest`).

    embeddings: [V, d] float, row t the unit-norm codebook vector of token t, zero for tokens that are not codes (a
    non-code token forms a group of its own); rule: the `GSD` settings.
    """

    distorts: ClassVar[bool] = True
    embeddings: torch.Tensor
    rule: GSD

    @property
    def lossless(self) -> bool:
        return self.rule.group_size == 1

    def members(self, p: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids [B, L, G], in-group mask [B, L, G]) of each draft's group: the G tokens ranked around it by p
        (positions past either end of the ranking dropped), filtered by the probability and codebook thresholds; the
        draft itself is always in. p: [B, L, V]; drafts: [B, L] long."""
        import torch

        V, G = p.shape[-1], self.rule.group_size
        order = p.argsort(dim=-1, descending=True, stable=True)  # rank -> token
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(V, device=p.device).expand_as(order))
        below = (G - 1) // 2
        ranks = rank.gather(-1, drafts[..., None]) + torch.arange(-below, G - below, device=p.device)  # [B, L, G]
        in_range = (ranks >= 0) & (ranks < V)
        tokens = order.gather(-1, ranks.clamp(0, V - 1))
        p_members, p_x = p.gather(-1, tokens), p.gather(-1, drafts[..., None])
        vectors = self.embeddings.to(p.device)
        e_x = vectors[drafts]  # [B, L, d]
        cosine = (vectors[tokens] * e_x[..., None, :]).sum(-1).to(p.dtype)
        codes = (e_x.abs().sum(-1) > 0)[..., None]
        near = (1 - cosine < self.rule.d_threshold) & ((p_members - p_x).abs() < self.rule.p_threshold) & codes
        return tokens, in_range & ((tokens == drafts[..., None]) | near)

    def draft_masses(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(p(C), q(C)) of each draft's group C: p, q [B, L, V], drafts [B, L] -> two [B, L]."""
        tokens, inside = self.members(p, drafts)
        return ((p.gather(-1, tokens) * inside).sum(-1), (q.gather(-1, tokens) * inside).sum(-1))

    def acceptance(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """min(1, p(C)/q(C)) of each draft's group."""
        return accept_probability(*self.draft_masses(p, q, drafts))

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """GSD keeps the exact residual norm(max(p - q, 0))."""
        return residual_law(p, q)
