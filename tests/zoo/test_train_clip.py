"""Smoke test of the in-domain CLIP training script (a few steps, resume, reload as a local CLIP folder), its
retrieval metric, and the shipped `shapes_clip`."""

import json

import torch
from safetensors.torch import load_file

from mmspec.eval.metrics import load_clip
from mmspec.zoo import IMAGE_CLIP, zoo_path
from mmspec.zoo.shapes import scenes
from mmspec.zoo.train_clip import TEXT_CONTEXT, build_processor, main, retrieval_top1


def test_train_resume_and_reload(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    args = ["--work-dir", str(work), "--out-dir", str(out), "--train-scenes", "32", "--held-out-scenes", "32",
            "--batch-size", "4", "--ckpt-every", "1"]
    main([*args, "--steps", "1"])
    main([*args, "--steps", "2"])  # resumes at step 1
    assert torch.load(work / "ckpt-clip.pt", weights_only=False)["step"] == 2
    metrics = json.loads((out / "training_metrics.json").read_text())
    assert metrics["steps"] == 2 and set(metrics["held_out_retrieval_top1"]) == {"gallery_32"}
    clip = load_clip(out)
    assert clip.model.dtype == torch.float32
    assert all(t.dtype == torch.float16 for t in load_file(out / "model.safetensors").values())
    images, captions = scenes(0, 2, "heldout")
    assert clip(torch.from_numpy(images).permute(0, 3, 1, 2)).shape == (2, clip.num_features)


def test_tokenizer_covers_the_grammar_and_ends_every_caption_with_eos():
    tokenizer = build_processor().tokenizer
    _, captions = scenes(0, 300)
    encoded = tokenizer(captions, padding="max_length", max_length=TEXT_CONTEXT, return_tensors="pt")
    assert (encoded.input_ids != tokenizer.unk_token_id).all()
    lengths = encoded.attention_mask.sum(1)
    assert (encoded.input_ids[torch.arange(len(captions)), lengths - 1] == tokenizer.eos_token_id).all()
    assert (encoded.input_ids[:, 0] == tokenizer.bos_token_id).all()


def test_retrieval_counts_identical_captions_as_hits():
    embeds = torch.eye(4)
    captions = ["a", "b", "c", "c"]
    swapped = embeds[[0, 1, 3, 2]]  # images 2 and 3 match each other's text, which is the same caption
    assert retrieval_top1(embeds, swapped, captions, gallery=4) == {"image_to_text": 1.0, "text_to_image": 1.0}
    wrong = embeds[[1, 0, 2, 3]]
    assert retrieval_top1(embeds, wrong, captions, gallery=4) == {"image_to_text": 0.5, "text_to_image": 0.5}


def test_shipped_model_card_figures():
    metrics = json.loads((zoo_path(IMAGE_CLIP) / "training_metrics.json").read_text())
    assert metrics["held_out_retrieval_top1"]["gallery_1024"]["image_to_text"] > 0.9
