"""The embedded default models: tiny checkpoints trained offline by the scripts in this folder.

`mmspec/zoo/README.md` is the model card: data, sizes, training commands and held-out metrics.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent
TEXT_TARGET = "pycode/target"
TEXT_DRAFT = "pycode/draft"
IMAGE_T2I = "shapes"  # LlamaGenPipeline layout (model_index.json + components)
MAR_C2I = "mar_shapes"  # MARPipeline layout: class-to-image target + draft MAR over a KL autoencoder's tokens
VIDEO_WORLD = "nextframe_shapes"  # NextFramePipeline layout: action-conditioned next-frame model + frame autoencoder
IMAGE_CLIP = "shapes_clip"  # CLIPModel + CLIPProcessor: the in-domain evaluation model of the image world
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name


def zoo_names() -> list[str]:
    """The shipped zoo models: saved pipelines (`model_index.json`) and single models (`config.json`); heads and
    adapters (`*_head/`, `*_adapter/`) are components that load with their target, not models of their own."""
    pipelines = [p.parent for p in ZOO_DIR.glob("*/model_index.json")]
    models = [p.parent for p in ZOO_DIR.glob("*/config.json")]
    models += [p.parent for p in ZOO_DIR.glob("*/*/config.json")
               if p.parent.parent not in pipelines and not p.parent.name.endswith(("_head", "_adapter"))]
    return sorted(p.relative_to(ZOO_DIR).as_posix() for p in pipelines + models)


def zoo_path(name: str) -> Path:
    """Folder of the shipped zoo model `name` (e.g. "pycode/target"); raises if it is not installed."""
    path = ZOO_DIR / name
    if not (path / "config.json").exists() and not (path / "model_index.json").exists():
        raise ValueError(f"no zoo model named {name!r}; available: {zoo_names()}")
    return path


def resolve_model(name_or_path: str | os.PathLike, argument: str = "model") -> Path | str:
    """Where to load a model from: an existing folder as given, else the zoo model of that name ("shapes",
    "pycode/target"), else a hub id ("owner/name") unchanged for the loader to fetch. Anything else is a ValueError that
    names `argument` and lists the zoo."""
    path = Path(name_or_path)
    try:
        if path.exists():
            return path
    except OSError:  # a name the file system refuses (too long, invalid): not a folder
        pass
    name = str(name_or_path)
    if name in zoo_names():
        return ZOO_DIR / name
    if isinstance(name_or_path, str) and HUB_ID.fullmatch(name):
        return name
    raise ValueError(f"{argument}: no folder at {name!r} and no zoo model of that name; zoo models: {zoo_names()}")


def load_causal_lm(name_or_path: str | Path, dtype=None):
    """(model, tokenizer) from a zoo name ("pycode/target") or a local transformers folder, in eval mode.

    The zoo stores fp16 weights; they are loaded as float32 (CPU kernels are fastest and exact there) unless `dtype`
    says otherwise.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)
