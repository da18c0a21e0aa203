"""`TimedSpans`: forward hooks that count and time spans of a model's work inside a running pipeline, for the cost
model's projections (`mmspec.eval.cost_mar`, `mmspec.eval.cost_video`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from mmspec.core.stats import synchronize


class TimedSpans:
    """spans: name -> (opening module, closing module, record): a span opens at the opening module's forward pre-hook
    and closes at the closing module's forward hook (the same module for one call). Each opening appends
    `record(args)` (None without one) to `calls[name]`; `inside_s` sums the seconds of every span, the device
    synchronized at both ends so that they are the work's, not its launch's. `remove()` takes the hooks off and
    returns {name: calls, ..., "inside_s": seconds}."""

    def __init__(self, device: torch.device,
                 spans: dict[str, tuple[torch.nn.Module, torch.nn.Module, Callable[[tuple], object] | None]]):
        self.calls = {name: [] for name in spans}
        self.inside = 0.0

        def opener(name, record):
            def open_span(module, args):
                synchronize(device)
                self.began = time.perf_counter()
                self.calls[name].append(None if record is None else record(args))
            return open_span

        def close_span(module, args, output):
            synchronize(device)
            self.inside += time.perf_counter() - self.began

        self.handles = []
        for name, (opening, closing, record) in spans.items():
            self.handles += [opening.register_forward_pre_hook(opener(name, record)),
                             closing.register_forward_hook(close_span)]

    def remove(self) -> dict:
        for handle in self.handles:
            handle.remove()
        return {**self.calls, "inside_s": self.inside}
