"""Text speculation replayed from captured steps (`speculative_generate(..., graphs=StepGraphs(...))`) decodes what the
eager steps decode, token for token and stat for stat: the tape replay (a CUDA graph's semantics on a CPU) with real
transformers models on the fixed-capacity caches, for every capturable drafter (the draft model's chains, with a
confidence stop, SpecDec++'s learned stop and the heuristic schedule; cascades; layer skip; prompt lookup; S2D; the
draft model's trees; STAND's; EAGLE, EAGLE-3 and Hydra chains and trees) and none (graphed AR), greedy and sampled
(top-k), batch 2 with ragged prompts and an EOS that ends the rows at different steps, three calls reusing the
captured steps (a generator per row: an eager batch drops its finished rows, a captured one keeps them, and per-row
streams do not depend on the batch); a step's host reads, its fullgraph trace, and a mutant the replay catches."""

import copy

import pytest
import torch

from mmspec.core.drafting.lengths import DraftLengthSchedule
from mmspec.core.runtime.capture import HostReads, StepGraphs, trace_checks
from mmspec.core.tree_shape import TreeShape
from mmspec.models.acceptance import AcceptanceHead
from mmspec.models.heads import EagleHead, HydraHead
from mmspec.models.kangaroo import KangarooAdapter
from mmspec.text import speculative_generate
from mmspec.text.drafters import CascadeDrafter, LayerSkipDrafter, ModelDrafter, NGramDrafter, NoDrafter
from mmspec.text.head_drafters import HeadDrafter, HeadTreeDrafter
from mmspec.text.rows import TextRows
from mmspec.text.sorted_exits import SortedExitDrafter
from mmspec.text.tree_drafters import ModelTreeDrafter, StandDrafter
from tests.conftest import tiny_llama

PROMPTS = torch.tensor([[5, 9, 11, 5, 9, 30, 7, 5, 9], [0, 0, 0, 0, 12, 13, 12, 13, 12]])
MASK = torch.tensor([[1] * 9, [0, 0, 0, 0, 1, 1, 1, 1, 1]])  # the second prompt left-padded
EOS = 17


@pytest.fixture(scope="module")
def models():
    return tiny_llama(num_layers=3, seed=0), tiny_llama(num_layers=1, seed=1)


HEADS = {}  # one head per kind and target: later calls share the steps the first captured (keyed by its weights)


def head(kind: str, target, **options):
    """A random head on the target's features (in the target's dtype)."""
    key = kind, id(target), tuple(options.items())
    if key not in HEADS:
        torch.manual_seed(3)
        width, vocab = target.config.hidden_size, target.config.vocab_size
        made = (EagleHead(feature_size=width, vocab_size=vocab, n_head=2, ffn_hidden=16, **options) if kind == "eagle"
                else HydraHead(feature_size=width, vocab_size=vocab, num_heads=4, hidden=16))
        HEADS[key] = made.to(target.device).type(target.dtype).eval()
    return HEADS[key]


def acceptance_head(draft):
    """A random SpecDec++ acceptance head on the draft's features; its stop threshold cuts some drafts, not all."""
    torch.manual_seed(4)
    head = AcceptanceHead(feature_size=draft.config.hidden_size, hidden=16, layers=1, stop_threshold=(0.5, 0.5))
    return HEADS.setdefault(("acceptance", id(draft)), head.to(draft.device).type(draft.dtype).eval())


def sorted_adapter(target):
    """S2D's adapter at exits 1 and 2 of the 3-layer target (random: both exits are taken at T = 1)."""
    key = "s2d", id(target)
    if key not in HEADS:
        torch.manual_seed(5)
        HEADS[key] = KangarooAdapter.for_target(target, 1, [1, 2]).to(target.device).type(target.dtype).eval()
    return HEADS[key]


HEAD_TREE = TreeShape(nodes=6, branching=2, expand=2, depth=3)
DRAFTERS = {
    "model": lambda target, draft: ModelDrafter(draft),
    "confidence": lambda target, draft: ModelDrafter(draft, confidence_threshold=0.3),
    "specdecpp": lambda target, draft: ModelDrafter(draft, acceptance_head=acceptance_head(draft)),
    "heuristic": lambda target, draft: ModelDrafter(draft),  # with `SCHEDULES`' heuristic draft length
    "cascade": lambda target, draft: CascadeDrafter(draft, max_ngram=2),
    "cascade_lookup_after": lambda target, draft: CascadeDrafter(draft, max_ngram=2, lookup_after=2),
    "cascade_forwards": lambda target, draft: CascadeDrafter(draft, max_ngram=2, forwards_per_round=2),
    "stand": lambda target, draft: StandDrafter(TreeShape(nodes=6, branching=2, expand=2, depth=3)),
    "s2d": lambda target, draft: SortedExitDrafter(target, sorted_adapter(target), exit_threshold=0.2,
                                                   confidence_threshold=0.1),
    "layerskip": lambda target, draft: LayerSkipDrafter(target, 1),
    "ngram": lambda target, draft: NGramDrafter(max_ngram=2),
    "tree": lambda target, draft: ModelTreeDrafter(draft, TreeShape(nodes=6, branching=2, expand=2, depth=3)),
    "none": lambda target, draft: NoDrafter(),  # graphed AR
    "eagle": lambda target, draft: HeadDrafter(target, head("eagle", target)),
    "eagle3": lambda target, draft: HeadDrafter(target, head("eagle", target, feature_layers=(0, 2))),
    "hydra": lambda target, draft: HeadDrafter(target, head("hydra", target)),
    "eagle_tree": lambda target, draft: HeadTreeDrafter(target, head("eagle", target), HEAD_TREE),
    "hydra_tree": lambda target, draft: HeadTreeDrafter(target, head("hydra", target), HEAD_TREE),
}
# the variants of a mechanism the default tier covers once (a stop rule, a cascade, a head): the slow tier
SLOW_KINDS = {"confidence", "heuristic", "cascade_lookup_after", "cascade_forwards", "eagle3", "hydra", "hydra_tree"}
SAMPLINGS = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=1.0, top_k=8)}
SCHEDULES = {"heuristic": DraftLengthSchedule(2, kind="heuristic", max_length=5)}  # a drafter's draft_length


def generate(models, kind, sampling, seed=0, graphs=None, **options):
    target, draft = models
    device = target.device
    options = {"max_new_tokens": 24, "eos_token_id": EOS, **SAMPLINGS[sampling],
               **({"draft_length": SCHEDULES[kind]} if kind in SCHEDULES else {}), **options}
    generators = [torch.Generator(device).manual_seed(seed + 100 * row) for row in range(PROMPTS.shape[0])]
    return speculative_generate(target, PROMPTS.to(device), MASK.to(device), drafter=DRAFTERS[kind](target, draft),
                                generator=generators, graphs=graphs, **options)


def same_stats(replayed, eager) -> bool:
    """The same counts, except that a captured batch may run a few steps past its end (a block runs between two reads
    of the progress) where an eager batch of several rows reads it after every step."""
    return (replayed.target_forwards >= eager.target_forwards and replayed.draft_forwards >= eager.draft_forwards
            and replayed.accepted == eager.accepted and replayed.drafted == eager.drafted
            and torch.equal(replayed.acceptance_map, eager.acceptance_map)
            and torch.equal(replayed.from_draft, eager.from_draft) and torch.equal(replayed.steps, eager.steps)
            and replayed.child_acceptance == eager.child_acceptance)


def replays_match_eager(models, kind, sampling, cuda=False) -> None:
    graphs = StepGraphs(cuda=cuda)
    for seed in (0, 1, 0):  # the later calls replay the steps the first captured
        eager, eager_stats = generate(models, kind, sampling, seed)
        replayed, stats = generate(models, kind, sampling, seed, graphs)
        assert torch.equal(replayed, eager)
        assert same_stats(stats, eager_stats)
    assert len(graphs.shells) == 1


# greedy (one acceptance path for every drafter) in the default tier for a chain, a tree and a head's tree; sampled for
# every kind
GREEDY_KINDS = {"model", "tree", "eagle_tree"}


@pytest.mark.parametrize("kind,sampling", [
    pytest.param(kind, sampling, marks=pytest.mark.slow if kind in SLOW_KINDS or (
        sampling == "greedy" and kind not in GREEDY_KINDS) else ())
    for kind in DRAFTERS for sampling in SAMPLINGS])
def test_replayed_steps_decode_what_the_eager_steps_decode(models, kind, sampling):
    replays_match_eager(models, kind, sampling)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("kind", list(DRAFTERS))
def test_cuda_graphs_decode_what_the_eager_steps_decode_on_cuda(models, kind, sampling):
    replays_match_eager(tuple(copy.deepcopy(m).cuda() for m in models), kind, sampling, cuda=True)


def test_rows_end_at_their_own_eos_inside_a_block(models):
    """An EOS early in one row: the row commits nothing after it while the other row goes on (as eager)."""
    out, stats = generate(models, "ngram", "greedy", graphs=StepGraphs(cuda=False), max_new_tokens=40)
    new = out[:, PROMPTS.shape[1]:]
    ended = [(row == EOS).nonzero().flatten()[:1].tolist() for row in new]
    for row, end in zip(new, ended, strict=True):
        if end:
            assert (row[end[0] + 1:] == 0).all()  # padded after the EOS (pad id 0)
    assert stats.new_tokens.tolist() == [end[0] + 1 if end else 40 for end in ended]


class ReassignedCount(TextRows):
    """Mutation companion: commit rebinds `count` and `generated` to new tensors instead of writing them in place;
    a replay then keeps adding onto the captured ones, which the hand-back and the next block never see."""

    def commit(self, round):
        super().commit(round)
        self.generated = self.generated.clone()


def test_a_step_that_reassigns_its_state_is_caught(models, monkeypatch):
    import mmspec.text.generate as generate_module

    eager, _ = generate(models, "model", "greedy")
    monkeypatch.setattr(generate_module, "TextRows", ReassignedCount)
    try:
        replayed, _ = generate(models, "model", "greedy", graphs=StepGraphs(cuda=False))
    except RuntimeError as error:  # the loop, never seeing the rows advance, ran the replay past the buffers' end
        assert "out of bounds" in str(error)
        return
    assert not torch.equal(replayed, eager)


# the default tier traces a chain, a tree, a head, graphed AR and prompt lookup; the other drafters, the slow tier
TRACED_KINDS = {"model", "tree", "eagle", "none", "ngram"}


@pytest.mark.parametrize("kind", [kind if kind in TRACED_KINDS else pytest.param(kind, marks=pytest.mark.slow)
                                  for kind in DRAFTERS])
def test_a_step_reads_no_host_and_traces_whole(models, kind):
    """Host reads: the prefill's and the output's, and one per block of iterations; the step traces with
    `torch.compile(fullgraph=True)`."""
    graphs = StepGraphs(cuda=False)
    generate(models, kind, "sampled", graphs=graphs)
    with HostReads() as reads:
        _, stats = generate(models, kind, "sampled", graphs=graphs, max_new_tokens=64)
    iterations = stats.target_forwards - stats.prefill_forwards
    assert reads.count / iterations <= 0.5, (reads.count, iterations)
    with trace_checks() as checks:
        generate(models, kind, "sampled")
    assert checks and checks[0] == (True, ""), checks


def test_prompts_of_nearby_lengths_share_a_captured_step(models):
    """The step's shapes depend on the prompts' room (a multiple of 64 slots), not on their lengths: a shorter batch
    replays the step the first captured, and decodes what it decodes eagerly."""
    target, draft = models
    graphs = StepGraphs(cuda=False)
    for width in (9, 6):
        ids, mask = PROMPTS[:, -width:], MASK[:, -width:]
        runs = [speculative_generate(target, ids, mask, drafter=ModelDrafter(draft), max_new_tokens=16,
                                     temperature=1.0, generator=[torch.Generator().manual_seed(5 + row) for row in
                                                                 range(2)], graphs=captured)[0]
                for captured in (None, graphs)]
        assert torch.equal(runs[1], runs[0])
    assert len(graphs.shells) == 1
