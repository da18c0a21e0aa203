"""MAR-level speculative decoding with a tiny MAR (real encoder / decoder, analytic diffusion heads): schedules,
bookkeeping, pass counts, identity, and exact mode = the target on the coarsened schedule (reference B.5.2, E.1.6)."""

import math

import pytest
import torch
from scipy import stats

from mmspec.continuous.diffusion import DiffusionSchedule
from mmspec.continuous.mar_decoding import coarsen, cosine_plan
from mmspec.continuous.methods import AR, ContinuousSpeculation
from mmspec.core.progress import run_to_end
from mmspec.models.mar import MARModel
from tests.continuous.toy import AnalyticHeadMAR
from tests.models.test_mar import TINY, tiny_mar

SCALES = [1.0, 0.5, 0.8, 1.2]


def generate(model, seeds, plan, schedule, **kwargs):
    """Plain MAR sampling on `plan`: the continuous AR component."""
    result = run_to_end(AR().run(model, None, seeds, len(plan), schedule, plan=plan, **kwargs))
    return result.latents, result.stats


def generate_speculative(target, draft, seeds, num_iter, schedule, speculation=ContinuousSpeculation(), **kwargs):
    """Speculative MAR sampling with `speculation`."""
    result = run_to_end(speculation.run(target, draft, seeds, num_iter, schedule, **kwargs))
    return result.latents, result.stats


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    weight = torch.randn(32, 4, dtype=torch.float64) * 0.3
    return AnalyticHeadMAR(tiny_mar(0), weight, SCALES), AnalyticHeadMAR(tiny_mar(0), 0.95 * weight, SCALES)


def test_cosine_plan_and_its_coarsening():
    assert cosine_plan(16, 8) == [1, 1, 1, 2, 3, 2, 3, 3]
    assert cosine_plan(16, 16) == [1] * 16 and cosine_plan(16, 1) == [16]
    for num_iter in range(1, 65):
        plan = cosine_plan(64, num_iter)
        assert sum(plan) == 64 and min(plan) >= 1 and len(plan) == num_iter
    assert coarsen([1, 1, 1, 2, 3, 2, 3, 3], 2, 3) == [1, 1, 6, 8]
    with pytest.raises(ValueError, match="num_iter must be in"):
        cosine_plan(16, 17)


@pytest.mark.parametrize("num_iter,gamma,prefill", [(8, 3, 0.25), (16, 4, 0.0), (16, 5, 0.15), (5, 1, 0.5)])
def test_pass_counts_and_every_token_written_once(pair, num_iter, gamma, prefill):
    target, draft = pair
    seeds = torch.arange(4)
    tokens, stats_ = generate_speculative(target, draft, seeds, num_iter, DiffusionSchedule.cosine(5),
                                          speculation=ContinuousSpeculation(gamma, prefill))
    n_pre = math.floor(num_iter * prefill)
    assert stats_.target_forwards == n_pre + math.ceil((num_iter - n_pre) / gamma)
    assert stats_.draft_forwards == num_iter - n_pre
    plan = cosine_plan(16, num_iter)
    assert stats_.drafted == 4 * sum(plan[n_pre:])  # every drafted token verified exactly once
    assert len(stats_.residual_tries) == stats_.drafted - stats_.accepted
    assert stats_.log_ratio_terms["log_ratio"].numel() == stats_.drafted
    assert stats_.tokens_per_target_forward == pytest.approx(16 / stats_.target_forwards)
    assert (tokens.abs().sum(-1) > 0).all()  # every position written


class Spy:
    """Wraps a MAR: records the known-token mask of every encoder-decoder pass and the rows of the first head made
    after it (a verification's residual proposals make heads of their own rows later)."""

    def __init__(self, model):
        self.model, self.config, self.device, self.dtype = model, model.config, model.device, model.dtype
        self.masks, self.head_rows = [], {}

    def class_embedding(self, labels, batch_size):
        return self.model.class_embedding(labels, batch_size)

    def encode_decode(self, tokens, unknown, class_embedding, known_tokens=None):
        self.masks.append(unknown.clone())  # [B, L] without CFG
        return self.model.encode_decode(tokens, unknown, class_embedding, known_tokens)

    def diffusion_head(self, z, z_uncond=None, guidance_scale=1.0):
        self.head_rows.setdefault(len(self.masks) - 1, z.shape[0])
        return self.model.diffusion_head(z, z_uncond, guidance_scale)


def test_each_target_pass_verifies_exactly_the_block_drafted_since_the_last(pair):
    """The target's verification pass conditions on the tokens known before its block, its head sees exactly the
    block's positions, and prefill + blocks finalise every position once."""
    target, draft = Spy(pair[0]), Spy(pair[1])
    B, num_iter, gamma, prefill = 3, 12, 4, 0.25
    generate_speculative(target, draft, torch.arange(B), num_iter, DiffusionSchedule.cosine(3),
                         speculation=ContinuousSpeculation(gamma, prefill))  # no CFG: one mask row per sample
    n_pre, plan = math.floor(num_iter * prefill), cosine_plan(16, num_iter)
    verifications = target.masks[n_pre:]
    assert len(verifications) == math.ceil((num_iter - n_pre) / gamma)
    block_starts = list(range(0, num_iter - n_pre, gamma))
    ends = [*verifications[1:], torch.zeros_like(verifications[0])]
    finalised = (~verifications[0]).long()  # the target's own pre-fill steps
    assert (finalised.sum(1) == sum(plan[:n_pre])).all()
    for j, (context, start) in enumerate(zip(verifications, block_starts)):
        assert torch.equal(context, draft.masks[start])  # the pass sees what the block's first draft step saw
        block = context & ~ends[j]  # positions that became known during the block
        drafted = sum(plan[n_pre + start : n_pre + start + gamma])
        assert (block.sum(1) == drafted).all()
        assert target.head_rows[n_pre + j] == B * drafted  # the verification head scores exactly the block
        finalised += block.long()
    assert (finalised == 1).all()


def test_gamma_1_with_the_target_as_draft_is_the_target_bit_for_bit(pair):
    target, _ = pair
    seeds, labels, schedule = torch.arange(32), torch.arange(32) % 10, DiffusionSchedule.cosine(10)
    kwargs = dict(labels=labels, guidance_scale=2.5, temperature=0.9)
    tokens, stats_ = generate_speculative(target, target, seeds, 8, schedule,
                                          speculation=ContinuousSpeculation(1, 0.25), **kwargs)
    reference, _ = generate(target, seeds, cosine_plan(16, 8), schedule, **kwargs)
    assert stats_.acceptance_rate == 1.0 and torch.equal(tokens, reference)


def assert_same_token_law(a: torch.Tensor, b: torch.Tensor) -> None:
    """Samples [n, L, C] of two generators: every coordinate's mean within 5 standard errors, and KS p > 1e-4 on four
    fixed random projections of the whole token grid."""
    a, b = a.flatten(1).double(), b.flatten(1).double()
    z = (a.mean(0) - b.mean(0)) / torch.sqrt((a.var(0) + b.var(0)) / a.shape[0])
    assert z.abs().max() < 5, z.abs().max()
    directions = torch.randn(a.shape[1], 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for d in range(4):
        assert stats.ks_2samp((a @ directions[:, d]).numpy(), (b @ directions[:, d]).numpy()).pvalue > 1e-4


N_LAW = 3000  # rows of the law tests on the coarsened schedule
COARSENED = dict(labels=torch.arange(N_LAW) % 10, guidance_scale=2.0, temperature=1.0)


def coarsened(model, seeds: torch.Tensor) -> torch.Tensor:
    """`model` alone on the schedule that speculation with gamma 3 and prefill ratio 0.25 runs, one row per seed."""
    tokens, _ = generate(model, seeds, coarsen(cosine_plan(16, 8), 2, 3), DiffusionSchedule.cosine(10), **COARSENED)
    return tokens


def test_exact_mode_samples_the_target_on_the_coarsened_schedule(pair, report):
    target, draft = pair
    tokens, stats_ = generate_speculative(target, draft, torch.arange(N_LAW), 8, DiffusionSchedule.cosine(10),
                                          speculation=ContinuousSpeculation(3, 0.25), **COARSENED)
    assert 0.2 < stats_.acceptance_rate < 0.95 and stats_.fallbacks == 0
    reference = coarsened(target, torch.arange(N_LAW, 2 * N_LAW))
    assert_same_token_law(tokens, reference)
    with pytest.raises(AssertionError):  # power: the draft alone on the same schedule is told apart
        assert_same_token_law(coarsened(draft, torch.arange(N_LAW)), reference)
    report(f"MAR toy: exact acceptance {stats_.acceptance_rate:.3f}")


@pytest.mark.slow  # the paper rule's bias on the trajectory itself: tests/continuous/test_acceptance.py
def test_paper_mode_is_told_apart_from_the_target_on_the_coarsened_schedule(pair, report):
    target, draft = pair
    paper, paper_stats = generate_speculative(target, draft, torch.arange(N_LAW), 8, DiffusionSchedule.cosine(10),
                                              speculation=ContinuousSpeculation(3, 0.25, "paper"), **COARSENED)
    a, b = paper.flatten(1).double(), coarsened(target, torch.arange(N_LAW, 2 * N_LAW)).flatten(1).double()
    z = ((a.mean(0) - b.mean(0)) / torch.sqrt((a.var(0) + b.var(0)) / N_LAW)).abs().max()
    assert z > 5  # the released rule is not distribution-preserving, and at this N it shows
    report(f"MAR toy: paper mode acceptance {paper_stats.acceptance_rate:.3f}, largest coordinate mean shift vs the "
           f"coarsened target {z:.1f} SE")


@pytest.mark.parametrize(
    "settings,match",
    [(dict(gamma=0), r"gamma must be >= 1"), (dict(prefill_ratio=1.0), r"prefill_ratio must be in \[0, 1\)"),
     (dict(acceptance="lossless"), "acceptance must be one of"), (dict(max_tries=0), "max_tries must be >= 1"),
     (dict(acceptance="lantern"), r"does not apply to continuous decoding; continuous takes \('exact', 'paper'\)")],
)
def test_clear_errors(settings, match):
    with pytest.raises(ValueError, match=match):
        ContinuousSpeculation(**settings)


def test_num_iter_is_checked(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="num_iter must be in"):
        generate_speculative(target, draft, torch.arange(2), 17, DiffusionSchedule.cosine(5))


def test_draft_token_shape_must_match_the_target(pair):
    target, _ = pair
    other = MARModel(**{**TINY, "token_dim": 3})
    with pytest.raises(ValueError, match=r"draft tokens \(seq_len, token_dim\) = \(16, 3\) do not match"):
        generate_speculative(target, other, torch.arange(2), 8, DiffusionSchedule.cosine(5))


def upstream_guidance(guidance_scale: float, seq_len: int, num_iter: int) -> list[float]:
    """The per-step scale of LTH14/mar's `sample_tokens(cfg_schedule="linear")`, restated from its loop: the mask
    length after step s is max(1, min(unknown - 1, floor(L cos(pi/2 (s+1)/num_iter)))), the scale
    1 + (s - 1) (L - mask_len) / L, and the last step predicts every token still unknown."""
    unknown, scales = seq_len, []
    for step in range(num_iter):
        mask_len = max(1, min(unknown - 1, math.floor(seq_len * math.cos(math.pi / 2 * (step + 1) / num_iter))))
        scales.append(1 + (guidance_scale - 1) * (seq_len - mask_len) / seq_len)
        unknown = 0 if step == num_iter - 1 else mask_len
    return scales


class GuidanceRecorder:
    """A decoding whose steps only record the guidance scale the loop gives each step."""

    def __init__(self):
        self.seen = []

    def steps(self, *args):
        return self

    def __call__(self, state, step, positions, cfg, last):
        self.seen.append(cfg)
        return False


@pytest.mark.parametrize(("num_iter", "guidance_scale"), [(16, 3.0), (5, 2.9), (1, 4.0), (9, 0.5)])
def test_the_loop_guides_every_step_as_upstream_s_linear_schedule(num_iter, guidance_scale):
    """Every step, the last included (where the linear schedule stays below s: 1 + (s - 1)(L - 1)/L), and the
    constant schedule guides every step by s."""
    from mmspec.continuous.mar_decoding import decode

    model, seeds, schedule = tiny_mar(), torch.tensor([0, 1]), DiffusionSchedule.cosine(4)
    recorder = GuidanceRecorder()
    run_to_end(decode(recorder, model, None, seeds, num_iter, schedule, guidance_scale=guidance_scale))
    expected = upstream_guidance(guidance_scale, TINY["seq_len"], num_iter)
    assert recorder.seen == pytest.approx(expected, abs=1e-12)
    assert recorder.seen[-1] == pytest.approx(1 + (guidance_scale - 1) * (TINY["seq_len"] - 1) / TINY["seq_len"])
    constant = GuidanceRecorder()
    run_to_end(decode(constant, model, None, seeds, num_iter, schedule, guidance_scale=guidance_scale,
                      cfg_schedule="constant"))
    assert constant.seen == [guidance_scale] * num_iter
    with pytest.raises(ValueError, match=r"cfg_schedule must be one of \('linear', 'constant'\), got 'cosine'"):
        next(decode(constant, model, None, seeds, num_iter, schedule, guidance_scale=guidance_scale,
                    cfg_schedule="cosine"))
