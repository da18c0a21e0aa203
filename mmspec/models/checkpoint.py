"""Reading official training checkpoints (LlamaGen's `.pt`, MAR's `checkpoint-last.pth` and `kl16.ckpt`).

Training scripts save `{"model": state_dict, "optimizer": ..., "args": argparse.Namespace, ...}`; released files keep
the weights under "model", "ema" / "model_ema", "module" (DeepSpeed) or "state_dict", or are a bare state dict. Which
set a family's own sampling scripts read is the family's default (LlamaGen: "model"; MAR: "model_ema"); the other is
an option. Parameter names need no mapping: our modules use the official names.

Released files also carry entries that are not weights of the model (a codebook-usage counter, a training loss's
parameters, KV-cache buffers of a model saved after sampling). The authors' loaders read them non-strictly; we drop
the entries a family declares as known extras, say so in the log, and refuse everything else: a missing weight, or an
entry nobody declared, is named in the error.
"""

from __future__ import annotations

import argparse
import fnmatch
import logging
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

WEIGHT_KEYS = ("model", "ema", "model_ema", "module", "state_dict")
SHOWN = 5  # names an error quotes before "and N more"


def load_checkpoint(path: str | Path) -> dict:
    """An official checkpoint file as the training script pickled it (tensors, dicts and its argparse.Namespace)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint path {str(path)!r} is not a file")
    # The training scripts also pickle their argparse.Namespace ("args"); allow exactly that beside tensors.
    with torch.serialization.safe_globals([argparse.Namespace]):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict):
        raise TypeError(f"{path} holds a {type(checkpoint).__name__}, expected a (dict of) state dict")
    return checkpoint


def load_official_state_dict(path: str | Path, weight_keys: tuple[str, ...] = WEIGHT_KEYS,
                             weights: str | None = None) -> dict[str, torch.Tensor]:
    """The weights of an official checkpoint file as a flat {name: tensor} dict on the CPU (`state_dict_of`)."""
    return state_dict_of(load_checkpoint(path), Path(path).name, weight_keys, weights)


def state_dict_of(checkpoint: dict, source: str, weight_keys: tuple[str, ...] = WEIGHT_KEYS,
                  weights: str | None = None) -> dict[str, torch.Tensor]:
    """The weights of a loaded checkpoint (`load_checkpoint`) as a flat {name: tensor} dict.

    weights: the entry to read ("model", "ema", "model_ema", ...), which must be there; None = the first of
    `weight_keys` that holds a dict, else the top level (a bare state dict). `source` names the file in errors.
    """
    entries = sorted(k for k, v in checkpoint.items() if isinstance(v, dict))
    if weights is not None:
        if not isinstance(checkpoint.get(weights), dict):
            raise ValueError(f"weights={weights!r}: {source} has no such entry; its weight entries are {entries}")
        checkpoint = checkpoint[weights]
    else:
        for key in weight_keys:
            if isinstance(checkpoint.get(key), dict):
                checkpoint = checkpoint[key]
                break
    state = {k.removeprefix("module."): v for k, v in checkpoint.items() if isinstance(v, torch.Tensor)}
    if not state:
        raise ValueError(f"{source} has no tensors under any of {weight_keys} nor at the top level")
    return state


def named(keys: list[str]) -> str:
    """The first few of `keys`, and how many more."""
    more = len(keys) - SHOWN
    return ", ".join(keys[:SHOWN]) + (f" and {more} more" if more > 0 else "")


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str,
                 known_extras: tuple[str, ...] = (), what: str | None = None) -> None:
    """Load `state` into `model`, every weight required.

    known_extras: glob patterns of entries released files carry that are not the model's weights (`loss.*`); they
    are dropped and listed in the log. A missing weight, any other entry or a tensor of another shape raises a
    ValueError naming it (`source` names the file in the message, `what` the model: default its class name).
    """
    own = model.state_dict()
    expected = set(own)
    extras = sorted(k for k in state if k not in expected)
    ignored = [k for k in extras if any(fnmatch.fnmatchcase(k, pattern) for pattern in known_extras)]
    unknown = sorted(set(extras) - set(ignored))
    missing = sorted(expected - set(state))
    if missing:
        raise ValueError(f"{source} lacks {len(missing)} weight(s) of this {type(model).__name__}: {named(missing)}")
    if unknown:
        raise ValueError(f"{source} has {len(unknown)} entr{'y' if len(unknown) == 1 else 'ies'} this "
                         f"{type(model).__name__} does not have: {named(unknown)}")
    reshaped = [k for k in sorted(expected) if state[k].shape != own[k].shape]
    if reshaped:
        key = reshaped[0]
        raise ValueError(f"{source} is not a {what or type(model).__name__} of this configuration: {key} is "
                         f"{list(state[key].shape)} in the file, {list(own[key].shape)} here ({len(reshaped)} tensors "
                         "of another shape)")
    if ignored:
        logger.info("%s: ignored %d entries that are not %s weights: %s", source, len(ignored),
                    type(model).__name__, named(ignored))
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=True)
