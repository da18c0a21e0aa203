"""The device flags every benchmark takes (`--device`, `--dtype`) and what a results file records about the machine."""

from __future__ import annotations

import argparse
import platform

import torch

from mmspec.core.measured import device_fingerprint

DTYPES = ("float32", "bfloat16", "float16")


def add_device_arguments(parser: argparse.ArgumentParser, dtype: bool = True) -> None:
    parser.add_argument("--device", default="cpu", help="where the models run: cpu, cuda or cuda:N (default cpu)")
    if dtype:
        parser.add_argument("--dtype", default="float32", choices=DTYPES, help="the models' weights (default float32)")


def resolve_device(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """The torch device `--device` names; a device this machine lacks is a usage error (exit 2, one line)."""
    try:
        device = torch.device(name)
    except RuntimeError:
        parser.error(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            parser.error(f"--device {name}: no CUDA device here (torch {torch.__version__}, "
                         f"CUDA {torch.version.cuda or 'not built in'})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            parser.error(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


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
