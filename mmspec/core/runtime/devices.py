"""The `--device` / `--dtype` flags shared by the `mmspec` command, the demo, the benchmarks (`mmspec.eval`) and the
zoo's training scripts: one parser of the device name, so a device the machine lacks is one usage line (exit 2)
before anything loads. torch is imported only to ask it: with a CPU build, a CUDA device is refused from torch's
version file, in a tenth of a second."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")
DEVICE_HELP = "where the models run: auto (CUDA when present, else the CPU), cpu, cuda or cuda:N"


def add_device_arguments(parser: argparse.ArgumentParser, dtype: bool = True, default: str = "cpu") -> None:
    parser.add_argument("--device", default=default, help=f"{DEVICE_HELP} (default {default})")
    if dtype:
        parser.add_argument("--dtype", default="float32", choices=DTYPES, help="the models' weights (default float32)")


def torch_build() -> tuple[str, str | None] | None:
    """(torch's version, the CUDA version it was built with or None) read from its version file without importing
    it; None if the file does not say."""
    spec = importlib.util.find_spec("torch")
    version_file = Path(spec.origin).with_name("version.py") if spec and spec.origin else None
    if version_file is None or not version_file.is_file():
        return None
    fields = dict(re.findall(r"^(__version__|cuda)\s*(?::[^=]*)?=\s*(.+?)\s*$", version_file.read_text(), re.M))
    if "__version__" not in fields or "cuda" not in fields:
        return None
    cuda = fields["cuda"].strip("'\"")
    return fields["__version__"].strip("'\""), None if cuda == "None" else cuda


def parse_device(name: str) -> torch.device:
    """The torch device `--device` names ("auto": CUDA when present, else the CPU); a ValueError naming the flag for
    a name torch does not know or a device this machine lacks."""
    if not re.fullmatch(r"auto|cpu(:\d+)?|cuda(:\d+)?", name):  # refused without importing torch
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    build = torch_build()
    if build is not None and build[1] is None and re.fullmatch(r"cuda(:\d+)?", name):  # a CPU build: no import
        raise ValueError(f"--device {name}: no CUDA device here (torch {build[0]}, CUDA not built in)")
    import torch  # noqa: F811 (imported at run time only here)

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    check_available(device, f"--device {name}")
    return device


def check_available(device: torch.device, what: str) -> None:
    """A ValueError starting with `what` if this machine lacks `device` (a CUDA device, or that CUDA index)."""
    import torch  # noqa: F811 (imported at run time only here)

    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{what}: no CUDA device here (torch {torch.__version__}, "
                             f"CUDA {torch.version.cuda or 'not built in'})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{what}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def resolve_device(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """`parse_device`, a bad name being a usage error (exit 2, one line)."""
    try:
        return parse_device(name)
    except ValueError as error:
        parser.error(str(error))
