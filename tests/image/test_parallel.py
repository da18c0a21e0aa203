"""Parallel Jacobi decoding (`mmspec.image.parallel.PJD`): its knob at zero (one row) is SJD token for token, on the
lookup-table model and through the real LlamaGen adapter; with several rows every position is committed once, a row
commits only behind the row above, the cache holds exactly the committed tokens after every iteration, rows of a
batch are independent, and its deviation from the AR law is measured (the exact test rejects it)."""

import pytest
import torch

from mmspec import PJD
from mmspec.core.probs import SamplingConfig
from mmspec.core.settings import specs
from mmspec.core.stats import SpecStats
from mmspec.image import COUPLINGS, SJD, get_decoding
from mmspec.models.llamagen.adapter import LlamaGenCondition
from tests.image.table_model import TableImageModel
from tests.image.test_jacobi import make_adapter, text_states
from tests.image.test_jacobi_law import law_checks

GRID, V = (3, 3), 4
FORCED = torch.tensor([-1, -1, 3] * 3)  # an end-of-line column
SAMPLING = SamplingConfig(temperature=0.9, top_k=3, guidance_scale=2.0)


class Spied(TableImageModel):
    """The lookup-table model, keeping its state so a test can read the cache."""

    def prefill(self, condition, cfg, max_window=1):
        self.state, logits = super().prefill(condition, cfg, max_window)
        return self.state, logits


def decode(decoding, model, prompts, sampling=SAMPLING, seeds=None):
    stats = SpecStats()
    generators = [torch.Generator().manual_seed(s) for s in (seeds or range(len(prompts)))]
    with torch.no_grad():
        steps = list(decoding.run(model, prompts, sampling, generators, stats))
    return steps, stats


@pytest.mark.parametrize("coupling", COUPLINGS)
@pytest.mark.parametrize("window", [2, 3, 9, 12])
def test_one_row_is_sjd_token_for_token(window, coupling):
    prompts = torch.tensor([0, 1, 0, 1, 0, 1])
    model = TableImageModel(GRID, V, forced_tokens=FORCED)
    for init in specs(PJD)["init"].choices:
        (*_, sjd), sjd_stats = decode(SJD(window, init, coupling), model, prompts)
        (*_, pjd), pjd_stats = decode(PJD(window, rows=1, init=init, coupling=coupling), model, prompts)
        assert torch.equal(pjd.tokens, sjd.tokens), init
        assert pjd_stats.target_forwards == sjd_stats.target_forwards
        assert torch.equal(pjd_stats.acceptance_map, sjd_stats.acceptance_map)
    assert PJD(rows=1).law == "lossless" and PJD(rows=2).law == "lossy"


@pytest.mark.parametrize("options", [{"window": 5}, {"window": 7, "init": "vertical", "coupling": "gumbel"},
                                     {"window": 20, "init": "random", "coupling": "none"}], ids=str)
def test_one_row_is_sjd_through_the_real_transformer(options):
    """float64 tiny LlamaGen with CFG and top-k: the segment forward (scratch slots, copied on commit) gives SJD's
    tokens, and after every iteration its cache equals a fresh prefill of the committed prefix."""
    adapter, condition = make_adapter(), LlamaGenCondition(text_states(3))
    sampling = SamplingConfig(temperature=1.0, top_k=6, guidance_scale=3.0)
    generators = [torch.Generator().manual_seed(s) for s in (3, 4, 5)]
    stats = SpecStats()
    with torch.no_grad():
        *_, sjd = SJD(**options).run(adapter, condition, sampling, generators, stats)
    captured, prefill = {}, adapter.prefill

    def spy(*args, **kwargs):
        captured["state"], logits = prefill(*args, **kwargs)
        return captured["state"], logits

    adapter.prefill = spy
    cls = adapter.transformer.config.cls_token_num
    generators = [torch.Generator().manual_seed(s) for s in (3, 4, 5)]
    with torch.no_grad():
        for step in PJD(rows=1, **options).run(adapter, condition, sampling, generators, SpecStats()):
            cache = captured["state"].cache
            for b, c in enumerate(step.n_committed.tolist()):
                if c < 2:
                    continue
                fresh, _ = prefill(LlamaGenCondition(condition.states[b : b + 1]), cfg=True)
                adapter.forward(step.tokens[b : b + 1, : c - 1], fresh)
                fill = cls + c - 1
                assert captured["state"].cached[b, :fill].all() and not captured["state"].cached[b, fill:].any()
                for buffer, fresh_buffer in ((cache.k, fresh.cache.k), (cache.v, fresh.cache.v)):
                    torch.testing.assert_close(buffer[:, b, :, :fill], fresh_buffer[:, 0, :, :fill], rtol=0,
                                               atol=1e-10)
    assert torch.equal(step.tokens, sjd.tokens)


@pytest.mark.parametrize("rows, lag, window", [(2, 1, 3), (3, 1, 2), (3, 2, 5), (2, 1, 12)])
def test_several_rows_commit_every_position_behind_the_row_above(rows, lag, window):
    """Every position committed once with a valid id (forced ones with theirs); a token of row r + 1 at column c is
    committed no earlier than row r's column c + lag (the row-causal schedule); after every iteration the cached
    positions are committed, hold the committed tokens, and are all of them but each row's open token."""
    model = Spied(GRID, V, forced_tokens=FORCED)
    prompts = torch.tensor([0, 1, 1, 0])
    H, w = GRID
    stats, generators = SpecStats(), [torch.Generator().manual_seed(s) for s in range(4)]
    with torch.no_grad():
        for step in PJD(window, rows=rows, lag=lag).run(model, prompts, SAMPLING, generators, stats):
            if step.step == 0:
                continue
            committed, cached = step.tokens >= 0, model.state.cached
            assert not (cached & ~committed).any()
            assert torch.equal(model.state.tokens[:, : H * w][cached], step.tokens[cached])
            open_tokens = (committed & ~cached).sum(1)
            assert (open_tokens <= rows + 1).all() and (open_tokens >= 1).all()
    last = step
    assert (last.tokens >= 0).all() and (last.tokens[:, FORCED >= 0] == 3).all()
    assert model.state.cached.sum() == len(prompts) * (H * w - 1)  # all but the last token
    order = stats.acceptance_map.view(-1, H, w)
    for c in range(w):
        above = order[:, :-1, min(c + lag, w - 1)]
        assert (order[:, 1:, c] >= above).all(), c
    assert stats.tokens_per_target_forward > 1


def test_more_rows_take_fewer_target_forwards():
    """On the tiny transformer's 8 x 8 grid, more rows at once mean fewer target forwards."""
    adapter, condition = make_adapter(grid_size=8), LlamaGenCondition(text_states(2))
    sampling = SamplingConfig(temperature=1.0, top_k=6, guidance_scale=3.0)
    forwards = {}
    for rows in (1, 2, 4):
        _, stats = decode(PJD(4, rows=rows, lag=1), adapter, condition, sampling, seeds=[1, 2])
        forwards[rows] = stats.target_forwards
    assert forwards[4] < forwards[2] < forwards[1], forwards


def test_rows_are_independent_of_the_batch():
    adapter = make_adapter(grid_size=6)
    states = text_states(3)
    sampling = SamplingConfig(temperature=1.0, top_k=6, guidance_scale=3.0)
    (*_, batch), _ = decode(PJD(3, rows=3, lag=1), adapter, LlamaGenCondition(states), sampling, seeds=[7, 8, 9])
    (*_, alone), _ = decode(PJD(3, rows=3, lag=1), adapter, LlamaGenCondition(states[1:2]), sampling, seeds=[8])
    torch.testing.assert_close(batch.tokens[1], alone.tokens[0], rtol=0, atol=0)


def test_deviation_from_the_ar_law_is_measured(report):
    """100,002 rows on the 2 x 3 lookup-table model of the SJD law tests: two rows at once with lag 1 commit row 1's
    first column before row 0's last, so row 1 is drawn without part of its prefix; the exact test rejects the AR
    law (p < 1e-7) and the total-variation distance of the empirical law from AR's is well above sampling noise
    (about 0.01 at this size). One row, or two rows with a lag of a whole row (no overlap): not rejected. (The
    lookup-table model reads an unseen token as 0, a prefix with its own random law, so the distance here says that
    PJD is lossy, not how lossy it is on an image model: `python -m mmspec.eval.quality --methods ar pjd` measures
    that.)"""
    from tests.image import test_jacobi_law as law

    model = TableImageModel(law.GRID, law.V, forced_tokens=law.FORCED)
    prompts = law.GROUP.repeat(law.GROUPS)
    tv = {}
    for rows, lag in ((1, 1), (2, law.GRID[1]), (2, 1)):
        stats = SpecStats()
        with torch.no_grad():
            *_, last = PJD(2, rows=rows, lag=lag).run(model, prompts, law.SAMPLING, torch.Generator().manual_seed(0),
                                                  stats)
        checks = law_checks(last.tokens, model)
        outcomes = law.encode(last.tokens)[prompts == 0]
        empirical = torch.bincount(outcomes, minlength=law.V**law.N).double() / len(outcomes)
        tv[rows, lag] = 0.5 * float((empirical - model.exact_law(0, law.SAMPLING)).abs().sum())
        if lag == 1 and rows > 1:
            assert min(checks.values()) < law.ALPHA, checks
        else:
            assert min(checks.values()) > law.ALPHA, (rows, lag, checks)
    assert tv[2, 1] > 3 * tv[1, 1], tv
    report(f"PJD on the 2 x 3 lookup-table model: TV from the AR law {tv[2, 1]:.4f} (rows 2, lag 1) vs "
           f"{tv[1, 1]:.4f} (rows 1) and {tv[2, law.GRID[1]]:.4f} (rows 2, lag 3): sampling noise")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [({"rows": 0}, ValueError, r"rows must be >= 1"), ({"lag": 1.5}, TypeError, r"lag must be an int"),
     ({"init": "lookahead"}, ValueError, r"init must be one of \('random', 'horizontal', 'vertical'\)"),
     ({"coupling": "loose"}, ValueError, r"coupling must be one of")],
)
def test_bad_options_raise_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        PJD(**kwargs)


def test_an_adapter_without_segments_is_refused_before_the_prefill():
    class NoSegments(TableImageModel):
        forward_segments = None

    with pytest.raises(ValueError, match="needs a model adapter with forward_segments"):
        decode(PJD(), NoSegments(GRID, V), torch.tensor([0]))
    assert get_decoding("pjd", window=4, rows=3) == PJD(4, rows=3)
