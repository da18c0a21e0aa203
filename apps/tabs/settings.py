"""Demo controls generated from the settings of the registered decodings and rules (`mmspec.core.registry`): a
slider, number box, dropdown or checkbox per setting, typed and bounded by its spec, labelled with its help. A method
or rule registered by the user gets its controls too; no tab names a setting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from mmspec.core.component import rule_settings
from mmspec.core.registry import decodings, rules
from mmspec.core.settings import Spec, defaults, specs


@dataclass(frozen=True)
class Control:
    """The control of one setting. key: the name the handler gets it under (`sjd_window`, `lantern_delta`); owner:
    the decoding or rule it belongs to; field: the setting's name in that owner."""

    key: str
    owner: str
    field: str
    spec: Spec
    default: Any

    @property
    def label(self) -> str:
        return f"{self.owner} {self.field.replace('_', ' ')}"

    def build(self, visible: bool) -> gr.components.Component:
        """The Gradio component: bounded numbers as sliders, others as number boxes; choices as a dropdown."""
        spec, common = self.spec, {"label": self.label, "info": self.spec.help, "visible": visible,
                                   "elem_id": f"setting-{self.key.replace('_', '-')}"}
        if spec.kind is bool:
            return gr.Checkbox(value=self.default, **common)
        if spec.choices:
            return gr.Dropdown(list(spec.choices), value=self.default, **common)
        if spec.kind is tuple:
            value = "" if self.default is None else ", ".join(map(str, self.default))
            return gr.Textbox(value=value, placeholder="numbers, comma-separated (empty: none)", **common)
        if spec.optional:  # an empty box is the method's own default (a number box cannot be empty)
            return gr.Textbox(value="" if self.default is None else str(self.default), placeholder="empty: default",
                              **common)
        if spec.low is not None and spec.high is not None and self.default is not None:
            step = 1 if spec.kind is int else 0.01
            return gr.Slider(spec.low, spec.high, value=self.default, step=step, **common)
        return gr.Number(value=self.default, precision=0 if spec.kind is int else None, minimum=spec.low,
                         maximum=spec.high, **common)

    def read(self, value: Any) -> Any:
        """The control's value as the setting takes it (None where an optional setting is left empty); ValueError
        naming the control for what it cannot be."""
        if value is None or value == "":
            return None if self.spec.optional else self.default
        if self.spec.kind is tuple:
            try:
                return tuple(float(part) for part in str(value).split(","))
            except ValueError:
                raise ValueError(f"{self.label} must be numbers separated by commas, got {value!r}") from None
        if self.spec.kind in (int, float):
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{self.label} must be a number, got {value!r}") from None
            if self.spec.kind is int:
                if number != int(number):
                    raise ValueError(f"{self.label} must be a whole number, got {value}")
                return int(number)
            return number
        return value


def decoding_controls(modality: str, skip: tuple[str, ...] = ("ar",), fields_skipped: tuple[str, ...] = ()
                      ) -> list[Control]:
    """A control per setting of every registered decoding of `modality` but `skip`, keyed `<decoding>_<field>`."""
    return [Control(f"{name}_{field}", name, field, spec, defaults(cls)[field])
            for name, cls in decodings(modality).items() if name not in skip
            for field, spec in specs(cls).items() if field not in fields_skipped]


def rule_controls(modality: str) -> list[Control]:
    """A control per setting of every rule `modality`'s decodings take, keyed by its flat spelling (`lantern_k`)."""
    found = []
    for key, (rule, field) in rule_settings(modality).items():
        cls = rules(modality)[rule]
        found.append(Control(key, rule, field, specs(cls)[field], defaults(cls)[field]))
    return found
