"""Acceptance rules: pure functions of (p, draft, generator), vectorised over [B, L].

Terms (vLLM's): a draft token is *accepted* or rejected; at the first rejection a *residual* token is drawn; when every
draft token of a row is accepted a *bonus* token is drawn from the next target law. p is always the target law, q the
draft law, both from `process_logits` with the same settings.

Lossless rules
- "exact": speculative sampling (Leviathan et al. 2023, arXiv 2211.17192, Alg. 1; Chen et al. 2023, arXiv 2302.01318):
  accept x ~ q with probability min(1, p(x)/q(x)); residual norm(max(p - q, 0)). A deterministic draft (q = one-hot) is
  the special case: accept with probability p(x), residual = p with x removed.
- "greedy": accept x iff x = argmax p; the next token is argmax p.
- multi-draft, one position, K candidates: RSD (Jeon et al. 2024, arXiv 2402.14160: Gumbel-top-k candidates without
  replacement, recursive rejection) and SpecTr K-SEQ (Sun et al. 2023, arXiv 2310.15141, i.i.d. candidates).
Lossy rule (opt-in)
- "typical": Medusa's typical acceptance (Cai et al. 2024, arXiv 2401.10774): accept x iff
  p(x) > min(epsilon, delta * exp(-H(p))); at the first rejection sample p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.core.drafts import Draft
from mmspec.core.rng import Generators, sample, uniform

ACCEPTANCE_RULES = ("exact", "greedy", "typical")
LOSSLESS_RULES = ("exact", "greedy")
RESIDUAL_EPS = 1e-12  # below this residual mass, rejection had (numerically) zero probability; sample p instead


@dataclass(frozen=True)
class VerifyResult:
    """n_accepted: [B] long, accepted draft tokens per row. next_token: [B] long, the residual or bonus token.
    accept_mask: [B, L] bool, per-position acceptance before the first-rejection cut (acceptance maps, stats).
    excess_acceptance: [B] float, lossy rules only: summed over the kept draft tokens, the probability 1 - min(1, p/q)
    with which the exact rule would have rejected them (the realised distortion); None for lossless rules.
    """

    n_accepted: torch.Tensor
    next_token: torch.Tensor
    accept_mask: torch.Tensor
    excess_acceptance: torch.Tensor | None = None


def draft_law_at_tokens(draft: Draft, dtype: torch.dtype) -> torch.Tensor:
    """q(x_j) for every draft token: [B, L]; 1 for deterministic drafts."""
    if draft.q is None:
        return torch.ones(draft.tokens.shape, dtype=dtype, device=draft.tokens.device)
    return draft.q.gather(-1, draft.tokens[..., None]).squeeze(-1).to(dtype)


def draft_law(draft: Draft, V: int, dtype: torch.dtype) -> torch.Tensor:
    """Full q rows [B, L, V]; one-hot rows for deterministic drafts."""
    if draft.q is None:
        return torch.nn.functional.one_hot(draft.tokens, V).to(dtype)
    return draft.q.to(dtype)


def accept_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)), elementwise; 0 where q(x) = 0 (such a token cannot have been drawn)."""
    return torch.where(q_x > 0, (p_x / q_x.clamp(min=torch.finfo(q_x.dtype).tiny)).clamp(max=1), 0)


def residual_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)) over the last dim; p itself where that mass is ~0 (DESIGN.md §2.1). Not filtered again."""
    residual = (p - q).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > RESIDUAL_EPS, residual / mass.clamp(min=RESIDUAL_EPS), p)


def _at(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rows[b, index[b]] for rows: [B, L, V], index: [B] -> [B, V]."""
    return rows.gather(1, index[:, None, None].expand(-1, 1, rows.shape[-1])).squeeze(1)


def _in_draft(draft: Draft) -> torch.Tensor:
    """[B, L] bool, True at the real draft positions of each row (j < lengths[b])."""
    return torch.arange(draft.tokens.shape[1], device=draft.tokens.device) < draft.lengths[:, None]


def _target_at_tokens(p: torch.Tensor, draft: Draft) -> torch.Tensor:
    """p_j(x_j) for every draft token: [B, L]."""
    return p[:, : draft.tokens.shape[1]].gather(-1, draft.tokens[..., None]).squeeze(-1)


def first_rejection(accept: torch.Tensor) -> torch.Tensor:
    """Length of the all-accepted prefix of each row of accept: [B, L] bool -> [B] long."""
    return accept.long().cumprod(-1).sum(-1)


def _check(p: torch.Tensor, draft: Draft) -> tuple[int, int, int]:
    if p.ndim != 3:
        raise ValueError(f"p must be [B, L + 1, V], got shape {tuple(p.shape)}")
    B, L1, V = p.shape
    if draft.tokens.shape != (B, L1 - 1):
        raise ValueError(f"draft.tokens must be [{B}, {L1 - 1}] for p of shape {tuple(p.shape)}, got {tuple(draft.tokens.shape)}")
    return B, L1 - 1, V


def verify_exact(p: torch.Tensor, draft: Draft, generator: Generators) -> VerifyResult:
    """Speculative sampling over a chain. p: [B, L + 1, V], the target law at each draft position and after it."""
    B, L, V = _check(p, draft)
    u = uniform((B, L), generator, p.device, p.dtype)  # drawn for every position, so the stream never depends on acceptance
    accept = (u < accept_probability(_target_at_tokens(p, draft), draft_law_at_tokens(draft, p.dtype))) & _in_draft(draft)
    n = first_rejection(accept)
    p_n = _at(p, n)  # [B, V]
    rejected = n < draft.lengths  # else every real draft token was accepted: the bonus comes from p_n
    if L:
        next_law = torch.where(rejected[:, None], residual_law(p_n, _at(draft_law(draft, V, p.dtype), n.clamp(max=L - 1))), p_n)
    else:
        next_law = p_n
    return VerifyResult(n_accepted=n, next_token=sample(next_law, generator), accept_mask=accept)


def verify_greedy(p: torch.Tensor, draft: Draft, generator: Generators = None) -> VerifyResult:
    """Accept the longest prefix of draft tokens equal to argmax p; the next token is argmax p after it."""
    B, L, V = _check(p, draft)
    target_tokens = p.argmax(-1)  # [B, L + 1]
    accept = (draft.tokens == target_tokens[:, :L]) & _in_draft(draft)
    n = first_rejection(accept)
    return VerifyResult(n_accepted=n, next_token=target_tokens.gather(1, n[:, None]).squeeze(1), accept_mask=accept)


def verify_typical(
    p: torch.Tensor, draft: Draft, generator: Generators, epsilon: float = 0.09, delta: float = 0.3
) -> VerifyResult:
    """Lossy typical acceptance (Medusa defaults epsilon = 0.09, delta = 0.3); at the first rejection sample p."""
    if not (0 < epsilon <= 1 and 0 < delta):
        raise ValueError(f"typical acceptance needs epsilon in (0, 1] and delta > 0, got epsilon={epsilon}, delta={delta}")
    B, L, V = _check(p, draft)
    p_x = _target_at_tokens(p, draft)
    entropy = -(p[:, :L] * p[:, :L].clamp(min=1e-30).log()).sum(-1)
    accept = (p_x > torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))) & _in_draft(draft)
    n = first_rejection(accept)
    kept = torch.arange(L, device=p.device) < n[:, None]
    excess = ((1 - accept_probability(p_x, draft_law_at_tokens(draft, p.dtype))) * kept).sum(-1)
    return VerifyResult(n_accepted=n, next_token=sample(_at(p, n), generator), accept_mask=accept, excess_acceptance=excess)


def verify(p: torch.Tensor, draft: Draft, generator: Generators, rule: str = "exact") -> VerifyResult:
    """Dispatch to an acceptance rule by name (one of `ACCEPTANCE_RULES`)."""
    if rule == "exact":
        return verify_exact(p, draft, generator)
    if rule == "greedy":
        return verify_greedy(p, draft, generator)
    if rule == "typical":
        return verify_typical(p, draft, generator)
    raise ValueError(f"acceptance must be one of {ACCEPTANCE_RULES}, got {rule!r}")
