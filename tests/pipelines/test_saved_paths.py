"""Saved pipelines name their components by public import paths (`["mmspec", "LlamaGenTransformer"]`), the zoo's
folders are saved that way, and a folder saved before (with module paths) still loads and generates what it did."""

import importlib
import inspect
import json
import pkgutil
from pathlib import Path

import pytest
import torch
from diffusers import ModelMixin
from transformers import PreTrainedModel

import mmspec
import mmspec.models
from mmspec.models.mar import KLAutoencoder, MARModel
from mmspec.models.nextframe import NextFrameTransformer
from mmspec.pipelines.auto import AutoARImagePipeline
from mmspec.pipelines.llamagen import LlamaGenPipeline
from mmspec.pipelines.mar import MARPipeline
from mmspec.pipelines.video import NextFramePipeline
from mmspec.zoo import ZOO_DIR
from tests.models.llamagen_tiny import tiny_pipeline, tiny_transformer
from tests.models.test_mar import TINY

SAVED_BEFORE = Path(__file__).resolve().parents[1] / "fixtures" / "llamagen_saved_v0_1"


def components(folder: Path) -> dict[str, list]:
    """model_index.json's component entries: name -> [library, class name]."""
    index = json.loads((folder / "model_index.json").read_text())
    return {name: entry for name, entry in index.items() if not name.startswith("_") and isinstance(entry, list)}


def tiny(kind: str):
    torch.manual_seed(0)
    if kind == "llamagen":
        pipe = tiny_pipeline(dtype=torch.float32)
        pipe.register_modules(draft_transformer=tiny_transformer(seed=1, dtype=torch.float32))
        return pipe
    if kind == "mar":  # no draft: an optional component saved as [null, null]
        return MARPipeline(MARModel(**TINY), KLAutoencoder(embed_dim=4, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1,
                                                           encoder_attn_resolutions=(), resolution=16))
    return NextFramePipeline(NextFrameTransformer(latent_channels=3, latent_size=4, dim=32, depth=2, num_heads=2),
                             KLAutoencoder(embed_dim=3, ch=32, ch_mult=(1, 1), num_res_blocks=1,
                                           encoder_attn_resolutions=(), resolution=8))


@pytest.mark.parametrize("kind", ["llamagen", "mar", "video"])
def test_save_pretrained_names_public_import_paths_and_reloads(kind, tmp_path):
    pipe = tiny(kind)
    pipe.save_pretrained(tmp_path)
    entries = components(tmp_path)
    ours = {name: cls for name, (library, cls) in entries.items() if library == "mmspec"}
    assert ours and all(library in ("mmspec", "transformers", None) for library, _ in entries.values()), entries
    for name, cls in ours.items():
        assert getattr(mmspec, cls) is type(getattr(pipe, name))
    loaded = type(pipe).from_pretrained(tmp_path)
    for name in ours:
        assert type(getattr(loaded, name)) is type(getattr(pipe, name))
        for (key, a), b in zip(getattr(pipe, name).state_dict().items(), getattr(loaded, name).state_dict().values(),
                               strict=True):
            assert torch.equal(a, b), (name, key)


def test_reassigning_a_component_keeps_the_public_path():
    pipe = tiny("llamagen")
    pipe.draft_transformer = tiny_transformer(seed=2, dtype=torch.float32)
    assert tuple(pipe.config["draft_transformer"]) == ("mmspec", "LlamaGenTransformer")


@pytest.mark.parametrize("name", sorted(p.parent.name for p in ZOO_DIR.glob("*/model_index.json")))
def test_zoo_pipelines_are_saved_with_public_import_paths(name):
    entries = components(ZOO_DIR / name)
    assert not [entry for entry in entries.values() if entry[0].startswith("mmspec.")], entries
    for library, cls in entries.values():
        if library == "mmspec":
            assert issubclass(getattr(mmspec, cls), (ModelMixin, PreTrainedModel))


def test_every_component_class_of_mmspec_models_is_exported_from_mmspec():
    """`MMSpecPipeline` saves any `mmspec.models` component as ["mmspec", class name]: each must load from there."""
    found = {}
    for info in pkgutil.walk_packages(mmspec.models.__path__, "mmspec.models."):
        module = importlib.import_module(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, (ModelMixin, PreTrainedModel)):
                found[name] = cls
    assert {"LlamaGenTransformer", "MARModel", "NextFrameTransformer"} <= set(found)
    for name, cls in found.items():
        assert getattr(mmspec, name) is cls, name


def test_a_folder_saved_with_module_paths_still_loads_and_generates_the_same_tokens(tmp_path):
    """The fixture was written by `save_pretrained` before public paths (commit 2e4d902): a tiny LlamaGen pipeline
    with a draft, float32, with the tokens it generated then (AR, CFG 2, one seed per prompt). Its config predates
    `null_caption_mask`, so it now loads with LlamaGen's own ("prompt": the null caption under the prompt's
    padding mask); under the one mmspec used then ("all") it generates exactly the recorded tokens, and under
    LlamaGen's other ones, its short prompts being padded: the mask is the only change."""
    assert components(SAVED_BEFORE)["transformer"] == ["mmspec.models.llamagen.gpt", "LlamaGenTransformer"]
    expected = json.loads((SAVED_BEFORE / "expected_tokens.json").read_text())
    for loader in (LlamaGenPipeline, AutoARImagePipeline):
        pipe = loader.from_pretrained(SAVED_BEFORE, dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        assert pipe.transformer.config.null_caption_mask == "prompt"

        def tokens(pipe=pipe):
            return pipe(expected["prompt"], decoding=expected["decoding"], guidance_scale=expected["guidance_scale"],
                        generator=[torch.Generator().manual_seed(s) for s in expected["seeds"]],
                        output_type="latent").images.tolist()

        assert tokens() != expected["tokens"]
        pipe.transformer.register_to_config(null_caption_mask="all")
        assert tokens() == expected["tokens"]
    pipe.save_pretrained(tmp_path)  # saved again: public paths
    assert components(tmp_path)["transformer"] == ["mmspec", "LlamaGenTransformer"]


def test_the_facade_answers_unknown_names_with_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'NotAPipeline'"):
        mmspec.NotAPipeline  # noqa: B018
    assert set(mmspec.__all__) <= set(dir(mmspec))
