"""Exactness of continuous speculative acceptance on analytic Gaussians and diffusion heads (reference E.1), with
mutation companions that the same tests must reject."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from mmspec.continuous.acceptance import accept_draft, residual_sample, verify_trajectories
from mmspec.continuous.diffusion import DiffusionSchedule, sample_trajectory
from mmspec.core.rng import keyed_normal, keyed_uniform
from tests.continuous.toy import GaussianDataHead, keyed_trajectory_noise


def gaussian_log_pdf(x, mean, std):
    return (-0.5 * ((x - mean) / std) ** 2 - math.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)


def pure_gaussian_speculative(n, p, q, seed=0, residual_rule=None):
    """Draft from q = N(mq, sq^2), verify against p = N(mp, sp^2) (1-D); returns (samples, accepted, tries)."""
    (mp, sp), (mq, sq) = p, q
    rows = torch.arange(n)
    draft = mq + sq * keyed_normal(seed, rows, 0, dim=1).double()
    u = keyed_uniform(seed, rows, 1)
    accepted = accept_draft(gaussian_log_pdf(draft, mp, sp), gaussian_log_pdf(draft, mq, sq), u)

    def propose(attempt, pending):
        y = mp + sp * keyed_normal(seed, pending, 2, attempt, dim=1).double()
        return y.float(), gaussian_log_pdf(y, mp, sp), gaussian_log_pdf(y, mq, sq)

    uniform = residual_rule or (lambda attempt, pending: keyed_uniform(seed, pending, 3, attempt))
    rejected = (~accepted).nonzero().squeeze(1)
    out = draft.float().clone()
    out[rejected], tries, fallback = residual_sample(propose, uniform, rejected, 1, max_tries=1000)
    assert not fallback.any()
    return out[:, 0].numpy(), accepted, tries


def tv_1d(p, q):
    x = np.linspace(-12, 12, 400001)
    return 0.5 * np.trapezoid(np.abs(stats.norm.pdf(x, *p) - stats.norm.pdf(x, *q)), x)


P, Q = (0.0, 1.0), (0.8, 1.4)


def test_pure_gaussian_speculative_sampling_is_exact():
    n = 200_000
    samples, accepted, tries = pure_gaussian_speculative(n, P, Q)
    se_mean = P[1] / math.sqrt(n)
    assert abs(samples.mean() - P[0]) < 5 * se_mean
    assert abs(samples.var() - P[1] ** 2) < 5 * P[1] ** 2 * math.sqrt(2 / n)
    assert stats.kstest(samples, "norm", args=P).pvalue > 1e-3
    tv = tv_1d(P, Q)
    alpha = accepted.double().mean().item()
    assert abs(alpha - (1 - tv)) < 5 * math.sqrt(tv * (1 - tv) / n)
    mean_tries = tries.double().mean().item()  # geometric with success probability TV
    assert abs(mean_tries - 1 / tv) < 5 * math.sqrt((1 - tv) / tv**2 / tries.numel())


def test_mutation_residual_without_rejection_is_caught():
    """Mutation: take the first target proposal for every rejected draft (residual = p instead of norm(max(p-q, 0)))."""
    samples, _, _ = pure_gaussian_speculative(200_000, P, Q, residual_rule=lambda a, rows: torch.zeros(rows.numel()))
    assert stats.kstest(samples, "norm", args=P).pvalue < 1e-6


def speculative_tokens(draft_head, target_head, schedule, n, dim, temperature, seed=0, max_tries=100,
                       residual_test=True):
    """(draft trajectories, verify result) for n tokens; residual_test=False is a mutation: the first target
    proposal of a rejected draft is always kept (residual = p instead of norm(max(p - q, 0)))."""
    rows = torch.arange(n)
    x_T, noise = keyed_trajectory_noise(seed, rows, schedule.num_steps, dim)
    draft = sample_trajectory(draft_head, schedule, x_T, noise, temperature)

    def uniform(attempts, pending):
        u = keyed_uniform(seed + 1, pending, attempts)
        return u if residual_test else torch.where(attempts > 0, 0.0, u)

    result = verify_trajectories(
        draft, draft_head, target_head, schedule, temperature,
        target_noise=lambda attempts, pending: keyed_trajectory_noise(seed, pending, schedule.num_steps, dim,
                                                                       attempts),
        uniform=uniform, max_tries=max_tries)
    return draft, result


def target_tokens(head, schedule, n, dim, temperature, seed):
    x_T, noise = keyed_trajectory_noise(seed, torch.arange(n), schedule.num_steps, dim)
    return sample_trajectory(head, schedule, x_T, noise, temperature).token


def energy_distance_p_value(a: torch.Tensor, b: torch.Tensor, permutations: int = 500, seed: int = 0) -> float:
    """Permutation p-value of the multivariate energy distance (Szekely & Rizzo) between samples a, b [m, C]: the
    statistic 2 E|X - Y| - E|X - X'| - E|Y - Y'| recomputed under random relabellings of the pooled sample."""
    pooled = torch.cat([a, b]).double()
    distances = torch.cdist(pooled, pooled)
    m, total = len(a), len(pooled)

    def statistic(labels: torch.Tensor) -> torch.Tensor:  # labels [P, total] float, 1 = first sample
        to_a = labels @ distances  # [P, total]: each point's summed distance to the first sample
        to_b = distances.sum(0) - to_a
        within_a = (to_a * labels).sum(1) / m**2
        within_b = (to_b * (1 - labels)).sum(1) / (total - m) ** 2
        between = (to_a * (1 - labels)).sum(1) / (m * (total - m))
        return 2 * between - within_a - within_b

    observed = statistic(torch.cat([torch.ones(m), torch.zeros(total - m)]).double()[None])
    generator = torch.Generator().manual_seed(seed)
    shuffled = (torch.rand(permutations, total, generator=generator).argsort(1) < m).double()
    return ((statistic(shuffled) >= observed).sum().item() + 1) / (permutations + 1)


def assert_same_law(a: torch.Tensor, b: torch.Tensor) -> None:
    """Two samples [n, C] from one law: per-dimension means and variances within 5 standard errors, KS p > 1e-3 per
    dimension, and the energy-distance permutation test on the first 1,500 of each (joint law) p > 0.01."""
    n = a.shape[0]
    a, b = a.double(), b.double()
    se_mean = torch.sqrt((a.var(0) + b.var(0)) / n)
    assert ((a.mean(0) - b.mean(0)).abs() < 5 * se_mean).all(), (a.mean(0), b.mean(0))
    se_var = torch.sqrt((((a - a.mean(0)) ** 2).var(0) + ((b - b.mean(0)) ** 2).var(0)) / n)
    assert ((a.var(0) - b.var(0)).abs() < 5 * se_var).all(), (a.var(0), b.var(0))
    for d in range(a.shape[1]):
        assert stats.ks_2samp(a[:, d].numpy(), b[:, d].numpy()).pvalue > 1e-3
    assert energy_distance_p_value(a[:1500], b[:1500]) > 0.01  # 500 permutations: p can be as small as 0.002


TARGET = dict(m=[0.5, -1.0, 0.0, 2.0], s=[1.0, 0.5, 2.0, 0.8], v=0.3)
DRAFTS = {
    "shifted": dict(m=[0.9, -0.7, 0.6, 1.6], s=TARGET["s"], v=0.3),  # same step variances
    "reshaped": dict(m=[0.7, -0.8, 0.3, 1.8], s=[1.2, 0.6, 1.7, 1.0], v=-0.2),  # other data scale and variances
}


@pytest.mark.parametrize("draft_name", list(DRAFTS))
@pytest.mark.parametrize("num_steps,n", [(10, 40_000), pytest.param(100, 20_000, marks=pytest.mark.slow)])
def test_trajectory_exact_mode_samples_the_target_head(num_steps, n, draft_name):
    """10 steps carry the power (40,000 tokens, both mutations); 100 steps (the slow tier) check the many-step regime
    with 20,000 tokens, where no verification is still 40+ standard errors off in the mean."""
    schedule = DiffusionSchedule.cosine(num_steps)
    target, draft_head = GaussianDataHead(**TARGET), GaussianDataHead(**DRAFTS[draft_name])
    temperature = 0.9
    draft, result = speculative_tokens(draft_head, target, schedule, n, 4, temperature)
    alpha = result.accepted.double().mean().item()
    assert 0.05 < alpha < 0.95, alpha  # both paths are exercised
    assert not result.fallback.any() and torch.isfinite(result.log_ratio).all()
    reference = target_tokens(target, schedule, n, 4, temperature, seed=12345)
    assert_same_law(result.tokens, reference)

    # mutation companions: no verification at all (the draft head's tokens), and a residual without its rejection test
    # (with other step variances most of the residual mass is the whole of p, so only the shifted draft can tell; the
    # residual rule does not depend on the number of steps, so the 10-step case carries that companion)
    with pytest.raises(AssertionError):
        assert_same_law(draft.token, reference)
    if draft_name != "shifted" or num_steps != 10:
        return
    _, unrejected = speculative_tokens(draft_head, target, schedule, n, 4, temperature, residual_test=False)
    with pytest.raises(AssertionError):
        assert_same_law(unrejected.tokens, reference)


def test_identical_draft_is_always_kept_and_bit_identical():
    schedule = DiffusionSchedule.cosine(100)
    head = GaussianDataHead(**TARGET)
    draft, result = speculative_tokens(head, head, schedule, 2000, 4, 1.0)
    assert result.accepted.all() and (result.log_ratio == 0).all() and (result.tries == 0).all()
    assert torch.equal(result.tokens, target_tokens(head, schedule, 2000, 4, 1.0, seed=0))


@pytest.mark.parametrize("max_tries", [5, 100])
def test_batched_residual_rounds_equal_one_proposal_at_a_time(max_tries):
    """Rounds of k proposals take each row's first passing attempt: the same samples, tries and fallbacks as drawing one
    proposal per round with the same keyed draws, for k dividing max_tries or not."""
    mp, sp, mq, sq = 0.0, 1.0, 0.3, 1.0  # residual acceptance TV ~ 0.12: many rows need several tries
    rows = torch.arange(3000)

    def propose(attempts, pending):
        y = mp + sp * keyed_normal(0, pending, attempts, dim=1).double()
        return y.float(), gaussian_log_pdf(y, mp, sp), gaussian_log_pdf(y, mq, sq)

    def uniform(attempts, pending):
        return keyed_uniform(1, pending, attempts)

    one = residual_sample(propose, uniform, rows, 1, max_tries, proposals_per_round=1)
    assert one[2].any() == (max_tries == 5) and one[1].max() > 1
    for k in (3, 8, 64):
        batched = residual_sample(propose, uniform, rows, 1, max_tries, proposals_per_round=k)
        for a, b in zip(one, batched):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="proposals_per_round"):
        residual_sample(propose, uniform, rows, 1, max_tries, proposals_per_round=0)


def test_capped_residual_falls_back_to_a_target_sample_never_zero():
    schedule = DiffusionSchedule.cosine(10)
    target = GaussianDataHead(**TARGET)
    near = GaussianDataHead(m=[m + 0.1 for m in TARGET["m"]], s=TARGET["s"], v=TARGET["v"])  # residual mass ~ small
    _, result = speculative_tokens(near, target, schedule, 4000, 4, 1.0, max_tries=1)
    assert (~result.accepted).any() and (result.tries <= 1).all()
    assert result.fallback.any() and (result.tokens.abs().sum(-1) > 0).all()
    rows = result.fallback.nonzero().squeeze(1)
    x_T, noise = keyed_trajectory_noise(0, rows, 10, 4, attempt=1)
    assert torch.equal(result.tokens[rows], sample_trajectory(target, schedule, x_T, noise).token)


def test_paper_mode_is_biased_and_the_test_says_so(report):
    """The released CSpD criterion (inner temperature 42, sigma-product term, final-step residual) on the same toy:
    its output law is *not* the target's. This test measures the bias and fails if it ever disappears unnoticed."""
    from mmspec.continuous.paper import verify_paper

    schedule = DiffusionSchedule.cosine(100)
    target, draft_head = GaussianDataHead(**TARGET), GaussianDataHead(**DRAFTS["reshaped"])
    n, temperature = 40_000, 0.9
    rows = torch.arange(n)
    x_T, noise = keyed_trajectory_noise(0, rows, schedule.num_steps, 4)
    draft = sample_trajectory(draft_head, schedule, x_T, noise, temperature)
    aligned = sample_trajectory(target, schedule, x_T, noise, temperature)  # the target's own trajectory, same noise
    result = verify_paper(draft, aligned, temperature,
                          uniform=lambda attempt, pending: keyed_uniform(1, pending, attempt),
                          residual_noise=lambda attempt, pending: keyed_normal(2, pending, attempt, dim=4))
    terms = result.terms
    assert torch.allclose(terms["exponent"] + terms["sigma_product"] + terms["normalisation"], result.log_ratio)
    assert not (result.tokens == 0).all(-1).any()
    reference = target_tokens(target, schedule, n, 4, temperature, seed=12345)
    with pytest.raises(AssertionError):
        assert_same_law(result.tokens, reference)
    shift = (result.tokens.double().mean(0) - reference.double().mean(0)).tolist()
    towards_draft = (result.tokens.double().mean(0) - reference.double().mean(0)).sign() == (
        torch.tensor(DRAFTS["reshaped"]["m"]) - torch.tensor(TARGET["m"])).sign()
    report(f"paper-mode CSpD on the toy (S=100): acceptance {result.accepted.double().mean():.3f}, mean shift "
           f"{[round(v, 3) for v in shift]} (towards the draft in {int(towards_draft.sum())}/4 dims), mean "
           f"log-ratio terms: exponent {terms['exponent'].mean():.2f}, sigma product "
           f"{terms['sigma_product'].mean():.2f}, normalisation {terms['normalisation'].mean():.2f}")
