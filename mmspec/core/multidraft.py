"""Multi-draft verification at one position: K candidate tokens, one output token with the target law p.

- SpecInfer (Miao et al. 2024, arXiv 2305.09781): i.i.d. candidates; accept x_i with probability
  min(1, p_i(x_i)/q(x_i)), else p_{i+1} = norm(max(p_i - q, 0)); if all K are rejected, sample p_{K+1}.
- RSD (Jeon et al. 2024, arXiv 2402.14160): candidates drawn from q *without replacement* (Gumbel-top-k); recursive
  rejection: accept x_i with probability min(1, p_i(x_i)/q_i(x_i)), else p_{i+1} = norm(max(p_i - q_i, 0)) and
  q_{i+1} = q_i without x_i, renormalised; if all K are rejected, sample p_{K+1}.
- SpecTr K-SEQ (Sun et al. 2023, arXiv 2310.15141): i.i.d. candidates; with beta(rho) = sum_x min(q, p/rho), accept X_i
  with probability min(1, p(X_i)/(rho q(X_i))), rho* in [1, K] the smallest rho with 1 - (1 - beta)^K <= rho beta;
  if none is accepted, sample p_res = [p - min(q, p/rho) (1 - (1 - beta)^K)/beta] / (1 - beta)^K.
  P(accept) = 1 - (1 - beta(rho*))^K.

Each rule is a *plan* (acceptance probabilities and final residual law given the candidates; float64-testable) plus a
sampler that draws from the plan. Shapes: p, q: [B, V]; candidates: [B, K].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.core.rng import Generators, sample, uniform
from mmspec.core.rules.exact import accept_probability, residual_law


@dataclass(frozen=True)
class MultiDraftPlan:
    """accept_prob: [B, K], probability of accepting candidate i given candidates < i were rejected.
    residual: [B, V], the law of the output when every candidate is rejected."""

    accept_prob: torch.Tensor
    residual: torch.Tensor


@dataclass(frozen=True)
class MultiDraftResult:
    """accepted_index: [B] long, the accepted candidate (K when none was). token: [B] long, the output token."""

    accepted_index: torch.Tensor
    token: torch.Tensor


def gumbel_top_k(q: torch.Tensor, k: int, generator: Generators) -> torch.Tensor:
    """k distinct tokens per row, an ordered sample without replacement from q (Gumbel-top-k). [B, V] -> [B, k]."""
    B, V = q.shape
    if not 1 <= k <= int((q > 0).sum(-1).min()):
        raise ValueError(f"k must be in [1, smallest support of q], got k={k}")
    return without_replacement(q, uniform((B, V), generator, q.device, q.dtype), k)[0]


def without_replacement(q: torch.Tensor, u: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An ordered sample of k distinct tokens from q [..., V] by Gumbel-top-k on the uniforms u [..., V].

    Returns tokens [..., k] and valid [..., k] bool: False past the support of q (those tokens are placeholders; the
    valid ones are always a prefix, so the sample is one without replacement of size valid.sum(-1))."""
    gumbel = -torch.log(-torch.log(u.clamp(min=torch.finfo(u.dtype).tiny)))
    scores, tokens = (q.log() + gumbel).topk(k, dim=-1)
    return tokens, scores > -torch.inf


def sample_iid(q: torch.Tensor, k: int, generator: Generators) -> torch.Tensor:
    """k i.i.d. draws per row from q: [B, V] -> [B, k]."""
    return torch.stack([sample(q, generator) for _ in range(k)], dim=1)


def recursive_plan(p: torch.Tensor, q: torch.Tensor | None, candidates: torch.Tensor, valid: torch.Tensor | None,
                   without_replacement: bool) -> MultiDraftPlan:
    """Multi-round rejection over K candidates: SpecInfer's for iid candidates (or deterministic ones: q None, each
    candidate's law its own one-hot), RSD's for candidates drawn without replacement, where q also loses each
    rejected candidate. valid: [B, K] bool, a prefix of each row (None = all): an invalid candidate is never
    accepted and leaves the laws as they are, so a row with K' valid candidates gets the plan of K' candidates."""
    p_i, q_i = p, q
    accept = []
    for i in range(candidates.shape[1]):  # over the K candidates (K is small), vectorised over rows
        x = candidates[:, i : i + 1]
        live = torch.ones_like(x, dtype=torch.bool) if valid is None else valid[:, i : i + 1]
        q_now = torch.zeros_like(p).scatter_(1, x, 1.0) if q is None else q_i
        accept.append(torch.where(live, accept_probability(p_i.gather(1, x), q_now.gather(1, x)), 0).squeeze(1))
        p_i = torch.where(live, residual_law(p_i, q_now), p_i)
        if without_replacement:
            q_next = q_i.scatter(1, x, 0.0)
            q_i = torch.where(live, q_next / q_next.sum(-1, keepdim=True).clamp(min=torch.finfo(q.dtype).tiny), q_i)
    return MultiDraftPlan(accept_prob=torch.stack(accept, 1) if accept else p.new_zeros(p.shape[0], 0), residual=p_i)


def rsd_plan(p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor,
             valid: torch.Tensor | None = None) -> MultiDraftPlan:
    """RSD: recursive rejection for candidates drawn without replacement from q (`recursive_plan`)."""
    return recursive_plan(p, q, candidates, valid, without_replacement=True)


def spectr_beta(p: torch.Tensor, q: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """beta(rho) = sum_x min(q(x), p(x)/rho). p, q: [B, V]; rho: [B] -> [B]."""
    return torch.minimum(q, p / rho[:, None]).sum(-1)


def spectr_rho(p: torch.Tensor, q: torch.Tensor, k: int | torch.Tensor, iterations: int = 64) -> torch.Tensor:
    """rho* in [1, max(k, 1)]: the smallest rho with 1 - (1 - beta(rho))^k <= rho beta(rho), by bisection ([B]);
    k: an int or [B] per-row candidate counts.

    rho beta(rho) grows and beta(rho) falls with rho, so the condition is monotone; rho = k always satisfies it. The
    upper end of the bracket is returned, so the condition holds exactly.
    """
    B = p.shape[0]
    lo = torch.ones(B, dtype=p.dtype, device=p.device)
    k = torch.as_tensor(k, dtype=p.dtype, device=p.device).expand(B)
    hi = k.clamp(min=1)

    def valid(rho):
        beta = spectr_beta(p, q, rho)
        return 1 - (1 - beta) ** k <= rho * beta

    hi = torch.where(valid(lo), lo, hi)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        ok = valid(mid)
        hi = torch.where(ok, mid, hi)
        lo = torch.where(ok, lo, mid)
    return hi


def spectr_plan(p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor,
                valid: torch.Tensor | None = None) -> MultiDraftPlan:
    """K-SEQ for i.i.d. candidates from q. valid: [B, K] bool, a prefix of each row (None = all): a row with K'
    valid candidates gets the plan of K' candidates (K' = 0: the residual is p)."""
    K = candidates.shape[1] if valid is None else valid.sum(-1, keepdim=True).to(p.dtype)  # int or [B, 1]
    rho = spectr_rho(p, q, K if valid is None else K[:, 0])
    beta = spectr_beta(p, q, rho)[:, None]  # [B, 1]
    accept = accept_probability(p.gather(1, candidates), rho[:, None] * q.gather(1, candidates))
    if valid is not None:
        accept = accept * valid
    p_accept = 1 - (1 - beta) ** K
    # (1 - (1-beta)^K) / beta -> K as beta -> 0
    gain = torch.where(beta > 0, p_accept / beta.clamp(min=torch.finfo(p.dtype).tiny), K * torch.ones_like(beta))
    p_reject = (1 - beta) ** K
    residual = (p - torch.minimum(q, p / rho[:, None]) * gain).clamp(min=0)
    residual = torch.where(p_reject > 0, residual / residual.sum(-1, keepdim=True).clamp(min=1e-300), p)
    return MultiDraftPlan(accept_prob=accept, residual=residual)


def sample_plan(plan: MultiDraftPlan, candidates: torch.Tensor, generator: Generators) -> MultiDraftResult:
    """Try candidates in order with their acceptance probabilities; if all are rejected, sample the residual."""
    B, K = candidates.shape
    u = uniform((B, K), generator, candidates.device, plan.accept_prob.dtype)
    accepted = u < plan.accept_prob
    first = torch.where(accepted.any(-1), accepted.long().argmax(-1), K)
    fallback = sample(plan.residual, generator)
    token = torch.where(first < K, candidates.gather(1, first.clamp(max=K - 1)[:, None]).squeeze(1), fallback)
    return MultiDraftResult(accepted_index=first, token=token)


def verify_rsd(p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, generator: Generators) -> MultiDraftResult:
    """RSD verification of candidates drawn by `gumbel_top_k(q, K)`."""
    return sample_plan(rsd_plan(p, q, candidates), candidates, generator)


def verify_spectr(p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor,
                  generator: Generators) -> MultiDraftResult:
    """SpecTr K-SEQ verification of candidates drawn by `sample_iid(q, K)`."""
    return sample_plan(spectr_plan(p, q, candidates), candidates, generator)
