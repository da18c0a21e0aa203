"""Lazy public names for a package `__init__` (PEP 562): `__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)`
imports a name's module on first use, so importing the package loads neither torch nor model code."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package` whose public names are `exports`: name -> the module defining it. A
    name is looked up once, then cached in the package's namespace (the next lookup is a plain attribute)."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *exports})

    return __getattr__, __dir__
