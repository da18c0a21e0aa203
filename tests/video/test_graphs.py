"""A next-frame session's Euler steps replayed from graphs (`FrameSession(graphs=...)`) emit what the eager steps
emit, frame for frame: the tape replay (a CUDA graph's semantics on a CPU), frame speculation with eager and
pipelined context passes, batch 2, actions that change (rollbacks) and a window that fills and evicts; and a replay
that bakes the block's first frame in at capture is caught."""

import copy

import pytest
import torch

from mmspec.core.runtime.capture import HostReads
from mmspec.video import FrameSession, FrameSpeculation
from mmspec.video.methods import AR
from tests.video.test_speculation import action_sequence, context_frames, model, run  # noqa: F401  (model: a fixture)

DECODINGS = [AR(), FrameSpeculation(frames=3), FrameSpeculation(frames=2, context="pipelined"),
             FrameSpeculation.strict()]


def replays_match_eager(model, decoding, graphs="tape") -> None:  # noqa: F811
    actions = action_sequence(14)
    context = context_frames().to(model.device)
    eager, eager_session = run(model, actions, decoding, context)
    replayed, session = run(model, actions, decoding, context, graphs=graphs)
    assert torch.equal(replayed, eager)
    assert session.graphs.captured  # later blocks of a shape replay
    counted = {key: value for key, value in vars(session.stats).items() if key != "timings"}
    assert counted == {key: value for key, value in vars(eager_session.stats).items() if key != "timings"}


DECODING_IDS = ["ar", "eager_context", "pipelined", "strict"]


@pytest.mark.parametrize("decoding", DECODINGS, ids=DECODING_IDS)
def test_replayed_euler_steps_emit_what_the_eager_steps_emit(model, decoding):  # noqa: F811
    replays_match_eager(model, decoding)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("decoding", DECODINGS, ids=DECODING_IDS)
def test_cuda_graphs_emit_what_the_eager_steps_emit_on_cuda(model, decoding):  # noqa: F811
    replays_match_eager(copy.deepcopy(model).cuda(), decoding, graphs="cuda")


class BakedFirstFrame(FrameSession):
    """Mutation companion: the graph is handed the block's first frame as a Python int, which a capture bakes in
    (every replay then rotates its frames as the captured block's)."""

    def _denoise(self, x, actions, first_frame, start):
        self.stats.target_forwards += self.num_inference_steps - start
        key = (tuple(x.shape), start, self.cache.num_frames)
        return self.graphs(key, lambda x, actions: self._euler(x, actions, first_frame, start), x, actions)


def test_a_replay_that_bakes_in_the_first_frame_is_caught(model):  # noqa: F811
    actions = action_sequence(10)
    eager, _ = run(model, actions, AR())
    baked, _ = run(model, actions, AR(), session_cls=BakedFirstFrame, graphs="tape")
    assert not torch.equal(baked, eager)


def test_a_session_fed_ints_never_reads_a_tensor(model):  # noqa: F811
    """The host checks the caller's actions and decides to keep or roll back a block in Python; no forward reads
    the device (the model is told the actions are checked). A tensor of actions is read once per step."""
    actions = action_sequence(12)
    as_ints = actions.tolist()
    with HostReads() as reads:
        run(model, as_ints, FrameSpeculation(frames=3), graphs="tape")
    assert reads.count == 0
    with HostReads() as reads:
        run(model, actions, FrameSpeculation(frames=3), graphs="tape")
    assert reads.count == len(actions)


def test_cuda_graphs_need_a_cuda_model(model):  # noqa: F811
    with pytest.raises(ValueError, match="graphs='cuda' needs the model on a CUDA device"):
        run(model, action_sequence(2), graphs="cuda")
    with pytest.raises(ValueError, match="graphs must be 'cuda', 'tape' or None"):
        run(model, action_sequence(2), graphs="yes")
