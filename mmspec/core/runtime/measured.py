"""Measurements taken once per model and device and kept on disk: what the automatic choices of the pipelines
(`decoding="auto"`, `method="auto"`) read instead of measuring on every call.

A measurement is a flat `{name: seconds or rate}` dict under a key (e.g. "B=4 cfg"); the file it lives in is named by
fingerprints of the model and of the device, and holds them, so a file measured elsewhere is never reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import torch

from mmspec.core.paths import cache_root
from mmspec.core.stats import synchronize

PROBE_TOLERANCE = 0.3  # how far a probe's cost ratio to AR may stray from the cached one's before it is measured again
GAP = 2.0  # how many times slower (or faster) than predicted a run may go before its measurements are taken again

Choice = TypeVar("Choice")

# config entries that say where a model was loaded from, not what it computes: the same model read from another
# folder reuses its measurements
WHERE_IT_WAS_LOADED_FROM = ("_name_or_path", "_commit_hash", "_diffusers_version", "transformers_version")


def device_fingerprint(device: torch.device) -> dict:
    """What identifies the hardware a measurement was taken on: the accelerator's name, or the CPU's model and the
    threads torch uses, and torch's version."""
    if device.type == "cuda":
        capability = ".".join(map(str, torch.cuda.get_device_capability(device)))
        name, threads = f"{torch.cuda.get_device_name(device)} (sm {capability})", None
    else:
        name, threads = cpu_name(), torch.get_num_threads()
    return {"type": device.type, "name": name, "threads": threads, "cores": os.cpu_count(), "torch": torch.__version__}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def modules_fingerprint(modules: dict[str, torch.nn.Module | None], **extra) -> dict:
    """What identifies a model for its measurements: per module its class, config, parameter count, dtype and
    device, plus `extra` (e.g. an image span)."""
    described = {}
    for name, module in sorted(modules.items()):
        if module is None:
            continue
        config = getattr(module, "config", None)
        config = config.to_dict() if hasattr(config, "to_dict") else dict(config or {})
        config = {key: value for key, value in config.items() if key not in WHERE_IT_WAS_LOADED_FROM}
        first = next(module.parameters(), None)
        described[name] = {"class": type(module).__name__, "config": json.loads(json.dumps(config, default=str)),
                           "parameters": sum(p.numel() for p in module.parameters()),
                           "dtype": str(first.dtype) if first is not None else None,
                           "device": str(first.device) if first is not None else None}
    return {**extra, "modules": described}


Clock = Callable[[], float]  # seconds since an arbitrary start (time.perf_counter; a test's simulated machine)


def timings(call: Callable[[], object], device: torch.device, repeats: int, warmup: int = 0,
            after: Callable[[], object] | None = None, clock: Clock = time.perf_counter) -> list[float]:
    """Wall-clock seconds of each of `repeats` calls of `call()` after `warmup` untimed ones, the device
    synchronized before and after each (so the seconds are the work's); `after()` runs untimed after every call (a
    cache rollback that puts the state back)."""
    times = []
    for repeat in range(warmup + repeats):
        synchronize(device)
        began = clock()
        call()
        synchronize(device)
        if repeat >= warmup:
            times.append(clock() - began)
        if after is not None:
            after()
    return times


def median_seconds(call: Callable[[], object], device: torch.device, repeats: int, warmup: int = 0,
                   after: Callable[[], object] | None = None) -> float:
    """The median of `timings(call, device, repeats, warmup, after)`: what a benchmark reports."""
    return statistics.median(timings(call, device, repeats, warmup, after))


def settled(times: list[float]) -> float:
    """What a repeated timing costs on a quiet machine: the lower quartile of `times`. A busy machine (another job,
    a browser, a build) adds time to a call far more often than a clock takes any away, so the fastest quarter
    stands for the work; unlike the minimum, one spuriously short reading does not."""
    ordered = sorted(times)
    return ordered[(len(ordered) - 1) // 4]


def within(ratio: float, factor: float) -> bool:
    """Whether `ratio` lies in [1 / factor, factor]: two figures that agree up to `factor` either way."""
    return 1 / factor <= ratio <= factor


class Renewals:
    """Which cached measurements a policy takes again rather than reads: every key once after `remeasure_all()`
    (until it is measured anew), and the keys a run found off (`mark_stale`)."""

    def __init__(self):
        self.everything, self.fresh, self.stale = False, set(), set()

    def remeasure_all(self) -> None:
        self.everything, self.fresh = True, set()

    def mark_stale(self, *keys: str) -> None:
        self.stale.update(keys)

    def due(self, key: str) -> bool:
        """Whether `key` is to be measured again."""
        return key in self.stale or self.everything and key not in self.fresh

    def measured(self, key: str) -> None:
        self.fresh.add(key)
        self.stale.discard(key)


class HeldChoices(Generic[Choice]):
    """The choices an automatic policy holds, per key (model, batch size, sampling): the newest (`latest`), made
    again after `refresh()` (a run far off its prediction), and the one seeded calls keep (the first a call with a
    generator was given), so that a seed repeats its output on every call while calls without one follow the newest
    measurements. `forget()` drops both: the next calls, seeded or not, choose again."""

    def __init__(self):
        self.latest: dict[str, Choice] = {}
        self.seeded: dict[str, Choice] = {}

    def get(self, key: str, seeded: bool, choose: Callable[[], Choice]) -> Choice:
        """The choice for `key`: the one seeded calls keep (`seeded`), else the newest, made by `choose()` if none."""
        if seeded and key in self.seeded:
            return self.seeded[key]
        if key not in self.latest:
            self.latest[key] = choose()
        if seeded:
            self.seeded[key] = self.latest[key]
        return self.latest[key]

    def held(self, key: str) -> list[Choice]:
        """The choices that calls of `key` may run now (the newest, then the seeded calls' one)."""
        return [held[key] for held in (self.latest, self.seeded) if key in held]

    def refresh(self) -> None:
        """The next call without a generator (or the first with one) chooses again."""
        self.latest = {}

    def forget(self) -> None:
        self.latest, self.seeded = {}, {}


class MeasurementCache:
    """One JSON file per (model, device) under `folder` (default $MMSPEC_CACHE_DIR/<kind>):
    `{"model": fingerprint, "device": fingerprint, "entries": {key: {name: value}}}`. A file whose fingerprints differ
    from the caller's (a copy from another machine, an edited model) is ignored and rewritten."""

    def __init__(self, kind: str, folder: str | os.PathLike | None = None):
        self.folder = Path(folder) if folder is not None else cache_root() / kind

    def path(self, model_print: dict, device_print: dict) -> Path:
        digest = hashlib.sha256(json.dumps({"model": model_print, "device": device_print}, sort_keys=True).encode())
        return self.folder / f"{digest.hexdigest()[:20]}.json"

    def _read(self, model_print: dict, device_print: dict) -> dict:
        try:
            saved = json.loads(self.path(model_print, device_print).read_text())
        except (OSError, ValueError):
            return {}
        if saved.get("model") != model_print or saved.get("device") != device_print:
            return {}
        return saved.get("entries", {})

    def get(self, model_print: dict, device_print: dict, key: str) -> dict[str, float] | None:
        return self._read(model_print, device_print).get(key)

    def put(self, model_print: dict, device_print: dict, key: str, values: dict[str, float]) -> None:
        entries = self._read(model_print, device_print) | {key: values}
        path = self.path(model_print, device_print)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")  # concurrent writers never see half a file
        partial.write_text(json.dumps({"model": model_print, "device": device_print, "entries": entries}, indent=1))
        os.replace(partial, path)
