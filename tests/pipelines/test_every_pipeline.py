"""One contract for every pipeline class mmspec exports: `decoding=` takes a component and its shorthand (a registered
name plus settings) with the same result, the component survives `save_pretrained` / `from_pretrained`,
`callback_on_step_end` is called with the tensors it asks for, and the output is a `BaseOutput` whose stats'
`table()` and `as_dict()` work."""

import json
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from diffusers.utils import BaseOutput

import mmspec
from mmspec import AR, SJD, ContinuousSpeculation, FrameSpeculation, TextSpeculation
from mmspec.core.component import DecodingComponent
from mmspec.models.mar import KLAutoencoder, MARModel
from mmspec.models.nextframe import NextFrameTransformer
from mmspec.pipelines.base import MMSpecPipeline
from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET
from tests.models.llamagen_tiny import tiny_pipeline
from tests.models.test_mar import TINY
from tests.pipelines import test_family_pipelines as families


@dataclass
class Case:
    """A tiny pipeline, the arguments of a call, a decoding component and its shorthand, the output field to compare
    and the step callback's tensor inputs."""

    build: object
    inputs: dict
    decoding: DecodingComponent
    shorthand: dict
    result: str
    tensor_inputs: list[str] = field(default_factory=list)


def mar_pipeline():
    torch.manual_seed(0)
    vae = KLAutoencoder(embed_dim=4, ch=32, ch_mult=(1, 2, 2), num_res_blocks=1, encoder_attn_resolutions=(),
                        resolution=16)
    return mmspec.MARPipeline(MARModel(**TINY), vae, MARModel(**{**TINY, "encoder_depth": 1, "decoder_depth": 1}))


def video_pipeline():
    torch.manual_seed(0)
    return mmspec.NextFramePipeline(
        NextFrameTransformer(latent_channels=3, latent_size=4, dim=32, depth=2, num_heads=2, attention_window=3),
        KLAutoencoder(embed_dim=3, ch=32, ch_mult=(1, 1), num_res_blocks=1, encoder_attn_resolutions=(),
                      resolution=8))


def text_pipeline():
    return mmspec.SpeculativeTextPipeline.from_pretrained(TEXT_TARGET, draft=TEXT_DRAFT)


SJD3 = (SJD(window=3, init="vertical"), {"decoding": "sjd", "window": 3, "init": "vertical"})
IMAGE = dict(output_type="latent", **{"prompt": families.PROMPTS})
CASES = {
    mmspec.LlamaGenPipeline: Case(lambda: tiny_pipeline(dtype=torch.float32), IMAGE, *SJD3, "images",
                                  ["tokens", "n_committed"]),
    mmspec.JanusPipeline: Case(families.janus_pipeline, IMAGE, *SJD3, "images", ["tokens"]),
    mmspec.Emu3Pipeline: Case(families.emu3_pipeline, {**IMAGE, "height": 12, "width": 16}, *SJD3, "images",
                              ["n_committed"]),
    mmspec.LuminaMGPTPipeline: Case(families.lumina_pipeline, {**IMAGE, "height": 4, "width": 8}, *SJD3, "images",
                                    ["tokens"]),
    mmspec.MARPipeline: Case(mar_pipeline, dict(class_labels=[1, 2], num_iter=4, num_diffusion_steps=5,
                                                output_type="latent"),
                             ContinuousSpeculation(gamma=2, acceptance="paper"),
                             {"decoding": "speculative", "gamma": 2, "acceptance": "paper"}, "images",
                             ["latents", "known"]),
    mmspec.NextFramePipeline: Case(video_pipeline, dict(image=np.zeros((2, 8, 8, 3), np.uint8), actions=[1, 1, 2],
                                                        output_type="latent"),
                                   FrameSpeculation(frames=2), {"decoding": "speculative", "frames": 2}, "frames",
                                   ["latents"]),
    mmspec.SpeculativeTextPipeline: Case(text_pipeline, dict(prompt=["def f(x):\n", "import os\n"],
                                                             max_new_tokens=12, temperature=1.0),
                                         TextSpeculation(drafter="ngram", draft_length=3),
                                         {"decoding": "ngram", "draft_length": 3}, "sequences",
                                         ["generated_ids", "new_tokens"]),
}


def exported_pipelines() -> set[type]:
    classes = (getattr(mmspec, name) for name in mmspec.__all__ if name.endswith("Pipeline"))
    return {cls for cls in classes if isinstance(cls, type) and issubclass(cls, MMSpecPipeline)}


def test_every_exported_pipeline_class_is_walked():
    assert exported_pipelines() == set(CASES)


@pytest.fixture(scope="module", params=list(CASES), ids=lambda cls: cls.__name__)
def case(request):
    case = CASES[request.param]
    pipe = case.build()
    pipe.set_progress_bar_config(disable=True)
    return pipe, case


def seeded(seed: int, n: int = 2) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def generator_for(pipe, seed: int):
    # transformers' generate (the text pipeline's AR) takes one generator; every other call takes one per row
    return torch.Generator().manual_seed(seed) if isinstance(pipe, mmspec.SpeculativeTextPipeline) else seeded(seed)


def test_decoding_object_and_shorthand_callback_and_output(case):
    pipe, case = case
    calls = []

    def callback(p, step, n_done, tensors):
        assert p is pipe and sorted(tensors) == sorted(case.tensor_inputs)
        assert all(isinstance(t, torch.Tensor) for t in tensors.values())
        calls.append(step)

    out = pipe(**case.inputs, decoding=case.decoding, generator=generator_for(pipe, 0),
               callback_on_step_end=callback, callback_on_step_end_tensor_inputs=case.tensor_inputs)
    assert isinstance(out, BaseOutput) and calls == sorted(calls) and len(calls) >= 2
    short = pipe(**case.inputs, **case.shorthand, generator=generator_for(pipe, 0))
    assert short.stats.method == out.stats.method and case.decoding.describe() in out.stats.method
    assert torch.equal(torch.as_tensor(getattr(short, case.result)), torch.as_tensor(getattr(out, case.result)))
    figures = out.stats.as_dict()
    json.dumps(figures)  # plain values
    assert figures["target_forwards"] == out.stats.target_forwards >= 1
    assert figures["law"] == case.decoding.law  # "lossless" or "lossy", from the component that ran
    assert "target_forwards" in out.stats.table()


def test_save_and_load_keep_the_decoding_component(case, tmp_path):
    pipe, case = case
    before = pipe.decoding
    pipe.decoding = case.decoding
    try:
        pipe.save_pretrained(tmp_path)
    finally:
        pipe.decoding = before
    loaded = type(pipe).from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    assert loaded.decoding == case.decoding and json.loads((tmp_path / "model_index.json").read_text())[
        "decoding"] == case.decoding.to_config()
    expected = pipe(**case.inputs, decoding=case.decoding, generator=generator_for(pipe, 1))
    assert loaded(**case.inputs, generator=generator_for(pipe, 1)).stats.method == expected.stats.method
    loaded.decoding = AR()  # swappable on a loaded pipeline
    assert loaded(**case.inputs, generator=generator_for(pipe, 1)).stats.method.startswith("AR()")
