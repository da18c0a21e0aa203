"""S2D's sorted exits (`SortedExitDrafter`, `NestedExits`, a `KangarooAdapter` trained at several exits): every draft
token's law is its exit's whole-sequence law for that prefix (the nested cache catches the deeper levels up on what
they skipped; a catch-up that misses some of it is caught), greedy drafting keeps the target's output, and drafting
with the exit chosen per row and step keeps the target's law (chi-square against the exact joint law through the real
loop; a double exit that drops the token which tripped it is rejected by the same test), as Kangaroo's single exit
does."""

import pytest
import torch

from mmspec.adapters.nested_exits import NestedExits
from mmspec.adapters.views import kangaroo_view
from mmspec.core.drafting import proposer as drafting
from mmspec.core.probs import SamplingConfig
from mmspec.models.kangaroo import KangarooAdapter
from mmspec.text import TextSpeculation, speculative_generate
from mmspec.text import sorted_exits as sorted_exits_module
from mmspec.text.rows import TextRows
from mmspec.text.sorted_exits import SortedExitDrafter
from tests.conftest import tiny_llama
from tests.text.table_lm import TableLM, random_table
from tests.text.test_draft_stops import drop_the_tripping_token
from tests.text.test_generate import prompts
from tests.text.test_generate_law import ALPHA, V, law_test
from tests.text.test_kangaroo import adapter_for, exit_drafter


def sorted_adapter(model, exit_layers: list[int], noise: float = 0.3) -> KangarooAdapter:
    """An adapter for `exit_layers` (Kangaroo's exit: the middle one), moved off the layer it starts from."""
    adapter = adapter_for(model, exit_layers[len(exit_layers) // 2], noise=noise)
    sorted_one = KangarooAdapter.for_target(model, adapter.config.exit_layer, exit_layers)
    sorted_one.load_state_dict(adapter.state_dict())
    return sorted_one


@pytest.fixture
def deep_target():
    """Four layers, its head sharpened so that the exits' top-1 probabilities spread around 0.3."""
    model = tiny_llama(vocab_size=48, num_layers=4, seed=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(15.0)
    return model


class Recording(SortedExitDrafter):
    """Keeps, for every step, the rows' tokens so far, the exits they took and the draft they proposed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = []

    def _choose(self, tokens, end):
        self.chosen, logits = super()._choose(tokens, end)
        return self.chosen, logits

    def propose(self, rows, budget, width, sampling, generator):
        draft = super().propose(rows, budget, width, sampling, generator)
        self.steps.append(([rows.tokens[b, : rows.lengths[b]].clone() for b in range(rows.batch_size)],
                           self.chosen.clone(), draft))
        return draft


class ShortCatchUp(Recording):
    """Mutation: a catch-up window of one slot, so each level re-reads only a row's closing token: after a step that
    accepted its last draft (never fed through the levels), that draft's slot keeps no state of it."""

    catch_up_width = 1


@torch.no_grad()
def largest_law_gap(target, adapter, drafter: Recording) -> float:
    """The largest difference between a draft token's recorded law (T = 1) and the law its exit's whole-sequence
    view (`kangaroo_view`) gives after the same tokens."""
    views = [kangaroo_view(target, adapter, layer) for layer in adapter.exits]
    gap = 0.0
    for tokens, chosen, draft in drafter.steps:
        for b, row in enumerate(tokens):
            for i in range(int(draft.lengths[b])):
                prefix = torch.cat([row, draft.tokens[b, :i]])[None]
                law = views[int(chosen[b])](input_ids=prefix).logits[0, -1].softmax(-1)
                gap = max(gap, float((law - draft.q[b, i]).abs().max()))
    return gap


def run(target, drafter, draft_length=4, **options):
    ids, mask = prompts(3)
    return speculative_generate(target, ids, mask, drafter=drafter, max_new_tokens=20, pad_token_id=0,
                                draft_length=draft_length, generator=torch.Generator().manual_seed(0), **options)


def test_each_draft_law_is_its_exits_whole_sequence_law(deep_target):
    adapter = sorted_adapter(deep_target, [1, 2, 3])
    drafter = Recording(deep_target, adapter, exit_threshold=0.3)
    run(deep_target, drafter, temperature=1.0)
    assert (drafter.exits_taken > 0).sum() >= 2  # rows took several exits over the steps
    assert largest_law_gap(deep_target, adapter, drafter) < 1e-9


def test_a_catch_up_window_that_misses_committed_tokens_is_caught(deep_target):
    adapter = sorted_adapter(deep_target, [1, 2, 3])
    drafter = ShortCatchUp(deep_target, adapter, exit_threshold=0.3)
    run(deep_target, drafter, draft_length=1, temperature=1.0)  # a single draft: accepted, it was never fed
    assert largest_law_gap(deep_target, adapter, drafter) > 1e-3


def test_a_step_after_nothing_was_committed_drafts_from_the_same_prefix(deep_target):
    """A finished row keeps stepping without committing until the loop drops it: the levels have nothing to catch
    up on, and the step's first law is the previous step's."""
    ids, mask = prompts(1)
    rows = TextRows(ids, mask, 8, 4, None, 0)
    drafter = SortedExitDrafter(deep_target, sorted_adapter(deep_target, [1, 2, 3]), exit_threshold=0.3)
    drafter.start(rows, 48, 32)
    budget, sampling = torch.full((1,), 4), SamplingConfig(temperature=1.0)
    first, again = (drafter.propose(rows, budget, 4, sampling, torch.Generator().manual_seed(0)) for _ in range(2))
    torch.testing.assert_close(again.q[:, 0], first.q[:, 0])


@pytest.mark.parametrize("confidence_threshold", [0.0, 0.3])
def test_sorted_exits_keep_the_targets_greedy_output(deep_target, confidence_threshold):
    ids, mask = prompts(3)
    expected = deep_target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                                    pad_token_id=0)
    drafter = SortedExitDrafter(deep_target, sorted_adapter(deep_target, [1, 2, 3], noise=0.02),
                                exit_threshold=0.3, confidence_threshold=confidence_threshold)
    out, stats = run(deep_target, drafter, temperature=0)
    assert torch.equal(out, expected)
    assert 0 < stats.accepted < stats.drafted and (drafter.exits_taken > 0).sum() >= 2


def sorted_drafter(confidence_threshold: float) -> SortedExitDrafter:
    """S2D's drafter on a tiny Llama over the law test's vocabulary (the table target verifies: the law test needs
    its exact joint law), its head sharpened so that rows take either exit and the double exit trips."""
    host = tiny_llama(vocab_size=V, hidden_size=8, num_layers=3, seed=3, num_heads=1)
    with torch.no_grad():
        host.lm_head.weight.mul_(60.0)
    return SortedExitDrafter(host, sorted_adapter(host, [1, 2]), exit_threshold=0.9,
                             confidence_threshold=confidence_threshold)


# the self-drafting exits: (the drafter for a double-exit threshold, the module whose chain loop cuts the drafts, the
# rows its mutation companion needs: measured p-values at seeds 0-2, Kangaroo's 3e-3 to 2e-1 at 20,000 rows, 3e-6 to
# 6e-4 at 50,000 and 1e-17 to 4e-16 at 100,000; S2D's 1e-40 to 1e-30 at 20,000)
EXIT_DRAFTERS = {"kangaroo": (exit_drafter, drafting, 100_000), "s2d": (sorted_drafter, sorted_exits_module, 20_000)}


@pytest.mark.parametrize("kind", EXIT_DRAFTERS)
@pytest.mark.parametrize("draft_length,temperature,top_k,threshold", [
    pytest.param(3, 1.0, 0, 0.3, marks=pytest.mark.slow), (2, 0.8, 3, 0.6)])
def test_self_drafting_exits_keep_the_targets_law(kind, draft_length, temperature, top_k, threshold):
    """Kangaroo (one exit) and S2D (both exits drafting), each with the double early exit cutting drafts short."""
    drafter = EXIT_DRAFTERS[kind][0](threshold)
    p_value, stats = law_test(TableLM(random_table(V, 0)), drafter, temperature, top_k, draft_length=draft_length)
    assert p_value > ALPHA, f"output law differs from the target's (p = {p_value:.2e})"
    assert stats.drafted < draft_length * int(stats.steps.sum())  # the double exit cut drafts short
    assert 0 < stats.accepted < stats.drafted
    assert kind != "s2d" or (drafter.exits_taken > 0).all()


@pytest.mark.parametrize("kind", EXIT_DRAFTERS)
def test_a_double_exit_that_drops_the_tripping_token_is_rejected(kind, monkeypatch):
    make_drafter, chain_loop, rows = EXIT_DRAFTERS[kind]
    monkeypatch.setattr(chain_loop, "stop_after", drop_the_tripping_token)
    p_value, _ = law_test(TableLM(random_table(V, 0)), make_drafter(0.3), 1.0, 0, rows=rows, draft_length=3)
    assert p_value < ALPHA, f"the mutant exit was not detected (p = {p_value:.2e})"


def test_sorted_training_reads_each_exits_draft(deep_target):
    """What sorted fine-tuning trains (`NestedExits.exit_logits` on the target's hidden states) is what each exit's
    draft model gives."""
    adapter = sorted_adapter(deep_target, [1, 2, 3])
    ids = torch.randint(0, 48, (2, 9), generator=torch.Generator().manual_seed(0))
    hidden_states = deep_target(input_ids=ids, output_hidden_states=True).hidden_states
    for logits, layer in zip(NestedExits(deep_target, adapter).exit_logits(hidden_states), adapter.exits,
                             strict=True):
        torch.testing.assert_close(logits, kangaroo_view(deep_target, adapter, layer)(input_ids=ids).logits)


def test_bad_settings_are_refused(deep_target):
    with pytest.raises(ValueError, match="two exits or more"):
        SortedExitDrafter(deep_target, adapter_for(deep_target, 2))
    adapter = sorted_adapter(deep_target, [1, 2, 3])
    with pytest.raises(ValueError, match="exit_threshold must be in"):
        SortedExitDrafter(deep_target, adapter, exit_threshold=0)
    with pytest.raises(ValueError, match=r"trained for exit layers \[1, 2, 3\], not 4"):
        kangaroo_view(tiny_llama(vocab_size=48, num_layers=6), adapter, 4)
    with pytest.raises(ValueError, match="must be distinct, ascending and hold exit_layer"):
        KangarooAdapter(exit_layer=2, exit_layers=[1, 3])
    with pytest.raises(ValueError, match="exit_threshold"):
        TextSpeculation(drafter="model", exit_threshold=0.5)
    ids, mask = prompts(1)
    with pytest.raises(ValueError, match="drafter='s2d' needs an exit adapter"):
        TextSpeculation(drafter="s2d").run(deep_target, None, ids, mask, max_new_tokens=4)
