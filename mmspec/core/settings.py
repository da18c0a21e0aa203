"""Settings spelled once. A decoding component's or an acceptance rule's dataclass fields carry what a user needs to
know about them — help, type, choices, range — and that one declaration validates the object, generates the `mmspec`
command's flags and the demo's controls, and checks the pipelines' shorthand keywords (`decoding="sjd", window=8`).

    @dataclass(frozen=True)
    class SJD(ImageDecoding):
        window: int = setting(16, "tokens scored per target forward", low=1)
        init: str = setting("horizontal", "how positions no window has reached are drafted", choices=INITS)

A field made with `runtime()` is not a setting: the pipeline supplies it when it runs (a draft model's adapter), and it
is neither saved nor a flag; it names the pipeline attribute that supplies it, so one generic step fills it
(`MMSpecPipeline.supplied`) and a new learned part costs one line:

    head: Any = runtime(supplied_by="{kind}_head")   # the pipeline's eagle_head or hydra_head, by the field `kind`

This module imports nothing but the standard library, so the CLI answers `--help` and refuses bad arguments before
torch loads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

SETTING = "mmspec.setting"  # the dataclasses metadata key of a field's `Spec`
RUNTIME = "mmspec.runtime"  # ... of a field that is supplied when run, never saved: its `Supply`
KINDS = {int: "an int", float: "a number", bool: "a bool", str: "a str", tuple: "a sequence of numbers"}


@dataclass(frozen=True)
class Spec:
    """What a setting accepts. kind: int, float (ints too), bool, str or tuple (of numbers: a JSON list loads as one);
    optional: None is allowed (it means "the method's own default", said in `help`); low / high: the range
    (`low_open` / `high_open`: the bound itself excluded); choices: the allowed values of a str setting; only: the
    values of another setting under which this one is read (`{"drafter": ("ngram",)}`): given otherwise, it is
    refused, not ignored."""

    help: str
    kind: type
    optional: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    only: dict[str, tuple] | None = None

    @property
    def bounds(self) -> str | None:
        """The range in words: '>= 1', '> 0', 'in [0, 1)'; None without one."""
        low, high = self.low, self.high
        if low is None and high is None:
            return None
        if high is None:
            return f"{'>' if self.low_open else '>='} {low:g}"
        if low is None:
            return f"{'<' if self.high_open else '<='} {high:g}"
        return f"in {'(' if self.low_open else '['}{low:g}, {high:g}{')' if self.high_open else ']'}"

    def check(self, name: str, value: Any) -> Any:
        """`value` as the setting stores it (a sequence as a tuple); TypeError / ValueError naming `name`, the value
        and what is allowed otherwise."""
        if value is None:
            if self.optional:
                return None
            raise TypeError(f"{name} must be {KINDS[self.kind]}, got None")
        if self.kind is tuple:
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise TypeError(f"{name} must be {KINDS[tuple]}, got {value!r}")
            value = tuple(value)
            for item in value:
                self.check_number(name, item, float)
            return value
        if self.kind in (int, float):
            return self.check_number(name, value, self.kind)
        if not isinstance(value, self.kind):
            raise TypeError(f"{name} must be {KINDS[self.kind]}, got {type(value).__name__}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{name} must be one of {self.choices}, got {value!r}")
        return value

    def check_number(self, name: str, value: Any, kind: type) -> Any:
        allowed = (int,) if kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, allowed):
            raise TypeError(f"{name} must be {KINDS[kind]}, got {type(value).__name__}")
        if isinstance(value, float) and math.isinf(value):
            within = f" {self.bounds}" if self.bounds else ""
            raise ValueError(f"{name} must be a finite number{within}, got {value:g}")
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if too_low or too_high or value != value:  # NaN is in no range
            shown = f"{value:g}" if isinstance(value, float) else repr(value)
            raise ValueError(f"{name} must be {self.bounds}, got {shown}")
        return value


def setting(default: Any, help: str, *, kind: type | None = None, low: float | None = None,
            high: float | None = None, low_open: bool = False, high_open: bool = False,
            choices: tuple[str, ...] | None = None, only: dict[str, tuple] | None = None) -> Any:
    """A dataclass field that is a setting (see the module docstring); `kind` defaults to the default's type (give it
    when the default is None, which then also makes None allowed)."""
    spec = Spec(help, kind or type(default), optional=default is None, low=low, high=high, low_open=low_open,
                high_open=high_open, choices=choices, only=only)
    if spec.kind not in KINDS:
        raise TypeError(f"a setting is one of {[k.__name__ for k in KINDS]}, got {spec.kind.__name__}")
    return dataclasses.field(default=default, metadata={SETTING: spec})


@dataclass(frozen=True)
class Supply:
    """Where a runtime field comes from. by: the pipeline attribute that supplies it, formatted with the object's
    fields ("{kind}_head"); a method there is called for it. only: the field is read only under these values of
    other fields (as a setting's `Spec.only`); unset elsewhere, nothing is missing."""

    by: str | None = None
    only: dict[str, tuple] | None = None

    def source(self, owner: Any) -> str | None:
        """The attribute name for `owner`, the object the field belongs to (`{kind}`: its `kind`)."""
        return None if self.by is None else self.by.format_map(_Attributes(owner))

    def read_by(self, owner: Any) -> bool:
        return self.only is None or all(getattr(owner, k) in v for k, v in self.only.items())


class _Attributes(dict):
    """An object's attributes as a mapping, for `str.format_map`."""

    def __init__(self, owner: Any):
        super().__init__()
        self.owner = owner

    def __missing__(self, key: str) -> Any:
        return getattr(self.owner, key)


def runtime(default: Any = None, supplied_by: str | None = None, only: dict[str, tuple] | None = None) -> Any:
    """A dataclass field the caller supplies when running (not a setting: not saved, not a flag, not compared);
    `supplied_by`, `only`: see `Supply`."""
    return dataclasses.field(default=default, repr=False, compare=False,
                             metadata={RUNTIME: Supply(supplied_by, only)})


def runtime_fields(obj: Any) -> dict[str, Supply]:
    """The runtime fields of a dataclass object (or class) and where each comes from, in field order."""
    return {f.name: f.metadata[RUNTIME] for f in dataclasses.fields(obj) if RUNTIME in f.metadata}


def specs(cls: type) -> dict[str, Spec]:
    """The `Spec` of every setting of a dataclass, in field order (fields made with `setting`)."""
    return {f.name: f.metadata[SETTING] for f in dataclasses.fields(cls) if SETTING in f.metadata}


def defaults(cls: type) -> dict[str, Any]:
    """The default of every setting of a dataclass, in field order."""
    return {f.name: f.default for f in dataclasses.fields(cls) if SETTING in f.metadata}


@dataclass(frozen=True)
class Settings:
    """Base of the objects whose fields are settings (decoding components, acceptance rules): validated from the
    fields' specs in the constructor, then by `check()` for what involves several settings; a saved config is
    `{"name": ..., settings...}` (`to_config`)."""

    name: ClassVar[str]

    def __post_init__(self):
        default = defaults(type(self))
        for field, spec in specs(type(self)).items():
            object.__setattr__(self, field, spec.check(field, getattr(self, field)))
            if spec.only is not None and getattr(self, field) != default[field]:
                for other, values in spec.only.items():
                    if getattr(self, other) not in values:
                        raise ValueError(f"{field} applies to {other} {' / '.join(map(repr, values))}, not "
                                         f"{getattr(self, other)!r}")
        self.check()

    def check(self) -> None:
        """Checks that involve several settings (raise ValueError naming them); none by default."""

    @classmethod
    def settings(cls) -> list[str]:
        """The names of the saved fields, in order: the settings and any other field that is not `runtime()`."""
        return [f.name for f in dataclasses.fields(cls) if RUNTIME not in f.metadata]

    def unsupplied(self) -> list[str]:
        """The names of the `runtime()` fields this object reads that are still unset (what a caller has to supply
        before it runs), its rule's among them (`acceptance.head`)."""
        missing = [name for name, supply in runtime_fields(self).items()
                   if getattr(self, name) is None and supply.read_by(self)]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Settings):
                missing += [f"{f.name}.{name}" for name in value.unsupplied()]
        return missing

    def reads(self, field: str) -> bool:
        """Whether this object reads setting `field` as it is set up (a setting `only` read under some values of
        another is not read under the others)."""
        spec = specs(type(self)).get(field)
        return spec is None or spec.only is None or all(getattr(self, k) in v for k, v in spec.only.items())

    def to_config(self) -> dict:
        """{"name": ..., settings...}, JSON-ready: what a saved pipeline stores."""
        config = {"name": self.name}
        for key in self.settings():
            value = getattr(self, key)
            config[key] = value.to_config() if isinstance(value, Settings) else list(value) if isinstance(
                value, tuple) else value
        return config

    def describe(self) -> str:
        """The class and the settings it reads, as the stats name a decoding (a setting that another one switches
        off is left out): `PromptLookup(draft_length=4, ...)`."""
        shown = ", ".join(f"{key}={_described(getattr(self, key))}" for key in self.settings() if self.reads(key))
        return f"{type(self).__name__}({shown})"


def _described(value: Any) -> str:
    return value.describe() if isinstance(value, Settings) else repr(value)
