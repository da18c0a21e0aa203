"""Acceptance rules as settings objects, the `acceptance=` of every decoding component: `Exact()`, `Lantern(...)`,
`GSD(...)`, `Typical(...)`, `Paper()`. Each is validated once in its constructor, saves as a plain dict (`to_config`)
and is rebuilt from one (`acceptance_from`). The rules themselves are the pure functions of `mmspec.core.verify`;
which decodings take which rule is `mmspec.options.ACCEPTANCE_RULES`, the one registry of their names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from mmspec.options import ACCEPTANCE_RULES, acceptances

LANTERN_DEFAULT_DELTA = 0.1  # the official CLI's --lantern_delta, used when neither delta nor lam is given


def check_relaxation(k: int, delta: float | None, lam: float | None, V: int | None = None) -> None:
    """Raise a clear error for LANTERN settings outside their ranges (V: the vocabulary size, when known)."""
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if k < 0 or (V is not None and k > V - 1):
        bound = "" if V is None else f" = [0, {V - 1}]"
        raise ValueError(f"k must be in [0, V - 1]{bound} (neighbours per code), got {k}")
    if delta is None and lam is None:
        raise ValueError("relaxed acceptance needs a budget: delta (LANTERN) and/or lam (LANTERN++)")
    if delta is not None and not 0 <= delta <= 1:
        raise ValueError(f"delta must be in [0, 1] (a total-variation budget), got {delta}")
    if lam is not None and not lam >= 1:
        raise ValueError(f"lam must be >= 1 (p(A(x)) <= lam * p(x)), got {lam}")


@dataclass(frozen=True)
class Acceptance:
    """Base of the acceptance settings. `lossless`: whether the decoding's output law stays the model's."""

    name: ClassVar[str]
    lossless: ClassVar[bool]

    def to_config(self) -> dict:
        """{"name": ..., settings...}: what a saved pipeline stores; `acceptance_from` reads it back."""
        return {"name": self.name, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class Exact(Acceptance):
    """Speculative sampling: accept a draft x ~ q with min(1, p(x)/q(x)), else draw the residual (lossless)."""

    name: ClassVar[str] = "exact"
    lossless: ClassVar[bool] = True


@dataclass(frozen=True)
class Lantern(Acceptance):
    """LANTERN / LANTERN++ relaxed acceptance over VQ codebook neighbours (lossy; the stats report its distortion).

    k: nearest codes that may join a draft's neighbourhood A(x) (None: min(1000, V - 1)); delta: LANTERN's additive
    budget, the mass moved onto x, in [0, 1]; lam: LANTERN++'s multiplicative budget, p(A(x)) <= lam * p(x), >= 1.
    With neither budget given, delta = 0.1 (the official default). See `mmspec.core.verify.verify_lantern`.
    """

    name: ClassVar[str] = "lantern"
    lossless: ClassVar[bool] = False
    k: int | None = None
    delta: float | None = None
    lam: float | None = None

    def __post_init__(self):
        check_relaxation(0 if self.k is None else self.k, *self.budget)

    @property
    def budget(self) -> tuple[float | None, float | None]:
        """(delta, lam) with the default delta filled in."""
        if self.delta is None and self.lam is None:
            return LANTERN_DEFAULT_DELTA, None
        return self.delta, self.lam


@dataclass(frozen=True)
class GSD(Acceptance):
    """Grouped speculative decoding (So et al., ICCV 2025, arXiv 2508.07747; lossy, the stats report its distortion):
    a draft x is accepted with min(1, p(C)/q(C)) over its group C, the tokens next to x in the target's probability
    ranking (`group_size` of them, x included) whose target probability is within `p_threshold` of p(x) and whose
    codebook vector is within cosine distance `d_threshold` of x's; at a rejection the exact residual
    norm(max(p - q, 0)) is drawn. group_size 1 is the exact rule. Defaults: the official code's (x's rank +- 7,
    0.15, 0.5). See `mmspec.core.grouping.Grouping`."""

    name: ClassVar[str] = "gsd"
    lossless: ClassVar[bool] = False
    group_size: int = 15
    p_threshold: float = 0.15
    d_threshold: float = 0.5

    def __post_init__(self):
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            raise ValueError(f"group_size must be an int >= 1 (tokens per group, the draft included), got "
                             f"{self.group_size!r}")
        if not 0 <= self.p_threshold <= 1:
            raise ValueError(f"p_threshold must be in [0, 1] (a difference of probabilities), got {self.p_threshold}")
        if not 0 <= self.d_threshold <= 2:
            raise ValueError(f"d_threshold must be in [0, 2] (a cosine distance), got {self.d_threshold}")


@dataclass(frozen=True)
class Typical(Acceptance):
    """Medusa's typical acceptance (lossy): accept x iff p(x) > min(epsilon, delta * exp(-H(p))); at the first
    rejection sample p. epsilon in (0, 1], delta > 0 (Medusa's defaults)."""

    name: ClassVar[str] = "typical"
    lossless: ClassVar[bool] = False
    epsilon: float = 0.09
    delta: float = 0.3

    def __post_init__(self):
        if not (0 < self.epsilon <= 1 and self.delta > 0):
            raise ValueError(f"Typical needs epsilon in (0, 1] and delta > 0, got epsilon={self.epsilon}, "
                             f"delta={self.delta}")


@dataclass(frozen=True)
class Paper(Acceptance):
    """The released CSpD rule for continuous tokens (approximate, not distribution-preserving; its bias is measured):
    final-step Gaussians flattened by an inner temperature, a sigma-product term, a final-step residual. See
    `mmspec.continuous.acceptance.verify_paper`."""

    name: ClassVar[str] = "paper"
    lossless: ClassVar[bool] = False


# by name; the names are mmspec.options.ACCEPTANCE_RULES
RULES: dict[str, type[Acceptance]] = {rule.name: rule for rule in (Exact, Lantern, GSD, Typical, Paper)}


def acceptance_from(value: Acceptance | str | dict, modality: str | None = None,
                    argument: str = "acceptance") -> Acceptance:
    """An `Acceptance` from an object, a rule name (default settings) or a saved config dict; `modality` ("image",
    "text" or "continuous", see `mmspec.options.ACCEPTANCE_RULES`) refuses a rule its decodings do not take."""
    if isinstance(value, str):
        if value not in RULES:
            raise ValueError(f"{argument} must be one of {tuple(RULES)} or an Acceptance object, got {value!r}")
        value = RULES[value]()
    elif isinstance(value, dict):
        settings = dict(value)
        name = settings.pop("name", None)
        if name not in RULES:
            raise ValueError(f"{argument} config names no acceptance rule: {value!r}")
        value = RULES[name](**settings)
    elif not isinstance(value, Acceptance):
        raise TypeError(f"{argument} must be an Acceptance (Exact(), Lantern(...), Typical(...)) or its name, got "
                        f"{type(value).__name__}")
    if modality is not None and modality not in ACCEPTANCE_RULES[value.name]:
        raise ValueError(f"{argument}={value.name!r} does not apply to {modality} decoding; {modality} takes "
                         f"{acceptances(modality)}")
    return value
