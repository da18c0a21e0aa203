"""CSpD's released acceptance rule for continuous tokens (MarkXCloud/CSpD `judge_accept` / `sample_distribution`),
`acceptance=Paper()` of `ContinuousSpeculation`: final-step Gaussians flattened by an inner temperature (42), the
product of the step stds with the target's on top, and a final-step residual. It is **not distribution-preserving**
(its bias is measured, `tests/continuous`); it is here to compare with, and its log ratio is returned term by term.
Unlike the release, a residual that never passes keeps a target sample, never a zero vector. The module loads without
torch (the rule's settings are read before any model loads); its test imports the engine when it runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from mmspec.core.registry import register_rule
from mmspec.core.rules.base import AcceptanceRule

if TYPE_CHECKING:
    import torch

    from mmspec.continuous.acceptance import ContinuousVerifyResult, TrajectoryBlock, Uniforms
    from mmspec.continuous.diffusion import Trajectory


@register_rule
@dataclass(frozen=True)
class Paper(AcceptanceRule):
    """The released CSpD rule for continuous tokens (approximate, not distribution-preserving; its bias is measured):
    final-step Gaussians flattened by an inner temperature, a sigma-product term, a final-step residual."""

    name: ClassVar[str] = "paper"
    modalities: ClassVar[tuple[str, ...]] = ("continuous",)
    lossless: ClassVar[bool] = False

    def verify_block(self, block: TrajectoryBlock) -> ContinuousVerifyResult:
        """The released test of a block: the target's trajectories from the draft's own noise (aligned), then
        `verify_paper`."""
        import torch

        rows = torch.arange(block.draft.x.shape[1], device=block.draft.x.device)
        aligned = block.sample_target(*block.noise(torch.zeros_like(rows), rows), rows)
        return verify_paper(block.draft, aligned, block.temperature, block.uniform, block.final_noise,
                            max_tries=block.max_tries, proposals_per_round=block.proposals_per_round)


def _normal_log_pdf(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim of log N(x; mean, exp(log_std)^2), float32."""
    import torch

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
    import torch

    from mmspec.continuous.acceptance import ContinuousVerifyResult, accept_draft, residual_sample

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
