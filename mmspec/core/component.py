"""Decoding components: how a pipeline generates, held like a diffusers scheduler.

A component is a frozen dataclass of its settings (`SJD(window=16, acceptance=Exact())`, fields made with
`mmspec.core.settings.setting`), validated once in its constructor, registered by name for its modality
(`mmspec.core.registry`). It saves as a plain dict in the pipeline's `model_index.json` (`to_config`), is rebuilt from
one (`component_from`), can be swapped on a loaded pipeline (`pipe.decoding = ...`) or per call (`pipe(...,
decoding=)`), and is called the same way by every pipeline of its modality: `component.run(...)`. Each modality's base
class (`mmspec.image.methods.ImageDecoding`, `mmspec.text.methods.TextDecoding`, ...) states that contract; a
component of a speculative method also builds the step its modality's loop repeats.

Component modules import nothing heavy, so the CLI builds its flags from their fields before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from mmspec.core.registry import decodings, rules
from mmspec.core.rules.base import AcceptanceRule, TokenTest, rule_from
from mmspec.core.settings import Settings, specs


@dataclass(frozen=True)
class DecodingComponent(Settings):
    """Base of the decoding components. `name`: the registered name (the shorthand `decoding="sjd"`); `modality`:
    whose pipelines run it, and which acceptance rules its `acceptance` field (if it has one) may take."""

    name: ClassVar[str]
    modality: ClassVar[str]

    def __post_init__(self):
        if any(f.name == "acceptance" for f in fields(self)):
            object.__setattr__(self, "acceptance", rule_from(self.acceptance, self.modality))
        super().__post_init__()

    @property
    def lossless(self) -> bool:
        """Whether the output law is the model's (the acceptance rule's, for speculative components)."""
        acceptance = getattr(self, "acceptance", None)
        return acceptance is None or acceptance.lossless

    @property
    def law(self) -> str:
        """"lossless" or "lossy" (`lossless`), as the stats report it."""
        return "lossless" if self.lossless else "lossy"

    def check_sampling(self, temperature: float) -> None:
        """Refuse sampling settings this decoding cannot work with, before any model loads (LANTERN at temperature
        0); the acceptance rule's check by default."""
        acceptance = getattr(self, "acceptance", None)
        if isinstance(acceptance, AcceptanceRule):
            acceptance.check_sampling(temperature)

    def bind(self, model: Any, vocab_size: int) -> TokenTest | None:
        """The acceptance rule bound to `model` (`AcceptanceRule.bind`; LANTERN's neighbour table), None for a
        decoding without one. Decodings bind before their first forward, so a setting the model cannot take costs
        no forward."""
        acceptance = getattr(self, "acceptance", None)
        return acceptance.bind(model, vocab_size) if isinstance(acceptance, AcceptanceRule) else None


def rule_settings(modality: str) -> dict[str, tuple[str, str]]:
    """The flat spellings of the rules' settings a modality's decodings take: `"lantern_delta"` -> ("lantern",
    "delta") (a pipeline keyword, a CLI flag `--lantern-delta`)."""
    return {f"{name}_{field}": (name, field) for name, rule in rules(modality).items() for field in specs(rule)}


def setting_keywords(modality: str) -> tuple[str, ...]:
    """Every name a call may give a `modality` decoding's setting under, in order: the fields of its registered
    decodings, then the rules' flat spellings (`lantern_k`)."""
    fields = {name: None for cls in decodings(modality).values() for name in cls.settings()}
    return (*fields, *rule_settings(modality))


def acceptance_from(modality: str, acceptance: AcceptanceRule | str | dict | None = None,
                    **flat) -> AcceptanceRule | None:
    """The `acceptance=` object of a call's shorthand: a rule object, name or config dict, and the named rule's
    settings in their flat spelling (`acceptance="lantern", lantern_k=100`; see `rule_settings`). None if nothing is
    given. A flat setting of another rule than the one named is refused, as is a rule object with flat settings."""
    given = {key: value for key, value in flat.items() if value is not None}
    if acceptance is None and not given:
        return None
    rule = rule_from("exact" if acceptance is None else acceptance, modality)
    spellings = rule_settings(modality)
    others = sorted(key for key in given if spellings[key][0] != rule.name)
    if others:
        named = {spellings[key][0] for key in others}
        raise ValueError(f"{others} only apply to acceptance={' / '.join(map(repr, sorted(named)))}, got "
                         f"acceptance={rule.name!r}")
    if given and not isinstance(acceptance, str):
        raise ValueError(f"give {rule.name}'s settings in {type(rule).__name__}(...) or as {rule.name}_*, not both")
    return type(rule)(**{spellings[key][1]: value for key, value in given.items()}) if given else rule


def component_from(value: DecodingComponent | str | dict, modality: str, argument: str = "decoding",
                   names: tuple[str, ...] | None = None, **options) -> DecodingComponent:
    """A component of `modality` from an object, a registered name plus its settings as keyword arguments (`"sjd",
    window=32`, with the rule's flat spellings: `acceptance="lantern", lantern_k=100`), or a saved config dict.
    Options left as None take the component's defaults. A component of another modality is this modality's component
    of the same config (`AR()` is every pipeline's AR). `names`: what the caller accepts by name, for the error
    message (default: the registry's names)."""
    registry = decodings(modality)
    options = {key: v for key, v in options.items() if v is not None}
    flat = {key: options.pop(key) for key in rule_settings(modality) if key in options}
    if "acceptance" in options or flat:
        options["acceptance"] = acceptance_from(modality, options.pop("acceptance", None), **flat)
    if isinstance(value, DecodingComponent) and value.modality != modality:
        if options:
            raise ValueError(f"options {sorted(options)} only apply to a {argument} given by name, not to {value!r}")
        value = value.to_config()
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
        accepted = set(cls.settings())
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise ValueError(f"{argument}={value!r} does not take {unknown}; its options are "
                             f"{sorted(accepted) or 'none'}")
        return cls(**options)
    if not isinstance(value, DecodingComponent):
        classes = [c.__name__ for c in registry.values()]
        raise TypeError(f"{argument} must be a name, a config dict or one of {classes}, got {type(value).__name__}")
    if options:
        raise ValueError(f"options {sorted(options)} only apply to a {argument} given by name, not to {value!r}")
    return value
