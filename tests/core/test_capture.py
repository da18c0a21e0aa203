"""`mmspec.core.runtime.capture`: the tape replays with a CUDA graph's semantics (in-place state advances, a reassigned
attribute or a Python value read at capture does not, a host read cannot be captured); the host-read counter; the
state walk and the shell copy; the runner's block accounting; block sizes and the iterations they are cut to."""

import pytest
import torch

from mmspec.core.runtime.capture import (
    CaptureError,
    HostReads,
    StepGraphs,
    StepRunner,
    TapeGraph,
    block_size,
    copy_step,
    iterations_left,
    state_tensors,
)
from mmspec.core.stats import PhaseTimer, SpecStats


class Counter:
    """A toy step: counts up in place (`good`), by reassignment (`bad`) or by a Python int (`python`)."""

    def __init__(self):
        self.value = torch.zeros(3)
        self.python = 0
        self.stats = SpecStats()
        self.generator = None

    def good(self):
        self.value += 1

    def bad(self):
        self.value = self.value + 1

    def python_value(self):
        self.python += 1
        self.value.fill_(self.python)


def test_the_tape_replays_in_place_updates():
    step, tape = Counter(), TapeGraph()
    tape.capture(step.good)  # runs once while recording
    tape.replay()
    tape.replay()
    assert step.value.tolist() == [3.0, 3.0, 3.0]


def test_the_tape_does_not_see_a_reassigned_tensor_or_a_new_python_value():
    step, tape = Counter(), TapeGraph()
    tape.capture(step.bad)
    held = step.value  # the tensor the recording wrote
    tape.replay()
    tape.replay()
    assert held.tolist() == [1.0, 1.0, 1.0]  # each replay recomputes zeros + 1: the state never advances
    step, tape = Counter(), TapeGraph()
    tape.capture(step.python_value)
    tape.replay()
    assert step.python == 1 and step.value.tolist() == [1.0, 1.0, 1.0]


def test_a_host_read_cannot_be_captured():
    def reads():
        if torch.ones(()).item() > 0:
            pass

    with pytest.raises(CaptureError, match="_local_scalar_dense"):
        TapeGraph().capture(reads)
    with pytest.raises(CaptureError, match="nonzero"):
        TapeGraph().capture(lambda: torch.arange(3).nonzero())


def test_host_reads_are_counted_and_the_methods_restored():
    t = torch.arange(3)
    original = torch.Tensor.item
    with HostReads() as reads:
        t.sum().item()
        bool(t.any())
        t.tolist()
        int(t[0])
        t + 1  # not a read
    assert reads.count == 4 and torch.Tensor.item is original


def test_the_state_walk_skips_weights_generators_and_static_objects_and_the_copy_shares_them():
    class Static:
        capture_static = True

        def __init__(self):
            self.cache = torch.zeros(2)

    step = Counter()
    step.model = torch.nn.Linear(2, 2)
    step.generator = torch.Generator()
    step.static = Static()
    step.nested = {"a": [torch.ones(1)]}
    paths = set(state_tensors(step))
    assert "step.value" in paths and "step.nested['a'][0]" in paths
    assert not any("model" in p or "static" in p for p in paths)
    copy = copy_step(step)
    assert copy.model is step.model and copy.generator is step.generator and copy.static is step.static
    assert copy.value is not step.value and torch.equal(copy.value, step.value)


class Tokens:
    """A step that appends one token per call in place and counts its forwards (as image steps do)."""

    def __init__(self, generator=None):
        self.seq = torch.zeros(12, dtype=torch.long)
        self.at = torch.zeros((), dtype=torch.long)
        self.stats = SpecStats()
        self.generator = generator
        self.opening = type("Opening", (), {"timer": PhaseTimer({})})()

    def __call__(self):
        draw = torch.randint(0, 100, (1,), generator=self.generator)
        self.seq.scatter_(0, self.at[None], draw)
        self.at += 1
        self.stats.target_forwards += 1

    def finish(self):
        pass


@pytest.mark.parametrize("calls", [1, 2])
def test_the_runner_replays_blocks_on_a_shell_and_hands_the_state_back(calls):
    graphs = StepGraphs(cuda=False)
    for _ in range(calls):  # the second call reuses the first call's shell and graphs
        eager = Tokens(torch.Generator().manual_seed(5))
        for _ in range(11):
            eager()
        step = Tokens(torch.Generator().manual_seed(5))
        runner = StepRunner(step, step.stats, PhaseTimer({}), graphs, key="k")
        for k in (4, 4, 2, 1):
            runner.run(k)
        runner.finish()
        assert torch.equal(step.seq, eager.seq) and int(step.at) == 11
        assert step.stats.target_forwards == 11 and runner.iterations == 11
        assert step.generator.get_state().equal(eager.generator.get_state())  # the caller's generator advanced
    assert list(graphs.shells) == ["k"] and sorted(graphs.shells["k"].graphs) == [1, 2, 3, 4]


def test_block_sizes_shrink_towards_the_end():
    assert [block_size(r) for r in (100, 16, 15.9, 8, 7.9, 4, 3, 1.5, 0.2)] == [16, 16, 8, 8, 4, 4, 2, 1, 1]
    assert [block_size(r, 3) for r in (100, 2.5)] == [3, 2]  # the caller's bound


def test_iterations_left_follow_the_slowest_rows_rate_and_never_overshoot_a_first_block():
    assert iterations_left(64, 0, 0, 8) == 8  # before any iteration: at the most a step commits, no waste
    assert iterations_left(60, 40, 10, 8) == 15  # then at the rate kept so far: 4 tokens an iteration
    assert iterations_left(60, 3, 3, 8) == 6  # but no more than twice the iterations so far
    assert iterations_left(10, 3, 16, 8) == 10  # a rate below one token an iteration (a row that finished) counts as 1
    assert block_size(iterations_left(255, 0, 0, 16)) == 8 and block_size(iterations_left(255, 0, 0, 1)) == 16
