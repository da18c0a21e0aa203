"""Decoding components: how a pipeline generates, held like a diffusers scheduler.

A component is a frozen dataclass of its settings (`SJD(window=16, acceptance=Exact())`), validated once in its
constructor. It saves as a plain dict in the pipeline's `model_index.json` (`to_config`), is rebuilt from one
(`component_from`), can be swapped on a loaded pipeline (`pipe.decoding = ...`) or per call (`pipe(..., decoding=)`),
and is called with a model to decode. Fields marked `runtime` (a draft model's adapter, which the pipeline supplies)
are not settings and are not saved.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from mmspec.core.acceptance import Acceptance, acceptance_from

RUNTIME = {"runtime": True}  # dataclasses.field(metadata=RUNTIME): supplied when run, never saved
# on_step(step, n_done, tensors) -> whether to stop: the per-step hook a decoding loop calls after every target pass
# (the pipelines' `callback_on_step_end`); n_done: what every row has finished (tokens, frames)
StepHook = Callable[[int, int, dict[str, Any]], bool]


@dataclass(frozen=True)
class DecodingComponent:
    """Base of the decoding components. `name`: the registered name (the shorthand `decoding="sjd"`); `modality`:
    which acceptance rules its `acceptance` field may take (see `mmspec.options.ACCEPTANCE_RULES`)."""

    name: ClassVar[str]
    modality: ClassVar[str]

    def __post_init__(self):
        if "acceptance" in self.settings():
            object.__setattr__(self, "acceptance", acceptance_from(self.acceptance, self.modality))

    @property
    def lossless(self) -> bool:
        """Whether the output law is the model's (the acceptance rule's, for speculative components)."""
        acceptance = getattr(self, "acceptance", None)
        return acceptance is None or acceptance.lossless

    @property
    def law(self) -> str:
        """"lossless" or "lossy" (`lossless`), as the stats report it."""
        return "lossless" if self.lossless else "lossy"

    @classmethod
    def settings(cls) -> list[str]:
        """The saved fields, in order."""
        return [f.name for f in dataclasses.fields(cls) if not f.metadata.get("runtime")]

    def check_count(self, field: str, meaning: str) -> None:
        """Raise unless setting `field` is an int >= 1 (`meaning` says what it counts, for the message)."""
        value = getattr(self, field)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{field} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{field} must be >= 1 ({meaning}), got {value}")

    def check_choice(self, field: str, choices: tuple[str, ...]) -> None:
        """Raise unless setting `field` is one of `choices`."""
        value = getattr(self, field)
        if value not in choices:
            raise ValueError(f"{field} must be one of {choices}, got {value!r}")

    def to_config(self) -> dict:
        """{"name": ..., settings...}, JSON-ready: what `save_pretrained` writes."""
        config = {"name": self.name}
        for key in self.settings():
            value = getattr(self, key)
            config[key] = value.to_config() if isinstance(value, Acceptance) else value
        return config


def component_from(value: DecodingComponent | str | dict, registry: dict[str, type[DecodingComponent]],
                   argument: str = "decoding", names: tuple[str, ...] | None = None, **options) -> DecodingComponent:
    """A component from an object, a registered name plus its settings as keyword arguments (`"sjd", window=32`), or
    a saved config dict. Options left as None take the component's defaults. `names`: what the caller accepts by
    name, for the error message (default: the registry's names)."""
    options = {key: v for key, v in options.items() if v is not None}
    if isinstance(value, dict):
        if options:
            raise ValueError(f"options {sorted(options)} do not combine with a {argument} config dict")
        options = dict(value)
        value = options.pop("name", None)
        if not isinstance(value, str):
            raise ValueError(f"a {argument} config must name its component ('name': one of {tuple(registry)})")
    if isinstance(value, str):
        if value not in registry:
            raise ValueError(f"{argument} must be one of {names or tuple(registry)} or a decoding object, got "
                             f"{value!r}")
        cls = registry[value]
        accepted = set(inspect.signature(cls).parameters)
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise ValueError(f"{argument}={value!r} does not take {unknown}; its options are "
                             f"{sorted(accepted) or 'none'}")
        return cls(**options)
    if not isinstance(value, tuple(registry.values())):
        classes = [c.__name__ for c in registry.values()]
        raise TypeError(f"{argument} must be a name, a config dict or one of {classes}, got {type(value).__name__}")
    if options:
        raise ValueError(f"options {sorted(options)} only apply to a {argument} given by name, not to {value!r}")
    return value
