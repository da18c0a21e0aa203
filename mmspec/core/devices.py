"""The `--device` / `--dtype` flags shared by the `mmspec` command, the demo, the benchmarks (`mmspec.eval`) and the
zoo's training scripts: one parser of the device name, so a device the machine lacks is one usage line (exit 2)
before anything loads."""

from __future__ import annotations

import argparse

import torch

DTYPES = ("float32", "bfloat16", "float16")
DEVICE_HELP = "where the models run: auto (CUDA when present, else the CPU), cpu, cuda or cuda:N"


def add_device_arguments(parser: argparse.ArgumentParser, dtype: bool = True, default: str = "cpu") -> None:
    parser.add_argument("--device", default=default, help=f"{DEVICE_HELP} (default {default})")
    if dtype:
        parser.add_argument("--dtype", default="float32", choices=DTYPES, help="the models' weights (default float32)")


def parse_device(name: str) -> torch.device:
    """The torch device `--device` names ("auto": CUDA when present, else the CPU); a ValueError naming the flag for
    a name torch does not know or a device this machine lacks."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: no CUDA device here (torch {torch.__version__}, "
                             f"CUDA {torch.version.cuda or 'not built in'})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def resolve_device(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """`parse_device`, a bad name being a usage error (exit 2, one line)."""
    try:
        return parse_device(name)
    except ValueError as error:
        parser.error(str(error))
