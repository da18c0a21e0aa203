"""Smoke test of the MAR world's training script: every stage trains, resumes and reloads, and the export is a
loadable MARPipeline."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mmspec.models.mar import KLAutoencoder, MARModel
from mmspec.zoo import ZOO_DIR
from mmspec.zoo.pixels import encode_tokens, round_trip, to_uint8
from mmspec.zoo.shapes import BACKGROUNDS, SHAPES, class_label, scenes
from mmspec.zoo.train_mar import main
from tests.zoo.exports import check_autoencoder_kept


def test_class_labels_cover_shape_times_background():
    assert class_label("a large white square on a striped background") == SHAPES.index("square") * 6 + 1
    assert class_label("three large orange crosses left of a small blue circle on a plain background") == (
        SHAPES.index("cross") * len(BACKGROUNDS))
    with pytest.raises(ValueError, match="scene grammar"):
        class_label("a dog on a sofa")


def test_a_round_trip_decodes_the_latents_that_become_the_tokens():
    torch.manual_seed(0)
    vae = KLAutoencoder(embed_dim=4, ch=32, ch_mult=(1, 2), num_res_blocks=1, encoder_attn_resolutions=(),
                        resolution=64, scaling_factor=0.5)
    images = torch.from_numpy(scenes(0, 3)[0])
    latents, recon = round_trip(vae, images)
    assert latents.shape == (3, 4, 32, 32) and recon.shape == images.shape and recon.dtype == torch.uint8
    with torch.no_grad():
        assert torch.equal(recon, to_uint8(vae.decode(latents)))
    assert torch.equal(encode_tokens(vae, images), (latents * 0.5).flatten(2).transpose(1, 2))


def test_every_stage_trains_resumes_and_reloads(tmp_path):
    work = tmp_path / "work"
    args = ["--work-dir", str(work), "--train-scenes", "16", "--held-out-scenes", "8", "--vae-batch-size", "2",
            "--ckpt-every", "1", "--target-batch-size", "2", "--draft-batch-size", "2", "--target-steps", "1",
            "--draft-steps", "1", "--out-dir", str(tmp_path / "pipeline")]
    main(args + ["--vae-steps", "1", "--only", "vae"])
    main(args + ["--vae-steps", "2"])  # resumes the autoencoder at step 1, encodes, trains both MARs, exports
    for role in ("target", "draft"):
        model = MARModel.from_pretrained(work / f"mar_{role}")
        assert model.config.seq_len == 64 and model.config.token_dim == 8
        assert json.loads((work / f"mar_{role}" / "training_metrics.json").read_text())["held_out_loss"] > 0
    tokens = np.load(work / "mar-train-tokens.npy")
    assert tokens.shape == (16, 64, 8) and np.load(work / "mar-heldout-labels.npy").max() < 30
    assert torch.load(work / "ckpt-vae.pt", weights_only=False)["step"] == 2
    metrics = json.loads((work / "mar_vae" / "training_metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["held_out_psnr_db"] > 0 and metrics["latent_std"] > 0
    vae = KLAutoencoder.from_pretrained(work / "mar_vae")
    assert vae.config.scaling_factor == pytest.approx(1 / metrics["latent_std"], rel=1e-3)
    mean, _ = vae.encode(torch.zeros(1, 3, 64, 64))
    assert mean.shape == (1, 8, 8, 8)

    from mmspec.pipelines.mar import MARPipeline

    for component in ("vae", "transformer", "draft_transformer"):
        stored = load_file(tmp_path / "pipeline" / component / "diffusion_pytorch_model.safetensors")
        assert {t.dtype for t in stored.values()} == {torch.float16}
    pipe = MARPipeline.from_pretrained(tmp_path / "pipeline", dtype=torch.float32)
    assert pipe.draft_transformer.config.decoder_embed_dim < pipe.transformer.config.decoder_embed_dim
    image = pipe(3, num_iter=2, num_diffusion_steps=2, decoding="speculative", gamma=1,
                 generator=torch.Generator().manual_seed(0)).images[0]
    assert image.size == (64, 64)
    metrics = json.loads((tmp_path / "pipeline" / "training_metrics.json").read_text())
    assert set(metrics) == {"vae", "target", "draft"} and metrics["target"]["steps"] == 1


@pytest.mark.slow  # every stage end to end
def test_the_autoencoder_takes_a_time_budget_and_its_channels_set_the_mar_token_size(tmp_path):
    work = tmp_path / "work"
    args = ["--work-dir", str(work), "--train-scenes", "8", "--held-out-scenes", "4", "--vae-batch-size", "2",
            "--vae-minutes", "0.003", "--target-batch-size", "2", "--target-steps", "1", "--latent-channels", "4"]
    for stage in ("vae", "tokens", "target"):
        main(args + ["--only", stage])
    planned = torch.load(work / "ckpt-vae.pt", weights_only=False)["steps"]  # the steps that fit in the budget
    assert json.loads((work / "mar_vae" / "training_metrics.json").read_text())["steps"] == planned >= 1
    assert np.load(work / "mar-train-tokens.npy").shape == (8, 64, 4)
    assert MARModel.from_pretrained(work / "mar_target").config.token_dim == 4
    with pytest.raises(SystemExit):  # the shipped autoencoder has its own channels
        main(args + ["--vae-from", str(ZOO_DIR / "mar_shapes")])


def test_a_retrain_keeps_the_shipped_autoencoder(tmp_path):
    """--vae-from: the MAR models are trained on the latents of the given pipeline's autoencoder, exported unchanged
    with its metrics."""
    shipped = ZOO_DIR / "mar_shapes"
    main(["--work-dir", str(tmp_path / "work"), "--train-scenes", "8", "--held-out-scenes", "4", "--vae-from",
          str(shipped), "--target-batch-size", "2", "--draft-batch-size", "2", "--target-steps", "1",
          "--draft-steps", "1", "--out-dir", str(tmp_path / "pipeline")])
    assert not (tmp_path / "work" / "ckpt-vae.pt").exists()  # no autoencoder was trained
    assert check_autoencoder_kept(shipped, tmp_path / "pipeline", "vae", "MARModel")["target"]["steps"] == 1
