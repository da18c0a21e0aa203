"""`PromptLookup(...)`, `"ngram"`: model-free drafts copied from the prompt and the text so far (prompt lookup)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.registry import register_decoding
from mmspec.text.methods.base import LooksUp, TextDrafting


@register_decoding
@dataclass(frozen=True)
class PromptLookup(LooksUp, TextDrafting):
    """Drafts the tokens that followed the latest earlier match of the row's last n-gram (point masses)."""

    name: ClassVar[str] = "ngram"
    described: ClassVar[str] = "prompt lookup"

    def make_drafter(self, target, draft=None):
        from mmspec.text.drafters import NGramDrafter

        return NGramDrafter(max_ngram=self.max_ngram)
