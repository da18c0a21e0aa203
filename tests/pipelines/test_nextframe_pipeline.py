"""NextFramePipeline on a tiny random model: output types, export_to_video, save / load, sessions = offline calls,
speculation settings and stats, clear errors."""

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers.utils import export_to_video

from mmspec.models.mar import KLAutoencoder
from mmspec.models.nextframe import NextFrameTransformer
from mmspec.pipelines.video import NextFramePipeline
from mmspec.video import FrameSpeculation

ACTIONS = [1, 1, 1, 2, 2, 0, 0, 0, 0, 3]


@pytest.fixture(scope="module")
def pipe():
    torch.manual_seed(0)
    vae = KLAutoencoder(embed_dim=3, ch=32, ch_mult=(1, 1), num_res_blocks=1, encoder_attn_resolutions=(),
                        resolution=8, scaling_factor=1.0)
    transformer = NextFrameTransformer(latent_channels=3, latent_size=4, dim=32, depth=2, num_heads=2,
                                       attention_window=3)
    with torch.no_grad():
        for p in transformer.parameters():
            p.normal_(0, 0.15)
    return NextFramePipeline(transformer=transformer, vae=vae.eval())


def start_frames(batch: int = 2) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (batch, 8, 8, 3), dtype=np.uint8)


def test_output_types(pipe):
    def run(output_type):
        return pipe(start_frames(), ACTIONS[:4], generator=torch.Generator().manual_seed(1),
                    output_type=output_type).frames

    pil = run("pil")
    assert len(pil) == 2 and len(pil[0]) == 4 and all(isinstance(f, PIL.Image.Image) for f in pil[0])
    assert pil[0][0].size == (8, 8)
    arr = run("np")
    assert arr.shape == (2, 4, 8, 8, 3) and arr.min() >= 0 and arr.max() <= 1
    pt = run("pt")
    assert pt.shape == (2, 4, 3, 8, 8) and torch.allclose(pt.permute(0, 1, 3, 4, 2), torch.from_numpy(arr))
    latents = run("latent")
    assert latents.shape == (2, 4, 16, 3)
    assert np.array_equal(np.asarray(pil[1][2]), (arr[1, 2] * 255).round().astype(np.uint8))


def test_frames_export_to_video(pipe, tmp_path):
    out = pipe(start_frames(1)[0], ACTIONS, generator=torch.Generator().manual_seed(1))
    path = export_to_video(out.frames[0], str(tmp_path / "rollout.mp4"), fps=8, macro_block_size=1)
    assert (tmp_path / "rollout.mp4").stat().st_size > 0 and path.endswith(".mp4")
    arrays = pipe(start_frames(1)[0], ACTIONS, generator=torch.Generator().manual_seed(1), output_type="np").frames
    export_to_video(list(arrays[0]), str(tmp_path / "rollout_np.mp4"), fps=8, macro_block_size=1)


def test_save_and_load(pipe, tmp_path):
    pipe.save_pretrained(tmp_path)
    loaded = NextFramePipeline.from_pretrained(tmp_path)
    kwargs = dict(image=start_frames(), actions=ACTIONS[:3], output_type="latent")
    assert torch.equal(pipe(**kwargs, generator=torch.Generator().manual_seed(2)).frames,
                       loaded(**kwargs, generator=torch.Generator().manual_seed(2)).frames)


@pytest.mark.parametrize("speculation", [None, FrameSpeculation(frames=3), FrameSpeculation(frames=4, adaptive=True)])
def test_a_session_steps_to_the_offline_rollout(pipe, speculation):
    generator = torch.Generator().manual_seed(3)
    offline = pipe(start_frames(), ACTIONS, decoding=speculation, generator=generator, output_type="np")
    with pipe.start_session(start_frames(), decoding=speculation, generator=torch.Generator().manual_seed(3),
                            output_type="np") as session:
        stepped = np.stack([session.step(a) for a in ACTIONS], 1)
    assert np.allclose(stepped, offline.frames, atol=1e-6)
    for stats in (offline.stats, session.stats):
        assert stats.frames_emitted == len(ACTIONS) == stats.frames_computed - stats.frames_discarded
        assert stats.timings["decode"] > 0 and stats.fps > 0
    if speculation is not None:
        assert offline.stats.rollbacks > 0 and offline.stats.blocks < len(ACTIONS)


def test_per_video_actions_and_generators(pipe):
    actions = torch.tensor([ACTIONS[:5], ACTIONS[5:]])
    gens = [torch.Generator().manual_seed(4), torch.Generator().manual_seed(5)]
    both = pipe(start_frames(), actions, generator=gens, output_type="latent").frames
    alone = pipe(start_frames()[1:], actions[1:], generator=[torch.Generator().manual_seed(5)],
                 output_type="latent").frames
    assert torch.allclose(both[1:], alone, atol=1e-5)  # a video depends on its own seed, frames and actions only


def test_a_pil_session_returns_one_image_per_step(pipe):
    session = pipe.start_session(PIL.Image.fromarray(start_frames(1)[0]))
    frame = session.step(2)
    assert isinstance(frame, PIL.Image.Image) and frame.size == (8, 8)
    stats = session.close()
    assert stats.frames_emitted == 1
    with pytest.raises(ValueError, match="session is closed"):
        session.step(2)


def test_clear_errors(pipe):
    with pytest.raises(TypeError, match="image must be a PIL image"):
        pipe(start_frames().astype(np.float32), ACTIONS)
    with pytest.raises(ValueError, match="image frames must be 8 x 8 RGB"):
        pipe(np.zeros((2, 16, 16, 3), np.uint8), ACTIONS)
    with pytest.raises(ValueError, match=r"context holds 4 frames; it must hold 1 to 3"):
        pipe(np.zeros((1, 4, 8, 8, 3), np.uint8), ACTIONS)
    with pytest.raises(ValueError, match=r"actions must be in \[0, 5\)"):
        pipe(start_frames(), [1, 9])
    with pytest.raises(ValueError, match=r"actions must be a non-empty list of ints or \[2, T\] ints"):
        pipe(start_frames(), [[1, 2]] * 3)
    with pytest.raises(ValueError, match=r"frames must be >= 1"):
        pipe(start_frames(), ACTIONS, decoding=FrameSpeculation(frames=0))
    with pytest.raises(TypeError, match="decoding must be a name, a config dict or one of"):
        pipe(start_frames(), ACTIONS, decoding=4)
    with pytest.raises(ValueError, match=r"decoding must be one of \('ar', 'speculative'\)"):
        pipe(start_frames(), ACTIONS, decoding="sjd")
    with pytest.raises(ValueError, match="output_type must be one of"):
        pipe(start_frames(), ACTIONS, output_type="gif")
    with pytest.raises(ValueError, match="num_inference_steps must be an int >= 1"):
        pipe(start_frames(), ACTIONS, num_inference_steps=0)


def test_the_decoding_component_is_saved_loaded_swappable_and_the_same_as_its_shorthand(pipe, tmp_path):
    import json

    from mmspec import AR, NextFramePipeline

    def call(**decoding):
        return pipe(start_frames(), ACTIONS, generator=torch.Generator().manual_seed(3), output_type="latent",
                    **decoding)

    speculation = FrameSpeculation(frames=3, context="pipelined")
    as_object = call(decoding=speculation)
    assert torch.equal(call(decoding="speculative").frames, call(decoding=FrameSpeculation()).frames)  # by name
    assert as_object.stats.method == speculation.describe() and as_object.stats.frames_computed > len(ACTIONS) - 1
    assert pipe.decoding.name == "ar" and call().stats.method == "AR()"  # the video AR
    assert torch.equal(call().frames, call(decoding=FrameSpeculation(frames=1)).frames)  # AR() = frame by frame
    pipe.decoding = speculation
    try:
        pipe.save_pretrained(tmp_path)
        assert json.loads((tmp_path / "model_index.json").read_text())["decoding"] == {
            "name": "speculative", "frames": 3, "adaptive": False, "frame_cost": 0.2, "context": "pipelined"}
        loaded = NextFramePipeline.from_pretrained(tmp_path)
        loaded.set_progress_bar_config(disable=True)
        assert loaded.decoding == speculation
        assert torch.equal(loaded(start_frames(), ACTIONS, generator=torch.Generator().manual_seed(3),
                                  output_type="latent").frames, as_object.frames)
        pipe.decoding = {"name": "speculative", "frames": 2}  # a config dict, as model_index.json holds it
        assert pipe.decoding == FrameSpeculation(frames=2)
    finally:
        pipe.decoding = AR()


def test_callback_sees_every_frame_and_interrupt_stops_early(pipe):
    seen = []

    def callback(p, step, n_frames, kwargs):
        seen.append((step, n_frames, tuple(kwargs["latents"].shape)))
        if n_frames == 2:
            p._interrupt = True
        return kwargs

    out = pipe(start_frames(), ACTIONS, generator=torch.Generator().manual_seed(3), output_type="latent",
               callback_on_step_end=callback)
    B, _, L, C = out.frames.shape
    assert [s[:2] for s in seen] == [(0, 1), (1, 2)] and seen[1][2] == (B, 2, L, C)
    assert out.frames.shape[1] == 2 and out.stats.frames_emitted == 2
    full = pipe(start_frames(), ACTIONS, generator=torch.Generator().manual_seed(3), output_type="latent")
    assert torch.equal(full.frames[:, :2], out.frames)  # the frames before the interruption are the full run's
    with pytest.raises(ValueError, match=r"\['noise'\] are not in \['latents'\]"):
        pipe(start_frames(), ACTIONS, callback_on_step_end=callback, callback_on_step_end_tensor_inputs=["noise"])
    with pytest.raises(ValueError, match="read-only"):
        pipe(start_frames(), ACTIONS, callback_on_step_end=lambda p, s, n, kw: {"latents": kw["latents"] * 0})
