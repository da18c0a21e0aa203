"""What a results file records about the machine, how it is written, and the seeded generators a benchmark draws with
on its device (the `--device` / `--dtype` flags themselves: `mmspec.core.runtime.devices`)."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from mmspec.core.runtime.measured import device_fingerprint


def machine(device: torch.device) -> dict:
    """What a results file records of where it ran: `device` (the hardware's fingerprint, as the cost-curve cache
    keys it) and `environment` (python, torch and CUDA versions, and the GPU's name on CUDA)."""
    environment = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.type == "cuda":
        environment["gpu"] = torch.cuda.get_device_name(device)
    return {"device": device_fingerprint(device), "environment": environment}


def seeded(device: torch.device, seeds) -> list[torch.Generator]:
    """One generator per seed on `device` (the samplers draw on the device the model runs on)."""
    return [torch.Generator(device).manual_seed(seed) for seed in seeds]


def write_json(path: str | Path, report: dict) -> None:
    """A benchmark's report as JSON at `path`, its folder made if need be."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1) + "\n")
