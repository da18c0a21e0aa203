"""The synthetic captioned scenes: deterministic, held-out captions never in training, captions parse back."""

import numpy as np
import pytest

from mmspec.zoo.shapes import CAPTION_WORDS, is_held_out, parse_caption, scene, scenes


def test_scenes_are_deterministic_and_varied():
    images, captions = scenes(0, 16)
    again, captions_again = scenes(0, 16)
    assert images.shape == (16, 64, 64, 3) and images.dtype == np.uint8
    assert np.array_equal(images, again) and captions == captions_again
    assert len(set(captions)) > 12 and images.std(axis=(1, 2, 3)).min() > 5


def test_held_out_split_holds_only_held_out_captions():
    train = [scene(i)[1] for i in range(200)]
    held_out = [scene(i, "heldout")[1] for i in range(50)]
    assert not any(is_held_out(c) for c in train) and all(is_held_out(c) for c in held_out)
    assert not set(train) & set(held_out)
    with pytest.raises(ValueError, match="split"):
        scene(0, "test")


def test_captions_use_the_grammar_words_and_parse_back():
    for i in range(300):
        caption = scene(i)[1]
        assert set(caption.split()) <= set(CAPTION_WORDS)
        assert parse_caption(caption).caption() == caption
    spec = parse_caption("two small red triangles left of a large blue circle on a striped background")
    assert (spec.first.count, spec.first.shape, spec.relation, spec.second.color) == (2, "triangle", "left of", "blue")
    with pytest.raises(ValueError, match="grammar"):
        parse_caption("a purple elephant on a plain background")
