"""GSD's grouped acceptance (So et al., ICCV 2025, arXiv 2508.07747), the model-agnostic part: a draft is tested on
the mass of its group rather than its own.

Visual AR models spread probability over many interchangeable codes, so the exact test min(1, p(x)/q(x)) rejects
drafts that are as good as the token the target would have drawn. GSD groups x with the tokens ranked next to it by
the target (`group_size` ranks around x's, x included), keeps those whose target probability is within
`p_threshold` of p(x) and whose codebook vector is within cosine distance `d_threshold` of x's, and accepts with
min(1, p(C)/q(C)); a rejection draws the exact residual norm(max(p - q, 0)). The group is found anew for every
draft from the current p (dynamic clusters), unlike LANTERN's fixed neighbour table. Lossy: the emitted law moves
mass onto accepted drafts; `VerifyResult.excess_acceptance` reports min(1, p(C)/q(C)) - min(1, p(x)/q(x)) summed
over the tested positions. A group of one token is the exact rule, token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.core.acceptance import GSD
from mmspec.core.verify import residual_law


@dataclass(frozen=True)
class Grouping:
    """GSD's settings plus the geometry it needs from the model.

    embeddings: [V, d] float, row t the unit-norm codebook vector of token t, zero for tokens that are not codes (a
    non-code token forms a group of its own); rule: the `GSD` settings.
    """

    embeddings: torch.Tensor
    rule: GSD

    @property
    def lossless(self) -> bool:
        return self.rule.group_size == 1

    def members(self, p: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids [B, L, G], in-group mask [B, L, G]) of each draft's group: the G tokens ranked around it by p
        (positions past either end of the ranking dropped), filtered by the probability and codebook thresholds; the
        draft itself is always in. p: [B, L, V]; drafts: [B, L] long."""
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

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """GSD keeps the exact residual norm(max(p - q, 0))."""
        return residual_law(p, q)
