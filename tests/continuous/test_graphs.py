"""The diffusion head's reverse chain replayed from a graph (`mmspec.continuous.graphs`) decodes what the eager
sampler decodes, token for token: the tape replay (a CUDA graph's semantics on a CPU) with a real MAR head, CFG,
batch 2, AR and speculative decoding (its draft chains and its verifications' residual proposals), several calls
reusing the captured chains; and a chain that forgets to copy an input in is caught."""

import copy

import pytest
import torch

from mmspec.continuous.diffusion import DiffusionSchedule
from mmspec.continuous.graphs import SamplerGraphs
from mmspec.continuous.methods import AR, ContinuousSpeculation
from mmspec.core.progress import run_to_end
from mmspec.core.runtime.capture import HostReads
from tests.models.test_mar import tiny_mar

SEEDS, LABELS = torch.arange(2), torch.tensor([1, 3])


@pytest.fixture(scope="module")
def pair():
    return tiny_mar(0), tiny_mar(1)


def decode(decoding, pair, seeds=SEEDS, graphs=None):
    target, draft = pair
    result = run_to_end(decoding.run(target, draft, seeds.to(target.device), 8,
                                     DiffusionSchedule.cosine(6, x0_clip=4.0), LABELS.to(target.device), 3.0,
                                     temperature=0.9, graphs=graphs))
    return result.latents, result.stats


def replays_match_eager(pair, decoding, cuda=False) -> SamplerGraphs:
    graphs = SamplerGraphs(cuda=cuda)
    for seeds in (SEEDS, SEEDS + 7, SEEDS):  # the second and third calls replay the chains the first captured
        eager, eager_stats = decode(decoding, pair, seeds)
        replayed, stats = decode(decoding, pair, seeds, graphs)
        assert torch.equal(replayed, eager)
        assert (stats.target_forwards, stats.draft_forwards, stats.accepted) == (
            eager_stats.target_forwards, eager_stats.draft_forwards, eager_stats.accepted)
    assert graphs.captured  # plan [1, 1, 1, 2, 3, 2, 3, 3] at batch 2: chains of 2, 4 and 6 tokens
    return graphs


DECODINGS = pytest.mark.parametrize("decoding", [AR(), ContinuousSpeculation(gamma=3, prefill_ratio=0.25)],
                                    ids=["ar", "speculative"])


@DECODINGS
def test_replayed_chains_decode_what_the_eager_sampler_decodes(pair, decoding):
    graphs = replays_match_eager(pair, decoding)
    if isinstance(decoding, ContinuousSpeculation):  # the verifications' residual proposals: 8 target chains a row
        assert any(key[0] == id(pair[0]) and key[1][0] >= 8 for key in graphs.captured)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@DECODINGS
def test_cuda_graphs_decode_what_the_eager_sampler_decodes_on_cuda(pair, decoding):
    replays_match_eager(tuple(copy.deepcopy(model).cuda() for model in pair), decoding, cuda=True)


class StaleNoise(SamplerGraphs):
    """Mutation companion: a replay that does not copy the new call's x_T in (it samples from the captured one's)."""

    def __call__(self, key, fn, *inputs):
        if key in self.captured:
            inputs = (*inputs[:3], None, inputs[4])
        return super().__call__(key, fn, *inputs)


def test_a_chain_that_keeps_an_input_from_its_capture_is_caught(pair):
    graphs = StaleNoise(cuda=False)
    eager, _ = decode(AR(), pair)
    mismatched = [not torch.equal(decode(AR(), pair, graphs=graphs)[0], eager) for _ in range(2)]
    assert mismatched == [True, True]  # the first call already replays the 2-token chain from its second step on


def test_a_plain_decoding_reads_the_host_once_per_call(pair):
    """AR on MAR's schedule: no host read inside a step (the known-token count is the host's own, the schedule's
    tables are on the device), so the chains can replay without a sync."""
    with HostReads() as reads:
        decode(AR(), pair, graphs=SamplerGraphs(cuda=False))
    assert reads.count == 0


def test_the_encoder_given_the_known_count_computes_what_it_reads(pair):
    target = pair[0]
    unknown = torch.rand(2, 16).argsort(1) >= 5  # 5 known tokens per row, at other positions per row
    tokens, embedding = torch.randn(2, 16, 4), target.class_embedding(LABELS, 2)
    assert torch.equal(target.encode_decode(tokens, unknown, embedding, known_tokens=5),
                       target.encode_decode(tokens, unknown, embedding))
