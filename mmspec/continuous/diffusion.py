"""The per-token diffusion head's sampler (MAR's DDPM with learned-range variance), written so that speculative
decoding can score a trajectory under another head.

Conventions (LTH14/mar `diffusion/`): a cosine schedule of `num_train_steps` respaced to `num_sampling_steps` evenly
spaced steps; the head predicts eps and a variance interpolation v in [-1, 1] between the posterior variance and
beta; temperature scales the std of every reverse step; the last step (index 0) adds no noise, so x_0 = mu(x_1).
Steps are indexed by sampling step k = S-1 .. 0 (k = 0 least noisy); `timesteps[k]` is the training step the head
is conditioned on.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

# head(x_t [n, C], timesteps [n] long, rows [n] long) -> (eps [n, C], v [n, C] or None for the posterior variance);
# rows say which token (of the caller's n) each input row belongs to, so a head can pick its conditioning
DiffusionHead = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


def cosine_alphas_cumprod(num_train_steps: int, s: float = 0.008) -> torch.Tensor:
    """alpha-bar_t for t = 0 .. T-1 of Nichol & Dhariwal's cosine schedule (betas capped at 0.999), float64."""
    def f(t):
        return math.cos((t / num_train_steps + s) / (1 + s) * math.pi / 2) ** 2

    betas = torch.tensor([min(1 - f(t + 1) / f(t), 0.999) for t in range(num_train_steps)], dtype=torch.float64)
    return torch.cumprod(1 - betas, 0)


@dataclass(frozen=True)
class DiffusionSchedule:
    """A respaced DDPM schedule; all tensors [S] float64, index k = sampling step (0 = last, least noisy).

    x0_clip: clamp the x_0 predicted from eps to [-x0_clip, x0_clip] inside every reverse step (improved-diffusion's
    `clip_denoised`, with the token range instead of [-1, 1]); None = MAR's sampler, which does not clip. The first
    step of the cosine schedule divides by sqrt(alpha-bar) ~ 5e-5, so a head whose eps is off by 1e-2 there throws
    x_0 far out of range; clipping keeps such a head's samples in range. Draft and target share the schedule, so the
    clip is part of the one Gaussian kernel both are scored under.
    """

    timesteps: torch.Tensor  # [S] long, the training step of each sampling step
    alphas_cumprod: torch.Tensor
    x0_clip: float | None = None

    @classmethod
    def cosine(cls, num_sampling_steps: int = 100, num_train_steps: int = 1000,
               x0_clip: float | None = None) -> DiffusionSchedule:
        """The same settings give the same schedule object, so its device tables (`tables`) and the samplers
        captured on them (`mmspec.continuous.graphs`) serve every later call."""
        if not 1 <= num_sampling_steps <= num_train_steps:
            raise ValueError(f"num_sampling_steps must be in [1, {num_train_steps}], got {num_sampling_steps}")
        if x0_clip is not None and not x0_clip > 0:
            raise ValueError(f"x0_clip must be > 0 or None, got {x0_clip}")
        return _cosine(cls, num_sampling_steps, num_train_steps, x0_clip)

    def tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(timesteps [S] long, step_coefficients [6, S] float32) on `device`, moved there once: a reverse step
        indexes them without a host-to-device copy, which a CUDA graph cannot hold."""
        if device not in self._device_tables:
            self._device_tables[device] = (self.timesteps.to(device), self.step_coefficients.to(device))
        return self._device_tables[device]

    @cached_property
    def _device_tables(self) -> dict[torch.device, tuple[torch.Tensor, torch.Tensor]]:
        return {}

    @property
    def num_steps(self) -> int:
        return self.timesteps.numel()

    @property
    def alphas_cumprod_prev(self) -> torch.Tensor:
        return torch.cat([torch.ones(1, dtype=torch.float64), self.alphas_cumprod[:-1]])

    @property
    def betas(self) -> torch.Tensor:
        return 1 - self.alphas_cumprod / self.alphas_cumprod_prev

    @property
    def posterior_log_variance_clipped(self) -> torch.Tensor:
        posterior = self.betas * (1 - self.alphas_cumprod_prev) / (1 - self.alphas_cumprod)
        return torch.log(torch.cat([posterior[1:2], posterior[1:]])) if self.num_steps > 1 else torch.log(self.betas)

    @cached_property
    def step_coefficients(self) -> torch.Tensor:
        """[6, S] float32 per sampling step, computed once in float64: 1 / sqrt(a) and sqrt(1 / a - 1) (x_0 from x_t
        and eps), the posterior mean's x_0 and x_t coefficients, log beta and the clipped posterior log variance."""
        a, a_prev, beta = self.alphas_cumprod, self.alphas_cumprod_prev, self.betas
        return torch.stack([torch.rsqrt(a), torch.sqrt(1 / a - 1), torch.sqrt(a_prev) * beta / (1 - a),
                            torch.sqrt(1 - beta) * (1 - a_prev) / (1 - a), torch.log(beta),
                            self.posterior_log_variance_clipped]).float()

    def reverse_step(self, x_t: torch.Tensor, k: int | torch.Tensor, eps: torch.Tensor,
                     v: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log_std) [n, C] of p(x_{k-1} | x_k) given the head's eps and variance interpolation v ([n, C];
        None = the posterior variance), in float32; `k` an int or [n] long."""
        c = self.tables(x_t.device)[1][:, k]
        if c.ndim == 2:  # one step per row
            c = c[..., None]
        x_t, eps = x_t.float(), eps.float()
        x0 = c[0] * x_t - c[1] * eps
        if self.x0_clip is not None:
            x0 = x0.clamp(-self.x0_clip, self.x0_clip)
        mean = c[2] * x0 + c[3] * x_t
        log_var = c[5] if v is None else c[5] + (v.float() + 1) / 2 * (c[4] - c[5])
        return mean, (0.5 * log_var).expand_as(mean)


@functools.lru_cache(maxsize=32)
def _cosine(cls, num_sampling_steps: int, num_train_steps: int, x0_clip: float | None) -> DiffusionSchedule:
    full = cosine_alphas_cumprod(num_train_steps)
    # improved-diffusion's space_timesteps(T, "S"): S evenly spaced steps, rounded, first and last kept
    stride = (num_train_steps - 1) / max(num_sampling_steps - 1, 1)
    kept = torch.tensor([round(i * stride) for i in range(num_sampling_steps)], dtype=torch.long)
    return cls(kept, full[kept], x0_clip)


@dataclass(frozen=True)
class Trajectory:
    """A sampled reverse trajectory of n tokens: x [S + 1, n, C] with x[S] = x_T (the prior draw) down to x[0] = the
    token; mean / log_std [S, n, C]: the Gaussian step k was drawn from (std = temperature * exp(log_std) for k >= 1;
    step 0 adds no noise, x[0] = mean[0])."""

    x: torch.Tensor
    mean: torch.Tensor
    log_std: torch.Tensor

    @property
    def token(self) -> torch.Tensor:
        return self.x[0]


def sample_trajectory(head: DiffusionHead, schedule: DiffusionSchedule, x_T: torch.Tensor, noise: torch.Tensor,
                      temperature: float = 1.0, rows: torch.Tensor | None = None) -> Trajectory:
    """Run the reverse chain from x_T [n, C] with the given per-step noise [S, n, C] (noise[k] drives step k; noise[0]
    is unused: the last step is noiseless); rows [n] long: the tokens these are (default 0 .. n-1)."""
    S = schedule.num_steps
    rows = torch.arange(x_T.shape[0], device=x_T.device) if rows is None else rows
    timesteps = schedule.tables(x_T.device)[0]
    xs, means, log_stds = [x_T], [None] * S, [None] * S
    x = x_T
    for k in reversed(range(S)):
        eps, v = head(x, timesteps[k].expand(x.shape[0]), rows)
        means[k], log_stds[k] = schedule.reverse_step(x, k, eps, v)
        x = means[k] + temperature * torch.exp(log_stds[k]) * noise[k] if k > 0 else means[k]
        xs.append(x)
    return Trajectory(torch.stack(xs[::-1]), torch.stack(means), torch.stack(log_stds))


def score_trajectory(head: DiffusionHead, schedule: DiffusionSchedule, x: torch.Tensor,
                     rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Evaluate `head` on every state of a given trajectory x [S + 1, n, C] in one batched call: returns the head's
    (mean, log_std) [S, n, C] of each step (what it would have drawn x[k] from, given x[k + 1]); rows as in
    `sample_trajectory`."""
    S, n = schedule.num_steps, x.shape[1]
    rows = torch.arange(n, device=x.device) if rows is None else rows
    states = x[1:].reshape(S * n, -1)  # x[k + 1] is the input of step k
    steps = torch.arange(S, device=x.device).repeat_interleave(n)
    eps, v = head(states, schedule.tables(x.device)[0][steps], rows.repeat(S))
    mean, log_std = schedule.reverse_step(states, steps, eps, v)
    return mean.view(S, n, -1), log_std.view(S, n, -1)


def trajectory_log_density(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor,
                           temperature: float = 1.0) -> torch.Tensor:
    """log density [n] of the noisy steps of trajectory x [S + 1, n, C]: x[k] ~ N(mean[k], (temperature *
    exp(log_std[k]))^2) for k = 1 .. S - 1, in float32 (the shared N(0, I) prior on x[S] = x_T is left out, and
    step 0 is noiseless)."""
    if mean.shape[0] < 2:
        return torch.zeros(x.shape[1], device=x.device)
    log_sigma = log_std[1:].float() + math.log(temperature)
    z = (x[1:-1].float() - mean[1:].float()) * torch.exp(-log_sigma)
    return (-0.5 * z.square() - log_sigma - 0.5 * math.log(2 * math.pi)).sum(dim=(0, 2))


def gaussian_kl(mean1: torch.Tensor, log_var1: torch.Tensor, mean2: torch.Tensor,
                log_var2: torch.Tensor) -> torch.Tensor:
    """KL(N(mean1, exp(log_var1)) || N(mean2, exp(log_var2))), elementwise."""
    return 0.5 * (log_var2 - log_var1 + torch.exp(log_var1 - log_var2) + (mean1 - mean2).square() * torch.exp(-log_var2)
                  - 1.0)


def training_loss(predict: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                  x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor,
                  schedule: DiffusionSchedule) -> tuple[torch.Tensor, torch.Tensor]:
    """Improved DDPM's hybrid loss per token, as MAR trains its head: (mse [n], vb [n]) with the loss = mse + vb.

    predict(x_t [n, C], t [n]) -> (eps, v); x0 [n, C] clean tokens; t [n] steps of `schedule` (the full training
    schedule); noise [n, C]. mse: mean squared eps error; vb: the variational bound term in bits per dimension with
    the predicted mean detached (so it trains the variance only): KL(q(x_{t-1} | x_t, x_0) || p(x_{t-1} | x_t)) for
    t > 0, and at t = 0 the Gaussian NLL of x_0 (continuous tokens; image DDPMs use a discretised likelihood here).
    """
    a = schedule.alphas_cumprod.to(x0.device)[t][:, None]
    x_t = (a.sqrt() * x0.double() + (1 - a).sqrt() * noise.double()).float()
    eps, v = predict(x_t, schedule.timesteps.to(t.device)[t])
    mse = (eps - noise).square().mean(-1)
    mean, log_std = schedule.reverse_step(x_t, t, eps.detach(), v)
    c = schedule.tables(x0.device)[1][:, t, None]
    true_mean = c[2] * x0.float() + c[3] * x_t  # the posterior q(x_{t-1} | x_t, x_0)
    kl = gaussian_kl(true_mean, c[5].expand_as(mean), mean, 2 * log_std)
    nll = 0.5 * ((x0 - mean).square() * torch.exp(-2 * log_std) + 2 * log_std + math.log(2 * math.pi))
    vb = torch.where((t == 0)[:, None], nll, kl).mean(-1) / math.log(2.0)
    return mse, vb
