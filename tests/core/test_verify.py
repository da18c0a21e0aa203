"""Exact output laws of the acceptance rules, by float64 enumeration (no Monte Carlo), with mutation companions."""

import itertools

import pytest
import torch

from mmspec.core import multidraft
from mmspec.core.drafts import Draft
from mmspec.core.multidraft import rsd_plan, spectr_beta, spectr_plan, spectr_rho
from mmspec.core.rules import Exact, Typical
from mmspec.core.rules.exact import accept_probability, residual_law
from mmspec.core.verify import verify_chain, verify_exact, verify_greedy

V = 6


def law_cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, p, q) pairs in float64: random, with zeros, one-hots, p == q, disjoint supports."""
    g = torch.Generator().manual_seed(0)

    def rand(zeros=0):
        x = torch.rand(V, generator=g, dtype=torch.float64) ** 2
        x[torch.randperm(V, generator=g)[:zeros]] = 0
        return x / x.sum()

    one_hot = torch.zeros(V, dtype=torch.float64)
    one_hot[2] = 1
    disjoint_p = torch.tensor([0.5, 0.3, 0.2, 0, 0, 0], dtype=torch.float64)
    disjoint_q = torch.tensor([0, 0, 0, 0.1, 0.6, 0.3], dtype=torch.float64)
    shared = rand()
    cases = [("random", rand(), rand()), ("zeros", rand(2), rand(3)), ("p_one_hot", one_hot, rand()),
             ("q_one_hot", rand(1), one_hot), ("p_equals_q", shared, shared.clone()),
             ("disjoint", disjoint_p, disjoint_q)]
    cases += [(f"random{i}", rand(i % 3), rand((i + 1) % 3)) for i in range(6)]
    return cases


CASES = law_cases()


def support(q):
    return int((q > 0).sum())


IDS = [c[0] for c in CASES]


def single_draft_output_law(p, q, accept_fn=accept_probability, residual_fn=residual_law):
    """Law of the output of one-token speculative sampling: sum_x q(x) [a(x) delta_x + (1 - a(x)) residual]."""
    out = torch.zeros_like(p)
    residual = residual_fn(p[None], q[None])[0]
    for x in range(V):
        if q[x] == 0:
            continue
        a = accept_fn(p[x], q[x])
        out[x] += q[x] * a
        out += q[x] * (1 - a) * residual
    return out


@pytest.mark.parametrize("name,p,q", CASES, ids=IDS)
def test_exact_rule_output_law_is_p(name, p, q):
    torch.testing.assert_close(single_draft_output_law(p, q), p, rtol=0, atol=1e-12)
    acceptance = sum(q[x] * accept_probability(p[x], q[x]) for x in range(V))
    torch.testing.assert_close(acceptance, torch.minimum(p, q).sum(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name,p,q", [c for c in CASES if c[0] in ("random", "zeros", "random1", "random2")])
def test_exact_rule_mutations_are_rejected(name, p, q):
    resample_p = single_draft_output_law(p, q, residual_fn=lambda p, q: p)
    always_accept = single_draft_output_law(p, q, accept_fn=lambda px, qx: torch.ones_like(px))
    unnormalised = single_draft_output_law(p, q, residual_fn=lambda p, q: (p - q).clamp(min=0))
    for mutant in (resample_p, always_accept, unnormalised):
        assert (mutant - p).abs().max() > 1e-6


@pytest.mark.parametrize("name,p,q", CASES, ids=IDS)
def test_deterministic_draft_law(name, p, q):
    """q = one-hot at the drafted token x: accept with p(x), residual = p without x."""
    for x in range(V):
        a = accept_probability(p[x], torch.tensor(1.0, dtype=torch.float64))
        residual = residual_law(p[None], torch.nn.functional.one_hot(torch.tensor([x]), V).double())[0]
        out = a * torch.nn.functional.one_hot(torch.tensor(x), V).double() + (1 - a) * residual
        torch.testing.assert_close(out, p, rtol=0, atol=1e-12)


@pytest.mark.parametrize("deterministic", [False, True])
def test_verify_exact_first_token_follows_p(deterministic):
    """Monte Carlo through verify_exact itself: the first emitted token (accepted draft or residual) has law p.
    200,000 rows, chi-square at alpha = 1e-5."""
    from scipy.stats import chi2

    _, p, q = CASES[1]
    N = 200_000
    g = torch.Generator().manual_seed(3)
    tokens = torch.full((N, 1), 3) if deterministic else torch.multinomial(q, N, replacement=True, generator=g)[:, None]
    draft = Draft(tokens=tokens, lengths=torch.ones(N, dtype=torch.long),
                  q=None if deterministic else q.expand(N, 1, V))
    result = verify_exact(torch.stack([p, q]).expand(N, 2, V), draft, g)
    first = torch.where(result.n_accepted > 0, tokens[:, 0], result.next_token)
    counts = torch.bincount(first, minlength=V).double()
    keep = p > 0
    assert counts[~keep].sum() == 0
    stat = ((counts[keep] - N * p[keep]) ** 2 / (N * p[keep])).sum()
    assert chi2.sf(stat.item(), int(keep.sum()) - 1) > 1e-5


def draft_tuples_without_replacement(q, k):
    for tup in itertools.permutations(range(V), k):
        prob, remaining = 1.0, 1.0
        for x in tup:
            if q[x] == 0:
                prob = 0.0
                break
            prob *= q[x] / remaining
            remaining -= q[x]
        if prob > 0:
            yield tup, prob


def draft_tuples_iid(q, k):
    for tup in itertools.product(range(V), repeat=k):
        prob = torch.prod(q[list(tup)])
        if prob > 0:
            yield tup, prob


def multi_draft_output_law(plan_fn, p, q, tuples):
    """Exact output law of a multi-draft rule and its acceptance probability."""
    out, acceptance = torch.zeros_like(p), 0.0
    for tup, prob in tuples:
        plan = plan_fn(p[None], q[None], torch.tensor([tup]))
        reach = 1.0
        for i, x in enumerate(tup):
            a = plan.accept_prob[0, i]
            out[x] += prob * reach * a
            acceptance += prob * reach * a
            reach = reach * (1 - a)
        out += prob * reach * plan.residual[0]
    return out, acceptance


# RSD draws k distinct tokens, so q needs a support of at least k (a one-hot q is covered by the chain rule).
@pytest.mark.parametrize("name,p,q,k", [(*c, k) for c in CASES for k in (2, 3) if support(c[2]) >= k],
                         ids=[f"{c[0]}-k{k}" for c in CASES for k in (2, 3) if support(c[2]) >= k])
def test_rsd_output_law_is_p(name, p, q, k):
    out, _ = multi_draft_output_law(rsd_plan, p, q, draft_tuples_without_replacement(q, k))
    torch.testing.assert_close(out, p, rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("name,p,q", CASES, ids=IDS)
def test_spectr_output_law_and_acceptance(name, p, q, k):
    out, acceptance = multi_draft_output_law(spectr_plan, p, q, draft_tuples_iid(q, k))
    torch.testing.assert_close(out, p, rtol=0, atol=1e-12)
    rho = spectr_rho(p[None], q[None], k)
    beta = spectr_beta(p[None], q[None], rho)[0]
    torch.testing.assert_close(torch.as_tensor(acceptance, dtype=torch.float64), 1 - (1 - beta) ** k, rtol=0,
                               atol=1e-12)
    assert 1 <= rho.item() <= k
    # Multi-draft never accepts less often than a single draft: 1 - (1 - beta)^k >= sum min(p, q) (rho = 1).
    assert acceptance >= torch.minimum(p, q).sum() - 1e-12


@pytest.mark.parametrize("k", [2, 3])
def test_multi_draft_mutations_are_rejected(k, monkeypatch):
    _, p, q = CASES[0]
    # RSD that resamples from p instead of the residual (p_i never updated): wrong law.
    with monkeypatch.context() as patch:
        patch.setattr(multidraft, "residual_law", lambda p_, q_: p_)
        out, _ = multi_draft_output_law(rsd_plan, p, q, draft_tuples_without_replacement(q, k))
    assert (out - p).abs().max() > 1e-6
    # SpecTr with rho = 1 (plain per-candidate speculative sampling, residual as if k = 1): wrong law.
    monkeypatch.setattr(multidraft, "spectr_rho", lambda p_, q_, k_: torch.ones(p_.shape[0], dtype=p_.dtype))
    out, _ = multi_draft_output_law(spectr_plan, p, q, draft_tuples_iid(q, k))
    assert (out - p).abs().max() > 1e-6


def test_multi_draft_samplers_follow_their_plans():
    """Monte Carlo: verify_rsd / verify_spectr draw from their plans (G-test against the exact law p)."""
    from scipy.stats import chi2

    _, p, q = CASES[1]
    N = 200_000
    g = torch.Generator().manual_seed(1)
    for draw, verify_fn in ((multidraft.gumbel_top_k, multidraft.verify_rsd),
                            (multidraft.sample_iid, multidraft.verify_spectr)):
        P, Q = p.expand(N, V), q.expand(N, V)
        candidates = draw(Q, 2, g)
        tokens = verify_fn(P, Q, candidates, g).token
        counts = torch.bincount(tokens, minlength=V).double()
        expected = p * N
        keep = expected > 0
        assert counts[~keep].sum() == 0
        g_stat = 2 * (counts[keep] * (counts[keep] / expected[keep]).clamp(min=1e-300).log()).sum()
        assert chi2.sf(g_stat.item(), int(keep.sum()) - 1) > 1e-5


def test_gumbel_top_k_is_without_replacement_and_follows_q():
    from scipy.stats import chi2

    q = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0, 0.0], dtype=torch.float64)
    N = 100_000
    candidates = multidraft.gumbel_top_k(q.expand(N, V), 2, torch.Generator().manual_seed(0))
    assert (candidates[:, 0] != candidates[:, 1]).all()
    counts = torch.bincount(candidates[:, 0], minlength=V).double()
    stat = ((counts[:4] - N * q[:4]) ** 2 / (N * q[:4])).sum()
    assert chi2.sf(stat.item(), 3) > 1e-5 and counts[4:].sum() == 0


def chain(p_rows, tokens, lengths):
    return torch.stack(p_rows)[None], Draft(tokens=torch.tensor([tokens]), lengths=torch.tensor([lengths]))


def peaked(token, V_=V):
    x = torch.full((V_,), 0.01, dtype=torch.float64)
    x[token] = 1
    return x / x.sum()


def test_greedy_perfect_match():
    p, draft = chain([peaked(1), peaked(2), peaked(3)], [1, 2], 2)
    result = verify_greedy(p, draft)
    assert result.n_accepted.item() == 2 and result.next_token.item() == 3


def test_greedy_early_mismatch():
    p, draft = chain([peaked(1), peaked(2), peaked(3)], [4, 2], 2)
    result = verify_greedy(p, draft)
    assert result.n_accepted.item() == 0 and result.next_token.item() == 1


def test_greedy_empty_draft_is_an_ar_step():
    p, draft = chain([peaked(5), peaked(2), peaked(3)], [5, 2], 0)
    result = verify_greedy(p, draft)
    assert result.n_accepted.item() == 0 and result.next_token.item() == 5


def test_exact_rule_respects_per_row_draft_lengths():
    """A row whose draft is shorter than L gets its bonus from p at its own length."""
    draft = Draft(tokens=torch.tensor([[1, 2], [1, 2]]), lengths=torch.tensor([2, 1]))
    p = torch.where(torch.arange(V) == torch.tensor([1, 2, 3])[:, None], 1.0, 0.0).double().expand(2, 3, V)
    result = verify_exact(p, draft, torch.Generator().manual_seed(0))
    assert result.n_accepted.tolist() == [2, 1] and result.next_token.tolist() == [3, 2]


def test_typical_acceptance_is_lossy_and_opt_in():
    p = torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.05, 0.05]] * 2, dtype=torch.float64)[:, None].expand(1 * 2, 2, V)
    draft = Draft(tokens=torch.tensor([[1], [5]]), lengths=torch.tensor([1, 1]), q=None)
    result = verify_chain(p, draft, torch.Generator().manual_seed(0), Typical())
    assert result.n_accepted.tolist() == [1, 0]  # p=0.2 passes the threshold; p=0.05 does not
    assert not Typical.lossless and Exact.lossless and result.excess_acceptance is not None
