"""TextStats: the stats of text decodings."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.core.stats import SpecStats


@dataclass
class TextStats(SpecStats):
    """`SpecStats` of a text decoding adds from_draft: [B, N] bool, True where the new token is an accepted draft
    token (else the target drew it: a residual or bonus token, or every token of plain AR); False on padding."""

    from_draft: torch.Tensor | None = None
