"""Every public inference entry point runs without autograd whatever the caller's grad mode: called with gradients
enabled (as a user driving the model by hand would, outside `pipe()`), no output requires grad — a text state that
tracked gradients once built autograd graphs through the KV cache until the process ran out of memory. The companion
shows the check can fail: the undecorated `encode_prompt` does return a tensor that requires grad."""

import pytest
import torch

from mmspec.core.probs import SamplingConfig
from mmspec.core.stats import SpecStats
from mmspec.image import AR, SJD, DraftModel
from mmspec.models.llamagen.adapter import LlamaGenAdapter
from mmspec.text import speculative_generate
from mmspec.text.drafters import ModelDrafter


def tensors_in(value):
    """Every tensor in an output (dataclasses, tuples, lists, dicts, stats)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module):
        yield from tensors_in(vars(value))


def assert_no_grad(value, what: str) -> None:
    found = list(tensors_in(value))
    assert found, f"{what}: no tensor in the output"
    tracked = [tuple(t.shape) for t in found if t.requires_grad]
    assert not tracked, f"{what}: outputs of shapes {tracked} require grad"


@pytest.fixture(scope="module")
def image_pipe(small_image_model):
    from mmspec.pipelines.llamagen import LlamaGenPipeline

    pipe = LlamaGenPipeline.from_pretrained(small_image_model, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_image_pipeline_entry_points(image_pipe):
    pipe = image_pipe
    adapter = LlamaGenAdapter(pipe.transformer, pipe.vqvae)
    with torch.enable_grad():
        condition = pipe.encode_prompt(["a red circle", "a blue square"])
        assert_no_grad(condition, "LlamaGenPipeline.encode_prompt")
        tokens = torch.randint(0, adapter.vocab_size, (2, 256))
        assert_no_grad(pipe.decode_tokens(tokens, output_type="pt"), "decode_tokens")
        sampling = SamplingConfig(guidance_scale=3.0, top_k=8)
        for decoding in (AR(), SJD(window=8), DraftModel(
                draft_length=3, drafter=LlamaGenAdapter(pipe.draft_transformer, pipe.vqvae))):
            steps = list(decoding.run(adapter, condition, sampling, torch.Generator().manual_seed(0), SpecStats()))
            assert_no_grad(steps[-1], type(decoding).__name__)
        out = pipe("a red circle", output_type="pt", decoding="sjd", window=8,
                   generator=torch.Generator().manual_seed(0))
        assert_no_grad(out, "LlamaGenPipeline.__call__")


def test_the_check_fails_without_no_grad(image_pipe):
    """The mutation companion: `encode_prompt` without its decorator returns states that require grad."""
    undecorated = type(image_pipe).encode_prompt.__wrapped__
    with torch.enable_grad(), pytest.raises(AssertionError, match="require grad"):
        assert_no_grad(undecorated(image_pipe, ["a red circle"]), "undecorated encode_prompt")


def test_family_pipelines_encode_prompt():
    from tests.pipelines.test_family_pipelines import FAMILIES

    for name, (build, size, _, _) in FAMILIES.items():
        pipe = build()
        adapter = pipe.image_adapter(size.get("height"), size.get("width"))
        with torch.enable_grad():
            assert_no_grad(pipe.encode_prompt(["a red circle"], None, adapter), f"{name} encode_prompt")


def test_text_entry_points(tiny_target, tiny_draft):
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    with torch.enable_grad():
        out = speculative_generate(tiny_target, ids, drafter=ModelDrafter(tiny_draft), max_new_tokens=6,
                                   generator=torch.Generator().manual_seed(0))
        assert_no_grad(out, "speculative_generate")


def test_text_pipeline(tmp_path):
    from mmspec.pipelines.text import SpeculativeTextPipeline
    from mmspec.zoo import TEXT_DRAFT, TEXT_TARGET

    pipe = SpeculativeTextPipeline.from_pretrained(TEXT_TARGET, draft=TEXT_DRAFT)
    with torch.enable_grad():
        for method in ("model", "ar"):
            out = pipe("def f(x):\n", decoding=method, max_new_tokens=4)
            assert_no_grad([out.sequences, out.stats], f"SpeculativeTextPipeline decoding={method}")


def test_mar_and_video_pipelines():
    from mmspec.pipelines.mar import MARPipeline
    from mmspec.pipelines.video import NextFramePipeline
    from mmspec.zoo.video_world import episode, render_frame

    mar = MARPipeline.from_pretrained("mar_shapes", dtype=torch.float32)
    mar.set_progress_bar_config(disable=True)
    video = NextFramePipeline.from_pretrained("nextframe_shapes", dtype=torch.float32)
    video.set_progress_bar_config(disable=True)
    world = episode(0, "heldout")
    with torch.enable_grad():
        for decoding in ("ar", "speculative"):
            out = mar([1], decoding=decoding, output_type="latent", num_iter=4, num_diffusion_steps=3,
                      generator=torch.Generator().manual_seed(0))
            assert_no_grad(out, f"MARPipeline decoding={decoding}")
        assert_no_grad(mar.decode_tokens(out.images, output_type="pt"), "MARPipeline.decode_tokens")
        out = video(render_frame(world, world.start), [4, 4], num_inference_steps=2, output_type="pt")
        assert_no_grad(out, "NextFramePipeline.__call__")
