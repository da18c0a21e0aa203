"""Analytic diffusion heads for tests: the ideal eps-predictor for data N(m, diag s^2), in closed form."""

from __future__ import annotations

import torch

from mmspec.continuous.diffusion import cosine_alphas_cumprod
from mmspec.core.rng import keyed_normal


class GaussianDataHead:
    """eps(x_t, t) = (x_t - sqrt(a) E[x_0 | x_t]) / sqrt(1 - a), E[x_0 | x_t] = m + sqrt(a) s^2 / (a s^2 + 1 - a)
    (x_t - sqrt(a) m), a = alpha-bar_t of the 1000-step cosine schedule; v: a constant variance interpolation
    (None = the posterior variance)."""

    def __init__(self, m, s, v: float | None = None, num_train_steps: int = 1000):
        self.m, self.s, self.v = torch.as_tensor(m, dtype=torch.float64), torch.as_tensor(s, dtype=torch.float64), v
        self.alphas_cumprod = cosine_alphas_cumprod(num_train_steps)

    def __call__(self, x_t: torch.Tensor, timesteps: torch.Tensor, rows: torch.Tensor):
        a = self.alphas_cumprod[timesteps][:, None]
        x = x_t.double()
        x0 = self.m + a.sqrt() * self.s**2 / (a * self.s**2 + 1 - a) * (x - a.sqrt() * self.m)
        eps = ((x - a.sqrt() * x0) / (1 - a).sqrt()).float()
        return eps, None if self.v is None else torch.full_like(eps, self.v)


def keyed_trajectory_noise(seed: int, rows: torch.Tensor, num_steps: int, dim: int, attempt: int = 0):
    """(x_T [m, C], noise [S, m, C]) keyed by (seed, row, step, attempt): the same rows get the same noise whoever
    asks, and the draft (attempt 0) and each residual attempt get their own."""
    steps = torch.arange(num_steps + 1)[:, None]
    noise = keyed_normal(seed, rows[None, :], steps, attempt, dim=dim)  # [S + 1, m, C]
    return noise[num_steps], noise[:num_steps]


class AnalyticHeadMAR:
    """A tiny MAR whose encoder / decoder is real (random weights) and whose diffusion head is the ideal denoiser of
    token data N(z @ weight, diag s^2): a MAR with a well-behaved head and no training (a random MLP head's
    eps predictions blow tokens up at the noisiest steps)."""

    def __init__(self, mar, weight: torch.Tensor, s):
        self.mar, self.weight, self.s = mar, weight, torch.as_tensor(s, dtype=torch.float64)
        self.config, self.device, self.dtype = mar.config, mar.device, mar.dtype
        self.alphas_cumprod = cosine_alphas_cumprod(1000)

    def class_embedding(self, labels, batch_size):
        return self.mar.class_embedding(labels, batch_size)

    def encode_decode(self, tokens, unknown, class_embedding, known_tokens=None):
        return self.mar.encode_decode(tokens, unknown, class_embedding, known_tokens)

    def diffusion_head(self, z, z_uncond=None, guidance_scale=1.0):
        scale = torch.as_tensor(guidance_scale, dtype=torch.float64).expand(z.shape[0])

        def head(x_t, timesteps, rows):
            eps = GaussianDataHead(z[rows].double() @ self.weight, self.s, v=None)(x_t, timesteps, rows)[0]
            if z_uncond is not None:
                uncond = GaussianDataHead(z_uncond[rows].double() @ self.weight, self.s)(x_t, timesteps, rows)[0]
                eps = (uncond + scale[rows, None] * (eps - uncond)).float()
            return eps, None

        return head
