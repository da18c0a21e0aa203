"""`LayerSkip(...)`, `"layerskip"`: self-speculative drafts from the target's first layers (its early exit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.registry import register_decoding
from mmspec.core.settings import setting
from mmspec.text.methods.base import ConfidenceStop, TextDrafting


@register_decoding
@dataclass(frozen=True)
class LayerSkip(ConfidenceStop, TextDrafting):
    """Drafts with the target's first `exit_layer` layers and its own LM head."""

    name: ClassVar[str] = "layerskip"
    described: ClassVar[str] = "the target's first layers"

    exit_layer: int | None = setting(None, "layer-skip drafts with the target's first N layers (default: the "
                                     "config's early_exit_layer)", kind=int, low=1)

    def make_drafter(self, target, draft=None):
        from mmspec.text.drafters import LayerSkipDrafter, exits_of

        exit_layer = self.exit_layer or exits_of(target, "drafter='layerskip'").early_exit_layer
        if exit_layer is None:
            raise ValueError("drafter='layerskip' needs exit_layer: the target's config names no early_exit_layer")
        return LayerSkipDrafter(target, exit_layer, confidence_threshold=self.confidence_threshold)
