"""Frame speculation (reference E.2): sequential = strict, first-frame invariance, cached = an uncached recompute of the
same joint procedure, rollback restores exactly the cache of the emitted prefix, emitted frames carry their true
action, frame accounting; each with a broken variant the test must reject."""

import pytest
import torch

import mmspec.video.speculation as speculation
from mmspec.models.nextframe import NextFrameTransformer
from mmspec.video import FrameSession, FrameSpeculation
from mmspec.video.methods import AR

# 4 x 4 latents in 2 x 2 patches: 16 latent positions, 4 tokens per frame
CONFIG = dict(latent_channels=3, latent_size=4, patch_size=2, num_actions=5, dim=32, depth=2, num_heads=2,
              attention_window=3)
STEPS, CONTEXT_NOISE = 3, 0.1
ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    model = NextFrameTransformer(**CONFIG).eval()
    with torch.no_grad():  # adaLN-zero starts at a zero output: randomise so that every input matters
        for p in model.parameters():
            p.normal_(0, 0.15)
    return model


def context_frames(batch: int = 2, frames: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, frames, 16, 3, generator=torch.Generator().manual_seed(seed))


def action_sequence(length: int, batch: int = 2, change_prob: float = 0.35, seed: int = 0) -> torch.Tensor:
    """[length, B] persistent random actions (every row changes at the same ticks half the time)."""
    g = torch.Generator().manual_seed(seed)
    actions = [torch.randint(0, 5, (batch,), generator=g)]
    for _ in range(length - 1):
        change = torch.rand((), generator=g) < change_prob
        actions.append(torch.randint(0, 5, (batch,), generator=g) if change else actions[-1])
    return torch.stack(actions)


def run(model, actions, speculation=None, context=None, session_cls=FrameSession, **kwargs):
    """(frames [B, T, L_f, C], session) of a rollout under actions [T, B]."""
    context = context_frames() if context is None else context
    session = session_cls(model, context, seeds=torch.tensor([3, 8]), num_inference_steps=STEPS,
                          context_noise=CONTEXT_NOISE, speculation=speculation or AR(), **kwargs)
    frames = torch.stack([session.step(a) for a in actions], 1)
    session.close()
    return frames, session


@torch.no_grad()
def uncached_rollout(model, context, actions, block_size: int):
    """The joint-N procedure recomputed from scratch: every forward runs the model on all frames so far (at the
    context noise, keyed) plus the block, with no cache; blocks are kept while the action matches."""
    B, k = context.shape[:2]
    seeds = torch.tensor([3, 8])
    emitted, emitted_actions = list(context.unbind(1)), [torch.zeros(B, dtype=torch.long)] * k
    queue, queue_action = [], None
    for a in actions:
        if queue and not torch.equal(a, queue_action):
            queue = []
        if not queue:
            first = len(emitted)
            frames = torch.arange(first)
            noise = speculation.frame_noise(seeds, frames, speculation.CONTEXT_NOISE, 16, 3)
            ctx = (1 - CONTEXT_NOISE) * torch.stack(emitted, 1) + CONTEXT_NOISE * noise
            block = torch.arange(first, first + block_size)
            x = speculation.frame_noise(seeds, block, speculation.INITIAL_NOISE, 16, 3)
            acts = torch.cat([torch.stack(emitted_actions, 1), a[:, None].expand(B, block_size)], 1)
            for step in range(STEPS):
                t, t_next = 1 - step / STEPS, 1 - (step + 1) / STEPS
                times = torch.cat([torch.full((B, first), CONTEXT_NOISE), torch.full((B, block_size), t)], 1)
                velocity, _ = model(torch.cat([ctx, x], 1), times, acts)
                x = x + (t_next - t) * velocity[:, first:]
            queue, queue_action = list(x.unbind(1)), a
        emitted.append(queue.pop(0))
        emitted_actions.append(a)
    return torch.stack(emitted[k:], 1)


def test_strict_and_n_1_equal_sequential_generation(model):
    actions = action_sequence(10)
    sequential, _ = run(model, actions, FrameSpeculation(frames=1))
    strict, session = run(model, actions, FrameSpeculation.strict())
    assert torch.allclose(strict, sequential, atol=ATOL)
    assert session.stats.target_forwards == 1 + STEPS * len(actions)  # the context passes ride on the Euler steps
    eager_one, _ = run(model, actions, FrameSpeculation(frames=1))
    assert torch.equal(eager_one, sequential)


@pytest.mark.parametrize("frames", [2, 4])
def test_the_first_frame_of_every_block_is_the_sequential_frame(model, frames):
    """Constant action: block 1 starts at frame k; its first frame equals sequential frame k, the later ones are
    joint samples and differ."""
    actions = torch.full((frames, 2), 2)
    sequential, _ = run(model, actions, FrameSpeculation(frames=1))
    speculative, session = run(model, actions, FrameSpeculation(frames=frames))
    assert session.stats.blocks == 1
    assert torch.allclose(speculative[:, 0], sequential[:, 0], atol=ATOL)
    assert not torch.allclose(speculative[:, 1:], sequential[:, 1:], atol=1e-3)


def test_first_frame_check_rejects_attention_to_later_frames_of_the_block(model, monkeypatch):
    """Mutation: attention without the block-causal mask. Sequential frames are unchanged (a lone frame over a full
    cache attends to everything anyway); a block's first frame now sees its successors and leaves the sequential law."""
    actions, start = torch.full((4, 2), 2), context_frames(frames=1)
    sequential, _ = run(model, actions, FrameSpeculation(frames=1), context=start)
    attention = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask=None: attention(q, k, v))
    unmasked_sequential, _ = run(model, actions, FrameSpeculation(frames=1), context=start)
    unmasked, _ = run(model, actions, FrameSpeculation(frames=4), context=start)
    assert torch.allclose(unmasked_sequential[:, 0], sequential[:, 0], atol=ATOL)
    assert not torch.allclose(unmasked[:, 0], unmasked_sequential[:, 0], atol=1e-3)


@pytest.mark.parametrize("frames", [1, 2, 3])
@pytest.mark.parametrize("context", ["eager", "pipelined"])
def test_cached_speculation_equals_an_uncached_recompute(model, frames, context):
    """Actions with changes (so blocks are discarded and rolled back), batch 2, a window shorter than the rollout
    (so the cache evicts): every emitted frame equals the uncached joint procedure's."""
    actions = action_sequence(12, seed=5)
    speculative, session = run(model, actions, FrameSpeculation(frames=frames, context=context))
    if frames > 1:
        assert session.stats.rollbacks > 0 and session.stats.frames_discarded > 0
    reference = uncached_rollout(model, context_frames(), actions, frames)
    assert torch.allclose(speculative, reference, atol=1e-4)


def test_cached_equals_uncached_rejects_a_stream_that_shifts_with_discarded_frames(model, monkeypatch):
    """Mutation: noise drawn from a counter (sequentially consumed) instead of keyed by frame."""
    calls = iter(range(10**6))
    keyed = speculation.frame_noise
    monkeypatch.setattr(speculation, "frame_noise", lambda seeds, frames, purpose, *shape: keyed(
        seeds, frames + 1000 * next(calls) if purpose == speculation.INITIAL_NOISE else frames, purpose, *shape))
    actions = action_sequence(12, seed=3)
    speculative, _ = run(model, actions, FrameSpeculation(frames=3))
    monkeypatch.setattr(speculation, "frame_noise", keyed)
    assert not torch.allclose(speculative, uncached_rollout(model, context_frames(), actions, 3), atol=1e-2)


@torch.no_grad()
def fresh_context(model, emitted: torch.Tensor, actions: torch.Tensor):
    """Per layer (k, v) of the last `attention_window` frames of a fresh uncached context pass over every emitted
    frame [B, F, L_f, C] (frames 0 .. F - 1)."""
    F = emitted.shape[1]
    noise = speculation.frame_noise(torch.tensor([3, 8]), torch.arange(F), speculation.CONTEXT_NOISE, 16, 3)
    ctx = (1 - CONTEXT_NOISE) * emitted + CONTEXT_NOISE * noise
    _, kv = model(ctx, torch.full((2, F), CONTEXT_NOISE), actions)
    keep = min(F, CONFIG["attention_window"]) * model.grid_size**2
    return [(k[:, :, -keep:], v[:, :, -keep:]) for k, v in kv]


class RollbackSpy:
    """Wraps a session's cache.rollback: after each, snapshots positions, length and contents."""

    def __init__(self, session):
        self.snapshots, self.cache, self.rollback = [], session.cache, session.cache.rollback
        session.cache.rollback = self

    def __call__(self):
        dropped = self.rollback()
        cache = self.cache
        self.snapshots.append((cache.end, cache.positions.tolist(), cache.num_speculative,
                               [tuple(t.clone() for t in cache.context(layer)) for layer in range(len(cache.keys))]))
        return dropped


def check_rollbacks(model, rollback=None):
    actions = action_sequence(14, seed=5)
    session = FrameSession(model, context_frames(), seeds=torch.tensor([3, 8]), num_inference_steps=STEPS,
                           context_noise=CONTEXT_NOISE, speculation=FrameSpeculation(frames=3))
    if rollback is not None:
        session.cache.rollback = lambda: rollback(session.cache)
    spy = RollbackSpy(session)
    frames = torch.stack([session.step(a) for a in actions], 1)
    assert len(spy.snapshots) >= 2
    emitted = torch.cat([context_frames(), frames], 1)
    used = torch.cat([torch.zeros(2, 2, dtype=torch.long), torch.stack(session.actions_used, 1)], 1)
    for end, positions, speculative, contents in spy.snapshots:
        assert speculative == 0
        assert positions == list(range(max(0, end - CONFIG["attention_window"]), end))
        fresh = fresh_context(model, emitted[:, :end], used[:, :end])
        for (k, v), (k_fresh, v_fresh) in zip(contents, fresh, strict=True):
            assert k.shape == k_fresh.shape
            assert torch.allclose(k, k_fresh, atol=ATOL) and torch.allclose(v, v_fresh, atol=ATOL)
    # later frames: those of the uncached procedure given the same prefix (the whole rollout, checked above)
    assert torch.allclose(frames, uncached_rollout(model, context_frames(), actions, 3), atol=1e-4)


def test_after_every_rollback_the_cache_is_a_fresh_run_over_the_emitted_prefix(model):
    check_rollbacks(model)


def test_rollback_check_rejects_a_rollback_that_corrupts_the_last_committed_frame(model):
    def off_by_one(cache):  # mutation: the slot arithmetic is one frame off, the first discarded frame lands last
        L, at = cache.tokens_per_frame, (cache.committed - cache.start - 1) * cache.tokens_per_frame
        for tensor in cache.keys + cache.values:
            tensor[:, :, at : at + L] = tensor[:, :, at + L : at + 2 * L]
        dropped, cache.end = cache.num_speculative, cache.committed
        return dropped

    with pytest.raises(AssertionError):
        check_rollbacks(model, off_by_one)


class TrustsTheQueue(FrameSession):
    """Mutation: never compares the incoming action with the queued frames' one."""

    def _matches(self, actions):
        return True


@pytest.mark.parametrize("spec", [FrameSpeculation(frames=4), FrameSpeculation(frames=6, adaptive=True),
                                  FrameSpeculation(frames=3, context="pipelined")])
def test_every_emitted_frame_was_generated_under_its_true_action(model, spec):
    # changes inside blocks of every size tested, and one row changing alone (tick 11)
    actions = torch.tensor([[1, 1, 2, 2, 2, 2, 3, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1],
                            [1, 1, 2, 2, 2, 2, 3, 4, 4, 4, 0, 3, 3, 3, 3, 3, 3, 1, 1, 1]]).T
    _, session = run(model, actions, spec)
    assert torch.equal(torch.stack(session.actions_used), actions)
    _, broken = run(model, actions, spec, session_cls=TrustsTheQueue)
    assert not torch.equal(torch.stack(broken.actions_used), actions)


@pytest.mark.parametrize("spec", [FrameSpeculation(frames=1), FrameSpeculation(frames=4),
                                  FrameSpeculation(frames=8, adaptive=True)])
def test_frame_accounting(model, spec):
    actions = action_sequence(15, seed=2)
    _, session = run(model, actions, spec)
    stats = session.stats
    assert stats.frames_emitted == len(actions) == stats.frames_computed - stats.frames_discarded
    assert stats.frames_computed == sum(stats.block_sizes) and stats.blocks == len(stats.block_sizes)
    assert stats.rollbacks <= stats.blocks and stats.timings["model"] > 0 and stats.fps > 0


def test_adaptive_block_size_follows_action_persistence():
    spec = FrameSpeculation(frames=8, adaptive=True, frame_cost=0.3)
    sizes = [spec.block_size(kept, 10) for kept in (0, 10, 40, 200)]
    assert sizes[0] == 1 and sizes[-1] == 8 and sizes == sorted(sizes)
    assert FrameSpeculation(frames=5).block_size(0, 100) == 5  # fixed N ignores the history
    assert FrameSpeculation(frames=8, adaptive=True, frame_cost=0.0).block_size(1, 1) == 8  # free frames: speculate all


def test_clear_errors(model):
    with pytest.raises(ValueError, match=r"frames must be >= 1"):
        FrameSpeculation(frames=0)
    with pytest.raises(TypeError, match="frames must be an int"):
        FrameSpeculation(frames=2.0)
    with pytest.raises(ValueError, match="frame_cost must be >= 0, got -0.1"):
        FrameSpeculation(frame_cost=-0.1)
    with pytest.raises(ValueError, match="context must be one of"):
        FrameSpeculation(context="lazy")
    with pytest.raises(ValueError, match=r"context holds 4 frames; it must hold 1 to 3"):
        FrameSession(model, context_frames(frames=4), seeds=torch.tensor([3, 8]), speculation=AR())
    session = FrameSession(model, context_frames(), seeds=torch.tensor([3, 8]), speculation=AR())
    with pytest.raises(ValueError, match=r"actions must be in \[0, 5\)"):
        session.step(5)
    with pytest.raises(TypeError, match="actions must be integers"):
        session.step(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"actions must be an int or one per row \(2\), got 3"):
        session.step([1, 2, 3])
    with pytest.raises(ValueError, match=r"context_actions must be in \[0, 5\)"):
        FrameSession(model, context_frames(), seeds=torch.tensor([3, 8]), context_actions=torch.full((2, 2), -1),
                     speculation=AR())
    session.close()
    with pytest.raises(ValueError, match="session is closed"):
        session.step(1)
