"""mmspec: speculative decoding for autoregressive image, video and text generation.

The public classes are exported here, diffusers style, and imported on first use (PEP 562), so `import mmspec` loads
neither torch nor any model code:

    >>> import torch
    >>> from mmspec import LlamaGenPipeline
    >>> pipe = LlamaGenPipeline.from_pretrained("shapes", dtype=torch.float32)  # a zoo name or a saved folder
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "speculative_generate": "mmspec.text.generate",
    # decoding components: pipe(prompt, decoding=SJD(window=16, acceptance=Exact())); AR() is every pipeline's AR
    "AR": "mmspec.image.methods.ar",
    "SJD": "mmspec.image.methods.sjd",
    "DraftModel": "mmspec.image.methods.draft",
    "DraftHeads": "mmspec.image.methods.heads",
    "PJD": "mmspec.image.methods.pjd",
    "ContinuousSpeculation": "mmspec.continuous.methods",
    "FrameSpeculation": "mmspec.video.methods",
    # text drafters: pipe(prompt, decoding=PromptLookup(max_ngram=2)); TextSpeculation(drafter="ngram") names one
    **{name: "mmspec.text.methods" for name in ("TextSpeculation", "TextDraftModel", "PromptLookup", "LayerSkip",
                                                "Cascade", "Kangaroo", "SortedExits", "TextDraftTree", "Stand",
                                                "TextDraftHeads", "TextDrafting", "TreeDrafting")},
    # acceptance rules: acceptance=Lantern(k=100, delta=0.1)
    "Exact": "mmspec.core.rules.exact",
    "Lantern": "mmspec.core.rules.lantern",
    "GSD": "mmspec.core.rules.gsd",
    "Typical": "mmspec.core.rules.typical",
    "Judge": "mmspec.core.rules.judge",
    "Paper": "mmspec.continuous.paper",
    # your own methods and rules: a component or rule class, its settings, registered by name
    "DecodingComponent": "mmspec.core.component",
    "AcceptanceRule": "mmspec.core.rules.base",
    "setting": "mmspec.core.settings",
    "register_decoding": "mmspec.core.registry",
    "register_rule": "mmspec.core.registry",
    "AutoARImagePipeline": "mmspec.pipelines.auto",
    "register_image_pipeline": "mmspec.pipelines.auto",  # your own image family, found by AutoARImagePipeline
    "LlamaGenPipeline": "mmspec.pipelines.llamagen",
    "JanusPipeline": "mmspec.pipelines.janus",
    "Emu3Pipeline": "mmspec.pipelines.emu3",
    "LuminaMGPTPipeline": "mmspec.pipelines.lumina_mgpt",
    "MARPipeline": "mmspec.pipelines.mar",
    "NextFramePipeline": "mmspec.pipelines.video",
    "SpeculativeTextPipeline": "mmspec.pipelines.text",
    # the pipelines' components: saved pipelines name them ["mmspec", class name] in model_index.json
    "LlamaGenTransformer": "mmspec.models.llamagen.gpt",
    "AcceptanceHead": "mmspec.models.acceptance",
    "KangarooAdapter": "mmspec.models.kangaroo",
    "JudgeHead": "mmspec.models.judge",
    "EagleHead": "mmspec.models.heads",
    "HydraHead": "mmspec.models.heads",
    "LlamaGenVQModel": "mmspec.models.llamagen.vq",
    "MARModel": "mmspec.models.mar.model",
    "KLAutoencoder": "mmspec.models.mar.vae",
    "NextFrameTransformer": "mmspec.models.nextframe",
    "ChameleonVQGAN": "mmspec.models.chameleon_vqgan",
    "LuminaMGPTForConditionalGeneration": "mmspec.models.lumina_mgpt",
}
# diffusers loads a component ["mmspec", X] by looking X's base classes up by name in the module it names
# (`get_class_obj_and_candidates`); these are the bases our components have. Not part of the public API.
_LOADER_BASES = {"ModelMixin": "diffusers", "PreTrainedModel": "transformers"}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name) or _LOADER_BASES.get(name)
    if module is None:
        raise AttributeError(f"module 'mmspec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
