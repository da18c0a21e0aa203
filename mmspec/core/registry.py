"""Decoding methods and acceptance rules by name: what the CLI, the demo, the benchmarks and the pipelines' shorthand
(`decoding="sjd"`, `acceptance="lantern"`) enumerate instead of naming methods.

A component registers itself with `@register_decoding` (under its `modality` and `name`), a rule with
`@register_rule`; a modality's catalogue module imports its built-in components, so importing it fills the registry
(`mmspec.image.methods`, `mmspec.text.methods`, `mmspec.continuous.methods`, `mmspec.video.methods`; the built-in rules:
`mmspec.core.rules`). Your own method or rule registers the same way and is then taken by every front end. Nothing
here imports torch.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T", bound=type)

_DECODINGS: dict[str, dict[str, type]] = {}  # modality -> name -> component class, in registration order
_RULES: dict[str, type] = {}  # name -> acceptance rule class


def _add(table: dict[str, type], cls: type, what: str) -> None:
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier() or name != name.lower():
        raise ValueError(f"a registered {what} needs a lower-case identifier `name`, {cls.__qualname__} has {name!r}")
    known = table.get(name)
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"{what} name {name!r} is taken by {known.__module__}.{known.__qualname__}")
    table[name] = cls


def register_decoding(cls: T) -> T:
    """Class decorator: `cls` (a `DecodingComponent`) becomes `decodings(cls.modality)[cls.name]`."""
    _add(_DECODINGS.setdefault(cls.modality, {}), cls, f"{cls.modality} decoding")
    return cls


def register_rule(cls: T) -> T:
    """Class decorator: `cls` (an `AcceptanceRule`) becomes `rules()[cls.name]`."""
    _add(_RULES, cls, "acceptance rule")
    return cls


def unregister(cls: type) -> None:
    """Remove a registered component or rule (tests that register their own)."""
    for table in (*_DECODINGS.values(), _RULES):
        if table.get(getattr(cls, "name", None)) is cls:
            del table[cls.name]


def decodings(modality: str) -> dict[str, type]:
    """The registered decoding components of a modality ("image", "text", "continuous", "video"), by name."""
    return dict(_DECODINGS.get(modality, {}))


def rules(modality: str | None = None) -> dict[str, type]:
    """The registered acceptance rules, by name; with `modality`, those its decodings take."""
    return {name: rule for name, rule in _RULES.items() if modality is None or modality in rule.modalities}
