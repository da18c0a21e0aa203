"""LANTERN relaxed acceptance: neighbourhood invariants, per-candidate TV, the exact lossless
limit, the exact end-to-end output law (float64 enumeration) with its TV identity and bound, monotonicity, the
sampler against the enumerated law, and the official over-zeroing residual as a mutation companion."""

import itertools

import pytest
import torch

from mmspec.core.drafts import Draft
from mmspec.core.rules import lantern
from mmspec.core.rules.exact import accept_probability, residual_law
from mmspec.core.rules.lantern import Relaxation, relaxed_mass, relaxed_residual
from mmspec.core.verify import verify_chain, verify_exact
from tests.law import chi_square_p_value

V = 24


def brute_force_neighbours(codebook: torch.Tensor) -> torch.Tensor:
    """[V, V - 1] every other code by distance (the reference's full table), by a stable full sort."""
    distance = torch.cdist(codebook, codebook)
    distance.fill_diagonal_(torch.inf)
    return distance.argsort(dim=-1, stable=True)[:, :-1]


NEIGHBOURS = brute_force_neighbours(torch.randn(V, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
SETTINGS = [dict(delta=d) for d in (0.01, 0.05, 0.2, 0.6)] + [dict(lam=m) for m in (1.5, 3.0, 8.0)] + [
    dict(delta=0.2, lam=3.0)
]
KS = (1, 4, 23)


def relaxation(k, **budget) -> Relaxation:
    return Relaxation(NEIGHBOURS, k, **budget)


def random_law(g, concentration, zeros=0):
    law = torch.distributions.Dirichlet(torch.full((V,), concentration, dtype=torch.float64)).sample()
    if zeros:  # top-k filtering: zero-probability codes, some of them neighbours of the draft
        law[torch.randperm(V, generator=g)[:zeros]] = 0
        law /= law.sum()
    return law


def law_pairs(n=40, seed=0):
    """(p, q) pairs: q = 0.6 p + 0.4 Dir (the reference's check set-up), p with zeros, and point-mass drafts."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    pairs = []
    for i in range(n):
        p = random_law(g, (0.1, 0.5, 1.0)[i % 3], zeros=(0, 6)[i % 2])
        if i % 4 == 3:
            q = torch.nn.functional.one_hot(torch.randint(V, (), generator=g), V).double()
        else:
            q = 0.6 * p + 0.4 * random_law(g, 0.5)
        pairs.append((p, q))
    return pairs


def output_law(p, q, rule: Relaxation | None):
    """Exact law of the token emitted at a draft position: sum_x q(x) [f(x) delta_x + (1 - f(x)) residual], built
    from the functions LANTERN's verification uses. Returns (pi, alpha)."""
    tokens = torch.arange(V)
    p_A = p[tokens] if rule is None else relaxed_mass(p, tokens, rule)[0]
    f = accept_probability(p_A, q)
    residual = residual_law(p[None], q[None])[0] if rule is None else lantern.relaxed_residual(p[None], q[None],
                                                                                               rule)[0]
    alpha = (q * f).sum()
    return q * f + (1 - alpha) * residual, alpha


def tv(a, b):
    return 0.5 * (a - b).abs().sum().item()


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
@pytest.mark.parametrize("k", KS)
def test_neighbourhood_is_a_maximal_prefix_within_budget(setting, k):
    rule = relaxation(k, **setting)
    for p, _ in law_pairs(12):
        p_A, size = relaxed_mass(p, torch.arange(V), rule)
        for x in range(V):
            j = int(size[x])
            masses = p[NEIGHBOURS[x, :k]]
            budget = min(setting.get("delta", 1.0), (setting.get("lam", torch.inf) - 1) * p[x].item())
            assert masses[:j].sum() <= budget + 1e-12
            assert j == k or masses[: j + 1].sum() > budget  # maximal: the next neighbour would break the budget
            assert p_A[x].item() == pytest.approx((p[x] + masses[:j].sum()).item(), abs=1e-12)


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_per_candidate_tv_is_the_moved_mass_within_budget(setting):
    rule = relaxation(23, **setting)
    for p, _ in law_pairs(12, seed=1):
        p_A, size = relaxed_mass(p, torch.arange(V), rule)
        for x in range(V):
            moved = NEIGHBOURS[x, : int(size[x])]
            relaxed = p.clone()  # p with the mass of A(x) \ {x} moved onto x
            relaxed[moved] = 0
            relaxed[x] = p_A[x]
            assert tv(p, relaxed) == pytest.approx(p[moved].sum().item(), abs=1e-12)
            if "delta" in setting:
                assert tv(p, relaxed) <= setting["delta"] + 1e-12
            if "lam" in setting:
                assert relaxed[x] <= setting["lam"] * p[x] + 1e-12


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_g_star_by_its_definition_is_the_exact_residual(setting):
    """G* = norm(max(p - min(q, p(A(.))), 0)) built from every token's neighbourhood mass equals the residual the
    rule draws from (the exact one: p(A(y)) >= p(y) leaves no term where q > p)."""
    rule = relaxation(23, **setting)
    for p, q in law_pairs(12, seed=5):
        by_definition = residual_law(p[None], q.minimum(relaxed_mass(p, torch.arange(V), rule)[0])[None])
        assert torch.allclose(relaxed_residual(p[None], q[None], rule), by_definition, atol=1e-15, rtol=0)


@pytest.mark.parametrize("limit", [dict(k=0, delta=0.5), dict(k=23, delta=0.0), dict(k=23, lam=1.0)], ids=str)
def test_lossless_limits_are_the_exact_rule(limit):
    rule = Relaxation(NEIGHBOURS, **limit)
    assert rule.lossless
    for p, q in law_pairs():
        assert torch.equal(relaxed_residual(p[None], q[None], rule), residual_law(p[None], q[None]))
        pi, _ = output_law(p, q, rule)
        assert torch.allclose(pi, p, atol=1e-12, rtol=0)
    # sampled chains: bit-identical to the exact verifier for the same random stream
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(64, 5, V, generator=g), -1)
    q = torch.softmax(torch.randn(64, 4, V, generator=g), -1)
    tokens = torch.multinomial(q.flatten(0, 1), 1, generator=g).view(64, 4)
    draft = Draft(tokens, torch.randint(0, 5, (64,), generator=g), q)
    exact = verify_exact(p, draft, torch.Generator().manual_seed(9))
    relaxed = verify_chain(p, draft, torch.Generator().manual_seed(9), rule)
    assert torch.equal(exact.n_accepted, relaxed.n_accepted) and torch.equal(exact.next_token, relaxed.next_token)
    assert torch.equal(relaxed.excess_acceptance, torch.zeros(64))


def check_output_tv(p, q, rule) -> tuple[float, float, float]:
    """(TV(pi, p), alpha_relaxed - alpha_exact, min(TV(p, q), sum_x N(x))) of one draft position."""
    pi, alpha_relaxed = output_law(p, q, rule)
    _, alpha_exact = output_law(p, q, None)
    neighbour_mass = relaxed_mass(p, torch.arange(V), rule)[0] - p
    return tv(pi, p), (alpha_relaxed - alpha_exact).item(), min(tv(p, q), neighbour_mass.sum().item())


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_output_tv_equals_extra_acceptance_and_obeys_the_bound(setting):
    beyond_delta = 0
    for (p, q), k in itertools.product(law_pairs(30, seed=2), KS):
        distortion, extra, bound = check_output_tv(p, q, relaxation(k, **setting))
        assert distortion == pytest.approx(extra, abs=1e-12)
        assert distortion <= bound + 1e-12
        beyond_delta += distortion > setting.get("delta", 1.0) + 1e-9
    if setting == {"delta": 0.01}:  # the budget is per candidate: the output law is not within delta of p
        assert beyond_delta > 0


def official_over_zeroing_residual(p, q, rule):
    """The official code's dynamic-tree residual (mutation): for a point-mass draft x, zero x and, when A(x) has
    neighbours, all k + 1 nearest codes NN[x, :k + 1] instead of A(x); renormalise; uniform if nothing is left."""
    x = q.argmax(-1)
    zeroed = p.scatter(-1, x[:, None], 0)
    has_neighbours = relaxed_mass(p, x[:, None], rule)[1][:, 0] > 0
    nearest = rule.neighbours[x, : rule.k + 1].long()
    zeroed = torch.where(has_neighbours[:, None], zeroed.scatter(-1, nearest, 0), zeroed)
    mass = zeroed.sum(-1, keepdim=True)
    return torch.where(mass > 0, zeroed / mass.clamp(min=1e-300), torch.full_like(p, 1 / p.shape[-1]))


def point_mass_cases():
    return [(p, q) for p, q in law_pairs(40, seed=4) if q.max() == 1]


def test_official_residual_breaks_the_identity(monkeypatch):
    rule = relaxation(4, delta=0.2)
    cases = point_mass_cases()
    assert all(check_output_tv(p, q, rule)[0] == pytest.approx(check_output_tv(p, q, rule)[1], abs=1e-12)
               for p, q in cases)
    monkeypatch.setattr(lantern, "relaxed_residual", official_over_zeroing_residual)
    violations = sum(abs(check_output_tv(p, q, rule)[0] - check_output_tv(p, q, rule)[1]) > 1e-6 for p, q in cases)
    assert violations > 0


@pytest.mark.parametrize("parameter,values", [("delta", (0, 0.02, 0.1, 0.3, 1.0)), ("lam", (1, 1.5, 2, 4, 16)),
                                              ("k", (0, 1, 3, 10, 23))])
def test_acceptance_is_monotone_in_delta_lam_and_k(parameter, values):
    for p, q in law_pairs(20, seed=5):
        alphas = []
        for value in values:
            settings = {"k": 10, "delta": 0.1, parameter: value} if parameter != "lam" else {"k": 10, "lam": value}
            alphas.append(output_law(p, q, Relaxation(NEIGHBOURS, **settings))[1].item())
        assert all(b >= a - 1e-15 for a, b in itertools.pairwise(alphas)), alphas


def sampled_first_tokens(p, q, rule, n_rows, seed):
    """Monte Carlo: the token a chain verified with LANTERN emits at the first draft position of n_rows one-token
    chains."""
    g = torch.Generator().manual_seed(seed)
    draft_tokens = torch.multinomial(q, n_rows, replacement=True, generator=g)[:, None]
    draft = Draft(draft_tokens, torch.ones(n_rows, dtype=torch.long), q.float().expand(n_rows, 1, V))
    result = verify_chain(p.float().expand(n_rows, 2, V), draft, g, rule)
    return torch.where(result.n_accepted == 1, draft_tokens[:, 0], result.next_token), result


@pytest.mark.parametrize("case", [0, 3, 5])
def test_sampler_follows_the_enumerated_law(case):
    p, q = law_pairs(8, seed=7)[case]
    rule = relaxation(4, delta=0.2)
    tokens, result = sampled_first_tokens(p, q, rule, 200_000, seed=case)
    pi, alpha = output_law(p, q, rule)
    assert chi_square_p_value(torch.bincount(tokens, minlength=V), pi) > 1e-6
    # the reported extra acceptance estimates alpha_relaxed - alpha_exact, i.e. TV(pi, p)
    tested = torch.minimum(result.n_accepted + 1, torch.ones_like(result.n_accepted)).sum()
    assert float(result.excess_acceptance.sum() / tested) == pytest.approx(tv(pi, p), abs=0.01)


def test_sampler_with_official_residual_is_caught(monkeypatch):
    p, q = point_mass_cases()[0]
    rule = relaxation(4, delta=0.2)
    pi, _ = output_law(p, q, rule)
    monkeypatch.setattr(lantern, "relaxed_residual", official_over_zeroing_residual)
    tokens, _ = sampled_first_tokens(p, q, rule, 200_000, seed=11)
    assert chi_square_p_value(torch.bincount(tokens, minlength=V), pi) < 1e-6


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(k=3, delta=1.5), ValueError, "delta must be in"),
    (dict(k=3, delta=-0.1), ValueError, "delta must be in"),
    (dict(k=3, lam=0.5), ValueError, "lam must be >= 1"),
    (dict(k=-1, delta=0.1), ValueError, r"k must be in \[0, V - 1\]"),
    (dict(k=V, delta=0.1), ValueError, r"k must be in \[0, V - 1\]"),
    (dict(k=3), ValueError, "needs a budget"),
    (dict(k=2.0, delta=0.1), TypeError, "k must be an int"),
])
def test_bad_settings_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        Relaxation(NEIGHBOURS, **kwargs)


def test_k_beyond_the_table_and_bad_tables_raise():
    with pytest.raises(ValueError, match="exceeds the neighbour table"):
        Relaxation(NEIGHBOURS[:, :5], k=6, delta=0.1)
    with pytest.raises(TypeError, match="integer tensor"):
        Relaxation(NEIGHBOURS.double(), k=2, delta=0.1)


def test_non_image_tokens_are_never_relaxed():
    table = NEIGHBOURS.clone()
    table[5] = -1  # token 5 is not an image code (e.g. an end-of-line token)
    table[table == 5] = -1  # ... and no code relaxes onto it
    rule = Relaxation(table, k=23, delta=1.0)
    p = torch.full((V,), 1 / V, dtype=torch.float64)
    p_A, size = relaxed_mass(p, torch.arange(V), rule)
    assert p_A[5] == p[5] and size[5] == 0
    assert size[0] == 22 and p_A[0] == pytest.approx(23 / V)  # every other code but token 5
