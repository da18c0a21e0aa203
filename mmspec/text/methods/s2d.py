"""`SortedExits(...)`, `"s2d"`: S2D's nested drafts (Kavehzadeh et al. 2024), an exit adapter trained at several exits,
each row drafting a step through the exit it chooses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.registry import register_decoding
from mmspec.core.settings import setting
from mmspec.text.methods.base import ConfidenceStop, ExitAdapter, TextDrafting


@register_decoding
@dataclass(frozen=True)
class SortedExits(ExitAdapter, ConfidenceStop, TextDrafting):
    """Drafts through the shallowest exit whose confidence reaches exit_threshold, row by row and step by step."""

    name: ClassVar[str] = "s2d"
    described: ClassVar[str] = ("the exit adapter at the exit each row chooses per step among those it was trained "
                                "for (S2D)")

    exit_threshold: float = setting(0.3, "a row drafts the step through the shallowest exit whose top-1 probability "
                                    "for its first token reaches it (else the deepest; 0.3: the embedded pair's "
                                    "best)", low=0, high=1, low_open=True)

    def make_drafter(self, target, draft=None):
        from mmspec.text.sorted_exits import SortedExitDrafter

        return SortedExitDrafter(target, self.exit_adapter(), exit_threshold=self.exit_threshold,
                                 confidence_threshold=self.confidence_threshold)
