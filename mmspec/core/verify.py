"""The chain test: a draft chain verified with an acceptance rule, vectorised over [B, L], one pass per step.

Terms (vLLM's): a draft token is *accepted* or rejected; at the first rejection a *residual* token is drawn; when every
draft token of a row is accepted a *bonus* token is drawn from the next target law. p is always the target law, q the
draft law, both from `process_logits` with the same settings. The rule (`mmspec.core.rules`: exact, relaxed,
typical) supplies the acceptance probability of each draft and the residual law (`TokenTest`); this module runs them:
one uniform per draft position (drawn whatever is accepted, so the random stream never depends on acceptance), the
first rejection by a cumulative product, the closing token from the residual or the bonus law. At temperature 0 the
exact rule is greedy decoding (`verify_greedy`). Multi-draft and tree rules: `mmspec.core.multidraft`,
`mmspec.core.tree_verify`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.core.drafts import Draft
from mmspec.core.probs import one_hot
from mmspec.core.rng import Generators, sample, uniform
from mmspec.core.rules.base import TokenTest
from mmspec.core.rules.exact import Exact, accept_probability, at_drafts


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


def draft_law(draft: Draft, V: int, dtype: torch.dtype) -> torch.Tensor:
    """Full q rows [B, L, V]; one-hot rows for deterministic drafts."""
    if draft.q is None:
        return one_hot(draft.tokens, V, dtype)
    return draft.q.to(dtype)


def take_position(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rows[b, index[b]] for rows: [B, L, V], index: [B] -> [B, V]."""
    return rows.gather(1, index[:, None, None].expand(-1, 1, rows.shape[-1])).squeeze(1)


def in_draft(draft: Draft) -> torch.Tensor:
    """[B, L] bool, True at the real draft positions of each row (j < lengths[b])."""
    return torch.arange(draft.tokens.shape[1], device=draft.tokens.device) < draft.lengths[:, None]


def first_rejection(accept: torch.Tensor) -> torch.Tensor:
    """Length of the all-accepted prefix of each row of accept: [B, L] bool -> [B] long."""
    return accept.long().cumprod(-1).sum(-1)


def check_chain(p: torch.Tensor, draft: Draft) -> tuple[int, int, int]:
    """(B, L, V) of a chain's target laws p [B, L + 1, V] and its draft [B, L]; ValueError on other shapes."""
    if p.ndim != 3:
        raise ValueError(f"p must be [B, L + 1, V], got shape {tuple(p.shape)}")
    B, L1, V = p.shape
    if draft.tokens.shape != (B, L1 - 1):
        raise ValueError(f"draft.tokens must be [{B}, {L1 - 1}] for p of shape {tuple(p.shape)}, got "
                         f"{tuple(draft.tokens.shape)}")
    return B, L1 - 1, V


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


def chain_outcome(p: torch.Tensor, draft: Draft, u: torch.Tensor, test: TokenTest = Exact()) -> ChainOutcome:
    """The chain test of `draft` by `test` (a rule bound to the model, `AcceptanceRule.bind`) with the caller's
    uniforms u: [B, L] (one per draft position); p: [B, L + 1, V], the target law at each draft position and after
    it. Pure tensor code: decoders that draw their own uniforms (SJD) share it."""
    B, L, V = check_chain(p, draft)
    q = draft_law(draft, V, p.dtype)
    rule = test.acceptance(p[:, :L], q, draft.tokens)
    accept = (u < rule) & in_draft(draft)
    n = first_rejection(accept)
    p_n = take_position(p, n)  # [B, V]
    rejected = n < draft.lengths  # else every real draft token was accepted: the bonus comes from p_n
    next_law = p_n
    if L:
        next_law = torch.where(rejected[:, None], test.residual(p_n, take_position(q, n.clamp(max=L - 1))), p_n)
    excess = None
    if test.distorts:
        exact = accept_probability(at_drafts(p[:, :L], draft.tokens), at_drafts(q, draft.tokens))
        excess = excess_acceptance(rule, exact, n, draft.lengths)
    return ChainOutcome(n, accept, next_law, rejected, excess)


def excess_acceptance(rule: torch.Tensor, exact: torch.Tensor, n: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Sum over the tested positions (j <= n, j < lengths) of rule - exact acceptance probability: [B, L] -> [B]."""
    tested = torch.arange(rule.shape[1], device=rule.device) < torch.minimum(n + 1, lengths)[:, None]
    return ((rule - exact) * tested).sum(-1)


def verify_chain(p: torch.Tensor, draft: Draft, generator: Generators, test: TokenTest = Exact()) -> VerifyResult:
    """Verify a chain with `test`: one uniform per draft position (drawn for every position, so the random stream
    never depends on acceptance), then the closing token. p: [B, L + 1, V]."""
    B, L, V = check_chain(p, draft)
    outcome = chain_outcome(p, draft, uniform((B, L), generator, p.device, p.dtype), test)
    return outcome.result(sample(outcome.next_law, generator))


def verify_exact(p: torch.Tensor, draft: Draft, generator: Generators) -> VerifyResult:
    """Speculative sampling over a chain. p: [B, L + 1, V], the target law at each draft position and after it."""
    return verify_chain(p, draft, generator, Exact())


def verify_greedy(p: torch.Tensor, draft: Draft, generator: Generators = None) -> VerifyResult:
    """Accept the longest prefix of draft tokens equal to argmax p; the next token is argmax p after it."""
    B, L, V = check_chain(p, draft)
    target_tokens = p.argmax(-1)  # [B, L + 1]
    accept = (draft.tokens == target_tokens[:, :L]) & in_draft(draft)
    n = first_rejection(accept)
    return VerifyResult(n_accepted=n, next_token=target_tokens.gather(1, n[:, None]).squeeze(1), accept_mask=accept)


def verify(p: torch.Tensor, draft: Draft, generator: Generators, test: TokenTest = Exact(),
           greedy: bool = False) -> VerifyResult:
    """Verify a chain with a rule bound to the model (`AcceptanceRule.bind`); `greedy` (temperature 0) turns a rule
    that keeps the model's law into `verify_greedy`."""
    if greedy and not test.distorts:
        return verify_greedy(p, draft, generator)
    return verify_chain(p, draft, generator, test)
