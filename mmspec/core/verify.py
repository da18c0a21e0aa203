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
Lossy rules (opt-in)
- "typical": Medusa's typical acceptance (Cai et al. 2024, arXiv 2401.10774): accept x iff
  p(x) > min(epsilon, delta * exp(-H(p))); at the first rejection sample p.
- "lantern": relaxed acceptance for visual AR models (LANTERN, Jang et al. 2025, arXiv 2410.03355; LANTERN++, Park et
  al. 2025, arXiv 2502.06352). A draft x is scored with the target mass of A(x): x plus the longest prefix of its
  nearest codebook neighbours whose summed mass stays within the budget (delta, and/or (lam - 1) p(x)); accept with
  f(x) = min(1, p(A(x))/q(x)); at a rejection draw from Cool-SD's residual G* = norm(max(p - q f, 0)) (Li et al.,
  AAAI 2026, arXiv 2601.09212), which is the least-distorting one. Not the official code's residual, which zeroes all
  k + 1 nearest codes and adds distortion. What the budget guarantees is per candidate: TV(p, p with A(x) moved onto
  x) <= delta. The emitted law pi is NOT within delta of p; with G*, exactly
      TV(pi, p) = sum_x [min(q(x), p(A(x))) - p(x)]_+ = alpha_relaxed - alpha_exact <= min(TV(p, q), sum_x N(x)),
  N(x) = p(A(x)) - p(x): every unit of extra acceptance is one unit of distortion. `excess_acceptance` reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmspec.core.acceptance import GSD, Acceptance, Exact, Lantern, Typical, check_relaxation
from mmspec.core.drafts import Draft
from mmspec.core.rng import Generators, sample, uniform

# a relaxed (lossy) acceptance's model-side settings: draft_masses(p, q, drafts) -> (mass of p, mass of q) whose ratio
# is the acceptance probability, residual(p_n, q_n) -> the law drawn at a rejection, lossless (LANTERN's Relaxation,
# GSD's Grouping)
Relaxed = Any

RESIDUAL_EPS = 1e-12  # below this residual mass, rejection had (numerically) zero probability; sample p instead
RELAXED_MASS_CHUNK = 1 << 22  # elements of the [B, V, k] neighbour-mass tensor built at once for the G* residual


@dataclass(frozen=True)
class VerifyResult:
    """n_accepted: [B] long, accepted draft tokens per row. next_token: [B] long, the residual or bonus token.
    accept_mask: [B, L] bool, per-position acceptance before the first-rejection cut (acceptance maps, stats).
    excess_acceptance: [B] float, lossy rules only: summed over the tested draft positions (those up to and including
    the first rejection), the rule's acceptance probability of the draft minus the exact rule's min(1, p/q). Its mean
    over positions estimates alpha_rule - alpha_exact, which for "lantern" is the per-position TV distance of the
    output law from p (the realised distortion). None for lossless rules.
    """

    n_accepted: torch.Tensor
    next_token: torch.Tensor
    accept_mask: torch.Tensor
    excess_acceptance: torch.Tensor | None = None


@dataclass(frozen=True)
class Relaxation:
    """Settings of LANTERN relaxed acceptance.

    neighbours: [V, K] integer tensor; row x holds the token ids of x's K nearest codebook neighbours, nearest first,
    x itself excluded; -1 entries (a whole row for tokens that are not image codes) are never relaxed onto.
    k: how many of them may join A(x), 0 <= k <= K. delta: LANTERN's additive budget, sum of p over A(x) minus x
    <= delta, in [0, 1]. lam: LANTERN++'s multiplicative budget, p(A(x)) <= lam * p(x), lam >= 1. Give delta, lam or
    both (then both hold). k = 0, delta = 0 or lam = 1 is the exact rule.
    """

    neighbours: torch.Tensor
    k: int
    delta: float | None = None
    lam: float | None = None

    def __post_init__(self):
        table = self.neighbours
        if not isinstance(table, torch.Tensor) or table.ndim != 2 or table.dtype.is_floating_point:
            raise TypeError("neighbours must be an integer tensor [V, K] of token ids (a neighbour table)")
        V, K = table.shape
        check_relaxation(self.k, self.delta, self.lam, V)
        if self.k > K:
            raise ValueError(
                f"k = {self.k} exceeds the neighbour table's {K} neighbours per code; build it with k_max >= k"
            )

    @property
    def lossless(self) -> bool:
        """True when the settings admit no neighbour mass, so the rule is the exact one."""
        return self.k == 0 or self.delta == 0 or self.lam == 1

    def draft_masses(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(p(A(x)), q(x)) of each draft: p, q [B, L, V], drafts [B, L] -> two [B, L]; accepted with min(1, ratio)."""
        return relaxed_draft_mass(p, drafts, self), q.gather(-1, drafts[..., None]).squeeze(-1)

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The law drawn at a rejection: G* (`relaxed_residual`)."""
        return relaxed_residual(p, q, self)


def relaxed_mass(p: torch.Tensor, tokens: torch.Tensor, relaxation: Relaxation) -> tuple[torch.Tensor, torch.Tensor]:
    """p(A(x)) and |A(x)| - 1 for T tokens per law: p [..., V], tokens [..., T] long -> ([..., T] float, [..., T] long).

    A(x) is x plus the longest prefix of its k nearest neighbours whose cumulative mass under p stays within the
    budget (the cumulative mass is non-decreasing, so the admissible neighbours always form a prefix).
    """
    p_x = p.gather(-1, tokens)
    if relaxation.k == 0:
        return p_x, torch.zeros_like(tokens)
    neighbours = relaxation.neighbours.to(p.device)[tokens, : relaxation.k].long()  # [..., T, k]
    real = neighbours >= 0
    masses = p.gather(-1, neighbours.clamp(min=0).flatten(-2)).view(neighbours.shape)
    cumulative = masses.masked_fill(~real, 0).cumsum(-1)
    budget = torch.full_like(p_x, torch.inf)
    if relaxation.delta is not None:
        budget = budget.clamp(max=relaxation.delta)
    if relaxation.lam is not None:
        budget = torch.minimum(budget, (relaxation.lam - 1) * p_x)
    inside = cumulative <= budget[..., None]
    n = inside.sum(-1)
    moved = torch.where(n > 0, cumulative.gather(-1, (n - 1).clamp(min=0)[..., None]).squeeze(-1), 0)
    return p_x + moved, (inside & real).sum(-1)


def relaxed_draft_mass(p: torch.Tensor, drafts: torch.Tensor, relaxation: Relaxation) -> torch.Tensor:
    """p(A(x)) of one draft per law: p [..., V], drafts [...] long -> [...]."""
    return relaxed_mass(p, drafts[..., None], relaxation)[0].squeeze(-1)


def relaxed_residual(p: torch.Tensor, q: torch.Tensor, relaxation: Relaxation) -> torch.Tensor:
    """Cool-SD's G* = norm(max(p - q f, 0)) with f(y) = min(1, p(A(y))/q(y)): p, q [B, V] -> [B, V].

    q f = min(q, p(A(.))), computed that way so that lossless settings give exactly `residual_law(p, q)`. p(A(y)) is
    needed for every y, built in vocabulary chunks of at most RELAXED_MASS_CHUNK neighbour entries.
    """
    B, V = p.shape
    chunk = max(1, RELAXED_MASS_CHUNK // max(1, B * relaxation.k))
    tokens = torch.arange(V, device=p.device).expand(B, V)
    mass = torch.cat([relaxed_mass(p, part, relaxation)[0] for part in tokens.split(chunk, dim=1)], 1)
    return residual_law(p, torch.minimum(q, mass))


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


def take_position(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
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
    return _verify_chain(p, draft, generator, None)


def verify_lantern(p: torch.Tensor, draft: Draft, generator: Generators, relaxation: Relaxation) -> VerifyResult:
    """LANTERN relaxed acceptance over a chain with the G* residual; p as in `verify_exact`. Image-token drafts
    only relax onto their neighbours (`relaxation.neighbours`); other tokens are tested exactly."""
    if not isinstance(relaxation, Relaxation):
        raise TypeError(f"relaxation must be a Relaxation, got {type(relaxation).__name__}")
    return _verify_chain(p, draft, generator, relaxation)


def verify_lantern_greedy(
    p: torch.Tensor, draft: Draft, relaxation: Relaxation, generator: Generators = None
) -> VerifyResult:
    """Greedy LANTERN: accept x iff p(A(x)) >= max_{y != x} p(y), i.e. x is the argmax once A(x)'s mass is moved onto
    it; the next token is argmax p. p: [B, L + 1, V] laws at temperature 1 (after CFG / top-k / top-p), which give the
    neighbour masses; greedy decoding picks their argmax. k = 0, delta = 0 or lam = 1 is greedy decoding."""
    B, L, V = _check(p, draft)
    p_A = relaxed_draft_mass(p[:, :L], draft.tokens, relaxation)
    rival = p[:, :L].scatter(-1, draft.tokens[..., None], -1).amax(-1)  # the best other token
    target_tokens = p.argmax(-1)  # [B, L + 1]
    accept = (p_A >= rival) & _in_draft(draft)
    n = first_rejection(accept)
    exact = (draft.tokens == target_tokens[:, :L]).to(p.dtype)
    return VerifyResult(n_accepted=n, next_token=target_tokens.gather(1, n[:, None]).squeeze(1), accept_mask=accept,
                        excess_acceptance=excess_acceptance(accept.to(p.dtype), exact, n, draft.lengths))


def _verify_chain(p: torch.Tensor, draft: Draft, generator: Generators, relaxation: Relaxed | None) -> VerifyResult:
    B, L, V = _check(p, draft)
    # drawn for every position, so the random stream never depends on acceptance
    outcome = chain_outcome(p, draft, uniform((B, L), generator, p.device, p.dtype), relaxation)
    return outcome.result(sample(outcome.next_law, generator))


@dataclass(frozen=True)
class ChainOutcome:
    """A chain's acceptance tests before the closing token is drawn. n_accepted, accept_mask, excess_acceptance as
    in `VerifyResult`; next_law: [B, V], the law of the closing token: the residual at the first rejection, else the
    target law after the last accepted draft (the bonus). rejected: [B] bool, which of the two."""

    n_accepted: torch.Tensor
    accept_mask: torch.Tensor
    next_law: torch.Tensor
    rejected: torch.Tensor
    excess_acceptance: torch.Tensor | None

    def result(self, next_token: torch.Tensor) -> VerifyResult:
        return VerifyResult(self.n_accepted, next_token, self.accept_mask, self.excess_acceptance)


def chain_outcome(p: torch.Tensor, draft: Draft, u: torch.Tensor, relaxation: Relaxed | None) -> ChainOutcome:
    """The exact (relaxation None) or relaxed (LANTERN's `Relaxation`, GSD's `mmspec.core.grouping.Grouping`) chain
    test of `draft` with the caller's uniforms u: [B, L] (one per draft position); p as in `verify_exact`. Pure
    tensor code: decoders that draw their own uniforms (SJD) share it."""
    B, L, V = _check(p, draft)
    p_x, q_x = _target_at_tokens(p, draft), draft_law_at_tokens(draft, p.dtype)
    q = draft_law(draft, V, p.dtype)
    p_A, q_A = (p_x, q_x) if relaxation is None else relaxation.draft_masses(p[:, :L], q, draft.tokens)
    rule = accept_probability(p_A, q_A)
    accept = (u < rule) & _in_draft(draft)
    n = first_rejection(accept)
    p_n = take_position(p, n)  # [B, V]
    rejected = n < draft.lengths  # else every real draft token was accepted: the bonus comes from p_n
    next_law = p_n
    if L:
        q_n = take_position(q, n.clamp(max=L - 1))
        residual = residual_law(p_n, q_n) if relaxation is None else relaxation.residual(p_n, q_n)
        next_law = torch.where(rejected[:, None], residual, p_n)
    excess = None if relaxation is None else excess_acceptance(rule, accept_probability(p_x, q_x), n, draft.lengths)
    return ChainOutcome(n, accept, next_law, rejected, excess)


def excess_acceptance(rule: torch.Tensor, exact: torch.Tensor, n: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Sum over the tested positions (j <= n, j < lengths) of rule - exact acceptance probability: [B, L] -> [B]."""
    tested = torch.arange(rule.shape[1], device=rule.device) < torch.minimum(n + 1, lengths)[:, None]
    return ((rule - exact) * tested).sum(-1)


def verify_greedy(p: torch.Tensor, draft: Draft, generator: Generators = None) -> VerifyResult:
    """Accept the longest prefix of draft tokens equal to argmax p; the next token is argmax p after it."""
    B, L, V = _check(p, draft)
    target_tokens = p.argmax(-1)  # [B, L + 1]
    accept = (draft.tokens == target_tokens[:, :L]) & _in_draft(draft)
    n = first_rejection(accept)
    return VerifyResult(n_accepted=n, next_token=target_tokens.gather(1, n[:, None]).squeeze(1), accept_mask=accept)


def verify_typical(p: torch.Tensor, draft: Draft, generator: Generators, rule: Typical = Typical()) -> VerifyResult:
    """Lossy typical acceptance (`rule`: epsilon, delta; Medusa's defaults); at the first rejection sample p."""
    epsilon, delta = rule.epsilon, rule.delta
    B, L, V = _check(p, draft)
    p_x = _target_at_tokens(p, draft)
    entropy = -(p[:, :L] * p[:, :L].clamp(min=1e-30).log()).sum(-1)
    accept = (p_x > torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))) & _in_draft(draft)
    n = first_rejection(accept)
    exact = accept_probability(p_x, draft_law_at_tokens(draft, p.dtype))
    excess = excess_acceptance(accept.to(p.dtype), exact, n, draft.lengths)
    return VerifyResult(n_accepted=n, next_token=sample(take_position(p, n), generator), accept_mask=accept,
                        excess_acceptance=excess)


def verify(p: torch.Tensor, draft: Draft, generator: Generators, acceptance: Acceptance = Exact(),
           greedy: bool = False, relaxation: Relaxed | None = None) -> VerifyResult:
    """Verify a chain with the rule `acceptance` stands for; `greedy` (temperature 0) turns the exact rule into
    `verify_greedy`. `Lantern` and `GSD` need the model's `relaxation` (a `Relaxation`: its neighbour table; a
    `Grouping`: its codebook vectors)."""
    if isinstance(acceptance, Lantern):
        if relaxation is None:
            raise ValueError("Lantern acceptance needs relaxation=Relaxation(neighbours, k, delta / lam)")
        return verify_lantern(p, draft, generator, relaxation)
    if isinstance(acceptance, GSD):
        from mmspec.core.grouping import Grouping  # it builds on this module's residual

        if not isinstance(relaxation, Grouping):
            raise ValueError("GSD acceptance needs relaxation=mmspec.core.grouping.Grouping(embeddings, rule)")
        return _verify_chain(p, draft, generator, relaxation)
    if isinstance(acceptance, Typical):
        return verify_typical(p, draft, generator, acceptance)
    if isinstance(acceptance, Exact):
        return verify_greedy(p, draft, generator) if greedy else verify_exact(p, draft, generator)
    raise TypeError(f"acceptance must be an Acceptance (Exact(), Lantern(...), Typical(...)), got {acceptance!r}")
