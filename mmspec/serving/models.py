"""What a service serves: each model's id, modality ("image" or "text") and folder, told from the folder alone (no
torch, no Ray: `mmspec serve` checks its flags with it before anything loads), and how a replica loads it; and where
replicas and workers run: the Ray cluster joined, each one's share of its GPUs."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from mmspec.zoo import IMAGE_T2I, TEXT_DRAFT, TEXT_TARGET, resolve_model

DEFAULT_MODELS = (IMAGE_T2I, TEXT_TARGET)
TEXT_PIPELINE = "SpeculativeTextPipeline"


@dataclass(frozen=True)
class ServedModel:
    """A model of the service: `id` (what requests name in `model`), `modality`, `path` (a folder), `draft` (a text
    target's draft folder, or None), and where a replica puts it: `device`, `dtype` (a torch dtype's name) and
    `threads` (torch's CPU threads in each replica)."""

    id: str
    modality: str
    path: str
    draft: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 1

    def load(self):
        """The pipeline, on its device, progress bars off (a replica's log is not a terminal)."""
        import torch

        torch.set_num_threads(self.threads)
        dtype = getattr(torch, self.dtype)
        if self.modality == "image":
            from mmspec.pipelines.auto import AutoARImagePipeline

            pipe = AutoARImagePipeline.from_pretrained(self.path, dtype=dtype)
        else:
            from mmspec.pipelines.text import SpeculativeTextPipeline

            pipe = SpeculativeTextPipeline.from_pretrained(self.path, draft=self.draft, dtype=dtype)
        pipe.set_progress_bar_config(disable=True)
        return pipe.to(self.device)


def modality_of(folder: Path) -> str:
    """"image" for a saved image pipeline or an image family's checkpoint, "text" for a saved text pipeline or a
    causal LM's folder; ValueError for anything else."""
    from mmspec.pipelines.auto import CHECKPOINT_FAMILIES, saved_class_name  # argparse and json: no torch

    if (folder / "model_index.json").is_file():
        return "text" if saved_class_name(folder) == TEXT_PIPELINE else "image"
    if (folder / "config.json").is_file():
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        return "image" if model_type in CHECKPOINT_FAMILIES else "text"
    if any(folder.glob("t2i_*.pt")):
        return "image"
    raise ValueError(f"{folder} holds neither a saved pipeline (model_index.json) nor a checkpoint (config.json)")


def served_model(name: str, draft: str | None = None, **placement) -> ServedModel:
    """The model `name` (a zoo name or a folder) as the service serves it; the embedded text target gets the embedded
    draft unless `draft` names another. ValueError naming the model otherwise."""
    path = resolve_model(name, argument="--model")
    if not Path(path).is_dir():
        raise ValueError(f"--model {name!r}: a served model is a zoo name or a folder (hub ids are not fetched)")
    modality = modality_of(Path(path))
    if modality == "text" and draft is None and name == TEXT_TARGET:
        draft = TEXT_DRAFT
    if draft is not None:
        if modality != "text":
            raise ValueError(f"--draft applies to a text model; {name!r} is an image model")
        draft = str(resolve_model(draft, argument="--draft"))
    model_id = re.sub(r"[^\w.-]+", "-", name if not Path(name).is_dir() else Path(name).resolve().name).strip("-")
    return ServedModel(model_id, modality, str(path), draft, **placement)


def gpu_share(replicas: int, gpus: float) -> float:
    """The GPUs each of `replicas` replicas (or workers) holds where the cluster has `gpus`: one each where there are
    enough, else an equal share of what there is (two replicas on one GPU hold half each), 0 without GPUs."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    return min(1.0, gpus / replicas)


# Ray Serve kills an HTTP proxy that is not ready within 5 s, and serve.start then fails on the killed proxy rather
# than waiting for its restart: on a busy machine a new local instance would not start.
PROXY_READY_TIMEOUT = ("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")


def connect(address: str | None = None) -> float:
    """Join the Ray cluster at `address` (None: start a local one, whose proxies get PROXY_READY_TIMEOUT unless the
    environment sets it) unless this process has; the GPUs it has."""
    import ray

    if not ray.is_initialized():
        if address is None:
            os.environ.setdefault(*PROXY_READY_TIMEOUT)  # a local instance's processes inherit this environment
        ray.init(address=address, log_to_driver=False)
    return ray.cluster_resources().get("GPU", 0.0)
