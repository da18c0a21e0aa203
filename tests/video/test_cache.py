"""FrameKVCache: absolute positions, commit / rollback at frame granularity, eviction only of committed frames."""

import pytest
import torch

from mmspec.video import FrameKVCache

LAYERS, B, H, L_F, D = 2, 2, 3, 4, 5


def frame_kv(index: int, n: int = 1) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer k / v for frames index .. index + n - 1, each filled with a value naming (layer, frame)."""
    keys = [torch.cat([torch.full((B, H, L_F, D), 100.0 * layer + index + i) for i in range(n)], 2)
            for layer in range(LAYERS)]
    return keys, [-k for k in keys]


def new_cache(window=3, max_speculative=4) -> FrameKVCache:
    return FrameKVCache(LAYERS, B, H, D, L_F, window=window, max_speculative=max_speculative)


def frames_held(cache: FrameKVCache, layer: int = 0) -> list[int]:
    k, v = cache.context(layer)
    assert torch.equal(v, -k)
    return [int(k[0, 0, f * L_F, 0].item() - 100 * layer) for f in range(k.shape[2] // L_F)]


def test_append_commit_and_window_eviction_keep_absolute_positions():
    cache = new_cache(window=3)
    for index in range(5):
        cache.append(*frame_kv(index))
        cache.commit(1)
    assert frames_held(cache) == [2, 3, 4] == cache.positions.tolist() and frames_held(cache, 1) == [2, 3, 4]
    assert (cache.start, cache.end, cache.committed) == (2, 5, 5)


def test_rollback_returns_to_the_cache_of_a_run_over_the_committed_frames_only():
    speculative, fresh = new_cache(), new_cache()
    emitted = 0
    for block, keep in [(4, 2), (3, 3), (4, 0), (2, 1), (4, 4)]:  # speculate `block` frames, emit `keep` of them
        speculative.append(*frame_kv(emitted, block))
        speculative.commit(keep)
        assert speculative.rollback() == block - keep
        for index in range(emitted, emitted + keep):
            fresh.append(*frame_kv(index))
            fresh.commit(1)
        emitted += keep
        assert (speculative.start, speculative.end, speculative.committed) == (fresh.start, fresh.end, fresh.committed)
        assert speculative.positions.tolist() == fresh.positions.tolist() == frames_held(fresh)
        for layer in range(LAYERS):
            for a, b in zip(speculative.context(layer), fresh.context(layer)):
                assert torch.equal(a, b)
    assert emitted == 10 and frames_held(fresh) == [7, 8, 9]


def test_uncommitted_frames_are_never_evicted():
    cache = new_cache(window=2, max_speculative=4)
    cache.append(*frame_kv(0, 4))
    cache.commit(3)  # 3 committed > window 2: frame 0 goes, the speculative frame 3 stays
    assert frames_held(cache) == [1, 2, 3] and cache.num_speculative == 1
    with pytest.raises(ValueError, match="exceeds max_speculative=4"):
        cache.append(*frame_kv(4, 4))
    assert frames_held(cache) == [1, 2, 3]  # nothing written by the refused append


@pytest.mark.parametrize(
    "call,match",
    [(lambda c: c.commit(1), r"n must be in \[0, 0\]"),
     (lambda c: c.append(*[x[:1] for x in frame_kv(0)]), "one tensor per layer"),
     (lambda c: c.append([k[:, :, :3] for k in frame_kv(0)[0]], [v[:, :, :3] for v in frame_kv(0)[1]]),
      "not a whole number"),
     (lambda c: FrameKVCache(1, 1, 1, 1, 1, window=0, max_speculative=1), "window must be an int >= 1")],
)
def test_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(new_cache())
