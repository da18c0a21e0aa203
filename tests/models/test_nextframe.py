"""NextFrameTransformer: block-causal sliding-window attention, cached = uncached (with eviction)."""

import pytest
import torch

from mmspec.models.nextframe import NextFrameTransformer, rope_split

CONFIG = dict(latent_channels=3, latent_size=2, num_actions=5, dim=32, depth=2, num_heads=2, attention_window=8)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    model = NextFrameTransformer(**CONFIG).eval()
    with torch.no_grad():  # adaLN-zero starts at the identity with a zero output: randomise to make tests bite
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


def inputs(frames: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, frames, 4, 3, generator=g), torch.rand(2, frames, generator=g),
            torch.randint(0, 5, (2, frames), generator=g))


def test_rope_split_covers_the_head_with_even_parts():
    for head_dim in (8, 16, 32, 64, 128):
        parts = rope_split(head_dim)
        assert sum(parts) == head_dim and all(p % 2 == 0 and p > 0 for p in parts)


@torch.no_grad()
def test_attention_is_block_causal(model):
    latents, t, actions = inputs(5)
    out, _ = model(latents, t, actions)
    changed = latents.clone()
    changed[:, 2, 1] += 1.0  # one token of frame 2
    out2, _ = model(changed, t, actions)
    assert torch.equal(out[:, :2], out2[:, :2])  # earlier frames never see a later one
    assert not torch.allclose(out[:, 2:], out2[:, 2:], atol=1e-4)  # the frame itself (bidirectional) and later ones
    other = actions.clone()
    other[:, 3] = (other[:, 3] + 1) % 5
    out3, _ = model(latents, t, other)
    assert torch.equal(out[:, :3], out3[:, :3]) and not torch.allclose(out[:, 3], out3[:, 3], atol=1e-4)


@torch.no_grad()
def test_cached_frames_give_the_uncached_result(model):
    latents, t, actions = inputs(6)
    full, _ = model(latents, t, actions)
    cache = model.new_cache(2, max_speculative=8)
    pieces = []
    for start, stop in ((0, 2), (2, 3), (3, 6)):
        out, kv = model(latents[:, start:stop], t[:, start:stop], actions[:, start:stop], start, cache)
        cache.append([k for k, _ in kv], [v for _, v in kv])
        cache.commit(stop - start)
        pieces.append(out)
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-5)


def randomised(**config) -> NextFrameTransformer:
    torch.manual_seed(1)
    model = NextFrameTransformer(**{**CONFIG, **config}).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.2)
    return model


def cached_one_by_one(model, latents, t, actions, frames: int):
    """A cache that appended and committed frames 0 .. frames - 1 one at a time."""
    cache = model.new_cache(2, max_speculative=1)
    for f in range(frames):
        _, kv = model(latents[:, f : f + 1], t[:, f : f + 1], actions[:, f : f + 1], f, cache)
        cache.append([k for k, _ in kv], [v for _, v in kv])
        cache.commit(1)
    return cache


@torch.no_grad()
def test_a_frame_sees_only_the_attention_window_before_it():
    model = randomised(attention_window=2)
    latents, t, actions = inputs(6)
    out, _ = model(latents, t, actions)
    changed = latents.clone()
    changed[:, 1] += 1.0
    out2, _ = model(changed, t, actions)
    # frames 1-3 see frame 1 directly; 4-5 only through the keys of frames 2-3, in the second layer
    assert not torch.allclose(out[:, 3], out2[:, 3], atol=1e-4)
    one_layer = randomised(attention_window=2, depth=1)
    out, _ = one_layer(latents, t, actions)
    out2, _ = one_layer(changed, t, actions)
    assert torch.equal(out[:, 4:], out2[:, 4:]) and not torch.allclose(out[:, 3], out2[:, 3], atol=1e-4)


@torch.no_grad()
def test_an_evicted_window_gives_the_uncached_result_at_absolute_positions():
    """After frames 0-2 leave a 3-frame cache, frame 6 from the cache equals frame 6 of an uncached pass over 0-6:
    the cached keys of frames 3-5 keep their positions and what they saw, nothing is re-encoded."""
    model = randomised(attention_window=3)
    latents, t, actions = inputs(7)
    full, _ = model(latents, t, actions)
    cache = cached_one_by_one(model, latents, t, actions, 6)
    assert cache.positions.tolist() == [3, 4, 5]
    cached, _ = model(latents[:, 6:], t[:, 6:], actions[:, 6:], 6, cache)
    assert torch.allclose(cached, full[:, 6:], atol=1e-5)


@torch.no_grad()
def test_patches_round_trip_and_keep_block_causality_and_the_cache():
    model = randomised(latent_size=4, patch_size=2, attention_window=2)
    g = torch.Generator().manual_seed(2)
    latents = torch.randn(2, 5, 16, 3, generator=g)
    assert model.grid_size == 2 and model.patchify(latents).shape == (2, 5, 4, 12)
    assert torch.equal(model.unpatchify(model.patchify(latents)), latents)
    # a patch holds a 2 x 2 block of the raster-ordered grid: positions 0, 1, 4, 5 form patch 0
    assert torch.equal(model.patchify(latents)[0, 0, 0].view(4, 3), latents[0, 0, [0, 1, 4, 5]])
    t, actions = torch.rand(2, 5, generator=g), torch.randint(0, 5, (2, 5), generator=g)
    full, _ = model(latents, t, actions)
    cache = cached_one_by_one(model, latents, t, actions, 4)
    cached, _ = model(latents[:, 4:], t[:, 4:], actions[:, 4:], 4, cache)
    assert cache.positions.tolist() == [2, 3] and torch.allclose(cached, full[:, 4:], atol=1e-5)


def test_clear_errors(model):
    latents, t, actions = inputs(2)
    with pytest.raises(ValueError, match=r"actions must be in \[0, 5\)"):
        model(latents, t, actions + 5)
    with pytest.raises(ValueError, match="first_frame must follow the cached frames"):
        model(latents, t, actions, first_frame=3, cache=model.new_cache(2, 2))
    with pytest.raises(ValueError, match="dim / num_heads must be an even integer"):
        NextFrameTransformer(dim=30, num_heads=4)
    with pytest.raises(ValueError, match="attention_window must be >= 1"):
        NextFrameTransformer(attention_window=0)
    with pytest.raises(ValueError, match="patch_size must divide latent_size=8, got 3"):
        NextFrameTransformer(patch_size=3)
