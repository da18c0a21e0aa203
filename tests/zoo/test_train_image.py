"""Smoke test of the image training script: every stage for a few steps, resume, and the saved pipeline reloads."""

import json

import pytest
import torch

from mmspec.models.llamagen.gpt import LlamaGenTransformer
from mmspec.models.llamagen.vq import LlamaGenVQModel
from mmspec.pipelines.llamagen import LlamaGenPipeline
from mmspec.zoo.shapes import scenes
from mmspec.zoo.train_image import build_tokenizer, main


@pytest.mark.slow  # three trainings: the slow tier
def test_train_save_resume_and_reload(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    args = ["--work-dir", str(work), "--out-dir", str(out), "--train-scenes", "48", "--held-out-scenes", "16",
            "--vq-batch-size", "4", "--ar-batch-size", "2", "--ckpt-every", "1", "--vq-steps", "2",
            "--draft-steps", "1", "--draft-batch-size", "2"]
    main(args + ["--ar-steps", "1"])
    main(args + ["--ar-steps", "2", "--only", "ar"])  # resumes at step 1; re-saving the pipeline drops the old draft
    main(args + ["--ar-steps", "2", "--only", "draft"])  # the draft checkpoint is complete: evaluate and register it
    assert torch.load(work / "ckpt-ar.pt", weights_only=False)["step"] == 2
    assert torch.load(work / "ckpt-vq.pt", weights_only=False)["step"] == 2
    metrics = json.loads((out / "training_metrics.json").read_text())
    assert metrics["ar"]["steps"] == 2 and metrics["ar"]["held_out_loss"] > 0
    assert metrics["vqvae"]["held_out_psnr_db"] > 0 and 0 < metrics["vqvae"]["codebook_usage"] <= 1
    assert metrics["draft"]["steps"] == 1 and 0 < metrics["draft"]["held_out_acceptance"] <= 1

    pipe = LlamaGenPipeline.from_pretrained(out)
    assert pipe.text_encoder.dtype == pipe.transformer.dtype == torch.float32  # fp16 files, float32 compute
    pipe.set_progress_bar_config(disable=True)
    tokens = pipe("a small red circle on a plain background", output_type="latent",
                  generator=torch.Generator().manual_seed(0)).images
    assert tokens.shape == (1, 256)
    assert pipe.draft_transformer is not None  # the draft stage registered itself in model_index.json
    drafted = pipe("a small red circle on a plain background", output_type="latent", decoding="draft",
                   generator=torch.Generator().manual_seed(0))
    assert drafted.images.shape == (1, 256) and drafted.stats.draft_forwards > 0


@pytest.mark.slow  # a retrain end to end
def test_a_retrain_from_a_saved_pipeline_keeps_its_vq_tokenizer(tmp_path):
    """--vq-from: the GPT is retrained on the codes of the given pipeline's VQ, which is saved unchanged."""
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["--train-scenes", "24", "--held-out-scenes", "8", "--vq-batch-size", "4", "--vq-steps", "1",
              "--ar-batch-size", "2", "--ar-steps", "1", "--draft-batch-size", "2", "--draft-steps", "1"]
    main(common + ["--work-dir", str(tmp_path / "work1"), "--out-dir", str(first)])
    main(common + ["--work-dir", str(tmp_path / "work2"), "--out-dir", str(second), "--vq-from", str(first),
                   "--seed", "1"])
    vq_first, vq_second = (LlamaGenVQModel.from_pretrained(out / "vqvae") for out in (first, second))
    for (name, a), (_, b) in zip(vq_first.state_dict().items(), vq_second.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    metrics = [json.loads((out / "training_metrics.json").read_text()) for out in (first, second)]
    assert metrics[0]["vqvae"] == metrics[1]["vqvae"]
    gpt_first, gpt_second = (LlamaGenTransformer.from_pretrained(out / "transformer") for out in (first, second))
    assert not torch.equal(gpt_first.tok_embeddings.weight, gpt_second.tok_embeddings.weight)  # a new GPT (seed 1)


def test_caption_tokenizer_covers_the_grammar_without_unknown_words():
    tokenizer = build_tokenizer()
    _, captions = scenes(0, 200)
    encoded = tokenizer(captions, padding="max_length", max_length=16, return_tensors="pt")
    assert (encoded.input_ids != tokenizer.unk_token_id).all()
    assert (encoded.attention_mask[:, -1] == 1).all()  # left padding: the last slot is always a word
