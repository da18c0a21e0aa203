"""The stats family: every class's `as_dict()`, `table()` and properties work, empty and after a run's counts, and a
subclass only adds to its base's figures; `synchronized_timings` syncs every phase, inside its block only."""

import dataclasses

import pytest
import torch

from mmspec.continuous.stats import ContinuousStats
from mmspec.core.stats import DecodingStats, SpecStats
from mmspec.core.verify import VerifyResult
from mmspec.text.stats import TextStats
from mmspec.video import FrameStats

CLASSES = [DecodingStats, SpecStats, TextStats, ContinuousStats, FrameStats]


def properties(cls) -> list[str]:
    return [name for name in dir(cls) if isinstance(getattr(cls, name), property)]


def filled(cls):
    """An instance with the counts of a small run: 2 rows, 3 verification steps, 2 tokens accepted of 6 drafted."""
    stats = cls(target_forwards=4, prefill_forwards=1, draft_forwards=6, method="m", chosen_by="why",
                timings={"total": 0.5, "target": 0.25})
    if isinstance(stats, SpecStats):
        stats.steps = torch.zeros(2, dtype=torch.long)
        for n in ([1, 0], [0, 1], [0, 0]):
            stats.record_step(VerifyResult(torch.tensor(n), torch.zeros(2, dtype=torch.long),
                                           torch.zeros(2, 1, dtype=torch.bool)), torch.ones(2, dtype=torch.long),
                              active=torch.ones(2, dtype=torch.bool))
        stats.finalize()
    else:
        stats.steps = torch.full((2,), 3)
    stats.new_tokens = torch.full((2,), 4)
    if isinstance(stats, TextStats):
        stats.from_draft = torch.tensor([[True, False, False, False], [False, True, False, False]])
    if isinstance(stats, ContinuousStats):
        stats.residual_tries, stats.fallbacks = torch.tensor([1, 3]), 1
    if isinstance(stats, FrameStats):
        stats.frames_computed, stats.frames_emitted, stats.frames_discarded, stats.rollbacks = 6, 4, 2, 1
    return stats


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("state", ["empty", "filled"])
def test_every_stats_class_reports(cls, state):
    stats = cls() if state == "empty" else filled(cls)
    d = stats.as_dict()
    assert {"target_forwards", "new_tokens", "tokens_per_target_forward", "timings_s"} <= set(d)
    table = stats.table()
    assert all(f"{key}  " in table or key == "timings_s" for key in d)
    for name in properties(cls):
        getattr(stats, name)  # none raises
    if state == "filled":
        assert d["target_forwards"] == 4 and "time total (s)" in table


def test_figures_of_a_filled_run():
    spec = filled(SpecStats)
    assert spec.as_dict()["accept_hist"] == [4, 2] and spec.acceptance_rate == pytest.approx(2 / 6)
    assert spec.mean_accepted_length == pytest.approx(8 / 6) and spec.tokens_per_target_forward == pytest.approx(8 / 8)
    assert filled(ContinuousStats).as_dict()["mean_residual_tries"] == 2.0
    frames = filled(FrameStats)
    assert frames.tokens_per_target_forward == 1.0 and frames.as_dict()["frames_discarded"] == 2
    ar = filled(SpecStats)
    ar.speculative = False
    assert not {"drafted", "accepted", "acceptance_rate", "mean_accepted_length", "draft_forwards"} & set(ar.as_dict())


@pytest.mark.parametrize("cls", CLASSES[1:], ids=lambda c: c.__name__)
def test_a_subclass_only_adds(cls):
    base = cls.__mro__[1]
    assert {f.name for f in dataclasses.fields(base)} <= {f.name for f in dataclasses.fields(cls)}
    assert set(base().as_dict()) <= set(cls().as_dict())
    assert set(properties(base)) <= set(properties(cls))


def test_synchronized_timings_synchronize_every_phase_inside_the_block_only(monkeypatch):
    from mmspec.core import stats as stats_module

    synced = []
    monkeypatch.setattr(stats_module, "synchronize", synced.append)
    timings = {}
    timer = stats_module.PhaseTimer(timings)
    with timer("target"):
        pass
    assert synced == []  # outside a block: no host sync
    with stats_module.synchronized_timings("cpu"):
        with timer("target"):
            pass
        with timer("verify"):
            pass
    assert synced == [torch.device("cpu")] * 4  # as each phase starts and ends
    assert set(timings) == {"target", "verify"} and stats_module._SYNCHRONIZED == []


def test_child_acceptance_is_each_ranks_rate_among_the_visited_nodes_that_have_it():
    """Visited inner nodes: 2 children (the 1st accepted), 2 (none), 3 (the 3rd), 1 (the 1st); the third level is
    past every walk. Rates: rank 1: 2 of 4 nodes, rank 2: 0 of 3, rank 3: 1 of 1."""
    stats = TextStats()
    nan = float("nan")
    stats.record_tree_walk(torch.tensor([[0.5, 0.6, nan], [0.4, 0.9, nan]]), None,
                           torch.tensor([[2, 2, 0], [3, 1, 0]]), torch.tensor([[0, -1, -1], [2, 0, -1]]))
    stats.finalize()
    assert stats.child_acceptance == (0.5, 0.0, 1.0)
    assert stats.tree_acceptance == pytest.approx(0.6) and stats.tree_alpha_star is None
    assert "child_acceptance" in stats.as_dict() and "child_acceptance" in stats.table()


def test_finalize_brings_the_callers_tensors_in_the_same_transfer():
    """One host read folds the counters, the tree rates and what the caller asks along, in their shapes."""
    from mmspec.core.runtime.capture import HostReads

    stats = filled(SpecStats)  # finalized once: its counters are folded
    stats.record_step(VerifyResult(torch.tensor([2, 1]), torch.zeros(2, dtype=torch.long),
                                   torch.zeros(2, 2, dtype=torch.bool)), torch.full((2,), 2), active=None)
    nan = float("nan")
    stats.record_tree_walk(torch.tensor([[0.5, nan]]), None, torch.tensor([[2, 0]]), torch.tensor([[0, -1]]))
    along = torch.tensor([[3, 4, 5], [6, 7, 8]])
    with HostReads() as reads:
        host, = stats.finalize(along)
    assert reads.count == 1 and torch.equal(host, along) and host.dtype == torch.long
    assert stats.drafted == 6 + 4 and stats.accepted == 2 + 3 and stats.accept_hist.tolist() == [0, 1, 1]
    assert stats.child_acceptance == (1.0, 0.0) and stats.finalize() == []  # nothing left to fold
