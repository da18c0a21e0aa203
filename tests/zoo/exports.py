"""Checks of a trainer's exported pipeline folder, shared by the zoo's training tests."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def check_autoencoder_kept(shipped: Path, exported: Path, metrics_key: str, transformer: str) -> dict:
    """A retrain with --vae-from exported the shipped autoencoder unchanged with its metrics, and names its transformer
    ["mmspec", `transformer`]; returns the exported training metrics."""
    stored = [load_file(folder / "vae" / "diffusion_pytorch_model.safetensors") for folder in (shipped, exported)]
    assert stored[0].keys() == stored[1].keys() and all(torch.equal(stored[0][k], stored[1][k]) for k in stored[0])
    assert json.loads((exported / "model_index.json").read_text())["transformer"] == ["mmspec", transformer]
    metrics = [json.loads((folder / "training_metrics.json").read_text()) for folder in (shipped, exported)]
    assert metrics[0][metrics_key] == metrics[1][metrics_key]
    return metrics[1]
