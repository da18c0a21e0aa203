"""Sequence-level exactness of speculative Jacobi decoding: its output law equals AR sampling's.

A lookup-table image model (V = 4 image tokens, a 2 x 3 grid, the third position forced like an end-of-line column,
logits that depend on the whole prefix) decodes 100,002 rows in one batch of groups of three (prompts A, B, A) with
CFG 2.0, temperature 0.9 and top-k 3 < V, through the real SJD loop for every window in {2, 3, N, > N}, every draft
initialisation and every coupling. Checks per configuration, against the exact joint law enumerated from the model:
a chi-square test for each row of the group and for each prompt pooled, and a chi-square test of independence of two
rows of a group (outcomes binned into 8 classes of equal exact mass). Each check uses alpha = 1e-7, so a correct
implementation fails the whole file with probability < 2e-4. Mutation companions break one step of the exactness
argument (see `mmspec.image.jacobi`) and must be rejected by the same checks.
"""

import pytest
import torch

from mmspec.core.probs import SamplingConfig
from mmspec.core.stats import SpecStats
from mmspec.image import AR, COUPLINGS, INITS, SJD, jacobi
from mmspec.image.jacobi import JacobiOutcome
from tests.image.table_model import TableImageModel
from tests.law import chi_square_p_value

V, GRID, N = 4, (2, 3), 6
FORCED = torch.tensor([-1, -1, 3, -1, -1, -1])
SAMPLING = SamplingConfig(temperature=0.9, top_k=3, guidance_scale=2.0)
GROUP = torch.tensor([0, 1, 0])  # prompts of the three rows of a group
GROUPS = 33_334
# the mutation companions' batch (12,501 rows): each image mutation (here, in test_frontier_law.py, test_draft_model.py
# and test_draft_heads.py) still gives p < 1e-79 there (measured at seeds 0 and 1), in an eighth of a law test's time
MUTATION_GROUPS = 4_167
ALPHA = 1e-7
CLASSES = 8


def encode(tokens: torch.Tensor) -> torch.Tensor:
    return (tokens * V ** torch.arange(N - 1, -1, -1)).sum(-1)


def decode_rows(decoding, sampling=SAMPLING, seed=0, groups=GROUPS):
    model = TableImageModel(GRID, V, forced_tokens=FORCED)
    stats = SpecStats()
    with torch.no_grad():
        *_, last = decoding.run(model, GROUP.repeat(groups), sampling, torch.Generator().manual_seed(seed), stats)
    assert (last.n_committed == N).all()
    return last.tokens, stats, model


def mass_classes(law: torch.Tensor) -> torch.Tensor:
    """Class 0..CLASSES-1 of every outcome: outcomes sorted by probability, cut into bins of equal exact mass."""
    order = law.argsort()
    mass_before = law[order].cumsum(0) - law[order]
    classes = torch.empty_like(order)
    classes[order] = (mass_before * CLASSES).long().clamp(max=CLASSES - 1)
    return classes


def law_checks(tokens: torch.Tensor, model: TableImageModel, sampling=SAMPLING) -> dict[str, float]:
    """p-value of every check."""
    outcomes = encode(tokens).view(-1, len(GROUP))
    laws = {prompt: model.exact_law(prompt, sampling) for prompt in (0, 1)}
    checks = {}
    for r, prompt in enumerate(GROUP.tolist()):
        checks[f"row {r}"] = chi_square_p_value(torch.bincount(outcomes[:, r], minlength=V**N), laws[prompt])
    for prompt in (0, 1):
        pooled = outcomes[:, GROUP == prompt].flatten()
        checks[f"prompt {prompt}"] = chi_square_p_value(torch.bincount(pooled, minlength=V**N), laws[prompt])
    class_a, class_b = mass_classes(laws[0]), mass_classes(laws[1])
    joint = torch.bincount(class_a[outcomes[:, 0]] * CLASSES + class_b[outcomes[:, 1]], minlength=CLASSES**2)
    mass_a = torch.zeros(CLASSES, dtype=torch.float64).index_add_(0, class_a, laws[0])
    mass_b = torch.zeros(CLASSES, dtype=torch.float64).index_add_(0, class_b, laws[1])
    checks["rows 0, 1 independent"] = chi_square_p_value(joint, (mass_a[:, None] * mass_b[None]).flatten())
    return checks


def assert_exact(tokens, model, sampling=SAMPLING):
    checks = law_checks(tokens, model, sampling)
    failed = {name: p for name, p in checks.items() if p < ALPHA}
    assert not failed, f"output law differs from AR sampling's: {failed}"


def test_ar_baseline_matches_the_exact_law():
    tokens, stats, model = decode_rows(AR())
    assert_exact(tokens, model)
    assert (tokens[:, 2] == 3).all()  # the forced position


# the default tier: every initialisation and coupling at the smallest window, and one past the image each
# initialisation once (each coupling among them); the slow tier: the rest of the grid, and the two windows between
PAST_THE_IMAGE = {("horizontal", "none"), ("vertical", "maximal"), ("random", "gumbel"), ("lookahead", "maximal")}
SJD_GRID = [pytest.param(window, init, coupling, marks=() if window == 2 or (
                window == N + 3 and (init, coupling) in PAST_THE_IMAGE) else pytest.mark.slow)
            for window in (2, 3, N, N + 3) for init in INITS for coupling in COUPLINGS]


@pytest.mark.parametrize("window,init,coupling", SJD_GRID)
def test_sjd_matches_the_exact_law(window, init, coupling):
    tokens, stats, model = decode_rows(SJD(window, init, coupling))
    assert_exact(tokens, model)
    assert 0 < stats.accepted < stats.drafted  # both branches of the acceptance test ran
    assert stats.tokens_per_target_forward > 1.0 and (tokens[:, 2] == 3).all()


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.3, top_p=0.8, guidance_scale=3.0),
                                      SamplingConfig(temperature=1.0)], ids=["top-p", "no-cfg"])
def test_sjd_matches_the_exact_law_for_other_samplers(sampling):
    tokens, _, model = decode_rows(SJD(3, "vertical", "maximal"), sampling)
    assert_exact(tokens, model, sampling)


# ---- mutation companions: each breaks one step of the exactness argument ------------------------------------------
def stale_law_for_kept_drafts(p, drafts, q, lengths, uniforms, coupling, gumbel=None, relaxation=None):
    """A redrafted token that kept its old value carries its old law q instead of p_t (SCD's Lumina1 SCDMC file)."""
    step = _jacobi_step(p, drafts, q, lengths, uniforms, coupling, gumbel, relaxation)
    past_commit = torch.arange(drafts.shape[1]) > step.verify.n_accepted[:, None]
    kept = past_commit & (step.tokens[:, :-1] == drafts)
    laws = step.laws.clone()
    laws[:, :-1] = torch.where(kept[..., None], q, laws[:, :-1])
    return JacobiOutcome(step.verify, step.tokens, laws)


def misaligned_targets(p, drafts, q, lengths, uniforms, coupling, gumbel=None, relaxation=None):
    """Draft i is scored with the output at i instead of i - 1 (the i / i - 1 alignment off by one)."""
    return _jacobi_step(torch.cat([p[:, 1:], p[:, -1:]], 1), drafts, q, lengths, uniforms, coupling, gumbel, relaxation)


def first_draft_always_accepted(p_x, q_x):
    """Forced minimum acceptance of one draft per step (SimpleAR's `minumum_acc_tokens`)."""
    probability = _accept_probability(p_x, q_x)
    return probability.index_fill(-1, torch.tensor([0]), 1.0) if probability.shape[-1] else probability


def lookahead_stored_uniform(init, seq, laws, positions, where, drafted, draws, width, forced, span, ahead=None):
    """A lookahead draft, sampled from the law past the window, is stored with the uniform law of a random draft.
    (Storing the one-hot law of its own token would be no mutation: accept-with-p(x)-else-p-without-x is exact for any
    x drawn independently of the test, only slower.)"""
    new = _initialise(init, seq, laws, positions, where, drafted, draws, width, forced, span, ahead)
    laws.write(positions, span.uniform.to(laws.buffer).expand(*positions.shape, V),
               new & (jacobi.forced_at(forced, positions) < 0))
    return new


_jacobi_step, _accept_probability = jacobi.jacobi_step, jacobi.accept_probability
_initialise = jacobi.initialise_drafts
MUTATIONS = {  # (object, attribute, replacement, the decoding it breaks)
    "resample_from_p": (jacobi, "residual_law", lambda p, q: p, SJD(N, "horizontal", "maximal")),
    "stale_law_for_kept_drafts": (jacobi, "jacobi_step", stale_law_for_kept_drafts, SJD(N, "horizontal", "maximal")),
    "no_kv_rollback": (TableImageModel, "rollback", lambda self, state, keep: None, SJD(N, "horizontal", "maximal")),
    "misaligned_targets": (jacobi, "jacobi_step", misaligned_targets, SJD(N, "horizontal", "maximal")),
    "forced_minimum_acceptance": (jacobi, "accept_probability", first_draft_always_accepted,
                                  SJD(N, "horizontal", "maximal")),
    "lookahead_stored_uniform": (jacobi, "initialise_drafts", lookahead_stored_uniform, SJD(3, "lookahead", "maximal")),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mutations_are_rejected(mutation, monkeypatch):
    owner, attribute, replacement, decoding = MUTATIONS[mutation]
    monkeypatch.setattr(owner, attribute, replacement)
    tokens, _, model = decode_rows(decoding, groups=MUTATION_GROUPS)
    checks = law_checks(tokens, model)
    assert min(checks.values()) < ALPHA, f"mutation {mutation} was not detected: {checks}"
