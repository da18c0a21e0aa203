"""The transformers families (Janus, Emu3, Lumina-mGPT) on a fixed-capacity slot cache with their decoding steps
captured whole (`mmspec.models.hf_image.on_slot_cache`, what the family pipelines run on CUDA): through the CPU tape,
which replays with a CUDA graph's semantics, every decoding decodes what the eager path decodes, token for token and
stat for stat (sampled, CFG, top-k, a ragged batch of three prompts, the families' forced line tokens), also when a
second call replays the kept steps, and a slot cache that keeps rejected drafts is caught; a step reads nothing on
the host and traces whole. A frontier tree's nodes score, on either cache, what a window of their paths scores; a
draft model of the family drafts chains and trees on the slot cache as it does eagerly; half-precision steps capture
whole. Where CUDA is present the CUDA graphs decode the same."""

import pytest
import torch

from mmspec.adapters.static_cache import StaticCausalLMAdapter
from mmspec.core.probs import SamplingConfig
from mmspec.core.stats import SpecStats
from mmspec.image import AR, SJD, DraftModel
from mmspec.image.frontier import FrontierTree
from mmspec.models.emu3 import Emu3Adapter
from mmspec.models.hf_image import PromptCondition, SlotGraphs, on_slot_cache
from mmspec.models.janus import JanusAdapter
from mmspec.models.lumina_mgpt import LuminaMGPTAdapter
from tests.models import test_emu3, test_janus, test_lumina_mgpt
from tests.models.test_llamagen_graphs import second_iteration

SAMPLING = SamplingConfig(temperature=1.0, top_k=6, guidance_scale=3.0)
DECODINGS = {"ar": AR(), "sjd": SJD(3, "horizontal", "none"), "mc-sjd": SJD(4, "random", "maximal"),
             "sjd-wide": SJD(16, "lookahead", "gumbel"), "frontier": SJD(5, "random", "maximal", tree_width=3)}


def ragged(prompts: torch.Tensor, **negative) -> PromptCondition:
    """The prompts, the second one shorter by two tokens (left padding)."""
    mask = torch.ones_like(prompts)
    mask[1, :2] = 0
    return PromptCondition(prompts, mask, **negative)


def adapter_makers(seed: int) -> dict:
    """name: a maker of adapters of the family's tiny model of `seed`, float64 (no near-tie flips between the two
    caches' kernels)."""
    janus, emu3 = test_janus.tiny_janus(seed).double(), test_emu3.tiny_emu3(seed).double()
    lm, vqgan = test_lumina_mgpt.tiny_lumina(seed)
    lm = lm.double()
    return {"janus": lambda: JanusAdapter(janus), "emu3": lambda: Emu3Adapter(emu3, test_emu3.H, test_emu3.W),
            "lumina_mgpt": lambda: LuminaMGPTAdapter(lm, vqgan, test_lumina_mgpt.H, test_lumina_mgpt.W)}


@pytest.fixture(scope="module")
def drafters():
    """name: a draft adapter maker, each family's tiny model of another seed."""
    return adapter_makers(1)


@pytest.fixture(scope="module")
def families():
    """name: (adapter maker, condition)."""
    makers = adapter_makers(0)
    return {"janus": (makers["janus"], ragged(test_janus.PROMPTS)),
            "emu3": (makers["emu3"], ragged(test_emu3.PROMPTS, negative_ids=test_emu3.NEGATIVE)),
            "lumina_mgpt": (makers["lumina_mgpt"], ragged(test_lumina_mgpt.PROMPTS))}


def decode(decoding, adapter, condition, seed):
    stats = SpecStats()
    with torch.no_grad():
        *_, last = decoding.run(adapter, condition, SAMPLING, torch.Generator().manual_seed(seed), stats)
    return last.tokens, {**stats.as_dict(), "timings_s": None}


@pytest.mark.parametrize("family", ["janus", "emu3", "lumina_mgpt"])
def test_the_slot_cache_path_decodes_what_the_eager_path_decodes(families, family):
    make, condition = families[family]
    slotted = on_slot_cache(make(), SlotGraphs(cuda=False))
    for name, decoding in DECODINGS.items():
        for seed in (0, 1):  # the second call replays the steps the first captured
            tokens, stats = decode(decoding, slotted, condition, seed)
            eager_tokens, eager_stats = decode(decoding, make(), condition, seed)
            assert torch.equal(tokens, eager_tokens), (name, seed)
            assert stats == eager_stats, (name, seed)
    assert len(slotted.graphs.steps.shells) == len(DECODINGS)  # one capture per decoding, replayed after


def tree_logits(adapter, condition, tree: FrontierTree, tokens, visible=None):
    """Logits (conditional and unconditional rows) of a tree of `tokens` [B, T] scored after the prompts."""
    with torch.no_grad():
        state, _ = adapter.prefill(condition, cfg=True, max_window=tree.size)
        logits = adapter.forward_tree(tokens, tree.level, tree.ancestors if visible is None else visible, state)
    return torch.stack([logits.cond, logits.uncond])


def path_logits(adapter, condition, tree: FrontierTree, tokens):
    """The same logits, each node's from a window forward of its root-to-node path."""
    nodes = []
    for node in range(tree.size):
        path = tree.ancestors[node].nonzero().flatten()  # in slot order, which is level order along a path
        with torch.no_grad():
            state, _ = adapter.prefill(condition, cfg=True, max_window=tree.size)
            logits = adapter.forward(tokens[:, path], state)
        nodes.append(torch.stack([logits.cond[:, -1], logits.uncond[:, -1]]))
    return torch.stack(nodes, 2)


@pytest.mark.parametrize("family", ["janus", "emu3", "lumina_mgpt"])
def test_a_tree_node_scores_what_a_window_of_its_path_scores(families, family):
    """A frontier tree (window 4, width 3, depth 2) on the eager cache and on the slot cache; a tree mask that lets a
    node see the nodes slotted before it (its siblings and cousins, a window's causal mask) is caught."""
    make, condition = families[family]
    tree = FrontierTree.build(4, 3, 2)
    adapter = make()
    tokens = torch.randint(0, adapter.codebook().shape[0], (condition.input_ids.shape[0], tree.size),
                           generator=torch.Generator().manual_seed(0))
    reference = path_logits(adapter, condition, tree, tokens)
    for cache in (make(), on_slot_cache(make(), None)):
        torch.testing.assert_close(tree_logits(cache, condition, tree, tokens), reference, rtol=0, atol=1e-9)
    causal = torch.ones_like(tree.ancestors).tril()
    assert not torch.allclose(tree_logits(adapter, condition, tree, tokens, causal), reference, atol=1e-3)


# the default tier: Lumina-mGPT (the cheapest); the slow tier: Janus and Emu3, whose slot caches the tests above check
@pytest.mark.parametrize("family", [pytest.param("janus", marks=pytest.mark.slow),
                                    pytest.param("emu3", marks=pytest.mark.slow), "lumina_mgpt"])
def test_a_draft_model_of_the_family_decodes_on_the_slot_cache_what_it_decodes_eagerly(families, drafters, family):
    """Another model of the family drafts chains and full trees: with target and drafter on slot caches, the steps
    through the tape decode what the eager caches decode; a chain's step reads nothing on the host and traces
    whole."""
    make, condition = families[family]
    slotted = on_slot_cache(make(), SlotGraphs(cuda=False))
    for tree_width, seed in ((1, 0), (1, 1), (2, 0)):  # the chain's second call replays the first's steps
        tokens, stats = decode(DraftModel(3, tree_width=tree_width, drafter=on_slot_cache(drafters[family](), None)),
                               slotted, condition, seed)
        eager_tokens, eager_stats = decode(DraftModel(3, tree_width=tree_width, drafter=drafters[family]()), make(),
                                           condition, seed)
        assert torch.equal(tokens, eager_tokens), (tree_width, seed)
        assert stats == eager_stats and 0 < stats["accepted"] < stats["drafted"], (tree_width, seed)
    reads, traced, reason = second_iteration(on_slot_cache(make(), SlotGraphs(cuda=False)), condition,
                                             DraftModel(3, drafter=on_slot_cache(drafters[family](), None)), SAMPLING)
    assert reads == 0
    assert traced, reason


def test_a_slot_cache_that_keeps_rejected_drafts_is_caught(families, monkeypatch):
    """Mutant: the slot cache's rollback does nothing (the rejected drafts' keys stay visible)."""
    monkeypatch.setattr(StaticCausalLMAdapter, "rollback", lambda self, state, keep: None)
    make, condition = families["janus"]
    tokens, _ = decode(DECODINGS["mc-sjd"], on_slot_cache(make(), SlotGraphs(cuda=False)), condition, 0)
    assert not torch.equal(tokens, decode(DECODINGS["mc-sjd"], make(), condition, 0)[0])


@pytest.mark.parametrize("name", [  # the default tier: AR, a Jacobi window and a frontier tree
    pytest.param(name, marks=pytest.mark.slow) if name in ("mc-sjd", "sjd-wide") else name for name in DECODINGS])
def test_a_step_reads_nothing_on_the_host_and_traces_whole(families, name):
    make, condition = families["emu3"]  # forced end-of-line tokens inside the step
    reads, traced, reason = second_iteration(on_slot_cache(make(), SlotGraphs(cuda=False)), condition,
                                             DECODINGS[name], SAMPLING)
    assert reads == 0
    assert traced, reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
def test_half_precision_slot_steps_score_what_the_eager_cache_scores_and_capture_whole(dtype):
    """The families' weights in bfloat16 / float16: a frontier tree's logits on the slot cache agree with the eager
    cache's to the precision's rounding (far below the logits' spread), and a frontier step on the slot cache runs
    through the tape, reads nothing on the host and traces whole."""
    janus = test_janus.tiny_janus().to(dtype)
    condition = ragged(test_janus.PROMPTS)
    tree = FrontierTree.build(4, 3, 2)
    codes = JanusAdapter(janus).codebook().shape[0]
    tokens = torch.randint(0, codes, (3, tree.size), generator=torch.Generator().manual_seed(0))
    eager = tree_logits(JanusAdapter(janus), condition, tree, tokens)
    slotted = tree_logits(on_slot_cache(JanusAdapter(janus), None), condition, tree, tokens)
    assert eager.dtype == slotted.dtype == torch.float32  # the image logits, as every family returns them
    assert (slotted - eager).abs().max() < 0.05 * eager.std()
    adapter = on_slot_cache(JanusAdapter(janus), SlotGraphs(cuda=False))
    tokens, _ = decode(DECODINGS["frontier"], adapter, condition, 0)
    assert (tokens >= 0).all()
    reads, traced, reason = second_iteration(on_slot_cache(JanusAdapter(janus), SlotGraphs(cuda=False)), condition,
                                             DECODINGS["frontier"], SAMPLING)
    assert reads == 0
    assert traced, reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_decode_what_the_eager_path_decodes(families):
    make, condition = families["lumina_mgpt"]
    adapter = make()
    adapter.model.cuda()
    cuda = PromptCondition(*(None if x is None else x.cuda() for x in vars(condition).values()))
    slotted = on_slot_cache(adapter, SlotGraphs(cuda=True))
    for decoding in DECODINGS.values():
        stats = SpecStats()
        with torch.no_grad():
            *_, last = decoding.run(slotted, cuda, SAMPLING, torch.Generator("cuda").manual_seed(0), stats)
            *_, eager = decoding.run(make(), cuda, SAMPLING, torch.Generator("cuda").manual_seed(0), SpecStats())
        assert torch.equal(last.tokens, eager.tokens)
