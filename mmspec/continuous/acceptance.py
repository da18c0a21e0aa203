"""Speculative acceptance for continuous tokens (DESIGN §2.3 for diffusion heads): accept a draft with probability
min(1, p/q), else draw from the residual norm(max(p - q, 0)) by rejection with proposal p and acceptance
max(0, 1 - q/p) (expected tries 1 / TV(p, q)), with the laws given as log densities.

`verify_trajectories` is the **exact** mode for diffusion heads: the random variable is the whole reverse
trajectory (x_T .. x_1), whose density under either head is a product of the Gaussian steps actually sampled, and the
token is the *target's* noiseless last step mu_p(x_1). The accepted token is then distributed exactly as the target
head's own sampler output; nothing is approximated. Everything is in log space, float32.

`verify_paper` reproduces the released CSpD criterion (MarkXCloud/CSpD `judge_accept` / `sample_distribution`):
final-step Gaussians flattened by an inner temperature (42), the product of the step stds with the target's on top,
and a final-step residual. It is **not distribution-preserving**; it is here to compare with, and its log ratio is
returned term by term. Unlike the release, a residual that never passes keeps a target sample, never a zero vector.
"""

from __future__ import annotations

import math
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

# propose(attempts [m] long, rows [m] long) -> (candidates [m, C], log p [m], log q [m]): fresh target samples, one per
# (attempt, row) pair, drawn from noise keyed by both so that a proposal does not depend on how attempts are batched
Proposal = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
# uniform(attempts [m] long, rows [m] long) -> [m] in (0, 1); attempt 0 is the draft's own test
Uniforms = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ContinuousVerifyResult:
    """tokens [n, C]: the output; accepted [n] bool: the draft was kept; tries [n] long: residual proposals drawn
    (0 for kept drafts); fallback [n] bool: the residual hit max_tries and the last target proposal was kept (counted,
    never a zero vector); log_ratio [n]: the acceptance test's log ratio; terms: its decomposition, name -> [n], where
    the rule has one."""

    tokens: torch.Tensor
    accepted: torch.Tensor
    tries: torch.Tensor
    fallback: torch.Tensor
    log_ratio: torch.Tensor
    terms: dict[str, torch.Tensor] | None = None


def accept_draft(log_p: torch.Tensor, log_q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Keep a draft x ~ q with probability min(1, p(x) / q(x)): u < exp(min(0, log p - log q))."""
    return torch.log(u) < torch.clamp(log_p - log_q, max=0.0)


def accept_residual(log_p: torch.Tensor, log_q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Keep a proposal y ~ p with probability max(0, 1 - q(y) / p(y)): the accepted y follow norm(max(p - q, 0))."""
    return u < -torch.expm1(torch.clamp(log_q - log_p, max=0.0))


def residual_sample(propose: Proposal, uniform: Uniforms, rows: torch.Tensor, dim: int, max_tries: int,
                    proposals_per_round: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Residual draws for `rows` [m] long by rejection: (samples [m, C], tries [m] long, fallback [m] bool).

    Each round proposes `proposals_per_round` attempts at once for every row still pending (one batched call: a
    diffusion head's trajectory costs S sequential steps whatever the batch) and a row takes its first attempt that
    passes, so the output is that of one-at-a-time rejection sampling with the same keyed draws, and `tries` is the
    index of that attempt. After `max_tries` attempts a row keeps its last (target) proposal and is flagged.
    """
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    if proposals_per_round < 1:
        raise ValueError(f"proposals_per_round must be >= 1, got {proposals_per_round}")
    m = rows.numel()
    samples = torch.zeros(m, dim, device=rows.device)
    tries = torch.zeros(m, dtype=torch.long, device=rows.device)
    pending = torch.ones(m, dtype=torch.bool, device=rows.device)
    done = 0
    while done < max_tries:
        index = pending.nonzero().squeeze(1)  # one host sync per round
        if index.numel() == 0:
            break
        k = min(proposals_per_round, max_tries - done)
        attempts = torch.arange(done + 1, done + k + 1, device=rows.device).repeat_interleave(index.numel())
        tried = rows[index].repeat(k)  # attempt-major: [k * n_pending]
        candidates, log_p, log_q = propose(attempts, tried)
        keep = accept_residual(log_p, log_q, uniform(attempts, tried)).view(k, -1)
        passed = keep.any(0)
        first = torch.where(passed, keep.int().argmax(0), k - 1)  # the last attempt when none passed
        done += k
        take = passed | (done == max_tries)
        tries[index] += torch.where(passed, first + 1, k)
        chosen = candidates.view(k, index.numel(), -1)[first, torch.arange(index.numel(), device=rows.device)]
        samples[index[take]] = chosen[take].to(samples.dtype)
        pending[index[passed]] = False
    return samples, tries, pending


def verify_trajectories(draft: Trajectory, draft_head: DiffusionHead, target_head: DiffusionHead,
                        schedule: DiffusionSchedule, temperature: float,
                        target_noise: Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                        uniform: Uniforms, max_tries: int = 100,
                        proposals_per_round: int = 8) -> ContinuousVerifyResult:
    """Exact verification of n drafted tokens.

    draft: the draft head's trajectories (x [S + 1, n, C] with the Gaussians they were drawn from);
    target_noise(attempts [m], rows [m]) -> (x_T [m, C], noise [S, m, C]): fresh keyed noise for residual proposals.
    The target head scores the draft trajectories in one batched call; kept drafts output mu_p(x_1); rejected ones
    draw target trajectories until one passes the residual test.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for speculative acceptance, got {temperature}")
    n, C = draft.x.shape[1], draft.x.shape[2]
    rows = torch.arange(n, device=draft.x.device)
    mean_p, log_std_p = score_trajectory(target_head, schedule, draft.x)
    log_p = trajectory_log_density(draft.x, mean_p, log_std_p, temperature)
    log_q = trajectory_log_density(draft.x, draft.mean, draft.log_std, temperature)
    accepted = accept_draft(log_p, log_q, uniform(torch.zeros_like(rows), rows))
    tokens = mean_p[0].clone()
    tries = torch.zeros(n, dtype=torch.long, device=rows.device)
    fallback = torch.zeros(n, dtype=torch.bool, device=rows.device)

    def propose(attempts: torch.Tensor, pending: torch.Tensor):
        x_T, noise = target_noise(attempts, pending)
        proposal = sample_trajectory(target_head, schedule, x_T, noise, temperature, rows=pending)
        mean_q, log_std_q = score_trajectory(draft_head, schedule, proposal.x, rows=pending)
        return (proposal.token, trajectory_log_density(proposal.x, proposal.mean, proposal.log_std, temperature),
                trajectory_log_density(proposal.x, mean_q, log_std_q, temperature))

    rejected = (~accepted).nonzero().squeeze(1)
    if rejected.numel():
        tokens[rejected], tries[rejected], fallback[rejected] = residual_sample(propose, uniform, rejected, C,
                                                                                max_tries, proposals_per_round)
    return ContinuousVerifyResult(tokens, accepted, tries, fallback, log_p - log_q)


def _normal_log_pdf(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim of log N(x; mean, exp(log_std)^2), float32."""
    z = (x.float() - mean.float()) * torch.exp(-log_std.float())
    return (-0.5 * z.square() - log_std.float() - 0.5 * math.log(2 * math.pi)).sum(-1)


def verify_paper(draft: Trajectory, target: Trajectory, temperature: float, uniform: Uniforms,
                 residual_noise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], inner_temperature: float = 42.0,
                 max_tries: int = 100, proposals_per_round: int = 8) -> ContinuousVerifyResult:
    """The released CSpD acceptance (approximate). draft / target: both heads' trajectories from the same noise
    (aligned); residual_noise(attempts [m], rows [m]) -> [m, C] standard normals for the final-step residual proposals.

    log r = -1/2 |(x - mu_p0) / (t_in s_p0)|^2 + 1/2 |(x - mu_q0) / (t_in s_q0)|^2   ("exponent"; x = mu_q0)
            + sum_{k >= 1, d} (log sigma_p,k - log sigma_q,k)                       ("sigma_product")
            + sum_d (log s_q0 - log s_p0)                                           ("normalisation")
    with s_0 = temperature * sigma_0; the residual proposes y ~ N(mu_p0, s_p0^2) and keeps it with probability
    max(0, N_p(y) - N_q(y) / exp(sigma_product)) / N_p(y).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for speculative acceptance, got {temperature}")
    x = draft.token
    n, C = x.shape
    log_s_q, log_s_p = draft.log_std[0] + math.log(temperature), target.log_std[0] + math.log(temperature)
    log_t_in = math.log(inner_temperature)
    exponent = _normal_log_pdf(x, target.mean[0], log_s_p + log_t_in) - _normal_log_pdf(x, draft.mean[0],
                                                                                          log_s_q + log_t_in)
    exponent += (log_s_p - log_s_q).sum(-1)  # the pdfs' own normalisations cancel against the next term's twin
    sigma_product = (target.log_std[1:] - draft.log_std[1:]).sum(dim=(0, 2))
    normalisation = (log_s_q - log_s_p).sum(-1)
    log_ratio = exponent + sigma_product + normalisation
    rows = torch.arange(n, device=x.device)
    accepted = accept_draft(log_ratio, torch.zeros_like(log_ratio), uniform(torch.zeros_like(rows), rows))

    def propose(attempts: torch.Tensor, pending: torch.Tensor):
        y = target.mean[0][pending] + torch.exp(log_s_p[pending]) * residual_noise(attempts, pending)
        log_p = _normal_log_pdf(y, target.mean[0][pending], log_s_p[pending])
        log_q = _normal_log_pdf(y, draft.mean[0][pending], log_s_q[pending]) - sigma_product[pending]
        return y, log_p, log_q

    tokens = x.clone()
    tries = torch.zeros(n, dtype=torch.long, device=x.device)
    fallback = torch.zeros(n, dtype=torch.bool, device=x.device)
    rejected = (~accepted).nonzero().squeeze(1)
    if rejected.numel():
        tokens[rejected], tries[rejected], fallback[rejected] = residual_sample(propose, uniform, rejected, C,
                                                                                max_tries, proposals_per_round)
    terms = {"exponent": exponent, "sigma_product": sigma_product, "normalisation": normalisation}
    return ContinuousVerifyResult(tokens, accepted, tries, fallback, log_ratio, terms)
