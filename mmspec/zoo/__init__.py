"""The embedded default models: tiny checkpoints trained offline by the scripts in this folder.

`mmspec/zoo/README.md` is the model card: data, sizes, training commands and held-out metrics.
"""

from __future__ import annotations

from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent
TEXT_TARGET = "pycode/target"
TEXT_DRAFT = "pycode/draft"
IMAGE_T2I = "shapes"  # LlamaGenPipeline layout (model_index.json + components)
MAR_C2I = "mar_shapes"  # MARPipeline layout: class-to-image target + draft MAR over a KL autoencoder's tokens
VIDEO_WORLD = "nextframe_shapes"  # NextFramePipeline layout: action-conditioned next-frame model + frame autoencoder
IMAGE_CLIP = "shapes_clip"  # CLIPModel + CLIPProcessor: the in-domain evaluation model of the image world


def zoo_path(name: str) -> Path:
    """Folder of the shipped zoo model `name` (e.g. "pycode/target"); raises if it is not installed."""
    path = ZOO_DIR / name
    if not (path / "config.json").exists() and not (path / "model_index.json").exists():
        pipelines = [p.parent for p in ZOO_DIR.glob("*/model_index.json")]
        models = [p.parent for p in ZOO_DIR.glob("*/*/config.json") if p.parent.parent not in pipelines]
        available = sorted(p.relative_to(ZOO_DIR).as_posix() for p in pipelines + models)
        raise ValueError(f"no zoo model named {name!r}; available: {available}")
    return path


def load_causal_lm(name_or_path: str | Path, dtype=None):
    """(model, tokenizer) from a zoo name ("pycode/target") or a local transformers folder, in eval mode.

    The zoo stores fp16 weights; they are loaded as float32 (CPU kernels are fastest and exact there) unless `dtype`
    says otherwise.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(name_or_path)
    if not path.exists():
        path = zoo_path(str(name_or_path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)
