"""Speculative acceptance for continuous tokens (the exact rule for diffusion heads): accept a draft with probability
min(1, p/q), else draw from the residual norm(max(p - q, 0)) by rejection with proposal p and acceptance
max(0, 1 - q/p) (expected tries 1 / TV(p, q)), with the laws given as log densities.

`verify_trajectories` is the **exact** mode for diffusion heads: the random variable is the whole reverse
trajectory (x_T .. x_1), whose density under either head is a product of the Gaussian steps actually sampled, and the
token is the *target's* noiseless last step mu_p(x_1). The accepted token is then distributed exactly as the target
head's own sampler output; nothing is approximated. Everything is in log space, float32.

The released CSpD criterion, which is not distribution-preserving, is the `Paper` rule (`mmspec.continuous.paper`);
it draws its residual with `residual_sample` too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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
class TrajectoryBlock:
    """What a continuous rule verifies: n drafted tokens of a block. draft: the draft head's trajectories (x [S + 1,
    n, C] with the Gaussians they were drawn from); draft_head / target_head: both heads on the tokens' conditions
    (the target's from its one pass over the block); noise(attempts [m], rows [m]) -> (x_T [m, C], noise [S, m, C]):
    keyed noise of a target trajectory (attempt 0: the draft's own noise); final_noise(attempts, rows) -> [m, C]:
    keyed standard normals of a final-step proposal; uniform: keyed uniforms (attempt 0 tests the draft); the
    residual's budget (max_tries, proposals_per_round); target_chain(x_T [m, C], noise [S, m, C], rows [m]) ->
    the target head's trajectories of those rows, as `sample_trajectory(target_head, ...)` draws them (None: it; a
    decoding passes one that replays the chains from graphs, `mmspec.continuous.graphs`)."""

    draft: Trajectory
    draft_head: DiffusionHead
    target_head: DiffusionHead
    schedule: DiffusionSchedule
    temperature: float
    noise: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    final_noise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    uniform: Uniforms
    max_tries: int = 100
    proposals_per_round: int = 8
    target_chain: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Trajectory] | None = None

    def sample_target(self, x_T: torch.Tensor, noise: torch.Tensor, rows: torch.Tensor) -> Trajectory:
        """The target head's reverse chains from x_T [m, C] with noise [S, m, C] for tokens `rows` [m]."""
        if self.target_chain is not None:
            return self.target_chain(x_T, noise, rows)
        return sample_trajectory(self.target_head, self.schedule, x_T, noise, self.temperature, rows=rows)


@runtime_checkable
class TrajectoryTest(Protocol):
    """A continuous rule's own test of a block (a lossy rule brings one; the exact rule is `verify_block`)."""

    def verify_block(self, block: TrajectoryBlock) -> ContinuousVerifyResult: ...


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
                        uniform: Uniforms, max_tries: int = 100, proposals_per_round: int = 8,
                        target_chain: Callable[..., Trajectory] | None = None) -> ContinuousVerifyResult:
    """Exact verification of n drafted tokens.

    draft: the draft head's trajectories (x [S + 1, n, C] with the Gaussians they were drawn from);
    target_noise(attempts [m], rows [m]) -> (x_T [m, C], noise [S, m, C]): fresh keyed noise for residual proposals;
    target_chain: draws their trajectories (`TrajectoryBlock.target_chain`; None: `sample_trajectory`).
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
        proposal = (sample_trajectory(target_head, schedule, x_T, noise, temperature, rows=pending)
                    if target_chain is None else target_chain(x_T, noise, pending))
        mean_q, log_std_q = score_trajectory(draft_head, schedule, proposal.x, rows=pending)
        return (proposal.token, trajectory_log_density(proposal.x, proposal.mean, proposal.log_std, temperature),
                trajectory_log_density(proposal.x, mean_q, log_std_q, temperature))

    rejected = (~accepted).nonzero().squeeze(1)
    if rejected.numel():
        tokens[rejected], tries[rejected], fallback[rejected] = residual_sample(propose, uniform, rejected, C,
                                                                                max_tries, proposals_per_round)
    return ContinuousVerifyResult(tokens, accepted, tries, fallback, log_p - log_q)


def verify_block(block: TrajectoryBlock) -> ContinuousVerifyResult:
    """The exact rule on a block (`verify_trajectories`)."""
    return verify_trajectories(block.draft, block.draft_head, block.target_head, block.schedule, block.temperature,
                               block.noise, block.uniform, block.max_tries, block.proposals_per_round,
                               block.target_chain)
