"""`AutoARImagePipeline`: one `from_pretrained` for every discrete-image family — a zoo name, or a directory whose
pipeline class is read from it (`model_index.json` of a saved pipeline, `config.json` of a transformers checkpoint:
Janus, Emu3, Lumina-mGPT / Chameleon, or LlamaGen's released `t2i_*.pt` files). `add_image_model_arguments` and
`image_pipeline_from_arguments` give command lines (`mmspec generate`, `mmspec.eval.quality`) the same options."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from mmspec.core.registry import load_plugins
from mmspec.zoo import IMAGE_T2I, resolve_model

# pipeline class name -> module (or the class, registered); transformers checkpoint model_type -> pipeline class name
PIPELINES: dict[str, str | type] = {
    "LlamaGenPipeline": "mmspec.pipelines.llamagen",
    "JanusPipeline": "mmspec.pipelines.janus",
    "Emu3Pipeline": "mmspec.pipelines.emu3",
    "LuminaMGPTPipeline": "mmspec.pipelines.lumina_mgpt",
}
CHECKPOINT_FAMILIES = {"janus": "JanusPipeline", "emu3": "Emu3Pipeline", "chameleon": "LuminaMGPTPipeline"}


def register_image_pipeline(cls: type) -> type:
    """Make `AutoARImagePipeline` (and `mmspec generate --model`) load a family's pipeline `cls` (an
    `ARImagePipeline`) from outside the library: a saved folder whose model_index.json names it, and, if it sets
    `checkpoint_model_type`, the transformers checkpoints of that model type. Usable as a class decorator; ValueError
    if another class has its name or model type."""
    if not (isinstance(cls, type) and hasattr(cls, "image_adapter") and hasattr(cls, "from_pretrained")):
        raise TypeError(f"register_image_pipeline takes an ARImagePipeline subclass, got {cls!r}")
    model_type = cls.checkpoint_model_type
    if cls.__name__ in PIPELINES or (model_type is not None and model_type in CHECKPOINT_FAMILIES):
        raise ValueError(f"an image pipeline named {cls.__name__} (or loading {model_type!r} checkpoints) is already "
                         "registered")
    PIPELINES[cls.__name__] = cls
    if model_type is not None:
        CHECKPOINT_FAMILIES[model_type] = cls.__name__
    return cls


def unregister_image_pipeline(cls: type) -> None:
    """Undo `register_image_pipeline(cls)`."""
    if PIPELINES.get(cls.__name__) is not cls:
        raise ValueError(f"{cls.__name__} is not a registered image pipeline")
    del PIPELINES[cls.__name__]
    CHECKPOINT_FAMILIES.pop(cls.checkpoint_model_type, None)


def saved_class_name(folder: str | Path) -> str | None:
    """The pipeline class a `save_pretrained` folder names in its `model_index.json`: `_class_name` is the class, or
    `[loader module, class]` where the folder also carries the module diffusers' own `from_pretrained` imports."""
    name = json.loads((Path(folder) / "model_index.json").read_text()).get("_class_name")
    return name[1] if isinstance(name, list) and len(name) == 2 else name


def pipeline_class_for(path: str | Path) -> type:
    """The pipeline class that loads directory `path` (the plugins' families too, `mmspec.core.registry`); ValueError
    naming what was found otherwise."""
    load_plugins()
    path = Path(path)
    if (path / "model_index.json").is_file():
        name = saved_class_name(path)
        if name not in PIPELINES:
            raise ValueError(f"{path} holds a {name} (model_index.json); mmspec's image pipelines are "
                             f"{sorted(PIPELINES)}")
    elif (path / "config.json").is_file():
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
        if model_type not in CHECKPOINT_FAMILIES:
            raise ValueError(f"{path} is a {model_type!r} checkpoint; the transformers families mmspec loads are "
                             f"{sorted(CHECKPOINT_FAMILIES)}")
        name = CHECKPOINT_FAMILIES[model_type]
    elif any(path.glob("t2i_*.pt")):
        name = "LlamaGenPipeline"  # LlamaGen's released files (t2i GPT, VQ, a T5 folder)
    else:
        raise ValueError(f"{path} has neither model_index.json (a saved pipeline), config.json (a transformers "
                         "checkpoint) nor LlamaGen's t2i_*.pt release")
    found = PIPELINES[name]
    return found if isinstance(found, type) else getattr(importlib.import_module(found), name)


class AutoARImagePipeline:
    """`AutoARImagePipeline.from_pretrained(path, **kwargs)` -> the family's pipeline, loaded."""

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, **kwargs):
        path = resolve_model(name_or_path)
        return pipeline_class_for(path).from_pretrained(path, **kwargs)


def add_image_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that pick and load a text-to-image pipeline of any family."""
    parser.add_argument("--model", default=IMAGE_T2I, help="zoo name, saved pipeline folder, or a Janus / Emu3 / "
                                                           "Lumina-mGPT checkpoint folder")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="weights dtype (bfloat16 for the 1B-7B checkpoints on a GPU)")
    parser.add_argument("--vqgan", default=None, help="Lumina-mGPT: Meta's Chameleon tokenizer/vqgan.ckpt")
    parser.add_argument("--target-size", type=int, default=None, help="Lumina-mGPT: the checkpoint's resolution "
                                                                      "(512 / 768 / 1024)")


def image_pipeline_from_arguments(args: argparse.Namespace):
    """The pipeline that `add_image_model_arguments`' options name (`vqgan` / `target_size` only when given)."""
    import torch

    extra = {key: getattr(args, key) for key in ("vqgan", "target_size") if getattr(args, key) is not None}
    return AutoARImagePipeline.from_pretrained(args.model, dtype=getattr(torch, args.dtype), **extra)
