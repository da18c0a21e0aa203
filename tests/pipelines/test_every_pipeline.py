"""One contract for every pipeline class mmspec exports: `decoding=` takes a component and its shorthand (a registered
name plus settings) with the same result, the component survives `save_pretrained` / `from_pretrained`,
`callback_on_step_end` is called with the tensors it asks for, the output is a `BaseOutput` whose stats' `table()` and
`as_dict()` work, a saved folder loads through diffusers' own `DiffusionPipeline.from_pretrained`, and a generator
passed to successive calls advances."""

import json
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from diffusers import DiffusionPipeline
from diffusers.utils import BaseOutput

import mmspec
from mmspec import AR, SJD, ContinuousSpeculation, FrameSpeculation, TextSpeculation
from mmspec.core.component import DecodingComponent
from mmspec.models.mar import KLAutoencoder, MARModel
from mmspec.models.nextframe import NextFrameTransformer
from mmspec.pipelines.base import MMSpecPipeline
from mmspec.text.policy import TextDecodingPolicy
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


def test_diffusers_own_entry_point_loads_a_saved_folder(case, tmp_path):
    """diffusers' custom-pipeline convention: `_class_name: [module, class]` and the module in the folder."""
    pipe, case = case
    pipe.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "model_index.json").read_text())["_class_name"] == ["mmspec_pipeline",
                                                                                       type(pipe).__name__]
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        DiffusionPipeline.from_pretrained(tmp_path)
    loaded = DiffusionPipeline.from_pretrained(tmp_path, trust_remote_code=True)
    assert type(loaded) is type(pipe)
    loaded.set_progress_bar_config(disable=True)
    expected = pipe(**case.inputs, decoding=case.decoding, generator=generator_for(pipe, 2))
    out = loaded(**case.inputs, decoding=case.decoding, generator=generator_for(pipe, 2))
    assert torch.equal(torch.as_tensor(getattr(out, case.result)), torch.as_tensor(getattr(expected, case.result)))


@pytest.mark.parametrize("plain", [False, True], ids=["speculative", "ar"])
def test_a_generator_passed_to_successive_calls_advances(case, plain):
    """Two calls with the same generator(s) continue one random stream: their outputs differ (a reseed from
    `initial_seed()` would repeat the first)."""
    pipe, case = case
    decoding = AR() if plain else case.decoding
    generator = generator_for(pipe, 3)
    first = pipe(**case.inputs, decoding=decoding, generator=generator)
    second = pipe(**case.inputs, decoding=decoding, generator=generator)
    assert not torch.equal(torch.as_tensor(getattr(first, case.result)), torch.as_tensor(getattr(second, case.result)))


@pytest.mark.parametrize("decoding", [{}, {"decoding": "ar"}], ids=["default", "ar"])
def test_text_calls_with_one_generator_continue_its_stream(decoding):
    pipe = text_pipeline()
    pipe.set_progress_bar_config(disable=True)
    pipe.decoding_policy = TextDecodingPolicy(calibration_tokens=8)  # "auto" times its candidates on short calls
    generator = torch.Generator().manual_seed(0)
    first, second = (pipe(["b d c"] * 8, max_new_tokens=5, temperature=1.0, generator=generator, **decoding)
                     for _ in range(2))
    assert not torch.equal(first.sequences, second.sequences)


@pytest.mark.parametrize("plain", [False, True], ids=["speculative", "ar"])
def test_calls_without_a_generator_draw_afresh_and_a_global_seed_repeats_them(case, plain):
    """As torch and diffusers sample without a generator: each call advances the global RNG (two calls differ) and
    `torch.manual_seed` repeats a call."""
    pipe, case = case
    decoding = AR() if plain else case.decoding
    torch.manual_seed(11)
    first, second = (torch.as_tensor(getattr(pipe(**case.inputs, decoding=decoding), case.result)) for _ in range(2))
    assert not torch.equal(first, second)
    torch.manual_seed(11)
    assert torch.equal(torch.as_tensor(getattr(pipe(**case.inputs, decoding=decoding), case.result)), first)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_diffusers_habits_get_an_answer_that_says_why(case):
    """`.to("cuda")` without CUDA, the offload and slicing helpers, a diffusion step count: one clear error each."""
    pipe, case = case
    name = type(pipe).__name__
    with pytest.raises(ValueError, match=rf"^{name}\.to\('cuda'\): no CUDA device here"):
        pipe.to("cuda")
    with pytest.raises(ValueError, match=rf"^{name}\.enable_model_cpu_offload\(\) moves models between a GPU"):
        pipe.enable_model_cpu_offload()
    with pytest.raises(NotImplementedError, match=f"^{name} does not support attention slicing"):
        pipe.enable_attention_slicing()
    if pipe.steps_instead is not None:
        with pytest.raises(TypeError, match=rf"^{name}\(\) takes no num_inference_steps: "):
            pipe(**case.inputs, num_inference_steps=4)
    assert pipe.to("cpu") is pipe
