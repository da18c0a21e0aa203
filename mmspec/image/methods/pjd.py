"""`PJD(...)`: parallel Jacobi decoding over image rows (lossy unless rows == 1). The settings; the step is
`mmspec.image.parallel.RowWindowStep` (its law and why it departs from AR's: that module's docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.registry import register_decoding
from mmspec.core.settings import setting
from mmspec.image.methods.base import ImageDecoding
from mmspec.image.methods.sjd import COUPLINGS, INITS


@register_decoding
@dataclass(frozen=True)
class PJD(ImageDecoding):
    """Parallel Jacobi decoding over image rows: `rows` grid rows decode at once, each in its own window, row r + 1
    `lag` columns behind row r's committed frontier (lossy unless rows == 1; rows=1 gives SJD's tokens). The defaults
    (4, 4, 1) are the fastest of a sweep on the embedded model. Needs an adapter with `forward_segments` /
    `commit_segments` (LlamaGen's and the embedded models')."""

    name: ClassVar[str] = "pjd"
    capabilities: ClassVar[frozenset[str]] = frozenset({"segments"})
    window: int = setting(4, "target positions per row window", low=1)
    rows: int = setting(4, "grid rows decoding at once (1 = SJD)", low=1)
    lag: int = setting(1, "columns a row stays behind the committed frontier of the row above", low=1)
    init: str = setting("horizontal", "how positions no window has reached are drafted",
                        choices=tuple(init for init in INITS if init != "lookahead"))
    coupling: str = setting("maximal", "how drafts are redrafted between iterations", choices=COUPLINGS)

    @property
    def lossless(self) -> bool:
        return self.rows == 1

    @property
    def forward_width(self) -> int:
        """Tokens one target forward scores per sample: the row windows, and with several rows one slot for a
        closing token no window starts from."""
        return self.rows * self.window + (self.rows > 1)

    @property
    def max_window(self) -> int:
        """The segment inputs' keys/values go to scratch slots past the image: one per input (the state's room is
        `max_window - 1` slots)."""
        return self.forward_width + 1

    def step(self, model, opening, sampling, generator, stats):
        from mmspec.image.parallel import RowWindowStep

        return RowWindowStep(self, model, opening, sampling, generator, stats)
