import pytest
import torch

from mmspec.core.progress import run_to_end
from mmspec.core.runtime.capture import StepGraphs
from mmspec.text import speculative_generate
from mmspec.text.drafters import (
    CascadeDrafter,
    DraftLengthSchedule,
    LayerSkipDrafter,
    ModelDrafter,
    NGramDrafter,
    NoDrafter,
)
from tests.conftest import tiny_llama
from tests.text.table_lm import TableLM, random_table

DRAFTERS = {
    "model": lambda target, draft: ModelDrafter(draft),
    "model_adaptive": lambda target, draft: ModelDrafter(draft, confidence_threshold=0.05),
    "ngram": lambda target, draft: NGramDrafter(),
    "layerskip": lambda target, draft: LayerSkipDrafter(target, exit_layer=1),
    "cascade": lambda target, draft: CascadeDrafter(draft),
    "cascade_horizontal": lambda target, draft: CascadeDrafter(draft, lookup_after=1),
}


def prompts(batch_size: int):
    """Left-padded prompts of different lengths (with repeats, so the n-gram drafter finds matches)."""
    rows = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11], [12, 13, 12, 13, 12], [3]][:batch_size]
    T = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (T - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("drafter_name", list(DRAFTERS))
@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
def test_greedy_equals_target_generate(tiny_target, tiny_draft, drafter_name, batch_size, schedule):
    ids, mask = prompts(batch_size)
    expected = tiny_target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24,
                                    pad_token_id=0)
    out, stats = speculative_generate(
        tiny_target, ids, mask, drafter=DRAFTERS[drafter_name](tiny_target, tiny_draft), max_new_tokens=24,
        temperature=0, eos_token_id=tiny_target.config.eos_token_id, pad_token_id=0,
        draft_length=DraftLengthSchedule(3, kind=schedule),
    )
    assert torch.equal(out, expected)
    assert stats.target_forwards <= 24 + 1


@pytest.mark.parametrize("graphs", [None, StepGraphs(cuda=False)], ids=["eager", "replayed"])
def test_no_drafter_is_ar_through_the_loop(tiny_target, graphs):
    """NoDrafter: one target forward and one token per step, what transformers' greedy `generate` decodes (ragged
    batch), eagerly or replayed (the graphed AR of a GPU); a draft length is refused."""
    ids, mask = prompts(4)
    expected = tiny_target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                                    pad_token_id=0)
    for _ in range(2):  # the second call replays the steps the first captured
        out, stats = speculative_generate(tiny_target, ids, mask, drafter=NoDrafter(), max_new_tokens=16,
                                          temperature=0, eos_token_id=tiny_target.config.eos_token_id,
                                          pad_token_id=0, graphs=graphs)
        assert torch.equal(out, expected)
        assert stats.drafted == 0 and stats.target_forwards >= 16 + 1
    with pytest.raises(ValueError, match="NoDrafter drafts nothing: draft_length must be None or 0, got 2"):
        speculative_generate(tiny_target, ids, mask, drafter=NoDrafter(), draft_length=2)


def test_ar_counts_its_own_forwards_through_generate_and_through_the_loop(tiny_target):
    """transformers' generate: N forwards for N tokens (its prefill yields the first), 1.0 token per forward; the
    speculative loop drafting nothing: N + 1 (its prefill stops short of the last prompt token), N / (N + 1)."""
    from mmspec.text.methods import AR

    ids, mask = prompts(1)
    through_generate = run_to_end(AR().run(tiny_target, None, ids, mask, max_new_tokens=8, temperature=0)).stats
    _, through_loop = speculative_generate(tiny_target, ids, mask, drafter=NoDrafter(), max_new_tokens=8,
                                           temperature=0)
    assert (through_generate.target_forwards, through_generate.tokens_per_target_forward) == (8, 1.0)
    assert (through_loop.target_forwards, through_loop.tokens_per_target_forward) == (9, 8 / 9)


def test_eos_stops_each_row_on_its_own():
    """Row-wise EOS: a row that hits EOS is padded, the others go on to max_new_tokens."""
    model = tiny_llama(num_layers=2)
    ids, mask = prompts(4)
    expected = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=0)
    eos = int(expected[0, ids.shape[1] + 3])  # make row 0's 4th new token the EOS
    expected = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=0,
                              eos_token_id=eos)
    out, _ = speculative_generate(model, ids, mask, drafter=NGramDrafter(), max_new_tokens=40, temperature=0,
                                  eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out, expected)


def test_per_row_generators_make_rows_independent_of_the_batch():
    target, draft = TableLM(random_table(5, 0)), TableLM(random_table(5, 1))
    ids = torch.tensor([[0, 3, 1], [0, 0, 2], [1, 1, 1]])
    mask = torch.tensor([[1, 1, 1], [0, 0, 1], [1, 1, 1]])
    seeds = [11, 12, 13]
    kwargs = dict(drafter=ModelDrafter(draft), max_new_tokens=12, draft_length=3, temperature=1.0)
    batch, _ = speculative_generate(target, ids, mask, generator=[torch.Generator().manual_seed(s) for s in seeds],
                                    **kwargs)
    for b in range(3):
        alone, _ = speculative_generate(target, ids[b : b + 1], mask[b : b + 1],
                                        generator=torch.Generator().manual_seed(seeds[b]), **kwargs)
        assert torch.equal(alone[0], batch[b])
    again, _ = speculative_generate(target, ids, mask, generator=[torch.Generator().manual_seed(s) for s in seeds],
                                    **kwargs)
    assert torch.equal(again, batch)


def test_ragged_acceptance_rows_do_not_wait():
    """Rows accept different numbers of tokens per step; the step count is set by the slowest row only."""
    target = tiny_llama(num_layers=2)
    ids, mask = prompts(4)
    _, stats = speculative_generate(target, ids, mask, drafter=LayerSkipDrafter(target, 1), max_new_tokens=30,
                                    temperature=0)
    per_row_tau = stats.new_tokens.double() / stats.steps
    assert stats.new_tokens.tolist() == [30] * 4
    assert per_row_tau.max() > per_row_tau.min()  # genuinely ragged
    assert stats.target_forwards == 1 + int(stats.steps.max())


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
        (dict(temperature=-0.5), ValueError, "temperature"),
        (dict(top_p=0.0), ValueError, "top_p"),
        (dict(top_p=1.5), ValueError, "top_p"),
        (dict(top_k=-1), ValueError, "top_k"),
        (dict(acceptance="lossy-typo"), ValueError, "acceptance"),
        (dict(generator=[torch.Generator()]), ValueError, "generator"),
        (dict(generator="seed"), TypeError, "generator"),
        (dict(max_new_tokens=400), ValueError, "context"),
        (dict(draft_length=0), ValueError, "draft length"),
    ],
)
def test_clear_errors(tiny_target, tiny_draft, kwargs, error, match):
    ids, mask = prompts(2)
    with pytest.raises(error, match=match):
        speculative_generate(tiny_target, ids, mask, drafter=ModelDrafter(tiny_draft), **kwargs)


def test_vocabulary_mismatch_is_an_error(tiny_target):
    other = tiny_llama(vocab_size=40, num_layers=1)
    ids, mask = prompts(1)
    with pytest.raises(ValueError, match="vocabulary size 40 does not match the target's 48"):
        speculative_generate(tiny_target, ids, mask, drafter=ModelDrafter(other))


def test_typical_acceptance_runs_and_reports(tiny_target, tiny_draft):
    ids, mask = prompts(2)
    out, stats = speculative_generate(tiny_target, ids, mask, drafter=ModelDrafter(tiny_draft), acceptance="typical",
                                      max_new_tokens=8, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, ids.shape[1] + 8) and stats.drafted > 0
    assert 0 <= stats.excess_acceptance <= 1 and "lossy_excess_acceptance" in stats.as_dict()
    _, exact_stats = speculative_generate(tiny_target, ids, mask, drafter=ModelDrafter(tiny_draft), max_new_tokens=8)
    assert exact_stats.excess_acceptance is None


def test_acceptance_map_of_a_draft_equal_to_the_target():
    """A drafter that is the target itself (greedy) has every draft accepted: steps commit 3 drafts + the bonus token,
    the last step is cut by max_new_tokens (its two tokens are both accepted drafts)."""
    target = tiny_llama(num_layers=2)
    ids, mask = prompts(1)
    _, stats = speculative_generate(target, ids, mask, drafter=ModelDrafter(target), max_new_tokens=10, temperature=0,
                                    draft_length=3)
    assert stats.acceptance_map.tolist() == [[1, 1, 1, 1, 2, 2, 2, 2, 3, 3]]
    assert stats.from_draft.tolist() == [[True, True, True, False] * 2 + [True, True]]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_acceptance_map_agrees_with_the_counters(tiny_target, tiny_draft, temperature):
    """Per row: steps 1..S in order, one group per verification step, accepted drafts first in each group, padding
    after EOS marked -1 / False; totals agree with the stats counters."""
    ids, mask = prompts(4)
    kwargs = dict(drafter=ModelDrafter(tiny_draft), max_new_tokens=30, temperature=temperature, draft_length=3)
    probe, _ = speculative_generate(tiny_target, ids, mask, generator=torch.Generator().manual_seed(0), **kwargs)
    eos = int(probe[1, ids.shape[1] + 5])  # the same run with this EOS stops row 1 by its 6th token
    out, stats = speculative_generate(tiny_target, ids, mask, eos_token_id=eos, pad_token_id=0,
                                      generator=torch.Generator().manual_seed(0), **kwargs)
    amap, from_draft = stats.acceptance_map, stats.from_draft
    assert amap.shape == from_draft.shape == (4, out.shape[1] - ids.shape[1])
    # a row's last step may accept drafts past its EOS / max_new_tokens that are never emitted (at most 3 per row)
    assert 0 <= stats.accepted - int(from_draft.sum()) <= 3 * 4
    for b in range(4):
        n = int(stats.new_tokens[b])
        assert (amap[b, n:] == -1).all() and not from_draft[b, n:].any()
        steps = amap[b, :n]
        assert steps.unique().tolist() == list(range(1, int(stats.steps[b]) + 1))
        assert (steps.diff() >= 0).all()
        for s in range(1, int(stats.steps[b]) + 1):
            group = from_draft[b, :n][steps == s]
            assert 1 <= len(group) <= 4
            assert group.tolist() == sorted(group.tolist(), reverse=True)  # accepted drafts, then the target's token
    assert stats.new_tokens[1] <= 6
