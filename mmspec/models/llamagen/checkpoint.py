"""Reading the official LlamaGen `.pt` files (https://github.com/FoundationVision/LlamaGen, model zoo in its README).

The training scripts save `{"model": state_dict, "optimizer": ..., "steps": ..., "args": ...}`; some released files keep
the weights under "ema", "module" (DeepSpeed) or "state_dict", or are a bare state dict. Parameter names need no
mapping: our modules use the official names.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

_WEIGHT_KEYS = ("ema", "model", "module", "state_dict")


def load_official_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The weights of an official LlamaGen checkpoint as a flat {name: tensor} dict on the CPU."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint path {str(path)!r} is not a file")
    # The training scripts also pickle their argparse.Namespace ("args"); allow exactly that beside tensors.
    with torch.serialization.safe_globals([argparse.Namespace]):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict):
        raise TypeError(f"{path} holds a {type(checkpoint).__name__}, expected a (dict of) state dict")
    for key in _WEIGHT_KEYS:
        if isinstance(checkpoint.get(key), dict):
            checkpoint = checkpoint[key]
            break
    state = {k.removeprefix("module."): v for k, v in checkpoint.items() if isinstance(v, torch.Tensor)}
    if not state:
        raise ValueError(f"{path} has no tensors under any of {_WEIGHT_KEYS} nor at the top level")
    return state
