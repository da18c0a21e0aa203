"""`AutoARImagePipeline`: one `from_pretrained` for every discrete-image family — the pipeline class is read from the
directory (`model_index.json` of a saved pipeline, `config.json` of a transformers checkpoint: Janus, Emu3,
Lumina-mGPT / Chameleon, or LlamaGen's released `t2i_*.pt` files)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

# pipeline class name -> module; transformers checkpoint model_type -> pipeline class name
PIPELINES = {
    "LlamaGenPipeline": "pipelines.llamagen",
    "JanusPipeline": "pipelines.janus",
    "Emu3Pipeline": "pipelines.emu3",
    "LuminaMGPTPipeline": "pipelines.lumina_mgpt",
}
CHECKPOINT_FAMILIES = {"janus": "JanusPipeline", "emu3": "Emu3Pipeline", "chameleon": "LuminaMGPTPipeline"}


def pipeline_class_for(path: str | Path) -> type:
    """The pipeline class that loads directory `path`; ValueError naming what was found otherwise."""
    path = Path(path)
    if (path / "model_index.json").is_file():
        name = json.loads((path / "model_index.json").read_text()).get("_class_name")
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
    return getattr(importlib.import_module(PIPELINES[name]), name)


class AutoARImagePipeline:
    """`AutoARImagePipeline.from_pretrained(path, **kwargs)` -> the family's pipeline, loaded."""

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs):
        return pipeline_class_for(path).from_pretrained(path, **kwargs)
