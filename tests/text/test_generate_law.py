"""Sequence-level exactness: speculative_generate's output law equals the target's AR joint law.

Lookup-table target and draft LMs over V = 5 (token 4 = EOS), 4 new tokens, two prompts of different lengths in one
left-padded batch of 200,000 rows, through the real loop (drafters, cache rollback, per-row EOS). Each configuration
gets a chi-square test per prompt against the exact joint law (cells with expected count < 5 pooled). A correct
implementation fails a configuration with probability < 2e-5 (two prompts at alpha = 1e-5). Mutation companions
break one piece of the algorithm and must be rejected by the same test.
"""

import pytest
import torch

from mmspec.adapters.static_cache import StaticCausalLMAdapter
from mmspec.core import speculation
from mmspec.core.drafting.lengths import DraftLengthSchedule
from mmspec.core.rules import exact
from mmspec.text import speculative_generate
from mmspec.text.drafters import ModelDrafter, NGramDrafter, NoDrafter
from tests.law import chi_square_p_value as law_p_value
from tests.text.table_lm import TableLM, exact_joint_law, random_table

V, EOS, N_NEW, ROWS, ALPHA = 5, 4, 4, 200_000, 1e-5
# the mutation companions' batch: each text companion that takes it still gives p < 1e-55 on 12,500 rows (measured at
# seeds 0 and 1), in a sixteenth of a law test's time; the learned stop's (test_draft_stops.py) needs more
MUTATION_ROWS = 12_500
PROMPTS = torch.tensor([[0, 3, 1], [0, 0, 2]])
PROMPT_MASK = torch.tensor([[1, 1, 1], [0, 0, 1]])


def encode(continuations: torch.Tensor) -> torch.Tensor:
    """Continuations [N, N_NEW] (padded with EOS after EOS) -> one integer per sequence, base V."""
    return (continuations * V ** torch.arange(N_NEW - 1, -1, -1)).sum(-1)


def chi_square_p_value(samples: torch.Tensor, law: dict) -> float:
    keys = torch.tensor([list(k) + [EOS] * (N_NEW - len(k)) for k in law])
    probs = torch.zeros(V**N_NEW, dtype=torch.float64)
    probs[encode(keys)] = torch.tensor(list(law.values()), dtype=torch.float64)
    return law_p_value(torch.bincount(encode(samples), minlength=V**N_NEW), probs)


def law_test(target, drafter, temperature, top_k, seed=0, rows=None, **options):
    """Run `speculative_generate` over the two prompts' `rows` rows (default ROWS); min p-value over the prompts, and
    the stats."""
    rows = rows or ROWS
    ids = PROMPTS.repeat(rows // 2, 1)
    mask = PROMPT_MASK.repeat(rows // 2, 1)
    out, stats = speculative_generate(
        target, ids, mask, drafter=drafter, max_new_tokens=N_NEW, temperature=temperature, top_k=top_k,
        eos_token_id=EOS, pad_token_id=EOS, generator=torch.Generator().manual_seed(seed), **options,
    )
    new = out[:, PROMPTS.shape[1]:]
    new = torch.cat([new, torch.full((rows, N_NEW - new.shape[1]), EOS)], 1)  # all rows may stop before N_NEW
    p_values = []
    for r in range(2):
        prompt = PROMPTS[r][PROMPT_MASK[r].bool()].tolist()
        law = exact_joint_law(target.table, prompt, N_NEW, temperature, top_k, EOS)
        p_values.append(chi_square_p_value(new[r::2], law))
    return min(p_values), stats


def run_and_test(drafter_kind, draft_length, temperature, top_k, seed=0, rows=None):
    """Min p-value over the two prompts."""
    target, draft = TableLM(random_table(V, 0)), TableLM(random_table(V, 1))
    drafter = {"model": lambda: ModelDrafter(draft), "ngram": lambda: NGramDrafter(max_ngram=2),
               "adaptive": lambda: ModelDrafter(draft, confidence_threshold=0.3), "none": NoDrafter}[drafter_kind]()
    return law_test(target, drafter, temperature, top_k, seed, rows, draft_length=draft_length)


CONFIGS = [
    ("model", 1, 1.0, 0),
    ("model", 2, 0.7, 3),
    ("model", 3, 1.3, 0),
    ("model", 4, 1.0, 2),
    ("ngram", 3, 1.0, 0),
    ("adaptive", DraftLengthSchedule(3, kind="heuristic", max_length=5), 1.0, 3),
    ("none", None, 0.8, 2),  # AR through the loop (the graphed AR baseline on a GPU)
]


@pytest.mark.parametrize(
    "drafter_kind,draft_length,temperature,top_k", CONFIGS, ids=lambda x: str(getattr(x, "kind", x))
)
def test_speculative_generate_matches_exact_joint_law(drafter_kind, draft_length, temperature, top_k):
    p_value, stats = run_and_test(drafter_kind, draft_length, temperature, top_k)
    assert p_value > ALPHA, f"output law differs from the target's (p = {p_value:.2e})"
    if drafter_kind not in ("ngram", "none"):
        assert stats.accepted > 0 and stats.accepted < stats.drafted  # both branches of the rule were exercised


VERIFY = speculation.verify


def off_by_one_bonus(p, draft, generator, test, greedy=False):
    """Mutation: the bonus token is drawn from the law one position too early."""
    shifted = p.clone()
    shifted[:, -1] = p[:, -2]
    return VERIFY(shifted, draft, generator, test, greedy)


MUTATIONS = {  # (module, attribute, replacement)
    "resample_from_p": (exact, "residual_law", lambda p, q: p),
    "accept_always": (exact, "accept_probability", lambda p_x, q_x: torch.ones_like(p_x)),  # HF #28508
    "off_by_one_bonus": (speculation, "verify", off_by_one_bonus),
    # the caches keep rejected tokens: every row rolls back only as far as the row that kept the most
    "no_per_row_rollback": (StaticCausalLMAdapter, "rollback", lambda adapter, state, keep: state.lengths.copy_(
        torch.minimum(state.lengths, state.prompt_lengths + state.rows(keep).max()))),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mutations_are_rejected(mutation, monkeypatch):
    module, attribute, replacement = MUTATIONS[mutation]
    monkeypatch.setattr(module, attribute, replacement)
    p_value, _ = run_and_test("model", 2, 1.0, 0, rows=MUTATION_ROWS)
    assert p_value < ALPHA, f"mutation {mutation} was not detected (p = {p_value:.2e})"
