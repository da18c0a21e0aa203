"""Draft-model speculative decoding: its output law equals AR sampling's (the law harness of test_jacobi_law.py, with
a table drafter whose laws differ from the target's), mutation companions, greedy equivalence and per-row
reproducibility on real (tiny) LlamaGen transformers."""

import pytest
import torch

from mmspec.core import verify
from mmspec.core.probs import SamplingConfig
from mmspec.core.stats import SpecStats
from mmspec.image import AR, DraftModel, draft_model
from mmspec.models.llamagen.adapter import LlamaGenAdapter, LlamaGenCondition
from tests.image.table_model import TableImageModel
from tests.image.test_jacobi_law import ALPHA, FORCED, GRID, N, V, assert_exact, decode_rows, law_checks
from tests.models.llamagen_tiny import TEXT_CONTEXT, tiny_transformer, tiny_vq


def drafter(scale=1.0):
    return TableImageModel(GRID, V, forced_tokens=FORCED, seed=1, scale=scale)


@pytest.mark.parametrize("draft_length", [1, 2, N - 1, N + 2])
def test_draft_model_decoding_matches_the_exact_law(draft_length):
    tokens, stats, model = decode_rows(DraftModel(draft_length, drafter=drafter()))
    assert_exact(tokens, model)
    assert 0 < stats.accepted < stats.drafted and stats.tokens_per_target_forward > 1.0
    assert stats.draft_forwards == 1 + draft_length * (stats.target_forwards - 1)
    assert (tokens[:, 2] == 3).all()


def test_draft_model_decoding_matches_the_exact_law_without_cfg():
    sampling = SamplingConfig(temperature=1.2, top_p=0.9)
    tokens, _, model = decode_rows(DraftModel(3, drafter=drafter(scale=3.0)), sampling)
    assert_exact(tokens, model, sampling)


def misaligned_draft_laws(p, chain, generator, acceptance, greedy=False, relaxation=None):
    """Mutation: each draft is verified against the draft law of the position before it (an off-by-one in the
    bookkeeping of q). (Treating the drafts as deterministic would not be a mutation: accept-with-p(x)-else-p-minus-x
    is exact for any draft distribution, just with lower acceptance.)"""
    rolled = verify.Draft(chain.tokens, chain.lengths, chain.q.roll(1, dims=1))
    return verify.verify(p, rolled, generator, acceptance, greedy, relaxation)


def residual_is_p(p, q):
    """Mutation: resample from p at a rejection instead of norm(max(p - q, 0))."""
    return p


MUTATIONS = {
    "misaligned_draft_laws": (draft_model, "verify", misaligned_draft_laws),
    "residual_is_p": (verify, "residual_law", residual_is_p),
    "no_target_rollback": (TableImageModel, "rollback", lambda self, state, keep: None),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mutations_are_rejected(mutation, monkeypatch):
    owner, attribute, replacement = MUTATIONS[mutation]
    monkeypatch.setattr(owner, attribute, replacement)
    tokens, _, model = decode_rows(DraftModel(2, drafter=drafter()))
    checks = law_checks(tokens, model)
    assert min(checks.values()) < ALPHA, f"mutation {mutation} was not detected: {checks}"


def llamagen(seed):
    return LlamaGenAdapter(tiny_transformer(seed=seed), tiny_vq())


def condition(B, seed=0):
    states = torch.randn(B, TEXT_CONTEXT, 16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return LlamaGenCondition(states)


def decode(decoding, model, B, sampling, generator):
    stats = SpecStats()
    with torch.no_grad():
        *_, last = decoding(model, condition(B), sampling, generator, stats)
    return last.tokens, stats


@pytest.mark.parametrize("draft_length", [1, 3, 20])
def test_greedy_draft_decoding_equals_greedy_ar(draft_length):
    sampling = SamplingConfig(temperature=0, guidance_scale=2.0)
    target = llamagen(0)
    ar, _ = decode(AR(), target, 3, sampling, None)
    spec, stats = decode(DraftModel(draft_length, drafter=llamagen(1)), target, 3, sampling, None)
    assert torch.equal(ar, spec)
    assert stats.target_forwards < 1 + target.num_image_tokens or stats.accepted == 0


def test_rows_do_not_depend_on_the_rest_of_the_batch():
    sampling = SamplingConfig(temperature=1.0, guidance_scale=2.0)
    target, decoding = llamagen(0), DraftModel(3, drafter=llamagen(1))
    seeds = [5, 6, 7]
    together, _ = decode(decoding, target, 3, sampling, [torch.Generator().manual_seed(s) for s in seeds])
    alone, _ = decode(decoding, target, 1, sampling, [torch.Generator().manual_seed(seeds[0])])
    assert torch.equal(together[:1], alone)
