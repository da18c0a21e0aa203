"""Reading official training checkpoints (LlamaGen's `.pt`, MAR's `checkpoint-last.pth` and `kl16.ckpt`).

Training scripts save `{"model": state_dict, "optimizer": ..., "args": argparse.Namespace, ...}`; released files keep
the weights under "ema" / "model_ema", "model", "module" (DeepSpeed) or "state_dict", or are a bare state dict.
Parameter names need no mapping: our modules use the official names.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

WEIGHT_KEYS = ("ema", "model", "module", "state_dict")


def load_official_state_dict(path: str | Path, weight_keys: tuple[str, ...] = WEIGHT_KEYS) -> dict[str, torch.Tensor]:
    """The weights of an official checkpoint as a flat {name: tensor} dict on the CPU: the first of `weight_keys`
    that holds a dict, else the top level."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint path {str(path)!r} is not a file")
    # The training scripts also pickle their argparse.Namespace ("args"); allow exactly that beside tensors.
    with torch.serialization.safe_globals([argparse.Namespace]):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict):
        raise TypeError(f"{path} holds a {type(checkpoint).__name__}, expected a (dict of) state dict")
    for key in weight_keys:
        if isinstance(checkpoint.get(key), dict):
            checkpoint = checkpoint[key]
            break
    state = {k.removeprefix("module."): v for k, v in checkpoint.items() if isinstance(v, torch.Tensor)}
    if not state:
        raise ValueError(f"{path} has no tensors under any of {weight_keys} nor at the top level")
    return state
