"""Judge decoding (`Judge`, `JudgeHead`): a judge that never fires reproduces exact speculative decoding token for
token (sampled and greedy), one that always fires keeps every draft and reports the distortion it adds, and the
judge reads the target's feature of each draft (slot i + 1 of the verification window), not of the token before."""

import pytest
import torch

from mmspec.adapters.causal_lm import CausalLMAdapter
from mmspec.core.progress import run_to_end
from mmspec.core.rules import Exact, Judge
from mmspec.core.rules.judge import JudgeTest
from mmspec.models.judge import JudgeHead
from mmspec.text import TextSpeculation
from tests.text.test_generate import prompts


def judge(feature_size: int, bias: float) -> JudgeHead:
    """A judge whose score is sigmoid(bias) whatever the feature."""
    head = JudgeHead(feature_size=feature_size).double()
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.fill_(bias)
    return head


def decode(target, draft, acceptance, temperature, seed=0):
    ids, mask = prompts(4)
    result = run_to_end(TextSpeculation(drafter="model", acceptance=acceptance).run(
        target, draft, ids, mask, max_new_tokens=24, temperature=temperature, pad_token_id=0,
        generator=torch.Generator().manual_seed(seed)))
    return result.sequences, result.stats


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_a_judge_that_never_fires_is_exact_decoding(tiny_target, tiny_draft, temperature):
    exact, exact_stats = decode(tiny_target, tiny_draft, Exact(), temperature)
    silent = Judge(threshold=0.5, head=judge(tiny_target.config.hidden_size, -30.0))
    out, stats = decode(tiny_target, tiny_draft, silent, temperature)
    assert torch.equal(out, exact)
    assert (stats.drafted, stats.accepted) == (exact_stats.drafted, exact_stats.accepted)
    assert stats.excess_acceptance == 0


def test_a_judge_that_always_fires_keeps_every_draft_and_reports_it(tiny_target, tiny_draft):
    _, exact_stats = decode(tiny_target, tiny_draft, Exact(), 0.0)
    out, stats = decode(tiny_target, tiny_draft, Judge(head=judge(tiny_target.config.hidden_size, 30.0)), 0.0)
    assert stats.accepted == stats.drafted > exact_stats.accepted
    assert stats.excess_acceptance > 0  # every kept mismatch is distortion


class SlotJudge:
    """A stand-in head: its score of a slot is the feature's first entry."""

    config = type("Config", (), {"threshold": 0.5})()

    def __init__(self, features):
        self.features = features

    def score(self, features):
        return features[..., 0]


def test_the_judge_reads_each_drafts_own_feature():
    """Window [x, d1, d2]: only d2's slot (2) scores high, so only d2 is judged good; x's slot (0) is not read."""
    features = torch.tensor([[[1.0], [0.0], [1.0]]])
    p = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    q = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])
    drafts = torch.tensor([[1, 1]])  # the exact rule rejects both: p(1) = 0
    acceptance = JudgeTest(SlotJudge(features), 0.5).acceptance(p, q, drafts)
    assert acceptance.tolist() == [[0.0, 1.0]]


def test_judge_needs_a_head_and_a_target(tiny_target):
    with pytest.raises(ValueError, match="needs a judge head"):
        Judge().bind(None, 48)
    with pytest.raises(ValueError, match="attach"):
        _ = JudgeHead(feature_size=32).features
    with pytest.raises(ValueError, match="features of width 8"):
        JudgeHead(feature_size=8).attach(CausalLMAdapter(tiny_target))
    with pytest.raises(ValueError, match="JudgeHead needs a model adapter with feature_readout"):
        JudgeHead(feature_size=32).attach(tiny_target)  # the module itself: the protocol is the adapter's
    with pytest.raises(ValueError, match="threshold"):
        JudgeHead(threshold=1.0)
