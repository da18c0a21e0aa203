"""`WindowGraphs`, the CUDA-graph path of the LlamaGen decoding loop: through its static buffers, kept cache and step
graphs (on this CPU `TapeGraph`s, which replay with a CUDA graph's semantics) every image decoding — AR, SJD at several
windows, MC-SJD, SJD's frontier trees, the draft model's chains and trees, PJD, EAGLE and Hydra heads' chains and
trees — decodes exactly what the eager path
decodes (sampled, CFG, top-k, batch 2, a padded prompt), also when later decodings reuse the kept cache and the
captured steps; the kept cache ends with the eager cache's keys / values. Mutants are caught: a reused cache that
keeps the last prompts' padding, and a step that reassigns its state instead of updating it in place (a graph's
replay would not see it). Each step does no host read and traces with `torch.compile(fullgraph=True)`. Where CUDA is
present the captured graphs decode what the eager path decodes. Errors."""

import pytest
import torch

from mmspec.core.probs import SamplingConfig
from mmspec.core.runtime.capture import HostReads, compiles_fullgraph
from mmspec.core.stats import SpecStats
from mmspec.image import AR, SJD, DraftHeads, DraftModel
from mmspec.image.jacobi import JacobiStep
from mmspec.image.loop import open_decoding
from mmspec.image.methods.pjd import PJD
from mmspec.models.heads import EagleHead, HydraHead
from mmspec.models.llamagen.adapter import LlamaGenAdapter, LlamaGenCondition
from mmspec.models.llamagen.graphs import WindowGraphs
from tests.models.llamagen_tiny import TEXT_CONTEXT, tiny_pipeline, tiny_transformer, tiny_vq

SAMPLING = SamplingConfig(temperature=1.0, top_k=8, guidance_scale=3.0)
DECODINGS = {"ar": lambda drafter: AR(), "sjd-w3": lambda drafter: SJD(3, "horizontal", "maximal"),
             "sjd-w16": lambda drafter: SJD(16, "random", "none"),
             "sjd-tree": lambda drafter: SJD(5, "random", "maximal", tree_width=3),
             "draft": lambda drafter: DraftModel(2, drafter=drafter),
             "draft-tree": lambda drafter: DraftModel(2, tree_width=2, drafter=drafter),
             "pjd": lambda drafter: PJD(3, rows=2),
             "heads": lambda drafter: DraftHeads("eagle", 2, head=head("eagle", drafter)),
             "heads-tree": lambda drafter: DraftHeads("eagle", 2, tree_width=2, head=head("eagle", drafter)),
             "hydra": lambda drafter: DraftHeads("hydra", 3, head=head("hydra", drafter))}
HEADS = {}  # one head per kind and dtype: a captured step replays the head it was captured with (keyed by weights)


def head(kind: str, drafter: LlamaGenAdapter):
    """A random head on the tiny transformer's features (width 32, 24 tokens, a 4 x 4 grid), in the models' dtype."""
    dtype = drafter.transformer.dtype
    if (kind, dtype) not in HEADS:
        torch.manual_seed(7)
        made = (EagleHead(feature_size=32, vocab_size=24, n_head=4, ffn_hidden=32, positions="2d", grid_size=4)
                if kind == "eagle" else HydraHead(feature_size=32, vocab_size=24, num_heads=3, hidden=32))
        HEADS[kind, dtype] = made.type(dtype).eval()
    return HEADS[kind, dtype]


def condition(padded_row: int, seed: int, device="cpu", dtype=torch.float64) -> LlamaGenCondition:
    """Two prompts; row `padded_row` has two padding slots (-1: no mask)."""
    states = torch.randn(2, TEXT_CONTEXT, 16, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(device)
    if padded_row < 0:
        return LlamaGenCondition(states)
    mask = torch.ones(2, TEXT_CONTEXT, dtype=torch.bool)
    mask[padded_row, :2] = False
    return LlamaGenCondition(states, mask.to(device))


def decode(name: str, target: LlamaGenAdapter, drafter: LlamaGenAdapter, cond: LlamaGenCondition, seed: int):
    """(tokens [2, N], the final state, the stats without timings) of one decoding."""
    captured, prefill = {}, target.prefill

    def spy(*args, **kwargs):
        captured["state"], logits = prefill(*args, **kwargs)
        return captured["state"], logits

    target.prefill = spy
    device, stats = cond.states.device, SpecStats()
    with torch.no_grad():
        *_, last = DECODINGS[name](drafter).run(target, cond, SAMPLING, torch.Generator(device).manual_seed(seed),
                                            stats)
    figures = {**stats.as_dict(), "timings_s": None, "map": stats.acceptance_map.tolist()}
    return last.tokens, captured["state"], figures


def adapters(models, graphs_type=None, capture=False):
    """(target, drafter) adapters, eager or with `graphs_type` (WindowGraphs or a mutant) per transformer."""
    vq = tiny_vq(dtype=models[0].dtype).to(models[0].device)
    if graphs_type is None:
        return tuple(LlamaGenAdapter(model, vq) for model in models)
    return tuple(LlamaGenAdapter(model, vq, graphs_type(model, capture=capture)) for model in models)


def graphed_decodes_match_eager(graphs_type, models=None, capture=False, device="cpu", dtype=torch.float64) -> bool:
    """Every decoding, three times on the same graphed adapters (reusing the kept caches: a padded prompt, then
    prompts without a mask, then the other row padded), equals an eager decoding token for token, and the kept cache
    ends as the eager one."""
    models = models or (tiny_transformer(seed=0), tiny_transformer(seed=1))
    graphed = adapters(models, graphs_type, capture)
    for name in DECODINGS:
        for padded_row, seed in ((0, 1), (-1, 2), (1, 3)):
            cond = condition(padded_row, seed, device, dtype)
            eager_tokens, eager_state, eager_stats = decode(name, *adapters(models), cond, seed)
            tokens, state, stats = decode(name, *graphed, cond, seed)
            if not torch.equal(tokens, eager_tokens) or stats != eager_stats:
                return False
            cache, eager = state.cache, eager_state.cache
            assert cache is graphed[0].graphs.kept
            if not torch.equal(cache.lengths, eager.lengths):
                return False
            filled = torch.arange(cache.capacity, device=device) < cache.lengths[:, None]  # [R, S]
            for buffer, eager_buffer in ((cache.k, eager.k), (cache.v, eager.v)):
                if not torch.equal(buffer.transpose(2, 3)[:, filled], eager_buffer.transpose(2, 3)[:, filled]):
                    return False
    return True


def test_the_graph_path_decodes_what_the_eager_path_decodes():
    assert graphed_decodes_match_eager(WindowGraphs)


class KeptPadding(WindowGraphs):
    """Mutant: a reused cache is emptied but keeps the previous decoding's padding (key_valid)."""

    def cache(self, rows, device=None, dtype=None, extra_slots=0):
        key = (rows, torch.device(device or self.transformer.device), dtype or self.transformer.dtype, extra_slots)
        padding = self.stores[key][0].key_valid.clone() if key in self.stores else None
        cache = super().cache(rows, device, dtype, extra_slots)
        if padding is not None:
            cache.key_valid.copy_(padding)
        return cache


def test_a_kept_cache_that_keeps_its_padding_is_caught():
    assert not graphed_decodes_match_eager(KeptPadding)


def test_calls_that_alternate_settings_keep_each_settings_cache_and_graphs():
    """AR, then SJD with a wider window, then AR again (a comparison, the demo): each setting's cache and captured
    steps are kept, not captured again."""
    graphs = WindowGraphs(tiny_transformer(seed=0), capture=False)
    ar_cache = graphs.cache(2, extra_slots=1)
    ar_steps = graphs.steps
    assert graphs.cache(2, extra_slots=32) is not ar_cache and graphs.steps is not ar_steps
    assert graphs.cache(2, extra_slots=1) is ar_cache and graphs.steps is ar_steps


class ReassigningStep(JacobiStep):
    """Mutant: replaces a state tensor (the committed lengths) with a new one instead of writing it in place; an
    eager loop does not mind, a graph's replay keeps reading the tensor it was captured with."""

    def __call__(self):
        super().__call__()
        self.rows.committed = self.rows.committed.clone()  # the same values in a new tensor


class ReassigningSJD(SJD):
    def step(self, model, opening, sampling, generator, stats):
        return ReassigningStep(self, model, opening, sampling, generator, stats)


def replays_match_eager(decoding) -> bool:
    """Two decodings on the same graphed adapter equal eager ones: the first captures blocks of 3, 4, 2 and 1
    iterations, the second replays them in another order (blocks of 1)."""
    models = (tiny_transformer(seed=0), tiny_transformer(seed=1))
    eager, graphed = adapters(models)[0], adapters(models, WindowGraphs)[0]
    for seed, block in ((1, None), (2, 1)):
        cond, runs = condition(0, seed), []
        for target in (eager, graphed):
            with torch.no_grad():
                *_, last = decoding.run(target, cond, SAMPLING, torch.Generator().manual_seed(seed), SpecStats(),
                                        block)
            runs.append(last.tokens)
        if not torch.equal(*runs):
            return False
    return True


def test_a_step_that_reassigns_its_state_is_caught():
    assert replays_match_eager(SJD(3, "horizontal", "maximal"))
    assert not replays_match_eager(ReassigningSJD(3, "horizontal", "maximal"))


def second_iteration(model, cond, decoding, sampling) -> tuple[int, bool, str]:
    """(host reads, whether it traces whole, the first graph break) of a decoding's second iteration on `model`:
    the first takes the first-round branches (a drafter's first context)."""
    stats = SpecStats()
    decoding.check_model(model)  # as a decoding's run does (a head taps the target's features here)
    with torch.no_grad():
        opening = open_decoding(model, cond, sampling, None, stats, decoding.max_window, decoding)
        step = decoding.step(model, opening, sampling, None, stats)
        step()
        with HostReads() as reads:
            step()
        opening.timer.enabled = False  # dynamo does not trace the host timer (a capture turns it off too)
        traced, reason = compiles_fullgraph(step)
    return reads.count, traced, reason


# one step of each kind in the default tier (AR, a Jacobi window, a frontier tree, PJD, a draft model, a head); the
# other settings of each, whose captured code decodes what the eager steps decode (above), in the slow tier
TRACED = {"ar", "sjd-w16", "sjd-tree", "pjd", "draft", "heads"}


@pytest.mark.parametrize("name", [name if name in TRACED else pytest.param(name, marks=pytest.mark.slow)
                                  for name in DECODINGS])
def test_a_step_reads_nothing_on_the_host_and_traces_whole(name):
    models = (tiny_transformer(seed=0, dtype=torch.float32), tiny_transformer(seed=1, dtype=torch.float32))
    target, drafter = adapters(models)
    reads, traced, reason = second_iteration(target, condition(0, 1, dtype=torch.float32), DECODINGS[name](drafter),
                                             SAMPLING)
    assert reads == 0
    assert traced, reason


def test_rollback_writes_the_fill_levels_in_place():
    model = tiny_transformer()
    cache = model.new_cache(2)
    lengths = cache.lengths
    model.forward_window(torch.zeros(2, 5, 32, dtype=torch.float64), cache)
    cache.rollback(torch.tensor([3, 4]))
    assert cache.lengths is lengths and lengths.tolist() == [3, 4] and cache.max_length == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_captured_graphs_decode_what_the_eager_path_decodes_on_cuda():
    models = tuple(tiny_transformer(seed=seed, dtype=torch.float32).cuda() for seed in (0, 1))
    assert graphed_decodes_match_eager(WindowGraphs, models, capture=True, device="cuda", dtype=torch.float32)


def test_errors():
    model, other = tiny_transformer(seed=0), tiny_transformer(seed=1)
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device, got cpu"):
        WindowGraphs(model).cache(2)
    graphs = WindowGraphs(model, capture=False)
    with pytest.raises(ValueError, match=r"tokens must be \[None, W\] for the kept cache"):
        graphs(torch.zeros(2, 3, dtype=torch.long))
    cache = graphs.cache(2)
    with pytest.raises(ValueError, match=r"tokens must be \[2, W\]"):
        graphs(torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="overflows the cache"):
        graphs(torch.zeros(2, cache.capacity + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="graphs must be the WindowGraphs of this adapter's transformer"):
        LlamaGenAdapter(other, tiny_vq(), graphs)
    with pytest.raises(ValueError, match=r"enable_cuda_graphs needs the pipeline on a CUDA device "
                                         r"\(pipe.to\('cuda'\)\), it is on cpu"):
        tiny_pipeline().enable_cuda_graphs()
