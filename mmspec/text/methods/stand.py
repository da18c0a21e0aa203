"""`Stand()`, `"stand"`: STAND's model-free trees (Song et al. 2025) from an n-gram memory of the target's own laws."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.registry import register_decoding
from mmspec.text.methods.base import TreeDrafting


@register_decoding
@dataclass(frozen=True)
class Stand(TreeDrafting):
    """Trees whose nodes' laws mix the stored laws of the target that followed the same n-grams."""

    name: ClassVar[str] = "stand"
    described: ClassVar[str] = "an n-gram memory of the target's laws"

    def make_drafter(self, target, draft=None):
        from mmspec.text.tree_drafters import StandDrafter

        return StandDrafter()
