"""FID / KID / CLIP score through torchmetrics: they separate what should differ, agree on what should not, and the
OpenAI-CLIP folder layout loads through the same code path (a tiny random model saved locally)."""

import json
import string

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmspec.eval.metrics import (
    as_image_tensor,
    clip_score,
    frechet_distance,
    image_features,
    kernel_distance,
    load_clip,
    paired_mmd_test,
)
from mmspec.zoo.shapes import scenes


@pytest.fixture(scope="module")
def clip():
    return load_clip()  # the zoo's in-domain CLIP


@pytest.fixture(scope="module")
def held_out():
    images, captions = scenes(0, 512, "heldout")
    return as_image_tensor(images), captions


def blurred(images: torch.Tensor) -> torch.Tensor:
    kernel = torch.full((3, 1, 5, 5), 1 / 25)
    return F.conv2d(images.float(), kernel, padding=2, groups=3).round().clamp(0, 255).to(torch.uint8)


def hue_shifted(images: torch.Tensor) -> torch.Tensor:
    return images[:, [1, 2, 0]]


def test_fd_is_zero_on_itself_small_between_samples_and_large_under_degradation(clip, held_out):
    images, _ = held_out
    features = image_features(clip, images)
    assert abs(frechet_distance(features, features)) < 1e-6
    same_law = frechet_distance(features[:256], features[256:])  # > 0: finite-sample bias and noise (d = 128)
    for degrade in (blurred, hue_shifted):
        degraded = image_features(clip, degrade(images))
        assert frechet_distance(features[:256], degraded[256:]) > 3 * same_law


def test_kid_is_near_zero_between_samples_and_large_under_degradation(clip, held_out):
    images, _ = held_out
    features = image_features(clip, images)
    same_mean, same_std = kernel_distance(features[:256], features[256:], subset_size=100)
    assert abs(same_mean) < 3 * same_std + 1e-3
    for degrade in (blurred, hue_shifted):
        degraded = image_features(clip, degrade(images))
        mean, std = kernel_distance(features[:256], degraded[256:], subset_size=100)
        assert mean > 5 * max(same_mean, same_std)
    assert kernel_distance(features, features, seed=3) == kernel_distance(features, features, seed=3)


def test_paired_mmd_test_is_calibrated_under_the_null_and_has_power():
    """300 null replicates (paired sets from one law): p < 0.05 in 5 % of them; a binomial(300, 0.05) count lies in
    [3, 33] with probability > 1 - 1e-5. A shift of 1.5 sd is found in each of 20 replicates."""
    generator = torch.Generator().manual_seed(0)
    null_p = []
    for replicate in range(300):
        a, b = torch.randn(2, 20, 4, generator=generator, dtype=torch.float64)
        null_p.append(paired_mmd_test(a, b, permutations=199, seed=replicate)["p_value"])
    assert 3 <= sum(p < 0.05 for p in null_p) <= 33
    for replicate in range(20):
        a, b = torch.randn(2, 20, 4, generator=generator, dtype=torch.float64)
        assert paired_mmd_test(a, b + 1.5, permutations=199, seed=replicate)["p_value"] <= 0.05


def test_paired_mmd_test_statistic_is_kid_and_detects_degradation(clip, held_out):
    images, _ = held_out
    features = image_features(clip, images[:128])
    other = image_features(clip, blurred(images[:128]))
    result = paired_mmd_test(features, other, permutations=499)
    assert result["p_value"] == 1 / 500
    assert result["mmd2"] == pytest.approx(kernel_distance(features, other, subset_size=128, subsets=1)[0], rel=1e-9)
    with pytest.raises(ValueError, match="paired"):
        paired_mmd_test(features, other[:64])


def test_clip_score_prefers_matching_captions(clip, held_out):
    images, captions = held_out
    shuffled = captions[1:] + captions[:1]
    matching, mismatched = clip_score(clip, images, captions), clip_score(clip, images, shuffled)
    assert matching > mismatched + 5
    per_image = [clip_score(clip, images[i : i + 1], [c]) for i, c in enumerate(captions[:32])]
    per_image_shuffled = [clip_score(clip, images[i : i + 1], [c]) for i, c in enumerate(shuffled[:32])]
    assert np.mean(np.greater(per_image, per_image_shuffled)) > 0.8


def test_in_domain_features_match_the_processor(clip, held_out):
    images, _ = held_out
    processed = clip.processor(images=list(images[:4]), return_tensors="pt")["pixel_values"]
    assert torch.allclose(clip.pixel_values(images[:4]), torch.as_tensor(np.stack(processed)), atol=1e-6)


@pytest.fixture(scope="module")
def openai_layout_clip(tmp_path_factory):
    """A tiny random CLIP saved like a local openai/clip-vit-* folder: CLIPTokenizer (BPE), 224-px CLIP image
    processor, CLIPModel with 32-px patches."""
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPProcessor, CLIPTokenizer

    letters = list(string.ascii_lowercase)
    vocab = {t: i for i, t in enumerate(["<|startoftext|>", "<|endoftext|>", *letters, *(c + "</w>" for c in letters)])}
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[])
    config = CLIPConfig(
        text_config={"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 77, "bos_token_id": 0, "eos_token_id": 1,
                     "pad_token_id": 1},
        vision_config={"image_size": 224, "patch_size": 32, "hidden_size": 32, "intermediate_size": 64,
                       "num_hidden_layers": 1, "num_attention_heads": 2},
        projection_dim=16)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("clip") / "clip-vit-tiny"
    CLIPModel(config).save_pretrained(folder)
    CLIPProcessor(image_processor=CLIPImageProcessorPil(), tokenizer=tokenizer).save_pretrained(folder)
    return folder


def test_openai_clip_code_path_with_a_local_folder(openai_layout_clip, held_out):
    images, captions = held_out[0][:8], held_out[1][:8]
    clip = load_clip(openai_layout_clip)
    assert json.loads((openai_layout_clip / "config.json").read_text())["projection_dim"] == clip.num_features == 16
    features = image_features(clip, images)
    assert features.shape == (8, 16) and torch.isfinite(features).all()
    # our torch resize (64 -> 224 px, antialiased bicubic) stays close to the processor's PIL resize
    processed = torch.as_tensor(np.stack(clip.processor(images=list(images), return_tensors="pt")["pixel_values"]))
    assert (clip.pixel_values(images) - processed).abs().mean() < 0.01
    score = clip_score(clip, images, captions)
    assert 0 <= score <= 100


def test_clear_errors(tmp_path, clip, held_out):
    with pytest.raises(ValueError, match="clip_model: no folder"):
        load_clip(tmp_path / "nowhere" / "clip")
    with pytest.raises(ValueError, match="no zoo model"):
        load_clip("not_a_zoo_model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        load_clip(tmp_path / "empty")
    features = torch.randn(5, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="at least 2 images"):
        frechet_distance(features, features[:1])
    with pytest.raises(ValueError, match="at least 2 images"):
        kernel_distance(features[:1], features)
    with pytest.raises(ValueError, match="captions: expected one per image"):
        clip_score(clip, held_out[0][:2], held_out[1][:3])
    with pytest.raises(TypeError, match="images: expected uint8"):
        as_image_tensor(torch.rand(2, 3, 8, 8))
