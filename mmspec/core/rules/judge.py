"""Judge decoding (Bachmann et al. 2025, arXiv 2501.19309; lossy, opt-in, text): keep a drafted token the exact rule
accepts, or one the judge (`mmspec.models.judge.JudgeHead`, a linear layer on the target's feature of the token in
the verification forward) scores above a threshold; at the first token that fails both, draw the exact rule's
residual. No distribution guarantee: every token kept by the judge alone moves the output law off the target's, by
at most the excess acceptance `VerifyResult.excess_acceptance` reports (the judge's acceptance less the exact one,
summed over the positions tested). At temperature 0 the exact part is the greedy test (the draft equals the target's
argmax); the judge keeps tokens that differ from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from mmspec.core.registry import register_rule
from mmspec.core.rules.base import AcceptanceRule
from mmspec.core.rules.exact import Exact
from mmspec.core.settings import runtime, setting

if TYPE_CHECKING:
    import torch


@register_rule
@dataclass(frozen=True)
class Judge(AcceptanceRule):
    """Judge decoding (lossy): accept a draft the exact rule accepts or the judge head scores above `threshold`.
    head: the `JudgeHead`, attached to the target (a pipeline with a `judge_head` supplies it)."""

    name: ClassVar[str] = "judge"
    modalities: ClassVar[tuple[str, ...]] = ("text",)
    lossless: ClassVar[bool] = False
    threshold: float | None = setting(None, "keep a draft the exact rule rejects where the judge scores it above "
                                      "this (default: the judge head's own, chosen in training)", kind=float, low=0,
                                      high=1, low_open=True, high_open=True)
    head: Any = runtime(supplied_by="judge_head")

    def bind(self, model: Any, vocab_size: int) -> JudgeTest:
        if self.head is None:
            raise ValueError("acceptance='judge' needs a judge head: load a pipeline that has a judge_head, or give "
                             "Judge(head=<JudgeHead attached to the target>)")
        return JudgeTest(self.head, self.head.config.threshold if self.threshold is None else self.threshold)


class JudgeTest:
    """The judge rule bound to its head: acceptance max(exact, 1[score > threshold]), the exact rule's residual. The
    features of the drafts are those of the verification forward that gave p: its window is [x_{c-1}, d_1 .. d_L],
    so draft i's feature is at slot i + 1."""

    distorts = True
    exact = Exact()

    def __init__(self, head, threshold: float):
        self.head, self.threshold = head, threshold
        self.residual = self.exact.residual

    def __repr__(self) -> str:  # a captured round's key: the same head (by identity) and threshold
        return f"JudgeTest(head={type(self.head).__name__} at {id(self.head):#x}, threshold={self.threshold})"

    def acceptance(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        judged = self.head.score(self.head.features[:, 1 : drafts.shape[-1] + 1]) > self.threshold
        return self.exact.acceptance(p, q, drafts).where(~judged, 1)
