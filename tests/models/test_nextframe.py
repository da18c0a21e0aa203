"""NextFrameTransformer: block-causal attention, absolute frame positions, cached = uncached."""

import pytest
import torch

from mmspec.models.nextframe import NextFrameTransformer, rope_split

CONFIG = dict(latent_channels=3, latent_size=2, num_actions=5, dim=32, depth=2, num_heads=2)


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
    cache = model.new_cache(2, window=8, max_speculative=8)
    pieces = []
    for start, stop in ((0, 2), (2, 3), (3, 6)):
        out, kv = model(latents[:, start:stop], t[:, start:stop], actions[:, start:stop], start, cache)
        cache.append([k for k, _ in kv], [v for _, v in kv])
        cache.commit(stop - start)
        pieces.append(out)
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-5)


@torch.no_grad()
def test_positions_are_absolute_so_an_evicted_window_needs_no_re_encoding():
    """One layer, so a cached frame's keys depend on that frame alone: after frames 0-2 leave the window, frame 6
    computed from the cache equals an uncached pass over frames 3-6 at their absolute positions (not at 0-3)."""
    torch.manual_seed(1)
    model = NextFrameTransformer(**{**CONFIG, "depth": 1}).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.2)
    latents, t, actions = inputs(7)
    cache = model.new_cache(2, window=3, max_speculative=1)
    for f in range(6):
        _, kv = model(latents[:, f : f + 1], t[:, f : f + 1], actions[:, f : f + 1], f, cache)
        cache.append([k for k, _ in kv], [v for _, v in kv])
        cache.commit(1)
    assert cache.positions.tolist() == [3, 4, 5]
    cached, _ = model(latents[:, 6:], t[:, 6:], actions[:, 6:], 6, cache)
    window, _ = model(latents[:, 3:], t[:, 3:], actions[:, 3:], first_frame=3)  # frames 3..6 at their own positions
    assert torch.allclose(cached, window[:, -1:], atol=1e-5)


def test_clear_errors(model):
    latents, t, actions = inputs(2)
    with pytest.raises(ValueError, match=r"actions must be in \[0, 5\)"):
        model(latents, t, actions + 5)
    with pytest.raises(ValueError, match="first_frame must follow the cached frames"):
        model(latents, t, actions, first_frame=3, cache=model.new_cache(2, 4, 2))
    with pytest.raises(ValueError, match="dim / num_heads must be an even integer"):
        NextFrameTransformer(dim=30, num_heads=4)
