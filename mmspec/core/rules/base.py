"""What every acceptance rule is: a settings object (`Settings`) with a registered `name`, the `modalities` whose
decodings take it and whether it is `lossless`, and — for the token rules of image and text decodings — the chain
test's two pieces, behind the `TokenTest` protocol:

    acceptance(p, q, drafts) -> [B, L]           the probability of accepting draft x ~ q where the target law is p
    residual(p, q) -> [B, V]                      the law drawn at the first rejection

`rule.bind(model, vocab_size)` is the test for one model: the rule itself for rules that need nothing of the model,
a relaxation with the model's codebook geometry for the relaxed rules. The chain test that runs these pieces is
`mmspec.core.verify.chain_outcome`; tree rules are `mmspec.core.tree_verify`'s.

Rule modules are importable without torch (the CLI reads their settings before torch loads): tensor work happens in
their methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from mmspec.core.registry import rules
from mmspec.core.settings import Settings

if TYPE_CHECKING:
    import torch


class TokenTest(Protocol):
    """A rule as a chain test runs it. p, q: [..., L, V] target and draft laws at the draft positions; drafts:
    [..., L] long."""

    distorts: bool  # the rule may move the output law off p: the chain test reports its excess acceptance

    def acceptance(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
        """[..., L]: the probability of accepting each draft (the exact rule's min(1, p(x)/q(x)))."""

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """[..., V]: the law of the token drawn where the draft was rejected (p, q: [..., V] at that position)."""


@dataclass(frozen=True)
class AcceptanceRule(Settings):
    """Base of the acceptance rules, the `acceptance=` of every decoding component that verifies drafts."""

    name: ClassVar[str]
    modalities: ClassVar[tuple[str, ...]]  # "image", "text", "continuous": whose decodings take it
    lossless: ClassVar[bool]

    @property
    def distorts(self) -> bool:
        """Whether the rule may move the output law off the model's (a lossy rule: its excess acceptance is
        reported, also where its settings happen to admit none)."""
        return not self.lossless

    def check_sampling(self, temperature: float) -> None:
        """Refuse sampling settings the rule cannot work with (known before any model loads); none by default."""

    def bind(self, model: Any, vocab_size: int) -> TokenTest:
        """The test this rule verifies with on `model` (its adapter; `vocab_size` ids): the rule itself unless it
        needs something of the model."""
        return self


def rule_from(value: AcceptanceRule | str | dict, modality: str | None = None,
              argument: str = "acceptance") -> AcceptanceRule:
    """A rule from an object, a registered name (its default settings) or a saved config dict; `modality` refuses a
    rule its decodings do not take."""
    known = rules()
    if isinstance(value, str):
        if value not in known:
            raise ValueError(f"{argument} must be one of {tuple(known)} or an AcceptanceRule object, got {value!r}")
        value = known[value]()
    elif isinstance(value, dict):
        settings = dict(value)
        name = settings.pop("name", None)
        if name not in known:
            raise ValueError(f"{argument} config names no acceptance rule: {value!r}")
        value = known[name](**settings)
    elif not isinstance(value, AcceptanceRule):
        raise TypeError(f"{argument} must be an AcceptanceRule (Exact(), Lantern(...), ...) or its name, got "
                        f"{type(value).__name__}")
    if modality is not None and modality not in value.modalities:
        raise ValueError(f"{argument}={value.name!r} does not apply to {modality} decoding; {modality} takes "
                         f"{tuple(rules(modality))}")
    return value
