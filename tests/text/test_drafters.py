import pytest
import torch
from scipy.stats import chi2

from mmspec.adapters.causal_lm import CausalLMAdapter
from mmspec.adapters.views import early_exit_view
from mmspec.core.drafting.lengths import DraftLengthSchedule
from mmspec.core.probs import SamplingConfig
from mmspec.text.drafters import LayerSkipDrafter, ModelDrafter, NGramDrafter
from mmspec.text.rows import TextRows
from tests.conftest import tiny_llama


def rows_of(tokens: torch.Tensor, lengths: torch.Tensor, lookahead: int = 8) -> TextRows:
    """The rows of a batch whose row b is tokens[b, :lengths[b]] (all prompt), as a step sees them."""
    mask = torch.arange(tokens.shape[1]) < lengths[:, None]
    return TextRows(tokens, mask.long(), max_new_tokens=1, lookahead=lookahead, eos=None, pad_token_id=0)


@pytest.mark.parametrize("drafter_kind", ["model", "layerskip"])
@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=5)])
def test_drafter_tokens_follow_the_q_it_returns(drafter_kind, sampling):
    """HF #47932: a drafter must return the law it actually sampled from. Chi-square of 20,000 first and second draft
    tokens (same context in every row) against the q rows returned; false-failure rate < 1e-5 per position."""
    target = tiny_llama(vocab_size=16, num_layers=2)
    drafter = (ModelDrafter(tiny_llama(vocab_size=16, num_layers=1, seed=3)) if drafter_kind == "model"
               else LayerSkipDrafter(target, 1))
    N = 20_000
    tokens = torch.tensor([[3, 4, 5, 6]]).repeat(N, 1)
    rows = rows_of(tokens, torch.full((N,), 4))
    drafter.start(rows, 16, capacity=8)
    draft = drafter.propose(rows, torch.full((N,), 2), 2, sampling, torch.Generator().manual_seed(0))
    assert draft.q.shape == (N, 2, 16)
    q1 = draft.q[0, 0].double()
    torch.testing.assert_close(draft.q[:, 0].double(), q1.expand(N, 16))  # same context, same law
    counts = torch.bincount(draft.tokens[:, 0], minlength=16).double()
    keep = q1 * N >= 5
    assert counts[q1 == 0].sum() == 0
    stat = ((counts[keep] - N * q1[keep]) ** 2 / (N * q1[keep])).sum()
    assert chi2.sf(stat.item(), int(keep.sum()) - 1) > 1e-5
    # Second position: its law depends on the first token; the mean of the returned q rows is its marginal.
    marginal = draft.q[:, 1].double().mean(0)
    counts = torch.bincount(draft.tokens[:, 1], minlength=16).double()
    keep = marginal * N >= 5
    stat = ((counts[keep] - N * marginal[keep]) ** 2 / (N * marginal[keep])).sum()
    assert chi2.sf(stat.item(), int(keep.sum()) - 1) > 1e-5


def test_ngram_drafter_is_deterministic_and_copies_latest_match():
    drafter = NGramDrafter(max_ngram=2)
    tokens = torch.tensor([[1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 0, 0], [7, 8, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    lengths = torch.tensor([10, 3])
    draft = drafter.propose(rows_of(tokens, lengths), torch.tensor([3, 3]), 3, SamplingConfig(), None)
    assert draft.q is None
    # the latest "1 2" is followed by 5 6 1
    assert draft.tokens[0].tolist() == [5, 6, 1] and draft.lengths.tolist() == [3, 0]


def test_ngram_draft_is_cut_at_the_sequence_end():
    tokens = torch.tensor([[4, 5, 6, 4, 5, 0]])
    draft = NGramDrafter(max_ngram=2).propose(rows_of(tokens, torch.tensor([5])), torch.tensor([4]), 4,
                                              SamplingConfig(), None)
    assert draft.lengths.tolist() == [3] and draft.tokens[0, :3].tolist() == [6, 4, 5]  # 3 known tokens, budget 4


def test_early_exit_view_shares_weights_and_equals_truncated_model():
    target = tiny_llama(num_layers=3)
    view = early_exit_view(target, 2)
    assert view.model.embed_tokens.weight is target.model.embed_tokens.weight
    assert target.config.num_hidden_layers == 3 and view.config.num_hidden_layers == 2
    ids = torch.tensor([[4, 5, 6, 7]])
    with torch.no_grad():
        hidden = target.model(ids, output_hidden_states=True).hidden_states[2]
        expected = target.lm_head(target.model.norm(hidden))
        torch.testing.assert_close(view(ids).logits, expected)
        assert not torch.allclose(target(ids).logits, expected)  # the target itself is untouched
    calls = []
    target.register_forward_hook(lambda *_: calls.append(1))
    view(ids)
    assert calls == []  # hooks on the target (forward counters) do not fire for draft calls
    with pytest.raises(ValueError, match="exit_layer"):
        early_exit_view(target, 3)


def test_self_speculative_drafters_reach_the_exits_through_the_model_protocol():
    """LayerSkip drafts from the adapter's "exits" capability (`exit_model`, an early-exit view); a model adapter
    without it is refused by name before anything runs."""
    target = tiny_llama(num_layers=3)
    exits = LayerSkipDrafter(CausalLMAdapter(target), 2).model.model  # the early-exit view the adapter gave
    assert exits.config.num_hidden_layers == 2
    assert exits.model.embed_tokens.weight is target.model.embed_tokens.weight

    class NoExits(CausalLMAdapter):
        capabilities = frozenset({"tree"})

    with pytest.raises(ValueError, match=r"LayerSkipDrafter needs a model adapter with exit_model \(capability "
                                         r"'exits'\)"):
        LayerSkipDrafter(NoExits(target), 2)


def test_confidence_stop_shortens_drafts():
    draft_model = tiny_llama(num_layers=1, seed=5)
    tokens = torch.tensor([[3, 4, 5]]).repeat(8, 1)
    drafter = ModelDrafter(draft_model, confidence_threshold=0.99)
    rows = rows_of(tokens, torch.full((8,), 3))
    drafter.start(rows, 48, capacity=12)
    draft = drafter.propose(rows, torch.full((8,), 5), 5, SamplingConfig(), torch.Generator().manual_seed(0))
    assert draft.lengths.tolist() == [1] * 8  # a random tiny model is never 99% sure
    with pytest.raises(ValueError, match="confidence_threshold"):
        ModelDrafter(draft_model, confidence_threshold=1.5)


def test_heuristic_schedule_plus_two_minus_one():
    schedule = DraftLengthSchedule(3, kind="heuristic", max_length=6)
    schedule.reset(3, torch.device("cpu"))
    schedule.update(torch.tensor([3, 1, 0]), torch.tensor([3, 3, 3]))
    assert schedule.budget.tolist() == [5, 2, 2]
    schedule.update(torch.tensor([5, 0, 0]), torch.tensor([5, 2, 2]))
    assert schedule.budget.tolist() == [6, 1, 1]
    with pytest.raises(ValueError, match="schedule"):
        DraftLengthSchedule(3, kind="exponential")
