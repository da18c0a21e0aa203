"""`ContinuousSpeculation`: the decoding component of continuous speculative decoding (MAR-style), which
`MARPipeline` holds and saves; `mmspec.continuous.mar_decoding.generate_speculative` runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.acceptance import Acceptance, Exact
from mmspec.core.component import DecodingComponent


@dataclass(frozen=True)
class ContinuousSpeculation(DecodingComponent):
    """A draft MAR drafts `gamma` steps per target pass; the first `prefill_ratio` of the steps are the target's own.
    acceptance: `Exact()` (the whole reverse trajectory accepted with min(1, P/Q): exact for the target on the
    coarsened schedule) or `Paper()` (CSpD's released rule, approximate), or its name. A rejected token's residual
    draws target proposals in batched rounds of `proposals_per_round`, at most `max_tries` in all (then it keeps the
    last one, counted in `stats.fallbacks`)."""

    name: ClassVar[str] = "speculative"
    modality: ClassVar[str] = "continuous"
    gamma: int = 4
    prefill_ratio: float = 0.0
    acceptance: Acceptance = Exact()
    max_tries: int = 100
    proposals_per_round: int = 8

    def __post_init__(self):
        self.check_count("gamma", "draft steps per target pass")
        if isinstance(self.prefill_ratio, bool) or not isinstance(self.prefill_ratio, (int, float)) or not (
                0 <= self.prefill_ratio < 1):
            raise ValueError(f"prefill_ratio must be in [0, 1), got {self.prefill_ratio!r}")
        self.check_count("max_tries", "target proposals per residual draw")
        self.check_count("proposals_per_round", "target proposals per batched round")
        super().__post_init__()
