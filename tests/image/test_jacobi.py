"""Speculative Jacobi decoding through the real LlamaGen adapter: greedy equivalence with AR, cache consistency after
every iteration, the exact law on a tiny transformer, per-row state, stats and clear errors."""

import pytest
import torch

from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.stats import SpecStats
from mmspec.image import AR, COUPLINGS, INITS, SJD, get_decoding
from mmspec.models.llamagen.adapter import LlamaGenAdapter, LlamaGenCondition
from tests.law import chi_square_p_value
from tests.models.llamagen_tiny import TEXT_CONTEXT, tiny_transformer, tiny_vq


def make_adapter(vocab_size=24, grid_size=4, seed=0):
    return LlamaGenAdapter(tiny_transformer("t2i", grid_size, vocab_size, seed), tiny_vq(vocab_size))


def text_states(rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, TEXT_CONTEXT, 16, generator=g, dtype=torch.float64)


def run(decoding, adapter, condition, sampling, generator, block=None):
    stats = SpecStats()
    with torch.no_grad():
        steps = list(decoding.run(adapter, condition, sampling, generator, stats, block))
    return steps, stats


@pytest.mark.parametrize("window", [2, 5, 16, 20])
def test_greedy_sjd_equals_greedy_ar_for_every_mode(window):
    adapter, condition = make_adapter(), LlamaGenCondition(text_states(3))
    greedy = SamplingConfig(temperature=0, guidance_scale=3.0)
    (*_, ar), _ = run(AR(), adapter, condition, greedy, None)
    for init in INITS:
        for coupling in COUPLINGS:
            (*_, last), stats = run(SJD(window, init, coupling), adapter, condition, greedy,
                                    torch.Generator().manual_seed(1))
            assert torch.equal(last.tokens, ar.tokens), (init, coupling)
            assert stats.target_forwards <= 16  # never more forwards than AR (prefill + 15)
    if window > 2:  # a frontier tree (greedy laws are one-hot: the tree's alternates are never real candidates)
        (*_, last), stats = run(SJD(window, tree_width=3, tree_depth=2), adapter, condition, greedy,
                                torch.Generator().manual_seed(1))
        assert torch.equal(last.tokens, ar.tokens) and stats.target_forwards <= 16


@pytest.mark.parametrize("decoding", [SJD(6, "vertical", coupling) for coupling in COUPLINGS]
                         + [SJD(6, "vertical", "maximal", tree_width=3, tree_depth=2),
                            SJD(5, "random", "gumbel", tree_width=2, tree_depth=3)], ids=repr)
def test_cache_equals_a_fresh_prefill_of_the_committed_prefix_after_every_iteration(decoding):
    adapter = make_adapter()
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6, [0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    condition = LlamaGenCondition(text_states(3), mask)
    captured = {}
    prefill = adapter.prefill

    def spy_prefill(*args, **kwargs):
        captured["state"], logits = prefill(*args, **kwargs)
        return captured["state"], logits

    adapter.prefill = spy_prefill
    cls = adapter.transformer.config.cls_token_num
    sampling = SamplingConfig(temperature=1.0, top_k=6, guidance_scale=3.0)
    iterations = 0
    with torch.no_grad():
        for step in decoding.run(adapter, condition, sampling, torch.Generator().manual_seed(0), SpecStats()):
            cache = captured["state"].cache
            for b, c in enumerate(step.n_committed.tolist()):
                fresh, _ = prefill(LlamaGenCondition(condition.states[b : b + 1], mask[b : b + 1]), cfg=True)
                if c > 1:
                    adapter.forward(step.tokens[b : b + 1, : c - 1], fresh)
                fill = cls + c - 1  # the last committed token has no key/value yet: it opens the next window
                for row, fresh_row in ((b, 0), (b + 3, 1)):  # conditional row and its unconditional twin
                    assert cache.lengths[row] == fill
                    for buffer, fresh_buffer in ((cache.k, fresh.cache.k), (cache.v, fresh.cache.v)):
                        torch.testing.assert_close(buffer[:, row, :, :fill], fresh_buffer[:, fresh_row, :, :fill],
                                                   rtol=0, atol=1e-10)
            iterations += 1
    assert 1 < iterations < 16  # several iterations, fewer than AR's forwards


def sequence_law(model, states, sampling):
    """Exact AR joint law [V^N] of a tiny transformer (full teacher-forced passes, fp64)."""
    V, N = model.config.vocab_size, model.num_image_tokens
    sequences = torch.cartesian_prod(*[torch.arange(V)] * N)
    rows = len(sequences)
    cond = model(sequences, states.expand(rows, -1, -1), None)  # [rows, N, V]
    uncond = model(sequences, model.unconditional(rows, states.device), None)
    p = process_logits(cond, sampling, uncond)
    return p.gather(-1, sequences[..., None]).squeeze(-1).prod(-1)


@pytest.mark.parametrize("decoding", [SJD(3, "vertical", "maximal"),
                                      pytest.param(SJD(6, "random", "gumbel"), marks=pytest.mark.slow),
                                      SJD(2, "horizontal", "none"),
                                      pytest.param(SJD(4, "random", "maximal", tree_width=2), marks=pytest.mark.slow)],
                         ids=repr)
def test_sjd_through_the_real_transformer_matches_the_exact_law(decoding):
    """V = 3, a 2 x 2 grid: 81 outcomes per prompt; two prompts, CFG 2, top-k 2, 16,000 rows in one batch."""
    adapter = make_adapter(vocab_size=3, grid_size=2, seed=3)
    model = adapter.transformer
    for param in model.parameters():  # the tiny init is too peaked for 81 cells; soften it
        param.data.mul_(0.6)
    states = text_states(2, seed=5)
    sampling = SamplingConfig(temperature=1.0, top_k=2, guidance_scale=2.0)
    rows = 16_000
    with torch.no_grad():
        laws = [sequence_law(model, states[b : b + 1], sampling) for b in range(2)]
        (*_, last), stats = run(decoding, adapter, LlamaGenCondition(states.repeat(rows // 2, 1, 1)), sampling,
                                torch.Generator().manual_seed(0))
    outcomes = (last.tokens * 3 ** torch.arange(3, -1, -1)).sum(-1)
    for b in range(2):
        p_value = chi_square_p_value(torch.bincount(outcomes[b::2], minlength=81), laws[b])
        assert p_value > 1e-6, f"prompt {b}: p = {p_value:.2e}"
    assert stats.tokens_per_target_forward > 1.0


def test_rows_advance_independently_and_stats_record_the_acceptance_map():
    adapter, condition = make_adapter(), LlamaGenCondition(text_states(4))
    sampling = SamplingConfig(temperature=1.0, top_k=4, guidance_scale=3.0)
    steps, stats = run(SJD(8, "horizontal", "maximal"), adapter, condition, sampling,
                       torch.Generator().manual_seed(0), block=1)
    counts = torch.stack([s.n_committed for s in steps])  # [iterations + 1, B]
    assert (counts[1:] > counts[:-1]).any(0).all() and (counts[-1] == 16).all()
    assert any(len(set(c.tolist())) > 1 for c in counts)  # rows were at different positions at the same iteration
    amap = stats.acceptance_map  # [B, N]: the forward that committed each token
    assert amap.shape == (4, 16) and (amap[:, 0] == 0).all() and (amap[:, 1:] >= amap[:, :-1]).all()
    for b in range(4):  # row b took part in exactly the iterations until its last token
        assert stats.steps[b] == amap[b, -1] and stats.steps[b] == (counts[:, b] < 16).sum()
    assert stats.target_forwards == len(steps)  # the prefill, then one forward per iteration
    assert stats.tokens_per_target_forward == 64 / (stats.steps.sum() + 4)
    assert stats.accept_hist.sum() == stats.steps.sum() and 0 < stats.accepted <= stats.drafted


@pytest.mark.parametrize("decoding", [SJD(5, "random", "gumbel"), SJD(5, "random", "maximal", tree_width=3)],
                         ids=repr)
def test_per_row_generators_make_rows_independent_of_the_batch(decoding):
    """Row b with its own generator gives the same image alone or in a batch, while rows are at different positions."""
    adapter = make_adapter()
    states = text_states(3)
    sampling = SamplingConfig(temperature=1.0, top_k=6, guidance_scale=3.0)
    (*_, batch), _ = run(decoding, adapter, LlamaGenCondition(states), sampling,
                         [torch.Generator().manual_seed(s) for s in (7, 8, 9)])
    (*_, alone), _ = run(decoding, adapter, LlamaGenCondition(states[1:2]), sampling,
                         [torch.Generator().manual_seed(8)])
    assert torch.equal(batch.tokens[1], alone.tokens[0])


def test_window_one_is_plain_ar_sampling():
    adapter, condition = make_adapter(), LlamaGenCondition(text_states(2))
    sampling = SamplingConfig(temperature=1.0, guidance_scale=3.0)
    (*_, ar), _ = run(AR(), adapter, condition, sampling, torch.Generator().manual_seed(3))
    (*_, sjd), stats = run(SJD(1), adapter, condition, sampling, torch.Generator().manual_seed(3))
    assert stats.tokens_per_target_forward == 1.0 and stats.drafted == 0
    assert sjd.tokens.shape == ar.tokens.shape


@pytest.mark.parametrize(
    "kwargs,error,match",
    [({"window": 0}, ValueError, "window must be >= 1"), ({"window": 2.5}, TypeError, "window must be an int"),
     ({"init": "diagonal"}, ValueError, r"init must be one of \('random', 'horizontal', 'vertical', 'lookahead'\)"),
     ({"coupling": "loose"}, ValueError, r"coupling must be one of \('none', 'maximal', 'gumbel'\)")],
)
def test_bad_options_raise_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        SJD(**kwargs)
    with pytest.raises(error, match=match):
        get_decoding("sjd", **kwargs)


def test_a_model_without_an_image_span_and_wrong_generator_lists_are_rejected():
    class TextOnly:
        vocab_size = 5

    with pytest.raises(TypeError, match="image span"):
        next(SJD().run(TextOnly(), None, SamplingConfig(), None, SpecStats()))
    adapter, condition = make_adapter(), LlamaGenCondition(text_states(3))
    with pytest.raises(ValueError, match="list of 2 generators but the batch size is 3"):
        next(SJD().run(adapter, condition, SamplingConfig(), [torch.Generator()] * 2, SpecStats()))


@pytest.mark.parametrize("init", INITS)
def test_initial_drafts_of_free_positions_are_never_structure_tokens(init):
    """A 3 x (3 + 1) span whose last column is forced to end-of-line (id 4): every initialisation drafts the free
    positions from the image ids 0..3 only and stores the law it drew from; horizontal and vertical copies come from
    the nearest free position (copying the end-of-line there would be a draft of probability 0, always rejected);
    a lookahead law is renormalised over the image ids (uniform over them if it has no mass there)."""
    from mmspec.image.jacobi import DraftSpan, Ring, initialise_drafts
    from mmspec.models.hf_image import structured_span

    forced, N, L, V = structured_span(3, 3, 4), 12, 6, 5
    span = DraftSpan.of(forced, N, L, V, torch.device("cpu"))
    assert span.ids.tolist() == [0, 1, 2, 3]
    assert span.last_free_at(torch.tensor([3, 4, 7, 15])).tolist() == [2, 4, 6, 15]  # 15: scratch past the image
    seq = torch.zeros(2, N + L, dtype=torch.long)
    seq[:, :4] = torch.tensor([1, 2, 3, 4])  # the first row committed, closed by its end-of-line
    ring = Ring.zeros(2, L, V, torch.float64, torch.device("cpu"))  # the laws of the live window, slot = position mod L
    positions = torch.arange(4, 10).expand(2, -1)
    ahead = torch.tensor([[0.1, 0.05, 0.05, 0.0, 0.8], [0.0, 0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    drafted = (torch.arange(N + L) < 4).expand(2, -1)
    initialise_drafts(init, seq, ring, positions, True, drafted, torch.rand(2, 6), 4, forced, span, ahead)
    drafts, free, laws = seq[:, 4:10], forced[4:10] < 0, ring.read(positions)
    assert (drafts[:, free] < 4).all() and (drafts[:, ~free] == 4).all()
    assert (laws.gather(-1, drafts[..., None]) > 0).all()
    if init == "lookahead":
        expected = torch.tensor([[0.5, 0.25, 0.25, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25, 0.0]], dtype=torch.float64)
        torch.testing.assert_close(laws[:, free], expected[:, None].expand(2, int(free.sum()), V))
    torch.testing.assert_close(laws.sum(-1), torch.ones(2, 6, dtype=torch.float64))
    if init == "horizontal":
        assert (drafts[:, free] == 3).all()  # the token at position 2, the last free one before position 4
    if init == "random":
        assert torch.equal(laws[0, 1], torch.tensor([0.25, 0.25, 0.25, 0.25, 0.0], dtype=torch.float64))
