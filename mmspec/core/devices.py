"""The `--device` / `--dtype` flags shared by the benchmarks (`mmspec.eval`) and the zoo's training scripts: one
parser of the device name, so a device the machine lacks is one usage line (exit 2) before anything loads."""

from __future__ import annotations

import argparse

import torch

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
