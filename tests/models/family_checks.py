"""Checks every transformers-family image adapter (`mmspec.models.hf_image`) must pass, shared by the family tests:
decoding runs, the ragged cache after every SJD iteration against a fresh prefill, the exact law of the first two
image tokens (for chi-square tests of seeded samplers), LANTERN tables from the codebook, draft heads on the
family's features."""

from __future__ import annotations

import pytest
import torch

from mmspec.adapters.features import bind_head
from mmspec.core.codebook import NeighbourTable
from mmspec.core.probs import SamplingConfig, process_logits
from mmspec.core.stats import SpecStats
from mmspec.image import AR, COUPLINGS, SJD, DraftHeads
from mmspec.models.heads import EagleHead, HydraHead
from mmspec.models.hf_image import PromptCondition
from tests.law import chi_square_p_value


def run(decoding, adapter, condition, sampling, generator=None):
    stats = SpecStats()
    with torch.no_grad():
        *_, last = decoding.run(adapter, condition, sampling, generator, stats)
    return last.tokens, stats


def row_of(condition: PromptCondition, b: int) -> PromptCondition:
    def pick(x):
        return None if x is None else x[b : b + 1]

    return PromptCondition(pick(condition.input_ids), pick(condition.attention_mask), pick(condition.negative_ids),
                           pick(condition.negative_mask))


def check_greedy_sjd_equals_ar(adapter, condition, guidance, windows=(3, 16)):
    greedy = SamplingConfig(0, guidance_scale=guidance)
    ar, _ = run(AR(), adapter, condition, greedy)
    N = adapter.grid[0] * adapter.grid[1]
    for window in windows:
        for coupling in COUPLINGS:
            sjd, stats = run(SJD(window, "horizontal", coupling), adapter, condition, greedy,
                             torch.Generator().manual_seed(0))
            assert torch.equal(sjd, ar), (window, coupling)
            assert stats.target_forwards <= N
    return ar


def check_cache_after_every_iteration(adapter, condition: PromptCondition, guidance: float = 3.0):
    """After every SJD iteration, each row's valid cache slots (and its unconditional row's) hold exactly the keys /
    values of a fresh prefill of its prompt plus its committed image tokens."""
    B = condition.input_ids.shape[0]
    captured, prefill = {}, adapter.prefill

    def spy(*args, **kwargs):
        captured["state"], logits = prefill(*args, **kwargs)
        return captured["state"], logits

    adapter.prefill = spy
    iterations = 0
    try:
        with torch.no_grad():
            for step in SJD(4, "vertical", "maximal").run(adapter, condition,
                                                              SamplingConfig(1.0, guidance_scale=guidance),
                                                              torch.Generator().manual_seed(0), SpecStats()):
                state = captured["state"]
                for b, c in enumerate(step.n_committed.tolist()):
                    fresh, _ = prefill(row_of(condition, b), cfg=True)
                    if c > 1:
                        adapter.forward(step.tokens[b : b + 1, : c - 1], fresh)
                    for row, fresh_row in ((b, 0), (b + B, 1)):  # conditional row and its unconditional row
                        slots, fresh_slots = state.slot_mask[row], fresh.slot_mask[fresh_row]
                        assert int(slots.sum()) == int(fresh_slots.sum()) == int(state.prompt_lengths[row]) + c - 1
                        for ours, theirs in zip(state.cache.layers, fresh.cache.layers, strict=True):
                            for mine, reference in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
                                torch.testing.assert_close(mine[row][:, slots], reference[fresh_row][:, fresh_slots],
                                                           rtol=0, atol=1e-5)
                iterations += 1
    finally:
        del adapter.prefill
    N = adapter.grid[0] * adapter.grid[1]
    assert 1 < iterations < N


def check_cache_and_its_mutation(adapter, condition):
    check_cache_after_every_iteration(adapter, condition)
    adapter.rollback = lambda state, keep: None  # mutation: rejected drafts stay in the cache
    try:
        with pytest.raises(AssertionError):
            check_cache_after_every_iteration(adapter, condition)
    finally:
        del adapter.rollback


def exact_law_of_the_first_two_tokens(adapter, condition: PromptCondition, sampling) -> torch.Tensor:
    """[V * V] float64: P(token 0, token 1) of the adapter's processed laws for the one-row `condition`."""
    V = adapter.vocab_size
    expanded = PromptCondition(*(None if x is None else x.expand(V, -1) for x in
                                 (condition.input_ids, condition.attention_mask, condition.negative_ids,
                                  condition.negative_mask)))
    with torch.no_grad():
        state, logits = adapter.prefill(expanded, cfg=sampling.guidance_scale != 1)
        uncond = None if logits.uncond is None else logits.uncond[0, -1].double()
        first = process_logits(logits.cond[0, -1].double(), sampling, uncond)
        logits = adapter.forward(torch.arange(V)[:, None], state)
        uncond = None if logits.uncond is None else logits.uncond[:, -1].double()
        second = process_logits(logits.cond[:, -1].double(), sampling, uncond)
    return (first[:, None] * second).flatten()


def check_first_two_tokens_follow(law: torch.Tensor, tokens: torch.Tensor, V: int,
                                  wrong_law: torch.Tensor | None = None):
    """Chi-square of sampled [rows, >= 2] tokens' first two against `law` [V * V]; `wrong_law` must be rejected."""
    counts = torch.bincount(tokens[:, 0] * V + tokens[:, 1], minlength=V * V)
    assert chi_square_p_value(counts, law) > 1e-3
    if wrong_law is not None:
        assert chi_square_p_value(counts, wrong_law) < 1e-6


def from_bpe(adapter, tokens: torch.Tensor) -> torch.Tensor:
    """Vocabulary (BPE) ids [B, N] a family's own loop wrote -> the adapter's local ids (inverse of `to_bpe`)."""
    local = {int(bpe): i for i, bpe in enumerate(adapter.token_ids)}
    return tokens.clone().apply_(lambda bpe: local[bpe])


def check_lantern_table(adapter, k_max: int = 4):
    table = NeighbourTable.build(adapter.codebook(), k_max=k_max, cache=False)
    assert table.k_max == k_max
    neighbours = table.in_token_space(adapter.vocab_size, getattr(adapter, "codebook_token_ids", None))
    assert neighbours.shape == (adapter.vocab_size, k_max)
    codes = adapter.codebook().shape[0]
    assert (neighbours[:codes] >= 0).all() and (neighbours[codes:] == -1).all()  # structure tokens never relax


def check_draft_heads_read_the_family_s_features(adapter, condition: PromptCondition, guidance: float = 3.0):
    """The "features" capability: a head's tap catches the language model's last hidden states (what the family's
    image head reads) in every forward, and greedy decoding with a random EAGLE or Hydra head on them drafts and
    equals greedy AR."""
    width, dtype = adapter.language_model.config.hidden_size, next(adapter.language_model.parameters()).dtype
    torch.manual_seed(0)
    heads = {"eagle": EagleHead(feature_size=width, vocab_size=adapter.vocab_size, n_head=1, ffn_hidden=8),
             "hydra": HydraHead(feature_size=width, vocab_size=adapter.vocab_size, num_heads=3, hidden=8)}
    caught = {}
    handle = adapter.language_model.register_forward_hook(
        lambda module, args, output: caught.update(hidden=output.last_hidden_state))
    try:
        tap = bind_head(heads["eagle"].to(dtype).eval(), adapter)
        with torch.no_grad():
            state, _ = adapter.prefill(condition, cfg=guidance != 1.0)
            assert torch.equal(tap.feature, caught["hidden"][:, -1:])  # each row's last prompt token
            adapter.forward(torch.zeros(condition.input_ids.shape[0], 2, dtype=torch.long), state)
            assert torch.equal(tap.feature, caught["hidden"])  # every token of a window
    finally:
        handle.remove()
    greedy = SamplingConfig(0, guidance_scale=guidance)
    ar, _ = run(AR(), adapter, condition, greedy)
    for kind, head in heads.items():
        tokens, stats = run(DraftHeads(kind, 3, head=head.to(dtype).eval()), adapter, condition, greedy)
        assert torch.equal(tokens, ar), kind
        assert stats.drafted > 0
