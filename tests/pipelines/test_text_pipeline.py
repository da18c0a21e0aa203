import pytest
import torch

from mmspec import AR, TextSpeculation
from mmspec.pipelines.text import SpeculativeTextPipeline, TextPipelineOutput
from mmspec.text.methods import TextDraftHeads
from tests.conftest import embedded_text_pipeline


@pytest.fixture(scope="module")
def pipe():
    return embedded_text_pipeline()


PROMPTS = ["def fibonacci(n):\n", "import os\n\nclass Config:\n"]


@pytest.mark.parametrize(("decoding", "shown", "hidden"), [
    (TextSpeculation(drafter="tree"), {"tree_depth", "tree_branching", "tree_rates"},
     {"draft_length", "schedule", "tree_nodes", "max_ngram", "confidence_threshold"}),
    (TextSpeculation(drafter="tree", tree_rates=(0.6, 0.3)), {"tree_rates", "tree_nodes"},
     {"draft_length", "schedule", "tree_depth", "tree_branching"}),
    (TextSpeculation(drafter="ngram"), {"draft_length", "schedule", "max_ngram"},
     {"tree_depth", "tree_rates", "confidence_threshold"}),
])
def test_stats_name_only_the_settings_a_decoding_reads(decoding, shown, hidden):
    described = decoding.describe()
    assert all(f"{name}=" in described for name in shown), described
    assert not any(f"{name}=" in described for name in hidden), described


def test_greedy_decodings_complete_like_the_target(pipe):
    """Greedy speculative completions equal the target's own greedy `generate`, batch of two prompts."""
    ar = pipe(PROMPTS, decoding=AR(), max_new_tokens=40)
    assert isinstance(ar, TextPipelineOutput)
    assert ar.stats.tokens_per_target_forward == 1.0 and ar.stats.target_forwards == 40
    for drafter in ("model", "ngram", "layerskip", "tree", "stand"):
        out = pipe(PROMPTS, decoding=TextSpeculation(drafter=drafter), max_new_tokens=40)
        assert out.texts == ar.texts and torch.equal(out.sequences, ar.sequences)
        assert out.stats.target_forwards < 40


def test_tree_drafters_take_tree_settings_and_refuse_chain_ones(pipe):
    out = pipe(PROMPTS[0], decoding="tree", tree_depth=3, tree_branching=3, temperature=1.0, max_new_tokens=16,
               generator=torch.Generator().manual_seed(0))
    assert out.stats.method == TextSpeculation(drafter="tree", tree_depth=3, tree_branching=3).describe()
    assert out.stats.tree_acceptance is not None and out.stats.tokens_per_target_forward > 1
    with pytest.raises(ValueError,
                       match="draft_length applies to drafter 'model' / 'ngram' / 'layerskip' / 'cascade' / "
                             "'kangaroo' / 's2d' / 'heads', not 'tree'"):
        TextSpeculation(drafter="tree", draft_length=6)
    with pytest.raises(ValueError, match="acceptance='typical' is for chain drafters"):
        TextSpeculation(drafter="stand", acceptance="typical")
    with pytest.raises(ValueError, match="tree_depth applies to drafter 'tree', not 'stand'"):
        TextSpeculation(drafter="stand", tree_depth=2)


def test_a_positional_tree_from_a_runs_child_acceptance(pipe, tmp_path):
    """A wide tree's run measures the rate at which walks accept each child rank; the pipeline takes them back as
    tree_rates (the positional tree), which round-trips through a saved pipeline and is greedy-equal to AR."""
    wide = pipe(PROMPTS, decoding="tree", tree_depth=2, tree_branching=4, temperature=1.0, max_new_tokens=24,
                generator=torch.Generator().manual_seed(0))
    rates = wide.stats.child_acceptance
    assert len(rates) == 4 and rates[0] > 0
    out = pipe(PROMPTS, decoding="tree", tree_rates=rates, tree_nodes=12, temperature=1.0, max_new_tokens=24,
               generator=torch.Generator().manual_seed(0))
    decoding = TextSpeculation(drafter="tree", tree_rates=rates, tree_nodes=12)
    assert out.stats.method == decoding.describe() and out.stats.tokens_per_target_forward > 1
    assert decoding.tree_shape().nodes == 12 and decoding.tree_shape().template is not None
    before = pipe.decoding
    pipe.decoding = decoding
    try:
        pipe.save_pretrained(tmp_path)
    finally:
        pipe.decoding = before
    loaded = SpeculativeTextPipeline.from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    assert loaded.decoding == decoding and isinstance(loaded.decoding.tree_rates, tuple)
    ar = pipe(PROMPTS[0], decoding=AR(), max_new_tokens=24)
    assert torch.equal(loaded(PROMPTS[0], max_new_tokens=24).sequences, ar.sequences)  # greedy: the target's tokens


@pytest.mark.parametrize("settings,match", [
    (dict(tree_nodes=10), "tree_nodes applies with tree_rates"),
    (dict(tree_rates=(0.5, 0.2), tree_depth=3), "tree_depth sets the full tree"),
    (dict(tree_rates=(0.0, 0.2)), "tree_rates: rates must be probabilities"),
    (dict(tree_rates=0.5), "tree_rates must be a sequence of numbers, got 0.5"),
    (dict(drafter="stand", tree_rates=(0.5,)), "tree_rates applies to drafter 'tree' / 'heads', not 'stand'"),
])
def test_positional_tree_settings_are_checked(settings, match):
    with pytest.raises((TypeError, ValueError), match=match):
        TextSpeculation(**{"drafter": "tree", **settings})


def test_a_positional_head_tree_from_a_dynamic_trees_child_acceptance(pipe):
    """The EAGLE head's dynamic tree measures its child acceptance; `decoding="heads"` takes it back as tree_rates
    (the positional tree of tree_size nodes, as deep as the rates make it), greedy-equal to AR."""
    dynamic = pipe(PROMPTS, decoding="heads", tree_size=12, draft_length=3, temperature=1.0, max_new_tokens=24,
                   generator=torch.Generator().manual_seed(0))
    rates = dynamic.stats.child_acceptance
    assert len(rates) == 2 and rates[0] > 0  # EAGLE-2's tree: 2 children per expanded node
    decoding = TextDraftHeads(tree_size=12, tree_rates=rates)
    assert decoding.tree_shape().nodes == 12 and decoding.tree_shape().template is not None
    assert "tree_rates=" in decoding.describe() and "draft_length=" not in decoding.describe()
    out = pipe(PROMPTS, decoding=decoding, max_new_tokens=24)
    assert out.stats.method == decoding.describe() and out.stats.tokens_per_target_forward > 1
    assert torch.equal(out.sequences, pipe(PROMPTS, decoding=AR(), max_new_tokens=24).sequences)


@pytest.mark.parametrize("settings,match", [
    (dict(tree_rates=(0.6, 0.2)), "tree_rates builds a positional tree of tree_size nodes"),
    (dict(tree_size=8, tree_rates=(0.6, 0.2), draft_length=3), "positional tree's depth follows from tree_rates"),
    (dict(tree_size=8, tree_rates=(1.5,)), "tree_rates: rates must be probabilities"),
])
def test_head_tree_settings_are_checked(settings, match):
    with pytest.raises(ValueError, match=match):
        TextDraftHeads(**settings)


def test_shorthands_and_the_old_method_spelling_name_the_same_component(pipe):
    """`decoding="ngram", draft_length=6`, `decoding="speculative", drafter="ngram", ...`, a setting alone with
    `drafter=`, a config dict (also one saved under "speculative" before each drafter had a decoding of its own), and
    the old `method=` all run PromptLookup(draft_length=6)."""
    expected = TextSpeculation(drafter="ngram", draft_length=6)
    calls = [dict(decoding=expected), dict(decoding="ngram", draft_length=6),
             dict(decoding="speculative", drafter="ngram", draft_length=6), dict(drafter="ngram", draft_length=6),
             dict(decoding=expected.to_config()), dict(method="ngram", draft_length=6),
             dict(decoding={"name": "speculative", "drafter": "ngram", "draft_length": 6, "schedule": "constant",
                            "confidence_threshold": 0.0, "exit_threshold": 0.3, "tree_depth": 4, "max_ngram": 3})]
    outs = [pipe(PROMPTS[0], max_new_tokens=16, **call) for call in calls]
    assert all(out.stats.method == expected.describe() for out in outs)
    assert all(torch.equal(out.sequences, outs[0].sequences) for out in outs)
    assert pipe(PROMPTS[0], method="ar", max_new_tokens=8).stats.method == "AR(): transformers' generate"


@pytest.mark.parametrize("decoding", [AR(), TextSpeculation(drafter="model")])
def test_pieces_rebuild_the_completion_and_mark_accepted_drafts(pipe, decoding):
    out = pipe(PROMPTS, decoding=decoding, max_new_tokens=32, temperature=1.0,
               generator=torch.Generator().manual_seed(3))
    for row, pieces in enumerate(out.pieces):
        assert "".join(p.text for p in pieces) == out.texts[row]
        assert len(pieces) == int(out.stats.new_tokens[row])
        steps = [p.step for p in pieces]
        assert steps == sorted(steps)
    drafted = sum(p.from_draft for pieces in out.pieces for p in pieces)
    assert (drafted == 0) if isinstance(decoding, AR) else (0 < drafted <= out.stats.accepted)


@pytest.mark.parametrize("decoding", [AR(), TextSpeculation(drafter="model"), TextSpeculation(drafter="ngram")])
def test_step_callback_sees_the_tokens_so_far_and_can_stop_every_row(pipe, decoding):
    full = pipe(PROMPTS, decoding=decoding, max_new_tokens=24)
    seen = []

    def callback(p, step, n_generated, tensors):
        ids, counts = tensors["generated_ids"], tensors["new_tokens"]
        seen.append((step, n_generated, counts.clone()))
        assert p is pipe and ids.shape == (2, 24) and n_generated == int(counts.min())
        for row in range(2):  # what the rows generated so far is the start of the full completion
            n = int(counts[row])
            assert torch.equal(ids[row, :n], full.sequences[row, -24:][:n])
            assert (ids[row, n:] == pipe.tokenizer.pad_token_id).all()
        if n_generated >= 10:
            p._interrupt = True

    out = pipe(PROMPTS, decoding=decoding, max_new_tokens=24, callback_on_step_end=callback,
               callback_on_step_end_tensor_inputs=["generated_ids", "new_tokens"])
    assert seen and all(a[1] <= b[1] for a, b in zip(seen, seen[1:], strict=False))
    assert seen[-1][1] >= 10 and torch.equal(out.stats.new_tokens.cpu(), seen[-1][2].cpu())
    assert all(full.texts[row].startswith(out.texts[row]) for row in range(2))
    assert int(out.stats.new_tokens.min()) < 24


def test_sampling_is_reproducible_per_generator(pipe):
    kwargs = dict(decoding="model", max_new_tokens=24, temperature=1.0)
    first = pipe(PROMPTS[0], generator=torch.Generator().manual_seed(0), **kwargs)
    again = pipe(PROMPTS[0], generator=torch.Generator().manual_seed(0), **kwargs)
    assert torch.equal(first.sequences, again.sequences)
    ar = [pipe(PROMPTS[0], decoding="ar", max_new_tokens=24, temperature=1.0,
               generator=torch.Generator().manual_seed(0)).sequences for _ in range(2)]
    assert torch.equal(*ar)


@pytest.mark.parametrize("decoding", ["ar", "model", "ngram"])
def test_calls_without_a_generator_draw_afresh_from_the_global_rng(pipe, decoding):
    """As torch and transformers sample: each call advances the global RNG, so two calls differ, and the same
    global seed repeats them (AR once sampled on a fork of it restored afterwards: every call was the same)."""
    kwargs = dict(decoding=decoding, max_new_tokens=24, temperature=1.0)
    torch.manual_seed(5)
    first, second = (pipe(PROMPTS[0], **kwargs).sequences for _ in range(2))
    assert not torch.equal(first, second)
    torch.manual_seed(5)
    assert torch.equal(pipe(PROMPTS[0], **kwargs).sequences, first)


def test_clear_errors(pipe):
    with pytest.raises(ValueError, match=r"decoding must be one of \('auto', 'model', 'ngram'"):
        pipe("x = 1", decoding="beam")
    with pytest.raises(ValueError, match="not both"):
        pipe("x = 1", decoding="ngram", method="ngram")
    with pytest.raises(ValueError, match="contradicts"):
        pipe("x = 1", decoding="ngram", drafter="model")
    with pytest.raises(ValueError, match="exit_layer applies to drafter 'layerskip', not 'ngram'"):
        pipe("x = 1", decoding="ngram", exit_layer=2)
    with pytest.raises(ValueError, match="max_ngram applies to drafter 'ngram'"):
        TextSpeculation(drafter="model", max_ngram=4)
    with pytest.raises(ValueError, match="drafter must be one of"):
        TextSpeculation(drafter="medusa")
    with pytest.raises(ValueError, match="schedule must be one of"):
        TextSpeculation(schedule="exponential")
    with pytest.raises(ValueError, match="draft_length must be >= 1"):
        TextSpeculation(draft_length=0)
    with pytest.raises(TypeError, match="prompt"):
        pipe([], decoding="ngram")
    with pytest.raises(ValueError, match="one generator"):
        pipe("x = 1", decoding=AR(), generator=[torch.Generator()])
    with pytest.raises(ValueError, match="needs a draft model"):
        SpeculativeTextPipeline(pipe.target, pipe.tokenizer)("x = 1", decoding="model")
    assert "model" not in SpeculativeTextPipeline(pipe.target, pipe.tokenizer).methods
    with pytest.raises(ValueError, match="callback_on_step_end_tensor_inputs"):
        pipe("x = 1", callback_on_step_end=lambda *a: None, callback_on_step_end_tensor_inputs=["latents"])


def test_replayed_steps_through_the_pipeline_and_cuda_graphs_refused_on_a_cpu(pipe):
    """The pipeline hands its `step_graphs` to a speculative decoding (a CUDA pipeline makes them itself; tape
    graphs here run the same replay path): the text does not change, with a step callback (one step per block) or
    without."""
    from mmspec.core.runtime.capture import StepGraphs

    call = dict(decoding="speculative", drafter="model", max_new_tokens=24, temperature=1.0)

    def generators():  # one per prompt: an eager batch drops its finished rows, a captured one keeps them
        return [torch.Generator().manual_seed(3 + row) for row in range(len(PROMPTS))]

    eager = pipe(PROMPTS, generator=generators(), **call).texts
    steps = []
    pipe.step_graphs = StepGraphs(cuda=False)
    try:
        for callback in (None, lambda p, step, n, tensors: steps.append(step) or tensors):
            out = pipe(PROMPTS, generator=generators(), callback_on_step_end=callback, **call)
            assert out.texts == eager
        assert steps == list(range(1, len(steps) + 1)) and pipe.step_graphs.shells
        greedy = dict(max_new_tokens=24, temperature=0.0)  # AR replays its own loop, drafting nothing
        assert pipe(PROMPTS, decoding="ar", **greedy).texts == pipe(PROMPTS, decoding="speculative", **greedy).texts
    finally:
        pipe.step_graphs = None
    with pytest.raises(ValueError, match=r"enable_cuda_graphs needs the pipeline on a CUDA device"):
        pipe.enable_cuda_graphs()


def test_online_drafting_learns_from_draft_model_requests_between_calls(pipe):
    """Recorded: the calls that draft with the draft LM (not prompt lookup's); the update is swapped in before the
    next call, not during one; turned off, the last update is swapped in and the draft keeps what it learned."""
    learner = pipe.enable_online_drafting(every=1, steps=1, background=False)
    served = [w.clone() for w in pipe.draft.parameters()]
    pipe("def f(x):\n", decoding="ngram", max_new_tokens=8)
    assert learner.requests == 0
    pipe("def f(x):\n", decoding="model", max_new_tokens=8, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert learner.requests == 1 and learner.updates == 0  # trained, not yet swapped in
    assert all(torch.equal(a, b) for a, b in zip(served, pipe.draft.parameters()))
    pipe("def f(x):\n", decoding="cascade", max_new_tokens=8)
    assert learner.requests == 2 and learner.updates == 1
    assert not all(torch.equal(a, b) for a, b in zip(served, pipe.draft.parameters()))
    pipe.disable_online_drafting()
    assert pipe.online is None and learner.updates == 2
    with torch.no_grad():  # leave the module's pipeline as the other tests found it
        for weight, original in zip(pipe.draft.parameters(), served):
            weight.copy_(original)


def test_online_drafting_of_a_head_learns_from_its_kinds_calls(pipe):
    """drafter="eagle": recorded are the heads calls with the EAGLE head (not the draft LM's, not Hydra's); its
    update is swapped in before the next call."""
    learner = pipe.enable_online_drafting("eagle", every=1, steps=1, background=False)
    served = [w.clone() for w in pipe.eagle_head.parameters()]
    pipe("def f(x):\n", decoding="model", max_new_tokens=8)
    pipe("def f(x):\n", decoding="heads", kind="hydra", max_new_tokens=8)
    assert learner.requests == 0
    pipe("def f(x):\n", decoding="heads", max_new_tokens=8, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert learner.requests == 1 and learner.updates == 0
    pipe("def f(x):\n", decoding="heads", max_new_tokens=8)
    assert learner.requests == 2 and learner.updates == 1
    assert not all(torch.equal(a, b) for a, b in zip(served, pipe.eagle_head.parameters()))
    pipe.disable_online_drafting()
    with torch.no_grad():
        for weight, original in zip(pipe.eagle_head.parameters(), served):
            weight.copy_(original)


def test_online_drafting_needs_a_draft_and_valid_options(pipe):
    with pytest.raises(ValueError, match="divergence"):
        pipe.enable_online_drafting(divergence="jsd")
    without_draft = SpeculativeTextPipeline(pipe.target, pipe.tokenizer)
    with pytest.raises(ValueError, match="needs a draft LM"):
        without_draft.enable_online_drafting()
    with pytest.raises(ValueError, match="needs the pipeline's hydra_head"):
        without_draft.enable_online_drafting("hydra")
    with pytest.raises(ValueError, match="drafter must be one of"):
        pipe.enable_online_drafting("medusa")


def test_the_embedded_pipeline_runs_kangaroo_s2d_and_judge_decoding(pipe):
    """The shipped adapter (sorted: exits 2, 3, 4, 6) and judge load beside the target: Kangaroo and S2D draft
    exactly (greedy equals AR), judge decoding reports its distortion."""
    assert {"kangaroo", "s2d"} <= set(pipe.methods) and pipe.judge_head is not None
    assert pipe.kangaroo_adapter.exits == (2, 3, 4, 6)
    ar = pipe(PROMPTS, decoding="ar", max_new_tokens=16)
    for method in ("kangaroo", "s2d"):
        out = pipe(PROMPTS, decoding=method, max_new_tokens=16)
        assert out.texts == ar.texts and out.stats.accepted > 0
    judged = pipe(PROMPTS, decoding="model", acceptance="judge", max_new_tokens=16)
    assert judged.stats.excess_acceptance is not None and judged.stats.excess_acceptance >= 0


def test_a_registered_text_decoding_is_listed_where_its_parts_are_supplied(pipe):
    """A text decoding registered from outside is a method name of every text pipeline that can supply its runtime
    parts (here a draft head of the EAGLE kind, what `supplied` fills), and a `mmspec text --method` choice; a
    pipeline without the part does not list it."""
    from dataclasses import dataclass
    from typing import ClassVar

    from mmspec.cli import build_parser
    from mmspec.core.registry import register_decoding, unregister
    from mmspec.core.settings import runtime
    from mmspec.text.methods import TextDecoding, method_names

    @dataclass(frozen=True)
    class HeadedLookup(TextDecoding):
        """A test decoding that needs an EAGLE head."""

        name: ClassVar[str] = "headed_lookup"
        kind: ClassVar[str] = "eagle"
        head: object = runtime(supplied_by="{kind}_head")

    register_decoding(HeadedLookup)
    try:
        assert method_names()[-2:] == ("headed_lookup", "ar")
        assert "headed_lookup" in pipe.methods
        headless = type(pipe)(pipe.target, pipe.tokenizer, draft=pipe.draft)
        assert "headed_lookup" not in headless.methods and "heads" not in headless.methods
        choices = next(a for a in build_parser()._subparsers._group_actions[0].choices["text"]._actions
                       if a.dest == "method").choices
        assert "headed_lookup" in choices
    finally:
        unregister(HeadedLookup)
    assert "headed_lookup" not in method_names()


def test_one_supply_step_fills_the_parts_each_component_declares(pipe):
    """Each runtime field names the pipeline part that supplies it: the head of the component's kind, the exit
    adapter, the acceptance head, a judge rule's head; a part the component does not read is not missing, one the
    pipeline lacks is (`unsupplied`)."""
    from mmspec.core.rules.judge import Judge

    kangaroo = pipe.supplied(TextSpeculation(drafter="kangaroo"))
    assert kangaroo.kangaroo_adapter is pipe.kangaroo_adapter and kangaroo.unsupplied() == []
    learned = pipe.supplied(TextSpeculation(drafter="model", schedule="learned"))
    assert learned.acceptance_head is pipe.acceptance_head
    assert pipe.supplied(TextDraftHeads(kind="hydra")).head is pipe.hydra_head
    assert pipe.supplied(TextSpeculation(acceptance=Judge())).acceptance.head is pipe.judge_head
    bare = type(pipe)(pipe.target, pipe.tokenizer, draft=pipe.draft)
    assert bare.supplied(TextSpeculation(drafter="ngram")).unsupplied() == []  # reads no adapter: nothing missing
    assert bare.supplied(TextSpeculation(drafter="kangaroo")).unsupplied() == ["kangaroo_adapter"]
    assert bare.supplied(TextSpeculation(acceptance=Judge())).unsupplied() == ["acceptance.head"]
    assert {"kangaroo", "s2d", "heads"}.isdisjoint(bare.methods) and "model" in bare.methods
