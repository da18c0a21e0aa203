"""`Cascade(...)`, `"cascade"`: the draft LM over prompt lookup (CS-Drafting's vertical cascade, and its horizontal
one with `lookup_after`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mmspec.core.registry import register_decoding
from mmspec.core.settings import setting
from mmspec.text.methods.base import LooksUp, TextDrafting


@register_decoding
@dataclass(frozen=True)
class Cascade(LooksUp, TextDrafting):
    """The draft LM's chain, its looked-up continuations kept while its draws agree: as far in fewer draft
    forwards."""

    name: ClassVar[str] = "cascade"
    described: ClassVar[str] = "the draft LM over prompt lookup (CS-Drafting)"

    lookup_after: int | None = setting(None, "a horizontal cascade: the draft LM drafts the first N positions, "
                                       "prompt lookup the rest (default: every position from the draft LM, with "
                                       "the cheaper lookup under it)", kind=int, low=1)
    forwards_per_round: int | None = setting(None, "the draft LM's forwards a round (default: the draft length, "
                                             "every chain drafted in full; fewer: a chain ends where they reached, "
                                             "further where prompt lookup's continuations held)", kind=int, low=1)

    def check(self) -> None:
        super().check()
        if self.lookup_after is not None and self.schedule == "constant" and self.lookup_after >= self.draft_length:
            raise ValueError(f"lookup_after={self.lookup_after} must be below draft_length={self.draft_length}: the "
                             "positions after it are prompt lookup's (leave it unset for a vertical cascade only)")

    def needs_draft_model(self) -> bool:
        return True

    def make_drafter(self, target, draft=None):
        from mmspec.text.drafters import CascadeDrafter

        return CascadeDrafter(draft, max_ngram=self.max_ngram, lookup_after=self.lookup_after,
                              forwards_per_round=self.forwards_per_round)
