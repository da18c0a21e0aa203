"""ContinuousStats: the stats of continuous-token (MAR-style) decodings."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.core.stats import SpecStats


@dataclass
class ContinuousStats(SpecStats):
    """`SpecStats` of a continuous-token decoding adds:

    residual_tries: [rejected drafts] long, the target proposals each residual draw took (None for plain decoding).
    fallbacks: residual draws that hit the try cap and kept a target sample.
    log_ratio_terms: the acceptance log ratio of every verified token, term by term (name -> [drafted]; "log_ratio"
        for the exact rule, the released CSpD rule's three terms); None for plain decoding.
    """

    residual_tries: torch.Tensor | None = None
    fallbacks: int = 0
    log_ratio_terms: dict[str, torch.Tensor] | None = None

    def as_dict(self) -> dict:
        d = super().as_dict()
        if self.residual_tries is None:
            return d
        timings = d.pop("timings_s")
        tries = self.residual_tries
        return {**d, "mean_residual_tries": round(tries.double().mean().item(), 4) if tries.numel() else 0.0,
                "residual_fallbacks": self.fallbacks, "timings_s": timings}
