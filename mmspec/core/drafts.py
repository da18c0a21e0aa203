"""The draft record every verifier takes: draft tokens with the exact law each was sampled from.
Drafters that produce them live with their decoders (`mmspec.text.drafters`, `mmspec.image`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Draft:
    """Draft tokens for each row and the law they were drawn from.

    tokens: [B, L] long; positions >= lengths[b] are padding and never verified.
    lengths: [B] long, number of real draft tokens per row (0 <= lengths <= L).
    q: [B, L, V] float, the law token (b, j) was sampled from, or None when every token is deterministic (n-gram
       copies, argmax drafts): then the law is the one-hot at the token.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    q: torch.Tensor | None = None

    def __post_init__(self):
        B, L = self.tokens.shape
        if self.lengths.shape != (B,):
            raise ValueError(f"Draft.lengths must have shape [{B}], got {tuple(self.lengths.shape)}")
        if self.q is not None and self.q.shape[:2] != (B, L):
            raise ValueError(f"Draft.q must have shape [{B}, {L}, V], got {tuple(self.q.shape)}")

    @property
    def deterministic(self) -> bool:
        return self.q is None
