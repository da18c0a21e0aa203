"""Speculative acceptance for continuous tokens (DESIGN §2.3 for diffusion heads): accept a draft with probability
min(1, p/q), else draw from the residual norm(max(p - q, 0)) by rejection with proposal p and acceptance
max(0, 1 - q/p) (expected tries 1 / TV(p, q)), with the laws given as log densities.

`verify_trajectories` is the **exact** mode for diffusion heads: the random variable is the whole reverse
trajectory (x_T .. x_1), whose density under either head is a product of the Gaussian steps actually sampled, and the
token is the *target's* noiseless last step mu_p(x_1). The accepted token is then distributed exactly as the target
head's own sampler output; nothing is approximated. Everything is in log space, float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mmspec.continuous.diffusion import (
    DiffusionHead,
    DiffusionSchedule,
    Trajectory,
    sample_trajectory,
    score_trajectory,
    trajectory_log_density,
)

# propose(attempt, rows [m] long) -> (candidates [m, C], log p [m], log q [m]): fresh target samples for pending rows
Proposal = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
# uniform(attempt, rows [m] long) -> [m] in (0, 1); attempt 0 is the draft's own test
Uniforms = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ContinuousVerifyResult:
    """tokens [n, C]: the output; accepted [n] bool: the draft was kept; tries [n] long: residual proposals drawn
    (0 for kept drafts); fallback [n] bool: the residual hit max_tries and the last target proposal was kept (counted,
    never a zero vector); log_ratio [n]: log p - log q of the draft (its per-token decomposition is the caller's)."""

    tokens: torch.Tensor
    accepted: torch.Tensor
    tries: torch.Tensor
    fallback: torch.Tensor
    log_ratio: torch.Tensor


def accept_draft(log_p: torch.Tensor, log_q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Keep a draft x ~ q with probability min(1, p(x) / q(x)): u < exp(min(0, log p - log q))."""
    return torch.log(u) < torch.clamp(log_p - log_q, max=0.0)


def accept_residual(log_p: torch.Tensor, log_q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Keep a proposal y ~ p with probability max(0, 1 - q(y) / p(y)): the accepted y follow norm(max(p - q, 0))."""
    return u < -torch.expm1(torch.clamp(log_q - log_p, max=0.0))


def residual_sample(propose: Proposal, uniform: Uniforms, rows: torch.Tensor, dim: int,
                    max_tries: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Residual draws for `rows` [m] long by rejection: (samples [m, C], tries [m] long, fallback [m] bool). One batched
    proposal per attempt for the rows still pending; after `max_tries`, a row keeps its last (target) proposal."""
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    m = rows.numel()
    samples = torch.zeros(m, dim, device=rows.device)
    tries = torch.zeros(m, dtype=torch.long, device=rows.device)
    pending = torch.ones(m, dtype=torch.bool, device=rows.device)
    for attempt in range(1, max_tries + 1):
        index = pending.nonzero().squeeze(1)
        if index.numel() == 0:
            break
        candidates, log_p, log_q = propose(attempt, rows[index])
        keep = accept_residual(log_p, log_q, uniform(attempt, rows[index]))
        tries[index] += 1
        last = attempt == max_tries
        take = index if last else index[keep]
        samples[take] = candidates if last else candidates[keep]
        pending[index[keep]] = False
    return samples, tries, pending


def verify_trajectories(draft: Trajectory, draft_head: DiffusionHead, target_head: DiffusionHead,
                        schedule: DiffusionSchedule, temperature: float,
                        target_noise: Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                        uniform: Uniforms, max_tries: int = 100) -> ContinuousVerifyResult:
    """Exact verification of n drafted tokens.

    draft: the draft head's trajectories (x [S + 1, n, C] with the Gaussians they were drawn from);
    target_noise(attempt, rows) -> (x_T [m, C], noise [S, m, C]): fresh keyed noise for residual proposals.
    The target head scores the draft trajectories in one batched call; kept drafts output mu_p(x_1); rejected ones
    draw target trajectories until one passes the residual test.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for speculative acceptance, got {temperature}")
    n, C = draft.x.shape[1], draft.x.shape[2]
    rows = torch.arange(n, device=draft.x.device)
    mean_p, log_std_p = score_trajectory(target_head, schedule, draft.x, temperature)
    log_p = trajectory_log_density(draft.x, mean_p, log_std_p, temperature)
    log_q = trajectory_log_density(draft.x, draft.mean, draft.log_std, temperature)
    accepted = accept_draft(log_p, log_q, uniform(0, rows))
    tokens = mean_p[0].clone()
    tries = torch.zeros(n, dtype=torch.long, device=rows.device)
    fallback = torch.zeros(n, dtype=torch.bool, device=rows.device)

    def propose(attempt: int, pending: torch.Tensor):
        x_T, noise = target_noise(attempt, pending)
        proposal = sample_trajectory(target_head, schedule, x_T, noise, temperature)
        mean_q, log_std_q = score_trajectory(draft_head, schedule, proposal.x, temperature)
        return (proposal.token, trajectory_log_density(proposal.x, proposal.mean, proposal.log_std, temperature),
                trajectory_log_density(proposal.x, mean_q, log_std_q, temperature))

    rejected = (~accepted).nonzero().squeeze(1)
    if rejected.numel():
        tokens[rejected], tries[rejected], fallback[rejected] = residual_sample(propose, uniform, rejected, C,
                                                                                max_tries)
    return ContinuousVerifyResult(tokens, accepted, tries, fallback, log_p - log_q)
