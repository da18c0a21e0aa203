import math

import pytest
import torch

from mmspec.continuous.diffusion import DiffusionSchedule, cosine_alphas_cumprod, sample_trajectory, score_trajectory
from tests.continuous.toy import GaussianDataHead, keyed_trajectory_noise


def test_respaced_schedule_keeps_evenly_spaced_steps_and_their_alpha_bars():
    full = cosine_alphas_cumprod(1000)
    schedule = DiffusionSchedule.cosine(100)
    assert schedule.timesteps[0] == 0 and schedule.timesteps[-1] == 999 and schedule.num_steps == 100
    assert torch.allclose(torch.cumprod(1 - schedule.betas, 0), full[schedule.timesteps])
    same = DiffusionSchedule.cosine(1000)
    assert torch.allclose(same.betas, 1 - full / torch.cat([torch.ones(1, dtype=torch.float64), full[:-1]]))
    with pytest.raises(ValueError, match="num_sampling_steps"):
        DiffusionSchedule.cosine(0)


def test_x0_clip_bounds_the_predicted_x0_and_keeps_an_erring_head_in_range():
    """A head whose eps is off by 0.03 at every step: unclipped, the first (alpha-bar ~ 2e-9) step throws the chain
    far out of the data's range (a learned head then sees inputs it was never trained on); with clipped x_0 the
    chain stays in range and every token lies within the clip (the last step outputs x_0 itself)."""
    ideal = GaussianDataHead([0.5, -0.5], [1.0, 1.0])

    def erring(x_t, timesteps, rows):
        eps, v = ideal(x_t, timesteps, rows)
        return eps + 0.03, v

    x_T, noise = keyed_trajectory_noise(0, torch.arange(2000), 50, 2)
    loose = sample_trajectory(erring, DiffusionSchedule.cosine(50), x_T, noise)
    clipped = sample_trajectory(erring, DiffusionSchedule.cosine(50, x0_clip=4.0), x_T, noise)
    assert loose.x[49].abs().min() > 10 and clipped.x[49].abs().max() < 6 and clipped.token.abs().max() <= 4.0
    schedule = DiffusionSchedule.cosine(10, x0_clip=1.0)
    x_t, eps = torch.randn(6, 3) * 3, torch.randn(6, 3)
    mean, _ = schedule.reverse_step(x_t, 4, eps, None)
    c = schedule.step_coefficients[:, 4]
    assert torch.allclose(mean, c[2] * (c[0] * x_t - c[1] * eps).clamp(-1, 1) + c[3] * x_t)
    with pytest.raises(ValueError, match="x0_clip must be > 0"):
        DiffusionSchedule.cosine(10, x0_clip=0.0)


@pytest.mark.parametrize("v", [None, -1.0, 1.0])
def test_many_step_sampler_with_the_ideal_head_draws_the_data_law(v):
    """With the exact denoiser of N(m, s^2) data, 250 DDPM steps sample the data law (up to discretisation)."""
    m, s = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 1.5])
    schedule = DiffusionSchedule.cosine(250)
    n = 20_000
    x_T, noise = keyed_trajectory_noise(0, torch.arange(n), schedule.num_steps, 2)
    tokens = sample_trajectory(GaussianDataHead(m, s, v), schedule, x_T, noise).token.double()
    assert ((tokens.mean(0) - m).abs() < 5 * s / math.sqrt(n) + 0.01).all(), tokens.mean(0)
    assert ((tokens.std(0) / s - 1).abs() < 0.03).all(), tokens.std(0)


def test_scoring_a_trajectory_repeats_the_sampler_s_own_steps():
    schedule = DiffusionSchedule.cosine(20)
    head = GaussianDataHead([0.3, 0.1, -0.2], [1.0, 2.0, 0.5], v=0.4)
    x_T, noise = keyed_trajectory_noise(3, torch.arange(64), schedule.num_steps, 3)
    trajectory = sample_trajectory(head, schedule, x_T, noise, temperature=0.8)
    mean, log_std = score_trajectory(head, schedule, trajectory.x)
    assert torch.allclose(mean, trajectory.mean, atol=1e-6) and torch.allclose(log_std, trajectory.log_std, atol=1e-6)
    assert torch.equal(trajectory.token, trajectory.mean[0])  # the last step adds no noise


def test_training_loss_of_the_oracle_head():
    """A head that knows the noise predicts the true posterior mean: mse 0, and with the posterior variance (v = -1)
    the vb term is exactly 0 for t > 0 (larger variances cost bits); at t = 0 it is the Gaussian NLL of x_0."""
    from mmspec.continuous.diffusion import gaussian_kl, training_loss

    schedule = DiffusionSchedule.cosine(1000)
    generator = torch.Generator().manual_seed(0)
    n = 512
    x0 = torch.randn(n, 3, generator=generator)
    t = torch.randint(0, 1000, (n,), generator=generator)
    t[:8] = 0
    noise = torch.randn(n, 3, generator=generator)

    def oracle(v):
        return lambda x_t, timesteps: (noise, torch.full_like(noise, v))

    mse, vb = training_loss(oracle(-1.0), x0, t, noise, schedule)
    assert mse.abs().max() < 1e-10
    assert vb[t > 0].abs().max() < 1e-4
    log_var0 = schedule.posterior_log_variance_clipped[0].item()
    expected_nll = 0.5 * (log_var0 + math.log(2 * math.pi)) / math.log(2.0)
    assert torch.allclose(vb[t == 0], torch.full_like(vb[t == 0], expected_nll), rtol=1e-3)
    _, vb_wide = training_loss(oracle(1.0), x0, t, noise, schedule)
    assert (vb_wide >= vb - 1e-6).all() and vb_wide[t > 1].mean() > 1e-4
    assert torch.isclose(gaussian_kl(torch.tensor(1.0), torch.tensor(0.0), torch.tensor(0.0), torch.tensor(0.0)),
                         torch.tensor(0.5))
