"""Smoke test of the video world's training script: rollouts, every stage trains, resumes and reloads, and the export
is a loadable NextFramePipeline; the training clips' flow times mix diffusion forcing and sampling-like contexts."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mmspec.models.nextframe import NextFrameTransformer
from mmspec.zoo import ZOO_DIR
from mmspec.zoo.train_video import MAX_CONTEXT_NOISE, clip_timesteps, main, make_rollouts
from mmspec.zoo.video_world import episode, rollout
from tests.zoo.exports import check_autoencoder_kept


def test_rollouts_follow_the_world_and_record_the_action_behind_each_frame():
    frames, actions = make_rollouts("heldout", 2, num_actions=5)
    assert frames.shape == (2, 6, 32, 32, 3) and frames.dtype == np.uint8 and actions.shape == (2, 6)
    assert (actions[:, 0] == 0).all()
    assert np.array_equal(frames[1], rollout(episode(1, "heldout"), actions[1, 1:])[0])


def test_clip_timesteps_mix_independent_times_and_context_prefixes():
    t = clip_timesteps(8000, 6, torch.Generator().manual_seed(0))
    assert t.shape == (8000, 6) and 0 <= t.min() and t.max() < 1
    block = t[:, -1] == t[:, -2]  # sampling-like rows whose prefix leaves a block of 2+ frames: 1/2 x 4/5 of rows
    assert 0.37 < block.float().mean() < 0.43
    assert (t[block, 0] <= MAX_CONTEXT_NOISE).all()  # their first frame is context
    assert (t[~block, 0] > MAX_CONTEXT_NOISE).any()  # independent rows are not


def test_every_stage_trains_resumes_and_reloads(tmp_path):
    work = tmp_path / "work"
    args = ["--work-dir", str(work), "--train-episodes", "3", "--held-out-episodes", "2", "--vae-batch-size", "2",
            "--ckpt-every", "1", "--model-batch-size", "2", "--out-dir", str(tmp_path / "pipeline"),
            "--latent-channels", "2"]  # the shipped autoencoder has 4: the model takes the latents' channels
    main(args + ["--vae-steps", "1", "--model-steps", "1", "--only", "data"])
    main(args + ["--vae-steps", "1", "--only", "vae"])
    main(args + ["--vae-steps", "2", "--model-steps", "2"])  # resumes the autoencoder at step 1, then the rest
    assert torch.load(work / "ckpt-video-vae.pt", weights_only=False)["step"] == 2
    latents = np.load(work / "video-train-latents.npy")
    assert latents.shape == (3, 25, 64, 2)
    metrics = json.loads((work / "video_model" / "training_metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["held_out_loss"] > 0
    config = NextFrameTransformer.from_pretrained(work / "video_model").config
    assert config.attention_window == 4 and config.latent_channels == 2

    from mmspec.pipelines.video import NextFramePipeline

    for component in ("vae", "transformer"):
        stored = load_file(tmp_path / "pipeline" / component / "diffusion_pytorch_model.safetensors")
        assert {t.dtype for t in stored.values()} == {torch.float16}
    pipe = NextFramePipeline.from_pretrained(tmp_path / "pipeline", dtype=torch.float32)
    out = pipe(np.load(work / "video-heldout-frames.npy")[0, 0], [1, 2], num_inference_steps=1, output_type="np")
    assert out.frames.shape == (1, 2, 32, 32, 3)
    assert set(json.loads((tmp_path / "pipeline" / "training_metrics.json").read_text())) == {"video_vae",
                                                                                                "video_model"}


@pytest.mark.slow  # a retrain end to end
def test_a_retrain_keeps_the_shipped_autoencoder(tmp_path):
    """--vae-from: the model is trained on the latents of the given pipeline's autoencoder, exported unchanged with
    its metrics."""
    shipped = ZOO_DIR / "nextframe_shapes"
    main(["--work-dir", str(tmp_path / "work"), "--train-episodes", "2", "--held-out-episodes", "2", "--vae-from",
          str(shipped), "--model-batch-size", "2", "--model-minutes", "0.002", "--out-dir", str(tmp_path / "pipeline")])
    assert not (tmp_path / "work" / "ckpt-video-vae.pt").exists()  # no autoencoder was trained
    metrics = check_autoencoder_kept(shipped, tmp_path / "pipeline", "video_vae", "NextFrameTransformer")
    assert metrics["video_model"]["steps"] >= 1  # as many as fit in the budget
    with pytest.raises(SystemExit):  # the shipped autoencoder has its own channels
        main(["--work-dir", str(tmp_path / "work"), "--vae-from", str(shipped), "--latent-channels", "8"])
