"""`TextDraftModel(...)`, `"model"`: chains from the pipeline's draft LM (Leviathan et al. 2023), with SpecDec++'s
learned draft length and VocabTrim's trimmed draft vocabulary as options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mmspec.core.registry import register_decoding
from mmspec.core.settings import runtime, setting
from mmspec.text.methods.base import LEARNED, ConfidenceStop, TextDrafting, draft_vocabulary


@register_decoding
@dataclass(frozen=True)
class TextDraftModel(ConfidenceStop, TextDrafting):
    """Chains from the draft LM, each token drawn from its processed law. schedule 'learned': SpecDec++'s stop rule
    from the pipeline's acceptance head."""

    name: ClassVar[str] = "model"
    described: ClassVar[str] = "the draft LM"
    learns_length: ClassVar[bool] = True

    stop_threshold: float | None = setting(None, "schedule 'learned': stop once the predicted probability that a "
                                           "draft token so far is rejected exceeds it (default: the acceptance "
                                           "head's, chosen from the draft and target costs)", kind=float, low=0,
                                           high=1, low_open=True, high_open=True)
    draft_vocabulary: int | None = setting(None, "VocabTrim: the draft LM's head scores only the N tokens the target "
                                           "writes most (its config's token_ranking) and the special tokens "
                                           "(default: all)", kind=int, low=1)
    acceptance_head: Any = runtime(supplied_by="acceptance_head", only={"schedule": (LEARNED,)})

    def check(self) -> None:
        super().check()
        if self.stop_threshold is not None and self.schedule != LEARNED:
            raise ValueError("stop_threshold applies with schedule='learned'")
        if self.schedule == LEARNED and self.draft_vocabulary is not None:
            raise ValueError("schedule='learned' reads the draft's full law: it does not take a draft_vocabulary")
        if self.schedule == LEARNED and self.confidence_threshold:
            raise ValueError("schedule='learned' and confidence_threshold are two stop rules: give one")

    def reads(self, field: str) -> bool:
        return (field != "stop_threshold" or self.schedule == LEARNED) and super().reads(field)

    def needs_draft_model(self) -> bool:
        return True

    def make_drafter(self, target, draft=None):
        from mmspec.text.drafters import ModelDrafter

        if self.draft_vocabulary is not None:
            return ModelDrafter(draft, confidence_threshold=self.confidence_threshold,
                                vocabulary=draft_vocabulary(target, self.draft_vocabulary))
        if self.schedule == LEARNED:
            if self.acceptance_head is None:
                raise ValueError("schedule='learned' needs an acceptance head: load a pipeline that has an "
                                 "acceptance_head, or pass acceptance_head=<AcceptanceHead>")
            return ModelDrafter(draft, acceptance_head=self.acceptance_head, stop_threshold=self.stop_threshold)
        return ModelDrafter(draft, confidence_threshold=self.confidence_threshold)
