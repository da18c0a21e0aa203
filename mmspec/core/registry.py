"""Decoding methods and acceptance rules by name: what the CLI, the demo, the benchmarks and the pipelines' shorthand
(`decoding="sjd"`, `acceptance="lantern"`) enumerate instead of naming methods.

A component registers itself with `@register_decoding` (under its `modality` and `name`), a rule with
`@register_rule`; a modality's catalogue module imports its built-in components, so importing it fills the registry
(`mmspec.image.methods`, `mmspec.text.methods`, `mmspec.continuous.methods`, `mmspec.video.methods`; the built-in rules:
`mmspec.core.rules`). Your own method or rule registers the same way and is then taken by every front end. Nothing
here imports torch.

Plugins: a package that declares an entry point in the group `mmspec.plugins` (in its pyproject.toml,
`[project.entry-points."mmspec.plugins"]` then `my_drafter = "my_package.drafter"`), or a module named in the
environment variable `MMSPEC_PLUGINS` (comma-separated), is imported the first time the registry is read, so what it
registers reaches `mmspec text --method`, `mmspec generate --decoding`, the demo and the benchmarks too.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points
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
    load_plugins()
    return dict(_DECODINGS.get(modality, {}))


def rules(modality: str | None = None) -> dict[str, type]:
    """The registered acceptance rules, by name; with `modality`, those its decodings take."""
    load_plugins()
    return {name: rule for name, rule in _RULES.items() if modality is None or modality in rule.modalities}


PLUGIN_GROUP = "mmspec.plugins"
_plugins_loaded = False


def load_plugins() -> None:
    """Import the plugins once (see the module docstring): the `mmspec.plugins` entry points of the installed
    packages, then the modules `MMSPEC_PLUGINS` names. An ImportError names a plugin that fails to import."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True  # first: a plugin reading the registry while it imports must not import itself again
    named = [(f"entry point {point.name!r} ({point.value})", point.value)
             for point in entry_points(group=PLUGIN_GROUP)]
    named += [(f"{name!r} (MMSPEC_PLUGINS)", name) for name in os.environ.get("MMSPEC_PLUGINS", "").split(",")
              if name.strip()]
    for label, target in named:
        module = target.split(":")[0].strip()
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ImportError(f"mmspec plugin {label} failed to import: {error}") from error
