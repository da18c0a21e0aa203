"""`Kangaroo(...)`, `"kangaroo"`: self-speculative drafts from the target's first layers and a trained exit adapter
(Liu et al. 2024), with the double early exit as the confidence stop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.registry import register_decoding
from mmspec.text.methods.base import ConfidenceStop, ExitAdapter, TextDrafting


@register_decoding
@dataclass(frozen=True)
class Kangaroo(ExitAdapter, ConfidenceStop, TextDrafting):
    """Drafts with the target's first layers, the pipeline's exit adapter and the target's LM head."""

    name: ClassVar[str] = "kangaroo"
    described: ClassVar[str] = "the target's first layers and a trained exit adapter (Kangaroo)"

    def make_drafter(self, target, draft=None):
        from mmspec.text.drafters import KangarooDrafter

        return KangarooDrafter(target, self.exit_adapter(), confidence_threshold=self.confidence_threshold)
